"""cpupools_runtime: kubelet on a real kubelet, on a real kernel (issue 38).

The node is the Debian 13 guest of tests/guest/kubelet_guest.py (kernel 6.12,
containerd 1.7, the real kubelet v1.36.2 as kubeadm sets it up, cgroup v2 and
the systemd driver), joined with its own client certificate
(``system:node:cpupools-guest``) to a real etcd and kube-apiserver v1.36 on
the machine's loopback (Node authorizer, NodeRestriction). There is no
scheduler or controller manager: pods name their node, and a ReplicaSet
object owns them so that a drain evicts them; the test recreates an evicted
pod as its controller would. One scenario, in order:

1. the node is Ready before cpupools runs;
2. site.yml with cpupools_runtime: kubelet and cpupools_kubelet_version: auto
   (the plan play says how many CPUs pods can use), then playbooks/reboot.yml:
   drain, the kubelet stopped with its drop-in written and its state removed,
   the reboot into the new kernel arguments, the kubelet's fresh state
   checked, the node Ready, verify, uncordon;
3. pods: a Guaranteed pod gets whole cores of the plan's exclusive set,
   isolated and nohz_full, no reserved CPU; a Burstable pod runs on the
   kubelet's shared set (no reserved CPU: strict-cpu-reservation; no CPU the
   Guaranteed pod holds); the kubelet, containerd and every host service run
   on the reserved CPUs only; verify.yml passes with the Guaranteed pod
   running (its holder found in cpu_manager_state), oslat measuring the
   exclusive CPUs it does not hold and one housekeeping CPU, and fails, naming
   the process, for a stray pinned onto the pod's CPUs;
4. a second site.yml, the pods running, changes nothing on the node, and
   the fleet report that showed the node pending its reboot shows it ok;
   by hand (CPUPOOLS_GUEST_ALL=1), a change of the pool sizes rolled out
   before it: the drain evicts the pods, the kubelet comes up without
   refusing its state, the rollout's verify finds no kernel thread that may
   move on the new isolated set, a recreated Guaranteed pod runs on the new
   exclusive set (a second reboot: out of CI since 2026-12-01, docs/guest.md,
   "What it costs");
by hand too (CPUPOOLS_GUEST_ALL=1, with the resize; out of CI since 2026-12-01):
5. a drop-in the kubelet refuses (the operator's own kubelet configuration
   turned the static policy's beta options off, and cpupools' drop-in asks
   for one): the rollout stops at this node with the kubelet's own message, the node stays
   cordoned, the fleet's other node (a sandbox node behind it) is not
   touched; playbooks/uninstall.yml brings the kubelet back (policy none,
   Ready);
6. the same cluster with cpupools_runtime: cmk: site.yml writes cmk's kernel
   arguments (isolcpus with domain, nohz_full and rcu_nocbs on the exclusive
   CPUs, irqaffinity) and its pool state; a pod that asks for
   cmk.intel.com/exclusive-cores only, completed by the MutatingAdmissionPolicy
   (the cmk mounts, CMK_PROC_FS), runs cmk isolate --pool=exclusive and gets
   the exclusive pool's list, on CPUs step 2's kernel isolated. cmk's own
   arguments booted and verified are tests/guest/test_real_kernel.py's, on
   Debian 12, by hand: a third reboot here cost CI more than it could give
   (docs/guest.md, "What it costs").

It needs what tests/guest/test_real_kernel.py needs, and the kubelet, etcd and
kube-apiserver of ../shared/k8s/bin (KUBEBUILDER_ASSETS); without them it is
skipped with the reason, or fails when CPUPOOLS_REQUIRE_GUEST=1 (.ci/run).
scripts/test.sh runs it beside the suite (marker kubelet_guest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, ansible_env, run_playbook
from sysfs import CORPUS, write_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guest_image as image
import kubelet_guest as kg
from cmk_kernel import CMK_ARGS, CMK_VERIFY_VARS
from guest_vm import Guest, qemu_missing

sys.path.insert(0, str(REPO / "tests"))
from cpupools.core.cpulist import format_cpulist, parse_cpulist
from k8s_real import PRODUCT_USER, RealKube

pytestmark = [pytest.mark.guest, pytest.mark.kubelet_guest, pytest.mark.slow]

NODE = kg.NODE
NS = "latency"
#: The guest's CPUs (tests/guest/guest_vm.py): cores (0,1) (2,3) on NUMA node 0, (4,5) (6,7) on node 1.
#: One infra core per NUMA node (auto) is reserved: 0-1,4-5; every other CPU is the kubelet's.
RESERVED = {0, 1, 4, 5}
KUBELETS = {2, 3, 6, 7}
CORES = [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
#: Step 4, by hand (CPUPOOLS_GUEST_ALL=1): NUMA node 1 keeps no housekeeping core: the kubelet gets 2-7.
RESIZED = {"cpupools_infra_cores": {0: 1, 1: 0}}
#: Step 4's resize, and steps 5 and 6, run only by hand (CPUPOOLS_GUEST_ALL=1): CI's time (docs/guest.md).
ALL_STEPS = os.environ.get("CPUPOOLS_GUEST_ALL") == "1"
FAKE_KUBELET = [sys.executable, str(REPO / "tests/fixtures/fake_kubelet.py")]
FAKE_BOOT = [sys.executable, str(REPO / "tests/fixtures/fake_boot.py")]
PODS_CAN_USE = "Say how many CPUs pods can use on the kubelet nodes this run changes"
VERIFY = "Verify that the isolated CPUs are quiet"
#: The operator's own kubelet configuration, read at the kubelet's next start (step 5): beta options off,
#: which cpupools' drop-in (distribute-cpus-across-numa, beta in 1.36) cannot run with.
OPERATORS_GATE = "featureGates:\n  CPUManagerPolicyBetaOptions: false\n"


def require(reason: str | None) -> None:
    if reason:
        if os.environ.get("CPUPOOLS_REQUIRE_GUEST") == "1":
            pytest.fail(f"CPUPOOLS_REQUIRE_GUEST=1 but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    """A control plane on the machine's loopback whose certificate the guest can check as 10.0.2.2."""
    require(qemu_missing())
    bin_dir = kg.assets_dir()
    require(None if bin_dir else "no kubelet, etcd and kube-apiserver: set KUBEBUILDER_ASSETS (../shared/k8s/bin)")
    kube = RealKube.start(bin_dir, tmp_path_factory.mktemp("kube"), server_ips=(kg.HOST_FROM_GUEST,))
    yield kube
    kube.stop()


