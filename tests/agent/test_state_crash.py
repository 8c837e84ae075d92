"""The state module killed at every step of its write path, then any entry point recovers (issue 11).

The module's work (``state_writer.converge``, what ``cpupools_state`` runs)
is run in a child process with ``CPUPOOLS_STATE_CRASH_AT=N``, which ends the
process with ``os._exit`` at the N-th write step, as SIGKILL would. N goes
over every step the uninterrupted write takes, not a sample. After each kill
one entry point runs first (in turn: the module again, ``cmk isolate``,
``cmk reconcile``, ``cmk describe``), then the module: every live task must
still be in the state, on the new plan's list, and its workload re-pinned to
that list's CPUs; a further module run changes nothing.

The resize: two live ``cmk isolate`` holders on this 2-CPU machine, one in
the exclusive pool on CPU 1 and one in the shared pool on CPU 0; the new
plan swaps the two CPUs between the pools, so both move and both must be
re-pinned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_support import REPO, agent_env, make_plan, tasks_of, write_plan_state
from cpupools import state as st
from cpupools import state_writer as sw

pytestmark = pytest.mark.slow

OLD = make_plan({"exclusive": {"0": ["1"]}, "shared": {"0": ["0"]}, "infra": {"0": []}})
NEW = make_plan({"exclusive": {"0": ["0"]}, "shared": {"0": ["1"]}, "infra": {"0": []}})

DRIVER = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from cpupools import state_writer as sw
result = sw.converge(sys.argv[2], json.loads(sys.argv[3]))
print(json.dumps({"changed": result["changed"], "affinity": result["affinity"], "steps": sw.steps_taken()}))
"""


def module(conf: Path, crash_at: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(sw.CRASH_ENV, None)
    if crash_at is not None:
        env[sw.CRASH_ENV] = str(crash_at)
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO / "module_utils"), str(conf), json.dumps(NEW)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start_holder(cmk: str, conf: Path, pool: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [cmk, "isolate", f"--conf-dir={conf}", f"--pool={pool}", "--", "sleep", "600"],
        env=agent_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not any(proc.pid in pids for pids in tasks_of(conf, pool).values()) or not workload(proc):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def workload(proc: subprocess.Popen) -> int | None:
    try:
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(kids[0]) if kids else None


def affinity(pid: int) -> list[int]:
    return sorted(os.sched_getaffinity(pid))


def reset(conf: Path, excl: subprocess.Popen, shared: subprocess.Popen) -> None:
    """The state before the resize: OLD with both holders on their lists, pinned there."""
    for leftover in (st.NEW_TREE, st.OLD_TREE, st.POOLS):
        sw._remove(str(conf / leftover))
    starts = {p.pid: st.read_proc_stat("/proc", p.pid)[2] for p in (excl, shared)}
    tasks = {"exclusive": {"0": {"1": [excl.pid]}}, "shared": {"0": {"0": [shared.pid]}}}
    write_plan_state(conf, OLD, tasks, starts)
    for proc, cpus in ((excl, [1]), (shared, [0])):
        for pid in (proc.pid, workload(proc)):
            os.sched_setaffinity(pid, cpus)


def entry_point(kind: str, cmk: str, conf: Path) -> None:
    args = {
        "isolate": ["isolate", f"--conf-dir={conf}", "--pool=shared", "--no-affinity", "--", "true"],
        "reconcile": ["reconcile", f"--conf-dir={conf}"],
        "describe": ["describe", f"--conf-dir={conf}"],
    }
    if kind == "module":
        res = module(conf)
    else:
        res = subprocess.run([cmk, *args[kind]], env=agent_env(), capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, (kind, res.stdout, res.stderr)
    if kind == "reconcile":
        assert json.loads(res.stdout) == {"reclaimedCpuLists": []}  # no live holder freed


@pytest.fixture
def holders(tmp_path, cmk):
    conf = tmp_path / "cmk"
    write_plan_state(conf, OLD)
    procs = [start_holder(cmk, conf, "exclusive"), start_holder(cmk, conf, "shared")]
    yield conf, procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_kill_at_any_write_step_is_recovered_by_any_entry_point(cmk, holders):
    conf, (excl, shared) = holders
    reset(conf, excl, shared)
    clean = module(conf)
    assert clean.returncode == 0, clean.stderr
    total = json.loads(clean.stdout)["steps"]
    assert total >= 30  # the tree, the swap, the metadata and four threads to re-pin
    kinds = ["module", "isolate", "reconcile", "describe"]
    for step in range(1, total + 1):
        reset(conf, excl, shared)
        killed = module(conf, crash_at=step)
        assert killed.returncode == sw.CRASH_STATUS, (step, killed.stdout, killed.stderr)
        kind = kinds[step % len(kinds)]
        entry_point(kind, cmk, conf)
        recovered = module(conf)
        assert recovered.returncode == 0, (step, kind, recovered.stderr)
        where = f"killed at step {step} of {total}, then {kind}"
        assert tasks_of(conf) == {"0": [excl.pid]}, where
        assert tasks_of(conf, "shared") == {"1": [shared.pid]}, where
        for proc, cpus in ((excl, [0]), (shared, [1])):
            assert affinity(proc.pid) == cpus and affinity(workload(proc)) == cpus, where
        again = module(conf)
        assert json.loads(again.stdout)["changed"] is False, where
    assert excl.poll() is None and shared.poll() is None
