"""verify: each check on a /proc and /sys tree laid out as a running kernel lays them out, oslat's real output.

The tree (tests/fixtures/procfs.py) is a 6-CPU node: CPUs 0-1 housekeeping, 2
shared, 3-5 exclusive, 2-5 isolated; a quiet baseline (``quiet_kernel``), then
one fault per test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cpupools.core.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from cpupools.core.errors import VerifyError
from cpupools.verify.gather import parse_interrupts
from cpupools.verify.latency import latency_cpus, parse_oslat_json, parse_oslat_text, percentile
from cpupools.verify.run import verify
from helpers import REPO
from procfs import (
    EXPECTED,
    KTHREAD_FLAGS,
    PLAN,
    Irq,
    Kernel,
    Task,
    interrupts_text,
    quiet_kernel,
    write,
    write_cmk_state,
    write_dump,
    write_kernel,
)

OSLAT = REPO / "tests" / "fixtures" / "verify"
WORKQUEUE = Path("/sys/devices/virtual/workqueue/cpumask")


def run_verify(tmp_path: Path, kernel: Kernel, cmk: dict | None = None, **kw) -> dict:
    root = write_kernel(tmp_path / "node", kernel)
    write_cmk_state(root, cmk if cmk is not None else {"3": "100", "4": "", "5": ""})
    kw.setdefault("pause", lambda: None)
    return verify(facts_root=str(root), root=str(root), plan=kw.pop("plan", PLAN), expected_args=EXPECTED, **kw)


def by_check(result: dict, check: str, severity: str | None = None) -> list[dict]:
    return [f for f in result["findings"] if f["check"] == check and severity in (None, f["severity"])]


def test_a_quiet_node_passes(tmp_path):
    result = run_verify(tmp_path, quiet_kernel())
    assert result["ok"] is True, result["findings"]
    assert [f for f in result["findings"] if f["severity"] != "info"] == []
    assert result["per_cpu"]["3"]["held_by"] == "cmk pid 100"
    assert result["per_cpu"]["3"]["role"] == "exclusive" and result["per_cpu"]["2"]["role"] == "shared"
    assert all(row["quiet"] for row in result["per_cpu"].values())
    assert result["workqueue"] == {
        "cpumask": "0-1",
        "isolated_in_mask": "",
        "ok": True,
        "workqueues": {"blkcg_punt_bio": "0-1", "writeback": "0-1"},
    }
    assert result["rcu"]["offloaded"] == "2-5" and result["rcu"]["ok"]
    assert result["nohz"]["active"] == "2-5" and result["nohz"]["ok"]
    assert result["cmk"]["held"] == [{"pool": "exclusive", "cpus": "3", "pids": [100], "running_on": "3"}]
    assert result["kernel"]["release"] == "6.1.0-28-amd64"
    json.dumps(result)  # what the report and metrics read


def test_each_checked_cpus_governor_and_deepest_idle_state_are_shown(tmp_path):
    """What a tuned node's CPUs may do (issue 41): read back per CPU, the drivers in the result."""
    from sysfs import POWER, _write_power

    root = write_kernel(tmp_path / "node", quiet_kernel())
    _write_power(str(root), POWER["intel"], range(6), 1)
    for state in (2, 3):  # C1E and C6 disabled on CPU 3
        (root / f"sys/devices/system/cpu/cpu3/cpuidle/state{state}/disable").write_text("1\n")
    (root / "sys/devices/system/cpu/cpufreq/policy3/scaling_governor").write_text("performance\n")
    write_cmk_state(root, {"3": "100", "4": "", "5": ""})
    result = verify(facts_root=str(root), root=str(root), plan=PLAN, expected_args=EXPECTED, pause=lambda: None)
    assert result["power"] == {
        "cpufreq": "intel_pstate",
        "mode": "active",
        "turbo": True,
        "cpuidle": "intel_idle",
        "uncore": "intel_uncore_frequency",
    }
    assert result["per_cpu"]["3"]["power"] == {
        "governor": "performance",
        "scaling_min_khz": 800000,
        "scaling_max_khz": 3800000,
        "deepest": "C1",
        "disabled": ["C1E", "C6"],
    }
    assert result["per_cpu"]["4"]["power"]["deepest"] == "C6"
    assert result["per_cpu"]["4"]["power"]["governor"] == "powersave"
    # A node without the drivers (the fixture of the other tests): nothing to show, no failure.
    bare = run_verify(tmp_path / "bare", quiet_kernel())
    assert bare["per_cpu"]["3"]["power"] is None and bare["power"]["cpuidle"] is None


