"""What cmk's kernel arguments do on a guest's booted kernel (tests/guest/test_real_kernel.py).

The Debian 12 guest boots the plan below on its CPUs (tests/guest/guest_vm.py):
siblings (0,1) (2,3) on NUMA node 0 and (4,5) (6,7) on node 1, one infra core
per node, one exclusive and one shared core. The Debian 13 kubelet guest
(tests/guest/test_real_kubelet.py, step 6) writes the same arguments
(``CMK_ARGS``) and measures with the same oslat settings (``CMK_VERIFY_VARS``)
on the kubelet's boot; it booted cmk's arguments too until CI's time ruled a
third reboot out, and docs/guest.md keeps what its 6.12 kernel showed then.
"""

from __future__ import annotations

import json

#: cmk with one exclusive and one shared core on the guests' CPUs (docs/kernel-args.md): exclusive
#: core (2,3) and shared core (6,7) isolated from the scheduler's domains, the tick and RCU callbacks
#: off the exclusive CPUs only, IRQs on the infra cores.
CMK_ARGS = {
    "isolcpus": "managed_irq,domain,2-3,6-7",
    "nohz_full": "2-3",
    "rcu_nocbs": "2-3",
    "irqaffinity": "0-1,4-5",
}
#: oslat on the exclusive CPUs and one housekeeping CPU, briefly: under emulation the figures prove
#: the pipeline, not the hardware.
CMK_VERIFY_VARS = {"cpupools_verify_latency": True, "cpupools_verify_latency_duration": 5}


def assert_verified(result: dict) -> None:
    """verify's findings on the kernel booted with cmk's arguments (docs/guest.md: what it shows, and why)."""
    why = json.dumps({k: result.get(k) for k in ("summary", "findings")}, indent=1)[:6000]
    assert (result["kernel"]["isolated"], result["kernel"]["nohz_full"]) == ("2-3,6-7", "2-3"), why
    # What stays on the isolated CPUs is exactly the disk's per-queue vectors: managed IRQs with a
    # one-CPU mask (8 queues, one per CPU), which isolcpus=managed_irq leaves in place. Debian 12's 6.1
    # and Debian 13's 6.12 kernels placed them alike.
    on_isolated = {irq["name"]: (irq["effective"], irq["managed"]) for irq in result["irqs"]}
    assert on_isolated == {
        "virtio1-req.2": ("6", True),
        "virtio1-req.3": ("7", True),
        "virtio1-req.6": ("2", True),
        "virtio1-req.7": ("3", True),
    }, why
    # The unbound workqueues' mask is the housekeeping CPUs.
    assert result["workqueue"]["cpumask"] == "0-1,4-5" and result["workqueue"]["ok"], why
    assert (result["rcu"]["expected"], result["rcu"]["ok"]) == ("2-3", True), why
    assert (result["nohz"]["expected"], result["nohz"]["active"], result["nohz"]["ok"]) == ("2-3", "2-3", True), why
    latency = result["latency"]
    assert latency["skipped"] is None and latency["ok"], why
    measured = set(latency["cpus"])
    assert {"2", "3"} <= measured and len(measured - {"2", "3"}) == 1, latency
    assert measured - {"2", "3"} <= {"0", "1", "4", "5"}, latency
    for cpu, figures in latency["cpus"].items():
        assert 0 <= figures["min_us"] <= figures["p99_us"] <= figures["max_us"], (cpu, figures)
    assert result["ok"], why