@pytest.fixture(scope="module")
def node(kube, tmp_path_factory):
    timings = {}
    start = time.monotonic()
    base = image.build(kg.TRIXIE_KUBELET)
    timings["image"] = time.monotonic() - start
    guest = Guest(base, tmp_path_factory.mktemp("kubelet-guest"))
    try:
        guest.start()
        timings["boot_to_ssh"] = guest.wait_for_ssh()
        timings["join_ready"] = kg.join(guest, kube)
        guest.timings = timings
        yield guest
    finally:
        guest.stop()


def host_vars(guest: Guest) -> dict:
    return {**guest.inventory_host(), "ansible_python_interpreter": "/usr/bin/python3"}


def write_inventory(tmp_path: Path, kube: RealKube, hosts: dict, **variables) -> str:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig", token=kube.product_token)
    data = {
        "all": {
            "children": {"cpupools_nodes": {"hosts": hosts}},
            "vars": {
                "cpupools_runtime": "kubelet",
                "cpupools_num_exclusive_cores": 1,
                "cpupools_num_shared_cores": 0,
                "cpupools_k8s_kubeconfig": str(kubeconfig),
                "cpupools_report_html": str(tmp_path / "report.html"),
                "cpupools_report_print": False,
                # Under emulation (tests/guest/test_real_kernel.py says why): the reboot, pods stopping.
                "cpupools_reboot_timeout": 1200,
                "cpupools_k8s_drain_timeout": 600,
                "cpupools_kubelet_restart_timeout": 600,
                **variables,
            },
        }
    }
    path = tmp_path / f"hosts-{len(list(tmp_path.glob('hosts-*.yml')))}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run(guest: Guest, playbook: str, tmp_path: Path, inv: str, step: str, extra=None, *args, ok: bool = True):
    start = time.monotonic()
    res = run_playbook(REPO / playbook, tmp_path, extra, *args, inventory=inv, env=ansible_env())
    guest.timings[step] = time.monotonic() - start
    (tmp_path / "timings.json").write_text(json.dumps(guest.timings))
    (tmp_path / f"{step}.json").write_text(res.stdout)
    if ok:
        failed = res.messages() or res.stdout[-4000:]
        assert res.rc == 0, f"{playbook}: status {res.rc}\n{failed}\n{res.stderr[-2000:]}\n{guest.tail()}"
    return res