def test_managed_irq_on_an_isolated_cpu_is_info(tmp_path):
    result = run_verify(tmp_path, quiet_kernel())
    (irq,) = result["irqs"]
    assert irq == {
        "irq": "36",
        "name": "virtio1-req.0",
        "effective": "3",
        "affinity": "3",
        "managed": True,
        "managed_how": "debugfs",
    }
    (finding,) = by_check(result, "irq")
    assert finding["severity"] == "info" and "managed (debugfs)" in finding["message"]
    assert "1 IRQ kept on isolated CPUs by the kernel (managed)" in result["summary"]


def test_unmanaged_irq_on_an_isolated_cpu_fails(tmp_path):
    kernel = quiet_kernel()
    kernel.irqs.append(Irq(40, "virtio3-tx", [0, 1, 2, 3, 4, 5], [4], managed=False))
    # No effective_affinity_list (older chips): smp_affinity_list stands in.
    kernel.irqs.append(Irq(41, "eth0", [5], None, managed=False, chip="IO-APIC", hwirq="11-fasteoi"))
    root = write_kernel(tmp_path / "node", kernel)
    # An IRQ without a handler (no action directory, no /proc/interrupts row) never fires.
    write(root, "proc/irq/9/smp_affinity_list", "0-5\n")
    write(root, "proc/irq/9/effective_affinity_list", "2\n")
    result = run_verify(tmp_path, kernel)
    assert result["ok"] is False
    fails = by_check(result, "irq", "fail")
    assert [f["cpus"] for f in fails] == ["4", "5"]  # not IRQ 9, which has no handler
    assert [irq["irq"] for irq in result["irqs"]] == ["36", "40", "41"]
    assert fails[0]["message"] == "IRQ 40 (virtio3-tx) is effective on isolated CPU 4 (affinity 0-5); not managed"
    assert result["per_cpu"]["4"]["quiet"] is False and "IRQ 40 virtio3-tx" in result["per_cpu"]["4"]["found"]
    assert result["per_cpu"]["3"]["quiet"] is True  # the managed one stays info
    # fail_on without irq: still listed, no longer fails the node.
    assert run_verify(tmp_path / "again", kernel, fail_on=["workqueue"])["ok"] is True


def test_managed_irq_with_a_housekeeping_cpu_in_its_mask_warns_under_managed_irq(tmp_path):
    kernel = quiet_kernel()
    kernel.irqs.append(Irq(38, "nvme0q2", [1, 4], [4], managed=True))
    result = run_verify(tmp_path, kernel)
    (warn,) = by_check(result, "irq", "warn")
    assert warn["cpus"] == "4" and "isolcpus=managed_irq should keep it there" in warn["message"]
    # Without the managed_irq flag the kernel may keep it there: info.
    kernel.cmdline = kernel.cmdline.replace("managed_irq,domain,", "domain,")
    assert by_check(run_verify(tmp_path / "again", kernel), "irq", "warn") == []


def test_managed_is_inferred_without_debugfs(tmp_path):
    kernel = quiet_kernel()
    kernel.debugfs = False
    kernel.irqs.append(Irq(40, "serial", [0, 1, 2, 3, 4, 5], [5], chip="IO-APIC", hwirq="3-edge"))
    # virtio-net's queue vectors: one CPU each by the driver's hint, not managed by the kernel.
    kernel.irqs.append(Irq(42, "virtio2-input.1", [4], [4], hint=[4]))
    result = run_verify(tmp_path, kernel)
    irqs = {irq["irq"]: irq for irq in result["irqs"]}
    assert irqs["36"]["managed"] is True and irqs["36"]["managed_how"] == "per-queue vector (inferred)"
    assert irqs["40"]["managed"] is None and irqs["42"]["managed"] is None
    (info,) = by_check(result, "irq", "info")
    assert "managed (inferred: no debugfs)" in info["message"]
    fails = by_check(result, "irq", "fail")
    assert [f["cpus"] for f in fails] == ["4", "5"]
    assert all("not known to be managed" in f["message"] for f in fails)


def test_device_interrupts_that_fire_on_an_isolated_cpu(tmp_path):
    kernel = quiet_kernel()
    root = tmp_path / "node"

    def later():
        kernel.irqs[1].counts[3] += 7
        kernel.per_cpu_rows["LOC"][3] += 100
        kernel.per_cpu_rows["LOC"][0] += 1000
        write(root, "proc/interrupts", interrupts_text(kernel))

    result = run_verify(tmp_path, kernel, pause=later)
    assert result["interrupts"]["grown"] == {"3": {"IRQ 36 virtio1-req.0": 7, "LOC": 100}}
    (warn,) = by_check(result, "irq", "warn")
    assert warn["cpus"] == "3" and "IRQ 36 virtio1-req.0 +7" in warn["message"]
    assert {"IRQ 36 virtio1-req.0 +7", "LOC +100"} <= set(result["per_cpu"]["3"]["found"])
    assert result["ok"] is True  # a warning, not a failure


