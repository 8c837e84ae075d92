"""Kill ``cmk isolate`` and ``cmk reconcile`` at every system call of their write path, then recover.

The write path is everything from the first ``flock`` to the exit (for
reconcile, from its first ``write``: it prepares files before the lock). A traced
run lists those calls as (name, n-th call of that name); each is then a kill
point: ``strace -e inject=NAME:signal=SIGKILL:when=N`` kills the process as
it enters that call, which is also "just after" the call before it. Of the
calls between two whose effect another process can see (a write, a rename,
an open that creates), one stands for all: a kill at any of them leaves the
same files and processes (agent_support.distinct_kill_points). After
each kill the next ``cmk isolate`` must get a list, and the next
``cmk reconcile`` must leave exactly the live holder, its marker, and
nothing else: every live task kept, no list lost, no leftovers.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from agent_support import PLAN_1X, PLAN_2X, agent_env, distinct_kill_points, tasks_of, traced_calls, write_plan_state
from agent_support import killed_at as support_killed_at
from cpupools.node import state as st

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

DEAD = 2**22 + 11


#: Memory management calls: their number depends on the lengths of the paths and
#: PIDs of each run (the traced run and the killed one differ), and a kill there
#: is a kill at the state-changing call next to it.
MEMORY = frozenset({"brk", "mmap", "munmap", "mremap", "madvise", "mprotect"})


def write_path_calls(argv: list[str], trace: str, first: str = "flock") -> list[tuple[str, int]]:
    """``(name, n)`` of every system call from the first ``first`` on but ``MEMORY``, n counting that name."""
    return traced_calls(argv, trace, agent_env(), first=first, leave_out=MEMORY)


def killed_at(argv: list[str], name: str, nth: int) -> int:
    return support_killed_at(argv, name, nth, agent_env())


@pytest.fixture
def holder():
    """A live process holding list "0", with its start-time marker."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid, st.read_proc_stat("/proc", proc.pid)[2]
    proc.kill()
    proc.wait()


def state_with(conf, live, dead: bool):
    """PLAN_2X with the live holder on exclusive "0"; with ``dead``, also dead entries beside it and on "1".

    A dead PID beside the live one makes reconcile rewrite the live holder's
    own list: a write that is not atomic would lose it.
    """
    pid, start = live
    tasks = {"exclusive": {"0": {"0": [pid, DEAD + 1] if dead else [pid], "1": [DEAD] if dead else []}}}
    starts = {pid: start, DEAD: 12345, DEAD + 1: 12346} if dead else {pid: start}
    return write_plan_state(conf, PLAN_2X, tasks, starts)


def shared_state_with(conf, live):
    """PLAN_1X with the live holder on the shared list "0": isolate --pool=shared rewrites that list twice."""
    pid, start = live
    return write_plan_state(conf, PLAN_1X, {"shared": {"0": {"0": [pid]}}}, {pid: start})


def assert_recovered(cmk, conf, live, pool: str = "exclusive", free: str = "1", held: str = "0") -> None:
    """The next isolate works; then reconcile leaves the live holder and nothing else."""
    pid, start = live
    run = [cmk, "isolate", f"--conf-dir={conf}", f"--pool={pool}", "--no-affinity", "--", "sh", "-c"]
    res = subprocess.run([*run, "echo $CMK_CPUS_ASSIGNED"], env=agent_env(), capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (0, f"{free if pool == 'exclusive' else held}\n"), res.stderr
    res = subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=agent_env(), capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lists = {held: [pid], free: []} if pool == "exclusive" else {held: [pid]}
    assert tasks_of(conf, pool) == lists
    assert sorted(os.listdir(conf / f"pools/{pool}/0/{held}")) == sorted(["tasks", f"task.{pid}.{start}"])
    if pool == "exclusive":
        assert os.listdir(conf / f"pools/{pool}/0/{free}") == ["tasks"]


def test_isolate_killed_at_every_call_of_its_write_path(cmk, tmp_path, holder):
    argv = lambda conf: [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "true"]  # noqa: E731
    conf = state_with(tmp_path / "traced", holder, dead=False)
    points = write_path_calls(argv(conf), str(tmp_path / "trace"))
    names = [name for name, _ in points]
    assert names.count("renameat") == 2 and names.count("flock") == 4  # take and give back, each under the lock
    for i, (name, nth) in enumerate(distinct_kill_points(str(tmp_path / "trace"), points)):
        conf = state_with(tmp_path / f"k{i}", holder, dead=False)
        assert killed_at(argv(conf), name, nth) in (-9, 137), (name, nth)
        assert_recovered(cmk, conf, holder)
        shutil.rmtree(conf)


def test_shared_isolate_killed_at_every_call_keeps_the_other_holder(cmk, tmp_path, holder):
    argv = lambda conf: [cmk, "isolate", f"--conf-dir={conf}", "--pool=shared", "--no-affinity", "--", "true"]  # noqa: E731
    conf = shared_state_with(tmp_path / "traced", holder)
    points = write_path_calls(argv(conf), str(tmp_path / "trace"))
    assert [name for name, _ in points].count("renameat") == 2
    for i, (name, nth) in enumerate(distinct_kill_points(str(tmp_path / "trace"), points)):
        conf = shared_state_with(tmp_path / f"k{i}", holder)
        assert killed_at(argv(conf), name, nth) in (-9, 137), (name, nth)
        assert_recovered(cmk, conf, holder, pool="shared")
        shutil.rmtree(conf)


def test_reconcile_killed_at_every_call_of_its_write_path(cmk, tmp_path, holder):
    argv = lambda conf: [cmk, "reconcile", f"--conf-dir={conf}"]  # noqa: E731
    conf = state_with(tmp_path / "traced", holder, dead=True)
    (conf / "pools/exclusive/0/1/.tasks.0123456789ab.tmp").write_text("left by a killed isolate")
    # From the first write on: reconcile writes and flushes the new tasks file of
    # list "0" (dead PID beside the live one) before it takes the lock.
    points = write_path_calls(argv(conf), str(tmp_path / "trace"), first="write")
    names = [name for name, _ in points]
    # List 0's prepared file is swapped in (renameat2), list 1 with the leftover rewritten (renameat); the
    # swapped-out file, the leftover and the dead markers removed.
    assert names.count("renameat2") == 1 and names.count("renameat") == 1 and names.count("unlinkat") >= 4
    assert names.index("fsync") < names.index("flock"), "list 0's file is prepared outside the lock"
    for i, (name, nth) in enumerate(distinct_kill_points(str(tmp_path / "trace"), points)):
        conf = state_with(tmp_path / f"k{i}", holder, dead=True)
        (conf / "pools/exclusive/0/1/.tasks.0123456789ab.tmp").write_text("left by a killed isolate")
        assert killed_at(argv(conf), name, nth) in (-9, 137), (name, nth)
        assert_recovered(cmk, conf, holder)
        shutil.rmtree(conf)