def cpus(text: str) -> set[int]:
    return set(parse_cpulist(text or ""))


def kernel(guest: Guest) -> dict:
    out = guest.ssh("cat /proc/cmdline /sys/devices/system/cpu/nohz_full /sys/devices/system/cpu/isolated").splitlines()
    args = dict(word.split("=", 1) for word in out[0].split() if "=" in word)
    return {
        "args": args,
        # isolcpus=[flag,...,]cpulist: the flags are words (managed_irq, domain, nohz).
        "isolcpus": cpus(",".join(w for w in args.get("isolcpus", "").split(",") if w[:1].isdigit())),
        "nohz_full": cpus(out[1]),
        "isolated": cpus(out[2]),
    }


def node_changes(res, host: str = NODE) -> list[str]:
    """The tasks that changed something on the node (the fleet report on the controller left out)."""
    return [
        t["task"]["name"]
        for t in res.tasks()
        if t["hosts"].get(host, {}).get("changed") and "fleet report" not in t["task"]["name"]
    ]


def whole_cores(held: set[int]) -> bool:
    return all(core <= held or not core & held for core in CORES)


def movable_kthreads(verified: dict) -> list[dict]:
    """The kernel threads verify found on the isolated CPUs that may move (an IRQ's thread follows its IRQ,
    which verify's IRQ check judges)."""
    return [k for k in verified["kthreads"] if not k["comm"].startswith("irq/")]


def assert_state_accepted(guest: Guest) -> None:
    """This boot's kubelet started on the CPU manager state it found: it refuses a checkpoint of another
    policy or of other CPUs, and asks for a drain."""
    journal = guest.ssh("journalctl -u kubelet -b --no-pager -o cat")
    for refusal in ("could not restore state from checkpoint", "doesn't match with CPUs in state", "please drain"):
        assert refusal not in journal, refusal


def report_status(res) -> str:
    return res.result("Render the fleet report", NODE)["hosts"][NODE]["status"]