def test_parse_interrupts_of_this_machine():
    with open("/proc/interrupts", encoding="ascii") as handle:
        text = handle.read()
    cpus, rows = parse_interrupts(text)
    assert cpus == list(range(len(cpus))) and cpus
    assert "LOC" in rows and set(rows["LOC"]["counts"]) == set(cpus) and not rows["LOC"]["device"]
    numbered = [row for key, row in rows.items() if key.isdigit()]
    assert numbered and all(row["device"] for row in numbered)
    for key, row in rows.items():
        if key.isdigit() and os.path.isdir(f"/proc/irq/{key}"):
            dirs = sorted(e for e in os.listdir(f"/proc/irq/{key}") if os.path.isdir(f"/proc/irq/{key}/{e}"))
            if dirs:
                assert sorted(row["name"].split(", ")) == dirs, key


def test_this_machines_proc_and_sys(tmp_path):
    """The real /proc and /sys of the machine the tests run on, read as a node whose last CPU is isolated."""
    last = (os.cpu_count() or 1) - 1
    if last == 0:
        pytest.skip("one CPU: nothing to isolate")
    plan = {
        "isolated_cpus": str(last),
        "housekeeping_cpus": f"0-{last - 1}",
        "pool_cpus": {"infra": f"0-{last - 1}", "exclusive": str(last)},
        "exclusive_pools": ["exclusive"],
        "runtime": "cmk",
    }
    result = verify(facts_root="/", root=str(tmp_path), plan=plan, pause=lambda: None)
    json.dumps(result)
    assert result["kernel"]["release"] == os.uname().release
    for irq in result["irqs"]:  # exactly the IRQs with a handler delivered to the isolated CPU
        assert last in parse_cpulist(irq["effective"]) and irq["name"]
    listed = {irq["irq"] for irq in result["irqs"]}
    for number in filter(str.isdigit, os.listdir("/proc/irq")):
        effective = Path(f"/proc/irq/{number}/effective_affinity_list")
        handled = any(Path(f"/proc/irq/{number}", e).is_dir() for e in os.listdir(f"/proc/irq/{number}"))
        if effective.exists() and handled and last in parse_cpulist(effective.read_text()):
            assert number in listed
    for stray in result["processes"]:
        assert stray["cpu"] == last and stray["why"] == f"ran on exclusive CPU {last}, not held"
    assert set(result["per_cpu"]) == {str(last)}
    if WORKQUEUE.exists():
        assert result["workqueue"]["cpumask"] == format_cpulist(parse_cpumask(WORKQUEUE.read_text()))
    idle = Path(f"/sys/devices/system/cpu/cpu{last}/cpuidle")
    if idle.is_dir():  # its deepest enabled idle state, as the kernel lists them
        states = [idle / name for name in os.listdir(idle) if name.startswith("state")]
        enabled = [s for s in states if (s / "disable").read_text().strip() == "0"]
        deepest = max(enabled, key=lambda s: (int((s / "latency").read_text()), int(s.name[5:])))
        assert result["per_cpu"][str(last)]["power"]["deepest"] == (deepest / "name").read_text().strip()


def test_parse_interrupts_arm64_row():
    text = "           CPU0       CPU1\n 11:      12345       6789     GICv3  27 Level     arch_timer\n"
    _, rows = parse_interrupts(text)
    assert rows["11"] == {"counts": {0: 12345, 1: 6789}, "name": "arch_timer", "device": True}


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("3", [0, 1]), ("3f\n", [0, 1, 2, 3, 4, 5]), ("00000000,000000f0", [4, 5, 6, 7]), ("1,00000001", [0, 32])],
)
def test_parse_cpumask(text, cpus):
    assert parse_cpumask(text) == cpus


def test_unbound_workqueue_mask_on_isolated_cpus_fails(tmp_path):
    kernel = quiet_kernel()
    kernel.workqueue = [0, 1, 2, 3, 4, 5]
    result = run_verify(tmp_path, kernel)
    assert result["ok"] is False and result["workqueue"]["isolated_in_mask"] == "2-5"
    fails = by_check(result, "workqueue", "fail")
    assert fails[0]["message"] == "unbound workqueues may run on isolated CPU 2-5: workqueue cpumask is 0-5"
    assert result["workqueue"]["ok"] is False


def test_a_workqueue_of_its_own_on_isolated_cpus(tmp_path):
    kernel = quiet_kernel()
    kernel.workqueue = [0, 1, 4]
    kernel.workqueues["writeback"] = [3, 4]
    result = run_verify(tmp_path, kernel)
    messages = [f["message"] for f in by_check(result, "workqueue", "fail")]
    assert any(m.startswith("workqueue writeback may run on isolated CPU 4:") for m in messages)
    # Where the unbound mask keeps it off, the kernel does: info only.
    kernel.workqueue = [0, 1]
    again = run_verify(tmp_path / "again", kernel)
    assert by_check(again, "workqueue", "fail") == []
    assert "the unbound mask 0-1 keeps it off them" in by_check(again, "workqueue", "info")[0]["message"]


