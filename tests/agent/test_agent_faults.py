"""Kill ``cmk isolate`` and ``cmk reconcile`` at every system call of their write path, then recover.

The write path is everything from the first ``flock`` to the exit. A traced
run lists those calls as (name, n-th call of that name); each is then a kill
point: ``strace -e inject=NAME:signal=SIGKILL:when=N`` kills the process as
it enters that call, which is also "just after" the call before it. After
each kill the next ``cmk isolate`` must get a list, and the next
``cmk reconcile`` must leave exactly the live holder, its marker, and
nothing else: every live task kept, no list lost, no leftovers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from agent_support import PLAN_2X, agent_env, tasks_of, write_plan_state
from cpupools import state as st

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

CALL = re.compile(r"^([a-z_0-9]+)\(")
DEAD = 2**22 + 11


def write_path_calls(argv: list[str], trace: str) -> list[tuple[str, int]]:
    """``(name, n)`` of every system call from the first flock on, n counting that name from the start."""
    res = subprocess.run(["strace", "-qq", "-o", trace, *argv], env=agent_env(), capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    seen: dict[str, int] = {}
    points = []
    locked = False
    with open(trace) as handle:
        for line in handle:
            match = CALL.match(line)
            if not match:
                continue
            name = match.group(1)
            seen[name] = seen.get(name, 0) + 1
            locked = locked or name == "flock"
            if locked:
                points.append((name, seen[name]))
    assert points, "no flock in the trace"
    return points


def killed_at(argv: list[str], name: str, nth: int) -> int:
    inject = f"inject={name}:signal=SIGKILL:when={nth}"
    res = subprocess.run(
        ["strace", "-qq", "-o", "/dev/null", "-e", f"trace={name}", "-e", inject, *argv],
        env=agent_env(),
        capture_output=True,
        timeout=60,
    )
    return res.returncode


@pytest.fixture
def holder():
    """A live process holding list "0", with its start-time marker."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid, st.read_proc_stat("/proc", proc.pid)[2]
    proc.kill()
    proc.wait()


def state_with(conf, live, dead_on_1: bool):
    pid, start = live
    tasks = {"exclusive": {"0": {"0": [pid], "1": [DEAD] if dead_on_1 else []}}}
    starts = {pid: start, DEAD: 12345} if dead_on_1 else {pid: start}
    return write_plan_state(conf, PLAN_2X, tasks, starts)


def assert_recovered(cmk, conf, live) -> None:
    """The next isolate works; then reconcile leaves the live holder and nothing else."""
    pid, start = live
    run = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "sh", "-c"]
    res = subprocess.run([*run, "echo $CMK_CPUS_ASSIGNED"], env=agent_env(), capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (0, "1\n"), res.stderr
    res = subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=agent_env(), capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert tasks_of(conf) == {"0": [pid], "1": []}
    assert sorted(os.listdir(conf / "pools/exclusive/0/0")) == sorted(["tasks", f"task.{pid}.{start}"])
    assert os.listdir(conf / "pools/exclusive/0/1") == ["tasks"]


def test_isolate_killed_at_every_call_of_its_write_path(cmk, tmp_path, holder):
    argv = lambda conf: [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "true"]  # noqa: E731
    conf = state_with(tmp_path / "traced", holder, dead_on_1=False)
    points = write_path_calls(argv(conf), str(tmp_path / "trace"))
    names = [name for name, _ in points]
    assert names.count("renameat") == 2 and names.count("flock") == 4  # take and give back, each under the lock
    for i, (name, nth) in enumerate(points):
        conf = state_with(tmp_path / f"k{i}", holder, dead_on_1=False)
        assert killed_at(argv(conf), name, nth) in (-9, 137), (name, nth)
        assert_recovered(cmk, conf, holder)
        shutil.rmtree(conf)


def test_reconcile_killed_at_every_call_of_its_write_path(cmk, tmp_path, holder):
    argv = lambda conf: [cmk, "reconcile", f"--conf-dir={conf}"]  # noqa: E731
    conf = state_with(tmp_path / "traced", holder, dead_on_1=True)
    (conf / "pools/exclusive/0/1/.tasks.0123456789ab.tmp").write_text("left by a killed isolate")
    points = write_path_calls(argv(conf), str(tmp_path / "trace"))
    names = [name for name, _ in points]
    assert "renameat" in names and names.count("unlinkat") >= 2  # tasks, the temporary file and the marker
    for i, (name, nth) in enumerate(points):
        conf = state_with(tmp_path / f"k{i}", holder, dead_on_1=True)
        (conf / "pools/exclusive/0/1/.tasks.0123456789ab.tmp").write_text("left by a killed isolate")
        assert killed_at(argv(conf), name, nth) in (-9, 137), (name, nth)
        assert_recovered(cmk, conf, holder)
        shutil.rmtree(conf)