def test_the_kubelet_runtime_on_a_real_kubelet(node, kube, tmp_path, capsys):
    guest = node
    kube.namespace(NS)
    assert kg.node_ready(kube.get(f"/api/v1/nodes/{NODE}")), "1. the node is Ready before cpupools runs"
    inv = write_inventory(tmp_path, kube, {NODE: host_vars(guest)})

    # 2. site.yml, then the drained reboot that also restarts the kubelet with the new policy.
    site = run(guest, "site.yml", tmp_path, inv, "site")
    assert site.result(PODS_CAN_USE, NODE)["msg"] == [
        f"host {NODE}: kubelet 1.36: pods can use 4 of 8 CPUs; reservedSystemCPUs 0-1,4-5 "
        "(the housekeeping CPUs of 2 NUMA node(s))"
    ]
    write = site.result("Write the kubelet drop-in, or leave it for the kubelet restart", NODE)
    assert write["restart_required"] is True, write  # the kubelet runs (policy none): pending until the rollout
    assert report_status(site) == "pending"  # the fleet report: a reboot to come
    rolled = run(guest, "playbooks/reboot.yml", tmp_path, inv, "reboot")
    booted = kernel(guest)
    assert booted["args"]["isolcpus"] == "managed_irq,2-3,6-7" and booted["nohz_full"] == KUBELETS, booted
    # The rollout removed the state of policy none before the kubelet's first start with static: the
    # kubelet refuses a checkpoint of another policy, or of other CPUs, and asks for a drain.
    assert_state_accepted(guest)
    # The rollout verified the node after its boot: the housekeeper kept every kernel thread that may move
    # off the isolated set (issue 41).
    after = rolled.result(VERIFY, NODE)
    assert movable_kthreads(after) == [], after["kthreads"]
    state = kg.cpu_manager_state(guest)
    assert (state["policyName"], cpus(state["defaultCpuSet"])) == ("static", KUBELETS), state
    dropin = yaml.safe_load(guest.ssh("cat /etc/kubernetes/kubelet.conf.d/50-cpupools.conf"))
    assert dropin["reservedSystemCPUs"] == "0-1,4-5" and dropin["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert kg.node_ready(kube.get(f"/api/v1/nodes/{NODE}"))
    assert not (kube.get(f"/api/v1/nodes/{NODE}").get("spec") or {}).get("unschedulable")

    # 3. Pods.
    rs = kg.owner(kube, NS, "latency-app")
    g = kg.create(kube, NS, kg.pod("guaranteed-1", kg.guaranteed(2), rs))
    b = kg.create(kube, NS, kg.pod("burstable-1", kg.burstable(), rs))
    for made in (g, b):
        kg.wait_running(kube, NS, made["metadata"]["name"], guest)
    held = cpus(kg.cpus_inside(guest, NS, "guaranteed-1", g["metadata"]["uid"]))
    state = kg.cpu_manager_state(guest)
    assert cpus(state["entries"][g["metadata"]["uid"]]["app"]) == held, state
    assert len(held) == 2 and whole_cores(held), held  # full-pcpus-only: one whole core
    assert held <= KUBELETS and held <= booted["isolcpus"] and held <= booted["nohz_full"], (held, booted)
    assert not held & RESERVED
    shared = cpus(kg.cpus_inside(guest, NS, "burstable-1", b["metadata"]["uid"]))
    assert shared == KUBELETS - held == cpus(state["defaultCpuSet"]), (shared, state)  # strict: no reserved CPU
    host_side = [
        p for p in kg.processes(guest) if p["cgroup"].startswith(("/system.slice", "/init.scope", "/user.slice"))
    ]
    assert {"kubelet", "containerd", "systemd", "sshd"} <= {p["comm"] for p in host_side}, host_side
    strays = [p for p in host_side if not cpus(p["allowed"]) <= RESERVED]
    assert strays == [], strays  # the kubelet, containerd and every service on the housekeeping CPUs only

    # With oslat, briefly (under emulation the figures prove the pipeline, not the hardware): the
    # exclusive CPUs no pod holds and one housekeeping CPU are measured, the pod's CPUs left alone.
    checked = run(guest, "playbooks/verify.yml", tmp_path, inv, "verify", CMK_VERIFY_VARS)
    result = checked.result(VERIFY, NODE)
    holder = f"kubelet {g['metadata']['uid']}/app"
    assert {result["per_cpu"][str(cpu)]["held_by"] for cpu in held} == {holder}, result["per_cpu"]
    assert result["ok"], json.dumps(result["findings"])[:4000]
    # The housekeeper (issue 41) ran at this boot on the real systemd and kernel, and its pass left no
    # kernel thread that may move allowed on an isolated CPU (kswapd0 last ran on an exclusive CPU on
    # one boot in three before it; an IRQ's thread follows its IRQ, which the irq check judges).
    housekeeper = guest.ssh(
        "systemctl show -p Result -p ExecMainStatus cpupools-housekeep.service; "
        "systemctl is-enabled cpupools-housekeep.service cpupools-housekeep.timer; "
        "journalctl -b -u cpupools-housekeep.service --no-pager -o cat"
    )
    assert "Result=success" in housekeeper and "ExecMainStatus=0" in housekeeper, housekeeper
    assert "disabled" not in housekeeper and "cmk housekeep: " in housekeeper, housekeeper
    assert movable_kthreads(result) == [], result["kthreads"]
    latency = result["latency"]
    measured = {int(cpu) for cpu in latency["cpus"]}
    assert latency["skipped"] is None and latency["ok"] and cpus(latency["left_out"]) == held, latency
    assert measured - RESERVED == KUBELETS - held and len(measured & RESERVED) == 1, latency
    for cpu, figures in latency["cpus"].items():
        assert 0 <= figures["min_us"] <= figures["p99_us"] <= figures["max_us"], (cpu, figures)
    # A stray: a host process pinned onto the pod's CPUs, waking up now and then.
    script = "#!/bin/sh\nwhile :; do sleep 1; done\n"
    guest.ssh(
        f"printf '{script}' >/usr/local/bin/cpupools-stray && chmod 755 /usr/local/bin/cpupools-stray && "
        f"setsid -f taskset -c {format_cpulist(held)} /usr/local/bin/cpupools-stray </dev/null >/dev/null 2>&1"
    )
    stray_pid = int(guest.ssh("sleep 1; pgrep -x cpupools-stray").split()[0])
    caught = run(guest, "playbooks/verify.yml", tmp_path, inv, "verify_stray", ok=False)
    guest.ssh("pkill -x cpupools-stray")
    assert caught.rc != 0
    assert f"pid {stray_pid} (cpupools-stray) is pinned to exclusive CPU {format_cpulist(held)}" in caught.messages()

    # 4. By hand (CPUPOOLS_GUEST_ALL=1): a change of the pool sizes, rolled out (a second reboot). Then a
    #    second site.yml with the pods running changes nothing on the node, and the fleet report that
    #    showed the node pending its reboot shows it ok (rendered anew: rebooted and verified).
    sizes = {}
    if ALL_STEPS:
        sizes, inv = RESIZED, resize(guest, kube, tmp_path, rs)
    again = run(guest, "site.yml", tmp_path, inv, "site_again")
    assert node_changes(again) == [], node_changes(again)
    assert report_status(again) == "ok"

    # 5 and 6, by hand (CPUPOOLS_GUEST_ALL=1, with step 4's resize): out of CI since 2026-12-01 (docs/guest.md,
    #    "What it costs"): a refused drop-in, uninstall.yml, then cmk on the same cluster and guest.
    if ALL_STEPS:
        refused_then_uninstalled(guest, kube, tmp_path, inv, sizes)
        cmk_on_the_same_cluster(guest, kube, tmp_path, booted)

    with capsys.disabled():
        print("\nreal-kubelet guest, seconds: " + json.dumps({k: round(v) for k, v in guest.timings.items()}))


def refused_then_uninstalled(guest: Guest, kube: RealKube, tmp_path: Path, inv: str, sizes: dict) -> None:
    """Step 5, by hand: a drop-in the kubelet refuses, rolled out over a fleet, stops the rollout at this node;
    uninstall.yml brings the kubelet back (policy none, Ready) and leaves no cpupools unit."""
    bystander = tmp_path / "bystander"
    write_tree(str(bystander), CORPUS["1s8c-smt2"])
    kube.add_node("bystander")
    subprocess.run([*FAKE_KUBELET, "start", str(bystander)], check=True)
    try:
        stale = refused(guest, kube, tmp_path, bystander, sizes)
    finally:
        subprocess.run([*FAKE_KUBELET, "stop", str(bystander)], check=True)
    undone = run(guest, "playbooks/uninstall.yml", tmp_path, inv, "uninstall", None, "--limit", NODE)
    assert undone.rc == 0
    kg.wait_ready(kube, 600, since=stale, guest=guest)  # systemd's next start of the kubelet reads no drop-in
    assert guest.ssh("systemctl is-active kubelet").strip() == "active"
    assert kg.cpu_manager_state(guest)["policyName"] == "none"
    assert guest.ssh("ls /etc/kubernetes/kubelet.conf.d/ /etc/systemd/system.conf.d/ 2>/dev/null").split() == [
        "/etc/kubernetes/kubelet.conf.d/:",
        "/etc/systemd/system.conf.d/:",
    ]
    # Uninstalled on a real systemd: none of cpupools' units is left, loaded or on disk (the housekeeper's).
    left = guest.ssh("systemctl list-units --all --no-legend 'cpupools*'; ls /etc/systemd/system | grep cpupools || :")
    assert left.strip() == "", left


def cmk_on_the_same_cluster(guest: Guest, kube: RealKube, tmp_path: Path, booted: dict) -> None:
    """Step 6, by hand: the same cluster, cpupools_runtime: cmk, on the kernel step 2 booted."""
    # site.yml writes cmk's kernel arguments and its pool state; a pod completed by the pod injection policy
    # runs cmk isolate on the kernel step 2 booted (cmk hands out its pools' CPUs whatever the kernel isolated;
    # cmk's own arguments booted and verified with oslat are tests/guest/test_real_kernel.py's, by hand).
    cmk_inv = write_inventory(
        tmp_path, kube, {NODE: host_vars(guest)}, cpupools_runtime="cmk", cpupools_num_shared_cores=1
    )
    site = run(guest, "site.yml", tmp_path, cmk_inv, "site_cmk")
    plan = site.result("Plan the CPU pools", NODE)["plan"]
    assert site.result("Write the kernel arguments into the boot loader configuration", NODE)["args"] == CMK_ARGS
    assert report_status(site) == "pending"

    workload = f"{kg.SHOW_CPUS}; env; exec sleep 1000000"
    isolate = ["/opt/bin/cmk", "isolate", "--pool=exclusive", "--", "sh", "-c", workload]
    asks = {"requests": {"cmk.intel.com/exclusive-cores": "1"}, "limits": {"cmk.intel.com/exclusive-cores": "1"}}
    made = kg.create(kube, NS, kg.pod("cmk-1", asks, kg.owner(kube, NS, "cmk-app"), command=isolate))
    spec = made["spec"]
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} >= {"/opt/bin", "/etc/cmk", "/proc"}
    assert {"name": "CMK_PROC_FS", "value": "/host/proc"} in spec["containers"][0]["env"], spec
    kg.wait_running(kube, NS, "cmk-1", guest)
    printed = kg.container_log(guest, NS, "cmk-1", made["metadata"]["uid"])
    env = dict(line.split("=", 1) for line in printed.splitlines() if line.startswith("CMK_"))
    mine = cpus(kg.cpus_inside(guest, NS, "cmk-1", made["metadata"]["uid"]))
    assert mine == cpus(env["CMK_CPUS_ASSIGNED"]), (mine, env)
    # isolcpus without domain (step 2's kernel) leaves /sys/devices/system/cpu/isolated empty: the command line says.
    assert mine == cpus(plan["pool_cpus"]["exclusive"]), (mine, plan["pool_cpus"])
    assert mine <= booted["isolcpus"] and mine <= booted["nohz_full"], (mine, booted)