def test_a_per_node_kernel_thread_on_an_isolated_cpu_is_a_warning_that_says_how_to_move_it(tmp_path):
    # What the Debian guest's 6.1 kernel showed (docs/verify.md): kswapd0 bound by the kernel to its
    # NUMA node's CPUs, isolated ones included, last ran on one. A thread whose mask is not a node's fails.
    kernel = quiet_kernel()
    kernel.tasks.append(Task(92, "kswapd0", [0, 1, 2], 2, ppid=2, flags=KTHREAD_FLAGS))
    kernel.tasks.append(Task(93, "kworker/u12:7", [0, 1, 2, 3], 3, ppid=2, flags=KTHREAD_FLAGS))
    root = tmp_path / "node"
    for node, cpus in (("node0", "0-2"), ("node1", "3-5")):
        (root / "sys/devices/system/node" / node).mkdir(parents=True)
        (root / "sys/devices/system/node" / node / "cpulist").write_text(cpus + "\n")
    result = run_verify(tmp_path, kernel)
    (warn,) = by_check(result, "kthread", "warn")
    assert warn["cpus"] == "2"
    assert warn["message"] == (
        "kernel thread 92 (kswapd0) last ran on isolated CPU 2 (allowed 0-2): the kernel binds it to its NUMA "
        "node's CPUs, isolated ones included, and wake-ups keep it where it last ran; the housekeeper "
        "(cpupools_housekeep, cmk housekeep) moves it at boot and every interval, or by hand: taskset -pc 0-1 92"
    )
    (fail,) = by_check(result, "kthread", "fail")
    assert fail["message"] == "kernel thread 93 (kworker/u12:7) last ran on isolated CPU 3 (allowed 0-3)"
    assert result["per_cpu"]["2"]["quiet"] is False  # a warning: not quiet, but the node is not failed for it


def test_kernel_threads_that_could_move(tmp_path):
    kernel = quiet_kernel()
    kernel.tasks.append(Task(46, "kcompactd0", [0, 1, 2, 3, 4, 5], 4, ppid=2, flags=KTHREAD_FLAGS))
    kernel.tasks.append(Task(47, "khugepaged", [0, 1, 2, 3, 4, 5], 0, ppid=2, flags=KTHREAD_FLAGS))
    kernel.tasks.append(Task(48, "kauditd", [0, 1, 5], 1, ppid=2, flags=KTHREAD_FLAGS))
    result = run_verify(tmp_path, kernel)
    assert result["kthreads"] == [
        {"pid": 46, "comm": "kcompactd0", "allowed": "0-5", "cpu": 4},
        {"pid": 47, "comm": "khugepaged", "allowed": "0-5", "cpu": 0},
        {"pid": 48, "comm": "kauditd", "allowed": "0-1,5", "cpu": 1},
    ]
    assert "kernel thread 46 (kcompactd0)" in result["per_cpu"]["4"]["found"]
    (fail,) = by_check(result, "kthread", "fail")
    assert fail["cpus"] == "4"
    assert fail["message"] == "kernel thread 46 (kcompactd0) last ran on isolated CPU 4 (allowed 0-5)"
    # The others have not run there, and isolcpus=domain keeps the scheduler from moving them there.
    (info,) = by_check(result, "kthread", "info")
    assert info["cpus"] == "2-5" and info["message"].startswith(
        "2 kernel threads allowed on isolated CPU 2-5 may be moved there (khugepaged, kauditd); "
        "the scheduler keeps them off"
    )
    assert by_check(result, "kthread", "warn") == []
    # Per-CPU kthreads (ksoftirqd/3, cpuhp/4) are never listed, nor counted as strays.
    assert result["processes"] == []
    # CPUs 4-5 only tickless, not out of the scheduler's domains: it may put them there.
    kernel.isolated = "2-3"
    again = run_verify(tmp_path / "again", kernel)
    (warn,) = by_check(again, "kthread", "warn")
    assert warn["cpus"] == "2-5" and "khugepaged, kauditd" in warn["message"]
    assert again["per_cpu"]["5"]["quiet"] is False


