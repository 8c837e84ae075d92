"""Fixtures for the node agent tests: a built ``cmk``, pool states written from small plans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "module_utils"))

from cpupools import state as st  # noqa: E402
from cpupools import state_writer as sw  # noqa: E402


def make_plan(pools: dict, handout: dict | None = None) -> dict:
    """A plan dict as plan_pools returns it, reduced to what the state needs."""
    exclusive = [p for p in ("exclusive", "exclusive-non-isolcpus") if p in pools]
    if handout is None:
        handout = {p: [c for s in sorted(pools[p], key=int) for c in pools[p][s]] for p in exclusive}
    return {"version": 1, "pools": pools, "exclusive_pools": exclusive, "handout_order": handout}


#: This machine has CPUs 0 and 1 only: two exclusive lists, nothing else.
PLAN_2X = make_plan({"exclusive": {"0": ["0", "1"]}, "shared": {"0": []}}, {"exclusive": ["1", "0"]})
#: One exclusive list, shared and infra on the other CPU.
PLAN_1X = make_plan({"exclusive": {"0": ["1"]}, "shared": {"0": ["0"]}, "infra": {"0": []}})


def write_plan_state(conf: Path, plan: dict, tasks: dict | None = None, starts: dict | None = None) -> Path:
    layout = sw.desired_layout(plan)
    sw.ensure_lock_file(str(conf))
    with st.StateLock(str(conf)):
        sw.write_state(str(conf), layout, tasks or {}, starts or {}, sw.desired_meta(plan, layout))
    return conf


@pytest.fixture(scope="session")
def cmk(tmp_path_factory) -> str:
    """Build the agent with scripts/build_agent.py (launcher + zipapp); return the launcher path."""
    out = tmp_path_factory.mktemp("agent") / "cmk"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_agent.py"), str(out)], check=True, capture_output=True
    )
    return str(out)


@pytest.fixture
def state_dir(tmp_path):
    """``state_dir(plan, tasks=None, starts=None)`` -> conf dir holding that state."""

    def make(plan: dict = PLAN_2X, tasks: dict | None = None, starts: dict | None = None) -> Path:
        return write_plan_state(tmp_path / "cmk", plan, tasks, starts)

    return make


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CMK_")}
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra)
    return env


def tasks_of(conf: Path, pool: str = "exclusive") -> dict[str, list[int]]:
    """cpulist -> PIDs, read straight from the tasks files."""
    out = {}
    for tasks in sorted((conf / "pools" / pool).glob("*/*/tasks")):
        text = tasks.read_text()
        out[tasks.parent.name] = [int(p) for p in text.split(",")] if text else []
    return out


def tree_snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """``path -> (content, mtime_ns, mode)`` of every file and directory under ``root``."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        st_ = path.lstat()
        out[str(path.relative_to(root))] = (path.read_bytes() if path.is_file() else b"", st_.st_mtime_ns, st_.st_mode)
    return out
