"""Fixtures for the node agent tests: a built ``cmk``, pool states written from small plans."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))

from cpupools.node import state as st  # noqa: E402
from cpupools.node import state_writer as sw  # noqa: E402


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


_CALL = re.compile(r"^([a-z_0-9]+)\(")


def traced_calls(
    argv: list[str], trace: str, env: dict[str, str], first: str = "flock", leave_out: frozenset[str] = frozenset()
) -> list[tuple[str, int]]:
    """Run ``argv`` once under strace; ``(name, n)`` of every system call from the first ``first`` on.

    ``n`` counts that name from the start of the process, as
    ``strace -e inject=NAME:when=N`` does; names in ``leave_out`` are skipped.
    """
    res = subprocess.run(["strace", "-qq", "-o", trace, *argv], env=env, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    seen: dict[str, int] = {}
    points = []
    started = False
    with open(trace) as handle:
        for line in handle:
            match = _CALL.match(line)
            if not match:
                continue
            name = match.group(1)
            seen[name] = seen.get(name, 0) + 1
            started = started or name == first
            if started and name not in leave_out:
                points.append((name, seen[name]))
    assert points, f"no {first} in the trace"
    return points


#: System calls whose effect no other process can see once the caller is dead: reads and stats, closes,
#: fsync (a killed process is not a crashed machine: the next process reads the page cache), advisory
#: locks (released with the process), memory, signal and descriptor bookkeeping, waits and clocks.
UNSEEN = frozenset(
    {
        "access", "brk", "clock_gettime", "clock_nanosleep", "close", "epoll_wait", "faccessat", "faccessat2",
        "fadvise64", "fcntl", "fdatasync", "flock", "fstat", "fsync", "futex", "getcwd", "getdents64", "getegid",
        "geteuid", "getgid", "getpid", "getppid", "getrandom", "gettid", "gettimeofday", "getuid", "ioctl",
        "lseek", "lstat", "madvise", "mmap", "mprotect", "mremap", "munmap", "nanosleep", "newfstatat", "poll",
        "ppoll", "pread64", "prlimit64", "pselect6", "read", "readlink", "readlinkat", "readv", "rseq",
        "rt_sigaction", "rt_sigprocmask", "sched_getaffinity", "sched_yield", "select", "set_robust_list",
        "set_tid_address", "sigaltstack", "stat", "statx", "sysinfo", "uname", "wait4",
    }
)  # fmt: skip
_OPENS_TO_WRITE = re.compile(r"\bO_(WRONLY|RDWR|CREAT|TRUNC|APPEND)\b")


def distinct_kill_points(trace: str, points: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The points of ``points`` (``traced_calls`` of the run that wrote ``trace``) that each leave a different system.

    Killed at a call (SIGKILL on its entry: the call does not run), a process
    leaves behind what every call before it did that another process can
    see: files and directories, other processes and their CPUs. The kill
    points between two such calls leave the same system, so the recovery
    that follows sees the same thing, and one of them stands for all: the
    point at the visible call itself (before its effect), and the last point
    for everything done. A call not in ``UNSEEN`` counts as visible;
    ``openat`` only when it may write or create (``O_WRONLY``, ``O_RDWR``,
    ``O_CREAT``, ``O_TRUNC``, ``O_APPEND``).
    """
    lines: dict[tuple[str, int], str] = {}
    seen: dict[str, int] = {}
    with open(trace) as handle:
        for line in handle:
            match = _CALL.match(line)
            if match:
                name = match.group(1)
                seen[name] = seen.get(name, 0) + 1
                lines[(name, seen[name])] = line
    kept = []
    for point in points:
        name = point[0]
        visible = bool(_OPENS_TO_WRITE.search(lines[point])) if name in ("open", "openat") else name not in UNSEEN
        if visible:
            kept.append(point)
    if points and (not kept or kept[-1] != points[-1]):
        kept.append(points[-1])
    return kept


def killed_at(argv: list[str], name: str, nth: int, env: dict[str, str]) -> int:
    """Run ``argv`` with SIGKILL injected at the ``nth`` call of ``name``; its exit status (-9 or 137 when killed)."""
    inject = f"inject={name}:signal=SIGKILL:when={nth}"
    res = subprocess.run(
        ["strace", "-qq", "-o", "/dev/null", "-e", f"trace={name}", "-e", inject, *argv],
        env=env,
        capture_output=True,
        timeout=60,
    )
    return res.returncode


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


def hold(cmk: str, conf: Path, pool: str = "exclusive", seconds: int = 120) -> subprocess.Popen:
    """Start ``cmk isolate ... sleep SECONDS`` in a session of its own; return once it holds its list.

    Waits for what tests assert on: the PID recorded in the pool, and the workload started.
    """
    proc = subprocess.Popen(
        [cmk, "isolate", f"--conf-dir={conf}", f"--pool={pool}", "--", "sleep", str(seconds)],
        env=agent_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not any(proc.pid in pids for pids in tasks_of(conf, pool).values()) or not workload(proc):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def children(pid: int) -> list[int]:
    """PIDs of the children of ``pid`` (none once it is gone)."""
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def workload(proc: subprocess.Popen) -> int | None:
    """PID of the isolate's child (its workload), once spawned."""
    kids = children(proc.pid)
    return kids[0] if kids else None


def can_unshare(*flags: str) -> bool:
    """Whether ``unshare FLAGS true`` works here (a PID namespace needs CAP_SYS_ADMIN)."""
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, check=False).returncode == 0
    except FileNotFoundError:
        return False