def test_rcu_offload_that_differs_from_rcu_nocbs(tmp_path):
    kernel = quiet_kernel()
    kernel.tasks = [t for t in kernel.tasks if t.comm not in ("rcuop/4", "rcuop/5")]
    kernel.tasks.append(Task(90, "rcuop/0", [0, 1], 0, ppid=2, flags=KTHREAD_FLAGS))
    kernel.tasks = [t for t in kernel.tasks if t.comm != "rcuog/2"]
    kernel.tasks.append(Task(80, "rcuog/2", [0, 1, 2, 3, 4, 5], 3, ppid=2, flags=KTHREAD_FLAGS))
    result = run_verify(tmp_path, kernel)
    assert result["rcu"]["offloaded"] == "0,2-3" and result["rcu"]["expected"] == "2-5"
    assert result["rcu"]["offloaded_from"] == "rcuo threads"
    fails = by_check(result, "rcu", "fail")
    assert [f["cpus"] for f in fails] == ["0,4-5", "3"]
    assert "not offloaded: CPU 4-5" in fails[0]["message"] and "without a plan: CPU 0" in fails[0]["message"]
    assert fails[1]["message"] == "RCU offload thread 80 (rcuog/2) last ran on isolated CPU 3 (allowed 0-5)"
    assert result["rcu"]["threads_on_isolated"] == [{"pid": 80, "comm": "rcuog/2", "allowed": "0-5", "cpu": 3}]
    assert by_check(result, "kthread") == []  # rcuo threads are the rcu check's


def test_rcu_threads_on_every_cpu(tmp_path):
    """Linux >= 5.17 starts rcuop/N on every possible CPU when rcu_nocbs= is given (the Debian 6.1
    guest shows rcuop/0-7 with rcu_nocbs=2-3): offload is read from the running command line."""
    kernel = quiet_kernel()
    kernel.tasks += [Task(70 + c, f"rcuop/{c}", [0, 1], 1, ppid=2, flags=KTHREAD_FLAGS) for c in (0, 1)]
    result = run_verify(tmp_path, kernel)
    assert result["rcu"]["threads"] == "0-5" and result["rcu"]["offloaded"] == "2-5"
    assert result["rcu"]["offloaded_from"].startswith("command line") and result["rcu"]["ok"]
    kernel.cmdline = kernel.cmdline.replace("rcu_nocbs=2-5", "rcu_nocbs=2-3").replace("nohz_full=2-5", "nohz_full=2")
    (fail,) = by_check(run_verify(tmp_path / "again", kernel), "rcu", "fail")
    assert fail["cpus"] == "4-5" and "read from the command line" in fail["message"]


def test_rcu_not_planned(tmp_path):
    root = write_kernel(tmp_path / "node", quiet_kernel())
    write_cmk_state(root, {"3": "100"})
    result = verify(facts_root=str(root), root=str(root), plan=PLAN, expected_args={}, pause=lambda: None)
    assert result["rcu"]["expected"] is None and result["nohz"]["expected"] is None
    assert any("rcu_nocbs is not planned" in f["message"] for f in by_check(result, "rcu", "info"))
    assert result["ok"] is True


def test_nohz_and_isolated_that_differ_from_the_plan(tmp_path):
    kernel = quiet_kernel()
    kernel.nohz_full = "2-4"
    kernel.isolated = "2-3"
    result = run_verify(tmp_path, kernel)
    fails = by_check(result, "nohz", "fail")
    assert [f["cpus"] for f in fails] == ["4-5", "5"]
    assert "tick is stopped on CPU 2-4 (nohz_full), planned 2-5" in fails[1]["message"]
    assert "isolates CPU 2-3" in fails[0]["message"]
    assert result["nohz"]["ok"] is False
    # A kernel that prints (null): no nohz_full at all.
    kernel.nohz_full, kernel.isolated = "(null)", "2-5"
    again = run_verify(tmp_path / "again", kernel)
    assert again["nohz"]["active"] == "" and by_check(again, "nohz", "fail")[0]["cpus"] == "2-5"


def test_a_stray_process_on_an_exclusive_cpu(tmp_path):
    kernel = quiet_kernel()
    kernel.tasks.append(Task(812, "sshd", [0, 1, 2, 3, 4, 5], 4, ppid=1))
    # A thread of a housekeeping process that ran on CPU 5.
    kernel.tasks.append(
        Task(900, "java", [0, 1, 2, 3, 4, 5], 0, threads=[Task(901, "GC Thread#0", [0, 1, 2, 3, 4, 5], 5)])
    )
    result = run_verify(tmp_path, kernel)
    assert result["ok"] is False
    assert result["processes"] == [
        {"pid": 812, "comm": "sshd", "cpu": 4, "allowed": "0-5", "why": "ran on exclusive CPU 4, not held"},
        {
            "pid": 901,
            "comm": "GC Thread#0",
            "cpu": 5,
            "allowed": "0-5",
            "why": "ran on exclusive CPU 5, not held",
            "tgid": 900,
        },
    ]
    assert [f["cpus"] for f in by_check(result, "process", "fail")] == ["4", "5"]
    assert "pid 812 (sshd)" in result["per_cpu"]["4"]["found"]
    # The CMK-held workload, its child and its thread on CPU 3 are not strays.
    assert result["per_cpu"]["3"]["quiet"] is True