def resize(guest: Guest, kube: RealKube, tmp_path: Path, rs: dict) -> str:
    """Step 4, by hand: the pods are evicted, the kubelet comes up, the pod runs again. Returns the inventory."""
    resized = write_inventory(tmp_path, kube, {NODE: host_vars(guest)}, **RESIZED)
    site = run(guest, "site.yml", tmp_path, resized, "site_resized")
    assert report_status(site) == "pending"  # the fleet report: a reboot to come
    assert site.result(PODS_CAN_USE, NODE)["msg"] == [
        f"host {NODE}: kubelet 1.36: pods can use 6 of 8 CPUs; reservedSystemCPUs 0-1 "
        "(the housekeeping CPUs of 2 NUMA node(s))"
    ]
    rolled = run(guest, "playbooks/reboot.yml", tmp_path, resized, "reboot_resized")
    # The rollout verified the node after its second boot: the housekeeper kept the kernel threads off the
    # new isolated set too (issue 41: none that may move, after each boot).
    after = rolled.result(VERIFY, NODE)
    assert movable_kthreads(after) == [], after["kthreads"]
    for name in ("guaranteed-1", "burstable-1"):
        kg.wait_gone(kube, NS, name, timeout=30)  # evicted by the drain, before the reboot
    booted = kernel(guest)
    new_set = {2, 3, 4, 5, 6, 7}
    assert booted["args"]["isolcpus"] == "managed_irq,2-7" and booted["nohz_full"] == new_set, booted
    assert_state_accepted(guest)
    g = kg.create(kube, NS, kg.pod("guaranteed-2", kg.guaranteed(2), rs))
    kg.wait_running(kube, NS, "guaranteed-2", guest)
    held = cpus(kg.cpus_inside(guest, NS, "guaranteed-2", g["metadata"]["uid"]))
    assert len(held) == 2 and whole_cores(held) and held <= new_set and held <= booted["nohz_full"], held
    services = [p for p in kg.processes(guest) if p["comm"] in ("kubelet", "containerd", "systemd")]
    assert {p["comm"] for p in services} == {"kubelet", "containerd", "systemd"}, services
    assert all(cpus(p["allowed"]) <= {0, 1} for p in services), "CPUAffinity follows the resize"
    return resized


