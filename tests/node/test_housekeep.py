"""node/housekeep.py: which kernel threads and host tasks leave the isolated CPUs, and moving them.

The tasks are read as verify reads them (``tasks.read_tasks``) from a /proc
written in the kernel's formats (tests/fixtures/procfs.py), with flags and
affinities as a real 6.x kernel shows them: kswapd0 and kcompactd0 bound to
their node, ksoftirqd per CPU and PF_NO_SETAFFINITY, an unbound kworker, an
interrupt thread, a host daemon, a pod's task, a cmk workload. The last test
moves a real process on this machine.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from cpupools.core.cpulist import format_cpulist
from cpupools.core.errors import StateError
from cpupools.node import housekeep
from cpupools.node.tasks import Facts, read_tasks
from procfs import KTHREAD_FLAGS, PERCPU_KTHREAD_FLAGS, Kernel, Task, write, write_kernel

#: An 8-CPU node, two NUMA nodes (0-3, 4-7); CPUs 2-3 and 6-7 isolated, 0 and 4 housekeeping, 1 and 5 shared.
ISOLATED = {2, 3, 6, 7}
HOUSEKEEPING = {0, 4}
ONLINE = set(range(8))
NODES = [{0, 1, 2, 3}, {4, 5, 6, 7}]
POD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-1.scope\n"
)


def _node(tmp_path) -> list[dict]:
    return read_tasks(Facts(str(_node_root(tmp_path))), pods=True)


def _node_root(tmp_path, **more):
    kernel = Kernel(
        cpus=8,
        tasks=[
            Task(45, "kswapd0", [0, 1, 2, 3], 2, ppid=2, flags=KTHREAD_FLAGS),
            Task(46, "kswapd1", [4, 5, 6, 7], 5, ppid=2, flags=KTHREAD_FLAGS),
            Task(36, "kcompactd0", [0, 1, 2, 3], 1, ppid=2, flags=KTHREAD_FLAGS),
            Task(22, "ksoftirqd/2", [2], 2, ppid=2, flags=PERCPU_KTHREAD_FLAGS),
            Task(90, "kworker/u16:3-events_unbound", list(ONLINE), 6, ppid=2, flags=KTHREAD_FLAGS),
            Task(91, "rcuop/2", list(ONLINE), 0, ppid=2, flags=KTHREAD_FLAGS),
            Task(92, "irq/45-nvme0q3", [2, 3], 3, ppid=2, flags=KTHREAD_FLAGS),
            Task(93, "kthread-on-isolated", [2, 3], 3, ppid=2, flags=KTHREAD_FLAGS),
            Task(94, "kthread-some", [1, 2, 5], 1, ppid=2, flags=KTHREAD_FLAGS),
            Task(95, "cpuhp/3", [3], 3, ppid=2, flags=PERCPU_KTHREAD_FLAGS),
            Task(
                218,
                "systemd-udevd",
                list(ONLINE),
                3,
                cgroup="0::/system.slice/systemd-udevd.service\n",
                threads=[Task(219, "udev-worker", list(ONLINE), 7)],
            ),
            Task(300, "sshd", [0, 4], 0, cgroup="0::/system.slice/ssh.service\n"),
            Task(301, "pinned-by-hand", [1, 2], 2, cgroup="0::/user.slice/user-0.slice/session-1.scope\n"),
            Task(400, "pause", list(ONLINE), 5, cgroup=POD),
            Task(500, "dpdk-app", [3], 3, cgroup="0::/system.slice/dpdk.service\n"),
            Task(501, "cmk-held-unpinned", list(ONLINE), 1, cgroup="0::/system.slice/app.service\n"),
        ],
        **more,
    )
    root = write_kernel(tmp_path / "node", kernel)
    for node, cpus in enumerate(NODES):
        write(root, f"sys/devices/system/node/node{node}/cpulist", format_cpulist(cpus) + "\n")
    return root


def test_what_moves_and_where(tmp_path):
    moves = housekeep.plan_moves(_node(tmp_path), ISOLATED, HOUSEKEEPING, ONLINE, NODES, held={501})
    where = {move.comm: (move.kind, move.target) for move in moves}
    assert where == {
        # bound to their node by the kernel: to the node's housekeeping CPU
        "kswapd0": ("kernel thread", (0,)),
        "kswapd1": ("kernel thread", (4,)),
        "kcompactd0": ("kernel thread", (0,)),
        # allowed everywhere: to every housekeeping CPU
        "kworker/u16:3-events_unbound": ("kernel thread", (0, 4)),
        "rcuop/2": ("kernel thread", (0, 4)),
        # bound to some CPUs by someone: what is left of them
        "kthread-some": ("kernel thread", (1, 5)),
        # a host daemon nobody pinned, each of its threads
        "systemd-udevd": ("task", (0, 4)),
        "udev-worker": ("task", (0, 4)),
    }, where
    # Left alone: per-CPU threads (PF_NO_SETAFFINITY or one CPU), the IRQ thread (its IRQ's affinity), a
    # kernel thread bound to isolated CPUs only, tasks already off them, tasks someone pinned, pods, cmk's.
    udev = next(m for m in moves if m.comm == "udev-worker")
    assert (udev.tid, udev.tgid, udev.allowed) == (219, 218, tuple(range(8)))


def test_a_node_without_housekeeping_cpus_on_a_numa_node_sends_its_threads_to_the_others(tmp_path):
    moves = housekeep.plan_moves(_node(tmp_path), ISOLATED | {4}, {0}, ONLINE, NODES)
    assert {m.comm: m.target for m in moves if m.comm.startswith("kswapd")} == {"kswapd0": (0,), "kswapd1": (0,)}
    kswapd1 = next(m for m in moves if m.comm == "kswapd1")
    assert "without housekeeping CPUs" in kswapd1.why
    with pytest.raises(ValueError, match="no housekeeping CPUs"):
        housekeep.plan_moves([], ISOLATED, set(), ONLINE)


def test_nothing_moves_on_a_node_already_kept_off(tmp_path):
    tasks = _node(tmp_path)
    moves = housekeep.plan_moves(tasks, ISOLATED, HOUSEKEEPING, ONLINE, NODES, held={501})
    after = [
        {**task, "allowed": [*next(m.target for m in moves if m.tid == task["pid"])]}
        if any(m.tid == task["pid"] for m in moves)
        else task
        for task in tasks
    ]
    assert housekeep.plan_moves(after, ISOLATED, HOUSEKEEPING, ONLINE, NODES, held={501}) == []
    assert housekeep.summary([]) == "no kernel thread or host task to move off the isolated CPUs"


def test_apply_says_what_happened_to_each_thread(tmp_path):
    moves = housekeep.plan_moves(_node(tmp_path), ISOLATED, HOUSEKEEPING, ONLINE, NODES, held={501})
    calls = []

    def setaffinity(tid, cpus):
        calls.append((tid, sorted(cpus)))
        if tid == 45:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        if tid == 218:
            raise OSError(errno.EINVAL, "Invalid argument")

    results = {r["comm"]: r for r in housekeep.apply_moves(moves, setaffinity)}
    assert len(calls) == len(moves) == len(results)
    assert results["kswapd0"]["status"] == "gone"
    assert results["systemd-udevd"]["status"] == "refused" and results["systemd-udevd"]["error"].startswith("EINVAL")
    assert results["udev-worker"] == {
        "tid": 219,
        "tgid": 218,
        "comm": "udev-worker",
        "kind": "task",
        "allowed": "0-7",
        "target": "0,4",
        "why": "a host task nobody pinned: to the housekeeping CPUs",
        "status": "moved",
    }
    line = housekeep.summary(list(results.values()))
    assert line.startswith("8 thread(s) to move off the isolated CPUs: 1 gone, 6 moved, 1 refused"), line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move a task between")
def test_a_real_process_is_moved_and_a_re_run_finds_nothing(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    keep, isolated = cpus[0], cpus[-1]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine = [t for t in read_tasks(Facts("/"), pods=True) if t["tgid"] == proc.pid]
        assert mine and all(set(t["allowed"]) >= set(cpus) for t in mine), mine
        moves = housekeep.plan_moves(mine, {isolated}, {keep}, cpus)
        assert [m.tid for m in moves] == [t["pid"] for t in mine]
        results = housekeep.apply_moves(moves)
        assert {r["status"] for r in results} == {"moved"}, results
        assert os.sched_getaffinity(proc.pid) == {keep}
        again = [t for t in read_tasks(Facts("/"), pods=True) if t["tgid"] == proc.pid]
        assert housekeep.plan_moves(again, {isolated}, {keep}, cpus) == []
    finally:
        proc.kill()
        proc.wait()
    # The process is gone: moving it again says so instead of failing.
    assert {r["status"] for r in housekeep.apply_moves(moves)} == {"gone"}


def _config(**more) -> dict:
    text = housekeep.render_config("2-3,6-7", "0,4", None, more.pop("keep", ()))
    return {**housekeep.parse_config(text), **more}


def test_the_pass_on_a_node_in_check_mode_then_for_real(tmp_path):
    """``housekeep``: what ``cmk housekeep`` does with the agent stage's configuration; check mode moves
    and writes nothing, the real pass moves each thread and rewrites the workqueue masks that hold an
    isolated CPU (as sysfs takes them), leaving the others."""
    root = _node_root(tmp_path, workqueue=list(ONLINE), workqueues={"writeback": [0, 4], "blkcg_punt_bio": [2, 5]})
    facts = Facts(str(root))
    calls = []
    checked = housekeep.housekeep(_config(), facts, facts, check=True, setaffinity=lambda *a: calls.append(a))
    assert calls == []
    assert {m["status"] for m in checked["moves"]} == {"would move"}
    assert {m["comm"] for m in checked["moves"]} >= {"kswapd0", "systemd-udevd", "cmk-held-unpinned"}
    assert [(q["path"], q["from"], q["status"]) for q in checked["workqueues"]] == [
        ("/sys/devices/virtual/workqueue/cpumask", "0-7", "would write"),
        ("/sys/devices/virtual/workqueue/blkcg_punt_bio/cpumask", "2,5", "would write"),
    ]
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text() == "ff\n"
    done = housekeep.housekeep(_config(), facts, facts, setaffinity=lambda tid, cpus: calls.append((tid, set(cpus))))
    assert dict(calls)[45] == {0} and dict(calls)[218] == {0, 4}
    assert {m["status"] for m in done["moves"]} == {"moved"}
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text() == "11\n"
    assert (root / "sys/devices/virtual/workqueue/blkcg_punt_bio/cpumask").read_text() == "11\n"
    assert (root / "sys/devices/virtual/workqueue/writeback/cpumask").read_text() == "11\n"  # never touched
    assert done["summary"].startswith(f"{len(calls)} thread(s) to move off the isolated CPUs: {len(calls)} moved")


def test_a_workload_and_what_it_started_are_never_moved_nor_the_names_kept(tmp_path):
    tasks = [
        {"pid": 10, "tgid": 10, "ppid": 1, "comm": "app", "flags": 0, "allowed": list(ONLINE)},
        {"pid": 11, "tgid": 11, "ppid": 10, "comm": "app-child", "flags": 0, "allowed": list(ONLINE)},
        {"pid": 12, "tgid": 11, "ppid": 10, "comm": "app-thread", "flags": 0, "allowed": list(ONLINE)},
        {"pid": 13, "tgid": 13, "ppid": 11, "comm": "grandchild", "flags": 0, "allowed": list(ONLINE)},
        {"pid": 20, "tgid": 20, "ppid": 1, "comm": "other", "flags": 0, "allowed": list(ONLINE)},
        {"pid": 21, "tgid": 21, "ppid": 1, "comm": "ptp4l", "flags": 0, "allowed": list(ONLINE)},
    ]
    assert housekeep.workloads(tasks, {10}) == {10, 11, 13}
    moves = housekeep.plan_moves(tasks, ISOLATED, HOUSEKEEPING, ONLINE, held=housekeep.workloads(tasks, {10}))
    assert [m.comm for m in moves] == ["other", "ptp4l"]
    moves = housekeep.plan_moves(tasks, ISOLATED, HOUSEKEEPING, ONLINE, keep=["ptp4l|phc2sys", "oth"])
    assert "ptp4l" not in [m.comm for m in moves] and "other" in [m.comm for m in moves]  # whole names only


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", r"no isolated or housekeeping="),
        ("isolated=2-3\n", r"no housekeeping="),
        ("isolated=2-3\nhousekeeping=x\n", "housekeeping"),
        ("isolated=2-3\nhousekeeping=\n", "no housekeeping CPUs"),
        ("isolated=2-3\nhousekeeping=0\nkeep=(\n", r":3: keep=\(: not a regular expression"),
        ("isolated=2-3\nhousekeeping=0\nconf_dir=etc/cmk\n", "not an absolute path"),
        ("isolated=2-3\nhousekeeping=0\nbogus=1\n", r":3: not a housekeeper configuration line"),
        ('{"isolated": "2-3"}', r":1: not a housekeeper configuration line"),
    ],
)
def test_a_configuration_that_cannot_be_used_is_refused(text, why):
    with pytest.raises(StateError, match=why):
        housekeep.parse_config(text)


def test_the_configuration_reads_back_what_was_rendered():
    text = housekeep.render_config("2-3,6-7", "0,4", "/etc/cmk", ["ptp4l|phc2sys", "a=b"])
    assert text.startswith(housekeep.CONFIG_HEADER)
    config = housekeep.parse_config(text)
    assert (config["isolated"], config["housekeeping"], config["conf_dir"]) == ([2, 3, 6, 7], [0, 4], "/etc/cmk")
    assert [pattern.pattern for pattern in config["keep"]] == ["ptp4l|phc2sys", "a=b"]
    assert housekeep.parse_config(housekeep.render_config("2", "0", None))["conf_dir"] is None


def test_a_configuration_for_cpus_the_node_does_not_have_moves_nothing(tmp_path):
    """A plan read from a fixture tree (a test container) or from before CPUs went offline: its CPU
    numbers mean nothing here, so the pass moves no task and writes no mask, and says why."""
    root = _node_root(tmp_path, workqueue=list(ONLINE))
    facts = Facts(str(root))
    config = housekeep.parse_config(housekeep.render_config("2-3,40-47", "0,4,48", None))
    calls = []
    result = housekeep.housekeep(config, facts, facts, setaffinity=lambda *a: calls.append(a))
    assert calls == [] and result["moves"] == [] and result["workqueues"] == []
    assert result["problem"].startswith("the configuration names CPUs this node does not have online (40-48;")
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text() == "ff\n"


def test_the_cpus_the_kernel_runs_come_from_cpuinfo_not_from_a_sysfs_fixture(tmp_path):
    """In a molecule container sysfs is the fixture the plan was made from (its CPUs look online):
    /proc/cpuinfo says which CPUs the kernel runs, and a plan beyond them moves nothing."""
    root = _node_root(tmp_path)
    write(root, "proc/cpuinfo", "".join(f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\n\n" for cpu in (0, 1)))
    facts = Facts(str(root))
    calls = []
    result = housekeep.housekeep(_config(), facts, facts, setaffinity=lambda *a: calls.append(a))
    assert calls == [] and result["problem"].startswith(
        "the configuration names CPUs this node does not have online (2-4,6-7; online: 0-1)"
    )
    assert housekeep.cpuinfo_cpus("processor 0: version = FF\nprocessor 1: version = FF\n") == [0, 1]  # s390x
    assert housekeep.cpuinfo_cpus(None) == []