def test_what_cmk_holds_against_what_runs(tmp_path):
    kernel = quiet_kernel()
    kernel.tasks.append(Task(300, "dpdk-app", [5], 5, ppid=1))  # pinned to 5, CMK does not record it
    result = run_verify(tmp_path, kernel, cmk={"3": "100", "4": "999", "5": ""})  # pid 999 is dead
    assert result["cmk"]["stale"] == [{"pool": "exclusive", "cpus": "4", "pids": [999]}]
    assert result["cmk"]["unrecorded"] == [{"pid": 300, "tgid": 300, "comm": "dpdk-app", "allowed": "5", "cpu": 5}]
    assert "pid 300 (dpdk-app)" in result["per_cpu"]["5"]["found"]
    (stale,) = by_check(result, "cmk", "warn")
    assert stale["cpus"] == "4" and "pid 999, which no longer runs" in stale["message"]
    (unrecorded,) = by_check(result, "cmk", "fail")
    assert unrecorded["cpus"] == "5" and "does not give it" in unrecorded["message"]
    assert result["processes"] == []  # listed once, by the cmk check
    assert result["ok"] is False
    # The held CPU 3 is left out of the latency run, the stale one (4) is not.
    measured, _, _, left_out = latency_cpus("auto", [3, 4, 5], {3}, [0, 1], "auto")
    assert (measured, left_out) == ([1, 4, 5], [3])


def test_kubelet_assigned_cpus_count_as_held(tmp_path):
    kernel = quiet_kernel()
    kernel.tasks = [t for t in kernel.tasks if t.pid not in (100, 101)]
    kernel.tasks.append(Task(400, "app", [4], 4, ppid=1))  # exactly the container's set
    kernel.tasks.append(Task(401, "other", [4, 5], 5, ppid=1))  # not a set the kubelet assigned
    root = write_kernel(tmp_path / "node", kernel)
    state = {"policyName": "static", "defaultCpuSet": "0-2,5", "entries": {"pod-uid-1": {"app": "4"}}, "checksum": 1}
    write(root, "var/lib/kubelet/cpu_manager_state", json.dumps(state))
    plan = dict(PLAN, runtime="kubelet")
    result = verify(facts_root=str(root), root=str(root), plan=plan, expected_args=EXPECTED, pause=lambda: None)
    assert result["per_cpu"]["4"]["held_by"] == "kubelet pod-uid-1/app"
    assert [u["pid"] for u in result["cmk"]["unrecorded"]] == [401]
    assert "the kubelet's cpu_manager_state" in by_check(result, "cmk", "fail")[0]["message"]
    assert by_check(result, "process") == []


#: Real cgroups of pods under the kubelet's systemd driver (cgroup v2), as read in the Debian 13 guest.
GUARANTEED = "/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-d546c5007bfd.scope"
BURSTABLE = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-78a40b7a.scope"
UID_G = "e471fd5f-c4cc-4916-a5f3-040d78782731"
UID_B = "625e74d1-65fd-4938-b480-805c440a0691"


def kubelet_node(tmp_path, *tasks):
    """A kubelet node of PLAN's shape: the pod of UID_G holds CPU 4 (its container app), 3 and 5 are shared."""
    kernel = quiet_kernel()
    kernel.tasks = [t for t in kernel.tasks if t.pid not in (100, 101)] + list(tasks)
    root = write_kernel(tmp_path / "node", kernel)
    state = {"policyName": "static", "defaultCpuSet": "3,5", "entries": {UID_G: {"app": "4"}}, "checksum": 1}
    write(root, "var/lib/kubelet/cpu_manager_state", json.dumps(state))
    return verify(facts_root=str(root), root=str(root), plan=dict(PLAN, runtime="kubelet"), **VERIFY_ARGS)


VERIFY_ARGS = {"expected_args": EXPECTED, "pause": lambda: None}


def test_the_kubelet_pods_tasks_are_found_by_their_cgroup(tmp_path):
    under = lambda uid: uid.replace("-", "_")  # noqa: E731 -- the systemd driver's escaping
    result = kubelet_node(
        tmp_path,
        Task(400, "app", [4], 4, cgroup=GUARANTEED.format(u=under(UID_G))),
        Task(401, "burst", [3, 5], 5, cgroup=BURSTABLE.format(u=under(UID_B))),  # the kubelet's shared pool
    )
    assert result["per_cpu"]["4"]["held_by"] == f"kubelet {UID_G}/app"
    assert result["cmk"]["unrecorded"] == [] and result["processes"] == [], result["findings"]
    assert result["ok"], result["findings"]