def refused(guest: Guest, kube: RealKube, tmp_path: Path, bystander: Path, sizes: dict) -> str:
    """Step 5: the guest first, then a sandbox node whose fake kubelet waits for the same change.

    Returns the Ready heartbeat the Node still shows from the kubelet that ran before.
    """
    guest.ssh(f"printf '{OPERATORS_GATE}' >>/etc/kubernetes/kubelet.yaml")
    sandbox = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "cpupools_root": str(bystander),
        "cpupools_kernel_args_backend": "grub",
        "cpupools_reboot_simulate_command": FAKE_BOOT,
        "cpupools_kubelet_simulate_command": FAKE_KUBELET,
    }
    # The guest keeps its sizes (step 4's, by hand, as host vars: the bystander has one NUMA node); the
    # fleet's change is the kubelet's alone, a restart and no reboot.
    fleet = write_inventory(
        tmp_path,
        kube,
        {NODE: {**host_vars(guest), **sizes}, "bystander": sandbox},
        cpupools_kubelet_topology_policy="single-numa-node",
    )
    site = run(guest, "site.yml", tmp_path, fleet, "site_fleet")
    for host in (NODE, "bystander"):
        assert site.result("Write the kubelet drop-in, or leave it for the kubelet restart", host)["restart_required"]
    mark = kube.audit_mark()
    log = (bystander / "var/log/fake-kubelet.log").read_text()
    roll = run(guest, "playbooks/reboot.yml", tmp_path, fleet, "reboot_refused", ok=False)
    assert roll.rc != 0
    said = roll.messages()
    assert f"host {NODE}: cpupools_runtime: the kubelet (kubelet) exited" in said, said
    assert (
        "the kubelet says: failed to run Kubelet: new static policy error: CPU Manager Policy Beta-level Options "
        'not enabled, but option "distribute-cpus-across-numa" provided. The node stays cordoned' in said
    ), said
    assert (kube.get(f"/api/v1/nodes/{NODE}").get("spec") or {}).get("unschedulable") is True
    touched = [e for e in kube.audit_writes(mark, PRODUCT_USER) if "bystander" in e.get("requestURI", "")]
    assert touched == [], touched
    assert (bystander / "var/log/fake-kubelet.log").read_text() == log  # neither stopped nor started
    return kg.ready_heartbeat(kube.get(f"/api/v1/nodes/{NODE}"))