def test_a_stray_pinned_onto_a_pods_cpus_is_named_though_its_mask_is_the_pods(tmp_path):
    """A process outside the pod, pinned (taskset) exactly onto the pod's CPU: not the holder."""
    result = kubelet_node(
        tmp_path,
        Task(400, "app", [4], 4, cgroup=GUARANTEED.format(u=UID_G.replace("-", "_"))),
        Task(402, "stray", [4], 4, cgroup="/system.slice/ssh.service"),
        Task(403, "daemon", [0, 1, 2, 3, 4, 5], 3, cgroup="/system.slice/cron.service"),  # off the housekeeping CPUs
    )
    assert [u["pid"] for u in result["cmk"]["unrecorded"]] == [402]
    (pinned,) = by_check(result, "cmk", "fail")
    assert "pid 402 (stray) is pinned to exclusive CPU 4" in pinned["message"]
    (ran,) = by_check(result, "process", "fail")
    assert "pid 403 (daemon) last ran on exclusive CPU 3" in ran["message"]
    assert result["ok"] is False


def test_bad_inputs_are_refused(tmp_path):
    root = write_kernel(tmp_path / "node", quiet_kernel())
    with pytest.raises(VerifyError, match="no isolated_cpus"):
        verify(facts_root=str(root), plan={})
    with pytest.raises(VerifyError, match="unknown check irqs"):
        verify(facts_root=str(root), plan=PLAN, fail_on=["irqs"])
    with pytest.raises(VerifyError, match=r"latency\.cpus"):
        verify(facts_root=str(root), plan=PLAN, latency={"enabled": True, "cpus": "4-2"}, pause=lambda: None)


def test_the_debian_guest_after_reboot(tmp_path):
    """What the real Debian 6.1 guest showed after site.yml and reboot.yml (tests/guest, H2's dump,
    tests/fixtures/verify/debian-6.1-guest-kernel-state.txt): 8 CPUs, exclusive 2-3 (nohz_full),
    shared 6-7, housekeeping 0-1,4-5; no debugfs IRQ directory (Debian builds without
    CONFIG_GENERIC_IRQ_DEBUGFS); rcuop/0-7 with rcu_nocbs=2-3."""
    root = write_dump(tmp_path / "guest", (OSLAT / "debian-6.1-guest-kernel-state.txt").read_text())
    write_cmk_state(root, {"2,3": ""})
    plan = {
        "isolated_cpus": "2-3,6-7",
        "housekeeping_cpus": "0-1,4-5",
        "pool_cpus": {"infra": "0-1,4-5", "exclusive": "2-3", "shared": "6-7"},
        "exclusive_pools": ["exclusive"],
        "runtime": "cmk",
    }
    expected = {"isolcpus": "managed_irq,domain,2-3,6-7", "nohz_full": "2-3", "rcu_nocbs": "2-3"}
    result = verify(facts_root=str(root), root=str(root), plan=plan, expected_args=expected, pause=lambda: None)
    assert result["ok"] is True
    assert [f for f in result["findings"] if f["severity"] != "info"] == []
    # Exactly the four virtio-blk request vectors of CPUs 2, 3, 6 and 7 stay there: managed.
    assert [(i["irq"], i["name"], i["effective"], i["managed"]) for i in result["irqs"]] == [
        ("27", "virtio1-req.2", "6", True),
        ("28", "virtio1-req.3", "7", True),
        ("31", "virtio1-req.6", "2", True),
        ("32", "virtio1-req.7", "3", True),
    ]
    assert {i["managed_how"] for i in result["irqs"]} == {"per-queue vector (inferred)"}
    moved = [f for f in by_check(result, "irq") if "may be moved" in f["message"]]
    assert [f["cpus"] for f in moved] == ["2-3,6-7"]
    assert "34 (virtio0-input.0), 35 (virtio0-output.0)" in moved[0]["message"]
    assert result["workqueue"]["cpumask"] == "0-1,4-5" and result["workqueue"]["ok"]
    assert result["rcu"]["threads"] == "0-7" and result["rcu"]["offloaded"] == "2-3" and result["rcu"]["ok"]
    assert result["nohz"] == {
        "expected": "2-3",
        "active": "2-3",
        "isolated_expected": "2-3,6-7",
        "isolated_active": "2-3,6-7",
        "ok": True,
    }
    assert result["processes"] == [] and result["kernel"]["release"] == "6.1.0-56-amd64"
    assert all(row["quiet"] for row in result["per_cpu"].values())


# oslat ---------------------------------------------------------------------------------


def test_oslat_json_and_text_of_one_real_run_agree():
    """Captured from rt-tests 2.4's oslat (V 2.40): ``-c 1 -C 0 -D 2 -q --json=...``, 32 buckets."""
    from_json = parse_oslat_json((OSLAT / "oslat-2.40-cpu1.json").read_text(), buckets=32)
    from_text = parse_oslat_text((OSLAT / "oslat-2.40-cpu1.txt").read_text())
    assert from_json == from_text
    assert from_json[1]["max_us"] == 1097 and from_json[1]["min_us"] == 1 and from_json[1]["avg_us"] == 1.0
    assert from_json[1]["overflows"] == 229
    assert from_json[1]["p99_us"] == 1 and from_json[1]["p999_us"] == 1


def test_oslat_two_cpus_with_omitted_zero_buckets():
    """``-c 0-1 -b 64 -z``: rows of empty buckets are left out (``...``), in the text and the JSON."""
    from_json = parse_oslat_json((OSLAT / "oslat-2.40-cpus0-1-b64-z.json").read_text(), buckets=64)
    from_text = parse_oslat_text((OSLAT / "oslat-2.40-cpus0-1-b64-z.txt").read_text())
    assert from_json == from_text
    assert (from_json[0]["max_us"], from_json[1]["max_us"]) == (4173, 777)
    assert (from_json[0]["overflows"], from_json[1]["overflows"]) == (12, 9)


def test_percentile_from_a_histogram_with_an_overflow_bucket():
    # Bucket k holds the loops under k µs; 32 is the overflow bucket (32 µs and more).
    assert percentile({1: 995, 3: 4, 32: 1}, 0.99, 32, 250) == 1
    assert percentile({1: 995, 3: 4, 32: 1}, 0.999, 32, 250) == 3
    # The 99th percentile falls in the overflow bucket: the measured max is the bound given.
    assert percentile({1: 900, 2: 80, 5: 9, 32: 11}, 0.99, 32, 250) == 250
    assert percentile({1: 900, 2: 80, 5: 10, 32: 10}, 0.99, 32, 250) == 5


@pytest.fixture
def oslat():
    tool = shutil.which("oslat")
    if tool is None:
        pytest.skip("oslat is not installed (Debian package rt-tests)")
    if os.geteuid() != 0:
        pytest.skip("oslat needs root (it locks memory)")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("oslat needs a CPU for its main thread and one to measure")
    return tool


def subprocess_run(argv: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=dict(os.environ, LC_ALL="C"))
    return proc.returncode, proc.stdout, proc.stderr


def test_a_real_oslat_run_over_the_threshold(tmp_path, oslat):
    """2 s of real oslat on CPU 1 (main thread on CPU 0): figures per CPU, and a threshold of 0 µs fails."""
    kernel = Kernel(cpus=2, cmdline="isolcpus=1", isolated="1", workqueue=[0], default_affinity=[0])
    kernel.tasks = [Task(1, "init", [0], 0, ppid=0)]
    root = write_kernel(tmp_path / "node", kernel)
    plan = {
        "isolated_cpus": "1",
        "housekeeping_cpus": "0",
        "pool_cpus": {"infra": "0", "exclusive": "1"},
        "exclusive_pools": ["exclusive"],
        "runtime": "cpu-pooler",
    }
    calls = []

    def run(argv):
        calls.append(argv)
        return subprocess_run(argv)

    latency = {"enabled": True, "duration": 2, "max_us": 0, "p99_us": None}
    result = verify(facts_root=str(root), root=str(root), plan=plan, latency=latency, run=run)
    section = result["latency"]
    assert section["version"] and section["skipped"] is None
    assert section["argv"][:5] == [oslat, "--cpu-list", "1", "--cpu-main-thread", "0"]
    assert "--json=<result.json>" in section["argv"]  # rt-tests >= 2.0
    figures = section["cpus"]["1"]
    assert 1 <= figures["min_us"] <= figures["p99_us"] <= figures["max_us"]
    assert result["per_cpu"]["1"]["latency"]["max_us"] == figures["max_us"]
    (fail,) = by_check(result, "latency", "fail")
    assert fail["cpus"] == "1" and f"max latency {figures['max_us']} µs is over the threshold 0 µs" in fail["message"]
    assert result["ok"] is False and section["ok"] is False
    assert len(calls) == 3  # --help, --version, the run


def test_check_mode_measures_nothing(tmp_path):
    def run(argv):
        raise AssertionError(f"check mode ran {argv}")

    latency = {"enabled": True, "duration": 10}
    result = run_verify(tmp_path, quiet_kernel(), latency=latency, check_mode=True, run=run)
    skipped = result["latency"]["skipped"]
    assert skipped.startswith("check mode: would run ")
    assert "--cpu-list 1,4-5 --cpu-main-thread 0 --duration 10" in skipped
    assert result["latency"]["left_out"] == "3"  # held by CMK's workload: never disturbed
    assert any("CPU 3 not measured: held by a workload" in f["message"] for f in by_check(result, "latency"))
    assert run_verify(tmp_path / "off", quiet_kernel())["latency"]["skipped"] == "not enabled"
