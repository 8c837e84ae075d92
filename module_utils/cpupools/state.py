"""The pool state: CMK v1.4's directory layout, its lock, and how a plan changes it.

Layout under the conf dir (default ``/etc/cmk``), exactly as CMK v1.4 wrote
and read it, so CMK's own tooling still reads our state::

    <conf>/lock                                   empty file, flock()ed
    <conf>/pools/<pool>/exclusive                 "1" or "0"
    <conf>/pools/<pool>/<socket>/<cpulist>/tasks  comma-separated PIDs, no newline ("" = free)

What cpupools adds lives where CMK never looks (CMK lists pool, socket and
cpulist directories and reads only ``tasks`` inside a cpulist directory):

    <conf>/cpupools.json                                        plan fingerprint + hand-out order
    <conf>/cpupools.order                                       hand-out order, one line per
                                                                exclusive pool (read by isolate)
    <conf>/pools/<pool>/<socket>/<cpulist>/task.<pid>.<start>   empty marker: the start time
                                                                (field 22 of /proc/PID/stat) of
                                                                each task, to catch PID reuse

Start times are empty marker files rather than a second data file: creating
and removing an empty file is atomic and cheap, while replacing a file with
data by rename makes ext4 flush it (``auto_da_alloc``), about a millisecond
per write on a busy disk, paid on every ``cmk isolate``.

Every file is replaced atomically (temporary file in the same directory,
then ``rename``). All reads and writes that must agree happen under an
exclusive ``flock`` on ``<conf>/lock``.

Standard library only, and cheap to import: ``cmk isolate`` imports this
module on every start (``json`` and ``hashlib`` are imported where used).
"""

from __future__ import annotations

import os
import time
from fcntl import LOCK_EX, LOCK_NB, LOCK_UN, flock

from .cpulist import parse_cpulist
from .errors import (
    CpulistError,
    LockTimeoutError,
    ResizeError,
    StateError,
    StatePermissionError,
    UsageError,
)

DEFAULT_CONF_DIR = "/etc/cmk"
DEFAULT_LOCK_TIMEOUT = 30.0
LOCK = "lock"
POOLS = "pools"
META = "cpupools.json"
ORDER = "cpupools.order"
TASKS = "tasks"
MARKER = "task."
EXCLUSIVE_FLAG = "exclusive"
META_VERSION = 1
#: Pools whose cpulists are handed out whole (CMK derives this from the name too).
EXCLUSIVE_POOL_NAMES = ("exclusive", "exclusive-non-isolcpus")

# Permission model (docs/agent.md "Permissions"): everything is root-owned and
# read-only for others, except the cpulist directories and their files, which
# workloads must rewrite (atomic rename needs write access to the directory).
# With a task group those are group-writable; without one only root may isolate.
MODE_DIR = 0o755
MODE_FILE = 0o644
MODE_TASK_DIR_GROUP = 0o2775
MODE_TASK_FILE_GROUP = 0o664


# Locking ---------------------------------------------------------------------


class StateLock:
    """Exclusive ``flock`` on ``<conf>/lock``, waiting at most ``timeout`` seconds.

    Polls with ``LOCK_NB`` and a short backoff instead of CMK's watchdog
    thread that raised KeyboardInterrupt in the main thread; the timeout bounds
    the wait only (the hold is ours and short). Released on ``__exit__``.
    """

    def __init__(self, conf_dir: str, timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.path = os.path.join(conf_dir, LOCK)
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> StateLock:
        try:
            # flock works on a read-only descriptor: workloads need no write access to the lock.
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StateError(
                f"state lock {self.path} is missing: the pool state is not installed "
                "(run the cpupools playbook, role node_agent)"
            ) from None
        except PermissionError:
            raise StatePermissionError(f"cannot open state lock {self.path}: permission denied") from None
        deadline = time.monotonic() + self.timeout
        delay = 0.0002
        while True:
            try:
                flock(self.fd, LOCK_EX | LOCK_NB)
                return self
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    os.close(self.fd)
                    self.fd = -1
                    raise LockTimeoutError(
                        f"lock {self.path} still held by another process after {self.timeout:g} s (CMK_LOCK_TIMEOUT)"
                    ) from None
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.005)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            flock(self.fd, LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def lock_timeout(environ: dict[str, str]) -> float:
    """``CMK_LOCK_TIMEOUT`` in seconds (default 30); a bad value is a usage error."""
    raw = environ.get("CMK_LOCK_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"CMK_LOCK_TIMEOUT={raw!r} is not a positive number of seconds")
    return value


# Processes -------------------------------------------------------------------


def parse_proc_stat(text: str) -> tuple[int, str, int]:
    """``(pid, state, starttime)`` from ``/proc/<pid>/stat`` text.

    The command name (field 2) may hold spaces and parentheses, so fields are
    counted from the last ``)``; ``starttime`` is field 22 (clock ticks since boot).
    """
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return int(head.split(" ", 1)[0]), fields[0], int(fields[19])


def read_proc_stat(proc_fs: str, pid: int | str) -> tuple[int, str, int] | None:
    """Parsed ``<proc_fs>/<pid>/stat``, or None when the process does not exist."""
    try:
        with open(f"{proc_fs}/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    try:
        return parse_proc_stat(text)
    except (ValueError, IndexError):
        return None


def task_alive(proc_fs: str, pid: int, start: int | None) -> bool:
    """True when ``pid`` runs and, if its start time was recorded, is the same process.

    A zombie counts as dead: the isolate process has exited, only its exit
    status is left for its parent.
    """
    stat = read_proc_stat(proc_fs, pid)
    if stat is None or stat[1] in ("Z", "X"):
        return False
    return start is None or stat[2] == start


# Reading ---------------------------------------------------------------------


class CpuList:
    """One cpulist directory; ``tasks`` and ``starts`` are read on first use."""

    __slots__ = ("_starts", "_tasks", "cpus", "path", "pool", "socket")

    def __init__(self, pool: str, socket: str, cpus: str, path: str) -> None:
        self.pool = pool
        self.socket = socket
        self.cpus = cpus
        self.path = path
        self._tasks: list[int] | None = None
        self._starts: dict[int, int] | None = None

    @property
    def cpu_ids(self) -> list[int]:
        return [int(c) for c in self.cpus.split(",")]

    @property
    def tasks(self) -> list[int]:
        if self._tasks is None:
            self._tasks = parse_tasks(_read_text(os.path.join(self.path, TASKS)), os.path.join(self.path, TASKS))
        return self._tasks

    @property
    def starts(self) -> dict[int, int]:
        """Recorded start time per PID, from the ``task.<pid>.<starttime>`` markers."""
        if self._starts is None:
            try:
                names = os.listdir(self.path)
            except OSError:
                names = []
            self._starts = parse_start_markers(names)
        return self._starts


class Pool:
    __slots__ = ("exclusive", "name", "path", "sockets")

    def __init__(self, name: str, exclusive: bool, path: str, sockets: dict[str, list[CpuList]]) -> None:
        self.name = name
        self.exclusive = exclusive
        self.path = path
        self.sockets = sockets

    def cpulists(self, socket: str | None = None) -> list[CpuList]:
        """Lists in CMK's stored order (sockets, then cpulist names, as sorted strings)."""
        if socket is not None:
            return list(self.sockets.get(socket, []))
        return [cl for s in self.sockets for cl in self.sockets[s]]


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except FileNotFoundError:
        raise StateError(f"state is corrupt: {path} is missing") from None
    except PermissionError:
        raise StatePermissionError(f"cannot read {path}: permission denied") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise StateError(f"state is corrupt: {path} is not a text file") from None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        raise StateError(f"state is corrupt: {path} is missing") from None
    except NotADirectoryError:
        raise StateError(f"state is corrupt: {path} is not a directory") from None
    except PermissionError:
        raise StatePermissionError(f"cannot list {path}: permission denied") from None


def parse_tasks(text: str, where: str = "tasks") -> list[int]:
    """CMK's tasks file: comma-separated PIDs, ``""`` when free."""
    text = text.strip()
    if not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not item.isascii():
            raise StateError(f"state is corrupt: {where} holds {text!r}; expected comma-separated PIDs")
        out.append(int(item))
    return out


def format_tasks(tasks: list[int]) -> str:
    return ",".join(str(pid) for pid in tasks)


def parse_start_markers(names: list[str]) -> dict[int, int]:
    """``pid -> starttime`` from marker names ``task.<pid>.<starttime>``; other names are ignored."""
    out = {}
    for name in names:
        if name.startswith(MARKER):
            pid, _, start = name[len(MARKER) :].partition(".")
            if pid.isdigit() and start.isdigit():
                out[int(pid)] = int(start)
    return out


def marker_name(pid: int, start: int) -> str:
    return f"{MARKER}{pid}.{start}"


def _socket_ok(name: str) -> bool:
    return name.isdigit() and name.isascii()


def read_state(conf_dir: str, only_pools: tuple[str, ...] | None = None) -> dict[str, Pool]:
    """Read the layout under ``conf_dir`` (pool -> Pool), validating every name.

    ``only_pools`` reads just those pools' sockets and cpulists (the others
    get empty socket maps), which keeps ``cmk isolate`` fast. Task files are read
    lazily. Anything that is not CMK's layout raises ``StateError`` naming
    the path.
    """
    pools_dir = os.path.join(conf_dir, POOLS)
    if not os.path.isdir(pools_dir):
        raise StateError(
            f"state directory {pools_dir} is missing: the pool state is not installed "
            "(run the cpupools playbook, role node_agent)"
        )
    pools: dict[str, Pool] = {}
    for name in _listdir(pools_dir):
        if name.startswith("."):
            continue  # a temporary tree of an interrupted write (never CMK's)
        pool_path = os.path.join(pools_dir, name)
        flag_path = os.path.join(pool_path, EXCLUSIVE_FLAG)
        flag = _read_text(flag_path).strip()
        if flag not in ("0", "1"):
            raise StateError(f"state is corrupt: {flag_path} holds {flag!r}; expected 1 or 0")
        sockets: dict[str, list[CpuList]] = {}
        if only_pools is None or name in only_pools:
            for socket in _listdir(pool_path):
                if socket == EXCLUSIVE_FLAG:
                    continue
                socket_path = os.path.join(pool_path, socket)
                if not _socket_ok(socket):
                    raise StateError(
                        f"state is corrupt: {socket_path} is not a socket directory (name must be a number)"
                    )
                lists = []
                for cpus in _listdir(socket_path):
                    _check_cpulist_name(cpus, os.path.join(socket_path, cpus))
                    lists.append(CpuList(name, socket, cpus, os.path.join(socket_path, cpus)))
                sockets[socket] = lists
        pools[name] = Pool(name, flag == "1", pool_path, sockets)
    return pools


def is_cmk_cpulist(name: str) -> bool:
    """CMK's cpulist form: distinct CPU ids joined by commas, no ranges.

    Ascending (``format_cmk_cpulist``) is what cpupools writes; CMK itself
    wrote shared and infra lists core by core (``0,44,1,45``), and such a
    state must still be readable.
    """
    if not name or "-" in name or ":" in name or " " in name:
        return False
    try:
        return len(parse_cpulist(name)) == name.count(",") + 1
    except CpulistError:
        return False


def _check_cpulist_name(name: str, path: str) -> None:
    if not is_cmk_cpulist(name):
        raise StateError(f"state is corrupt: {path} is not a cpulist directory (expected a name like 2,46)")
    if not os.path.isdir(path):
        raise StateError(f"state is corrupt: {path} is not a directory")


def read_meta(conf_dir: str) -> dict:
    """``<conf>/cpupools.json``, or ``{}`` when absent (a state written by CMK itself)."""
    import json

    path = os.path.join(conf_dir, META)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except PermissionError:
        raise StatePermissionError(f"cannot read {path}: permission denied") from None
    except ValueError:
        raise StateError(f"state is corrupt: {path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise StateError(f"state is corrupt: {path} does not hold a JSON object")
    return data


def read_handout_order(conf_dir: str, pool: str) -> list[str]:
    """The plan's hand-out order for ``pool`` from ``<conf>/cpupools.order`` (``[]`` when absent).

    A plain text file rather than ``cpupools.json`` because importing ``json``
    (and ``re`` with it) would cost ``cmk isolate`` several milliseconds.
    """
    try:
        with open(os.path.join(conf_dir, ORDER), encoding="ascii") as handle:
            for line in handle:
                fields = line.split()
                if fields and fields[0] == pool:
                    return fields[1:]
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError):
        raise StateError(f"state is corrupt: {os.path.join(conf_dir, ORDER)} is not readable text") from None
    return []


def format_handout_order(order: dict[str, list[str]]) -> str:
    return "".join(f"{pool} {' '.join(lists)}\n" for pool, lists in sorted(order.items()))


def ordered_for_handout(pool: Pool, order: list[str], socket: str | None = None) -> list[CpuList]:
    """The pool's cpulists in the plan's hand-out order; lists it does not name follow in CMK order."""
    lists = pool.cpulists(socket)
    rank = {cpus: i for i, cpus in enumerate(order)}
    # sorted() is stable: unranked lists keep CMK's stored order after the ranked ones.
    return sorted(lists, key=lambda cl: rank.get(cl.cpus, len(rank)))


# Writing ---------------------------------------------------------------------


def atomic_write(path: str, text: str, mode: int | None = None, gid: int | None = None, fsync: bool = False) -> None:
    """Replace ``path`` by a file holding ``text``: temp file in the same directory, then rename.

    ``mode`` defaults to the mode of the file being replaced (so a task file
    made group-writable by the module stays so when a workload rewrites it).
    """
    directory, name = os.path.split(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = MODE_FILE
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except PermissionError:
        raise StatePermissionError(f"cannot write in {directory}: permission denied") from None
    try:
        try:
            os.write(fd, text.encode("ascii"))
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:  # noqa: SIM105 - contextlib costs ~1 ms of cmk start-up
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_tasks(cpulist: CpuList, tasks: list[int], starts: dict[int, int]) -> None:
    """Record ``tasks`` for one cpulist (CMK's format) and the start times of new PIDs.

    ``tasks`` is replaced atomically. Markers of added PIDs are created
    before it is written and markers of removed PIDs deleted after, so a crash
    in between leaves only a marker without its PID (ignored, and removed by
    the next write of that cpulist or by reconcile); a PID without a marker
    falls back to CMK's existence check.
    """
    old_starts = cpulist.starts
    for pid in tasks:
        start = starts.get(pid)
        if start is not None and old_starts.get(pid) != start:
            if pid in old_starts:
                _unlink(os.path.join(cpulist.path, marker_name(pid, old_starts.pop(pid))))
            _create_empty(os.path.join(cpulist.path, marker_name(pid, start)))
            old_starts[pid] = start
    if tasks != cpulist.tasks:
        atomic_write(os.path.join(cpulist.path, TASKS), format_tasks(tasks))
    for pid in [p for p in old_starts if p not in tasks]:
        _unlink(os.path.join(cpulist.path, marker_name(pid, old_starts.pop(pid))))
    cpulist._tasks = list(tasks)


def _create_empty(path: str, mode: int = MODE_FILE) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode))
    except PermissionError:
        raise StatePermissionError(f"cannot write in {os.path.dirname(path)}: permission denied") from None


def _unlink(path: str) -> None:
    try:  # noqa: SIM105 - contextlib costs ~1 ms of cmk start-up
        os.unlink(path)
    except FileNotFoundError:
        pass


# Plans -> desired state (pure) -------------------------------------------------


def desired_layout(plan: dict) -> dict[str, dict]:
    """``pool -> {"exclusive": bool, "sockets": {socket: [cpulists sorted as CMK lists them]}}``.

    Every socket of the plan gets a directory in every pool, as CMK creates
    them (an empty socket map for a pool with no CPU there).
    """
    try:
        pools = plan["pools"]
        exclusive_pools = set(plan.get("exclusive_pools", EXCLUSIVE_POOL_NAMES))
        layout = {}
        for name in sorted(pools):
            sockets = {}
            for socket, lists in pools[name].items():
                checked = []
                for cpus in lists:
                    _check_plan_cpulist(str(cpus), name, str(socket))
                    checked.append(str(cpus))
                if not _socket_ok(str(socket)):
                    raise StateError(f"plan pool {name}: socket {socket!r} is not a number", "plan")
                sockets[str(socket)] = sorted(checked)
            layout[name] = {"exclusive": name in exclusive_pools, "sockets": dict(sorted(sockets.items()))}
    except (KeyError, TypeError, AttributeError) as exc:
        raise StateError(f"plan is malformed ({exc!r}); pass the cpupools_plan fact", "plan") from None
    if not layout:
        raise StateError("plan has no pools", "plan")
    seen: dict[int, str] = {}
    for name, pool in layout.items():
        for lists in pool["sockets"].values():
            for cpus in lists:
                for cpu in cpus.split(","):
                    other = seen.setdefault(int(cpu), f"{name}:{cpus}")
                    if other != f"{name}:{cpus}":
                        raise StateError(f"plan is inconsistent: CPU {cpu} is in {other} and {name}:{cpus}", "plan")
    return layout


def _check_plan_cpulist(cpus: str, pool: str, socket: str) -> None:
    if not is_cmk_cpulist(cpus):
        raise StateError(f"plan pool {pool} socket {socket}: {cpus!r} is not a cpulist in CMK form (like 2,46)", "plan")


def desired_meta(plan: dict, layout: dict[str, dict]) -> dict:
    """What ``cpupools.json`` holds for ``plan``: hand-out order and a fingerprint of the layout."""
    import hashlib
    import json

    order = {}
    for name, pool in layout.items():
        if pool["exclusive"]:
            wanted = [str(c) for c in plan.get("handout_order", {}).get(name, [])]
            present = [c for s in pool["sockets"].values() for c in s]
            order[name] = [c for c in wanted if c in present] + sorted(c for c in present if c not in wanted)
    canonical = json.dumps({"layout": layout, "handout_order": order}, sort_keys=True, separators=(",", ":"))
    return {
        "version": META_VERSION,
        "fingerprint": hashlib.sha256(canonical.encode()).hexdigest(),
        "handout_order": order,
    }


def current_layout(pools: dict[str, Pool]) -> dict[str, dict]:
    """The layout part of a read state, in the shape of ``desired_layout``."""
    return {
        name: {
            "exclusive": pool.exclusive,
            "sockets": {s: [cl.cpus for cl in lists] for s, lists in pool.sockets.items()},
        }
        for name, pool in pools.items()
    }


def current_tasks(pools: dict[str, Pool]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """``pool -> socket -> cpulist -> PIDs`` of a read state."""
    return {
        name: {s: {cl.cpus: list(cl.tasks) for cl in lists} for s, lists in pool.sockets.items()}
        for name, pool in pools.items()
    }


def diff_layout(current: dict[str, dict], desired: dict[str, dict]) -> dict[str, list[str]]:
    """What changes between two layouts: ``added``/``removed`` ``pool/socket/cpulist`` and ``flags``."""

    def entries(layout: dict[str, dict]) -> set[str]:
        return {f"{p}/{s}/{c}" for p, pool in layout.items() for s, lists in pool["sockets"].items() for c in lists} | {
            f"{p}/{s}/" for p, pool in layout.items() for s in pool["sockets"]
        }

    cur, des = entries(current), entries(desired)
    flags = sorted(
        f"{p}: exclusive {int(current[p]['exclusive'])} -> {int(desired[p]['exclusive'])}"
        for p in current.keys() & desired.keys()
        if current[p]["exclusive"] != desired[p]["exclusive"]
    )
    return {"added": sorted(des - cur), "removed": sorted(cur - des), "flags": flags}


def resize_tasks(
    tasks: dict[str, dict[str, dict[str, list[int]]]],
    live: set[int],
    desired: dict[str, dict],
    handout: dict[str, list[str]],
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], list[dict]]:
    """Place the live tasks of the current state on the desired layout.

    Rules: an exclusive holder keeps its cpulist when the desired layout still
    has it in the same pool, else moves to a free cpulist of that pool (same
    socket first, then the hand-out order); a shared/infra task keeps that
    pool's cpulist on the same socket (or the pool's first one when that
    socket has none). Dead PIDs are dropped only from cpulists that go away;
    elsewhere they are left for ``cmk reconcile``. Returns ``(new tasks,
    moves)``; raises ``ResizeError`` naming the PIDs and the numbers when the
    live tasks do not fit, before anything is changed.
    """
    new: dict[str, dict[str, dict[str, list[int]]]] = {
        p: {s: {c: [] for c in lists} for s, lists in pool["sockets"].items()} for p, pool in desired.items()
    }
    moves: list[dict] = []
    problems: list[str] = []
    for pool_name in sorted(tasks):
        old_pool = tasks[pool_name]
        target = new.get(pool_name)
        displaced: list[tuple[str, str, list[int]]] = []  # (socket, old cpulist, live pids)
        for socket, lists in old_pool.items():
            for cpus, pids in lists.items():
                if target is not None and cpus in target.get(socket, {}):
                    target[socket][cpus] = list(pids)  # the same list: everything stays, dead or alive
                    continue
                keep = [pid for pid in pids if pid in live]
                if keep:
                    displaced.append((socket, cpus, keep))
        if not displaced:
            continue
        holders = sorted({pid for _, _, pids in displaced for pid in pids})
        if target is None or not any(target.values()):
            problems.append(
                f"pool {pool_name}: live task(s) PID {', '.join(map(str, holders))} hold "
                f"{len(displaced)} cpulist(s) but the new plan has no cpulist in pool {pool_name}"
            )
            continue
        if desired[pool_name]["exclusive"]:
            order = handout.get(pool_name) or [c for s in sorted(target) for c in target[s]]
            free = [c for c in order if any(c in target[s] and not target[s][c] for s in target)]
            socket_of = {c: s for s in target for c in target[s]}
            if len(displaced) > len(free):
                total = sum(len(v) for v in target.values())
                problems.append(
                    f"pool {pool_name}: live task(s) PID {', '.join(map(str, holders))} hold "
                    f"{len(displaced)} cpulist(s) that the new plan drops, but only {len(free)} of its "
                    f"{total} cpulist(s) are free (the others are kept by live tasks)"
                )
                continue
            for socket, cpus, pids in displaced:
                pick = next((c for c in free if socket_of[c] == socket), free[0])
                free.remove(pick)
                target[socket_of[pick]][pick] = list(pids)
                moves.extend(
                    {"pid": pid, "pool": pool_name, "from": cpus, "to": pick, "socket": socket_of[pick]} for pid in pids
                )
        else:
            for socket, cpus, pids in displaced:
                dest_socket = socket if target.get(socket) else next(s for s in sorted(target) if target[s])
                pick = next(iter(target[dest_socket]))
                for pid in pids:
                    if pid not in target[dest_socket][pick]:
                        target[dest_socket][pick].append(pid)
                moves.extend(
                    {"pid": pid, "pool": pool_name, "from": cpus, "to": pick, "socket": dest_socket} for pid in pids
                )
    if problems:
        raise ResizeError("refusing to change the pool state: " + "; ".join(problems), "plan")
    return new, moves


def affinity_changes(
    old: dict[str, dict[str, dict[str, list[int]]]], new: dict[str, dict[str, dict[str, list[int]]]], live: set[int]
) -> dict[int, list[int]]:
    """``pid -> new CPU set`` for every live PID whose assigned CPUs differ between two task maps."""

    def cpus_of(tasks: dict[str, dict[str, dict[str, list[int]]]]) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for pool in tasks.values():
            for lists in pool.values():
                for cpus, pids in lists.items():
                    for pid in pids:
                        out.setdefault(pid, set()).update(int(c) for c in cpus.split(","))
        return out

    before, after = cpus_of(old), cpus_of(new)
    return {pid: sorted(after[pid]) for pid in sorted(after) if pid in live and before.get(pid) != after[pid]}


def render_state(layout: dict[str, dict], tasks: dict[str, dict[str, dict[str, list[int]]]], meta: dict) -> str:
    """A text picture of a state (one line per pool flag and per cpulist) for ``--diff``."""
    import json

    lines = []
    for pool, spec in sorted(layout.items()):
        lines.append(f"pools/{pool}/exclusive: {int(spec['exclusive'])}")
        for socket, lists in sorted(spec["sockets"].items(), key=lambda kv: int(kv[0])):
            if not lists:
                lines.append(f"pools/{pool}/{socket}/")
            for cpus in lists:
                pids = tasks.get(pool, {}).get(socket, {}).get(cpus, [])
                lines.append(f"pools/{pool}/{socket}/{cpus}/tasks: {format_tasks(pids)}")
    if meta:
        lines.append(f"{META}: {json.dumps(meta, sort_keys=True)}")
    return "\n".join(lines) + "\n"


def write_state(
    conf_dir: str,
    layout: dict[str, dict],
    tasks: dict[str, dict[str, dict[str, list[int]]]],
    starts: dict[int, int],
    meta: dict,
    task_gid: int | None = None,
) -> None:
    """Write the whole ``pools`` tree, then swap it in; call with the state lock held.

    The new tree is built beside the old one (``<conf>/.pools.new``) and
    renamed into place, so a reader under the lock sees either the old or the
    new state, never a mix; an interrupted write leaves only a dot-directory
    that the next write removes. ``cpupools.json`` is replaced atomically
    after the swap (a stale hand-out order is harmless: unknown lists follow
    in CMK order).
    """
    import shutil

    pools_dir = os.path.join(conf_dir, POOLS)
    new_dir = os.path.join(conf_dir, ".pools.new")
    old_dir = os.path.join(conf_dir, ".pools.old")
    for stale in (new_dir, old_dir):
        shutil.rmtree(stale, ignore_errors=True)
    task_dir_mode = MODE_DIR if task_gid is None else MODE_TASK_DIR_GROUP
    task_file_mode = MODE_FILE if task_gid is None else MODE_TASK_FILE_GROUP
    os.mkdir(new_dir, MODE_DIR)
    os.chmod(new_dir, MODE_DIR)
    for pool, spec in layout.items():
        pool_dir = os.path.join(new_dir, pool)
        os.mkdir(pool_dir)
        os.chmod(pool_dir, MODE_DIR)
        atomic_write(os.path.join(pool_dir, EXCLUSIVE_FLAG), "1" if spec["exclusive"] else "0", MODE_FILE)
        for socket, lists in spec["sockets"].items():
            socket_dir = os.path.join(pool_dir, socket)
            os.mkdir(socket_dir)
            os.chmod(socket_dir, MODE_DIR)
            for cpus in lists:
                list_dir = os.path.join(socket_dir, cpus)
                os.mkdir(list_dir)
                if task_gid is not None:
                    os.chown(list_dir, -1, task_gid)
                os.chmod(list_dir, task_dir_mode)
                pids = tasks.get(pool, {}).get(socket, {}).get(cpus, [])
                atomic_write(os.path.join(list_dir, TASKS), format_tasks(pids), task_file_mode, task_gid)
                for pid in pids:
                    if pid in starts:
                        marker = os.path.join(list_dir, marker_name(pid, starts[pid]))
                        _create_empty(marker, task_file_mode)
                        if task_gid is not None:
                            os.chown(marker, -1, task_gid)
    _fsync_tree(new_dir)
    if os.path.isdir(pools_dir):
        os.rename(pools_dir, old_dir)
    os.rename(new_dir, pools_dir)
    _fsync_dir(conf_dir)
    shutil.rmtree(old_dir, ignore_errors=True)
    write_meta(conf_dir, meta)


def write_meta(conf_dir: str, meta: dict) -> None:
    import json

    atomic_write(os.path.join(conf_dir, META), json.dumps(meta, indent=2, sort_keys=True) + "\n", MODE_FILE, fsync=True)
    atomic_write(
        os.path.join(conf_dir, ORDER), format_handout_order(meta.get("handout_order", {})), MODE_FILE, fsync=True
    )


def ensure_lock_file(conf_dir: str) -> bool:
    """Create ``<conf>`` and ``<conf>/lock`` when missing; True when something was created."""
    created = False
    if not os.path.isdir(conf_dir):
        os.makedirs(conf_dir, MODE_DIR)
        created = True
    path = os.path.join(conf_dir, LOCK)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, MODE_FILE)
        os.close(fd)
        os.chmod(path, MODE_FILE)
        created = True
    return created


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(top: str) -> None:
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)


def tree_mode_problems(conf_dir: str, layout: dict[str, dict], task_gid: int | None) -> list[str]:
    """Paths whose mode or group differ from the permission model (the module repairs them)."""
    bad = []
    want_dir = MODE_DIR if task_gid is None else MODE_TASK_DIR_GROUP
    for pool, spec in layout.items():
        for socket, lists in spec["sockets"].items():
            for cpus in lists:
                path = os.path.join(conf_dir, POOLS, pool, socket, cpus)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if st.st_mode & 0o7777 != want_dir or (task_gid is not None and st.st_gid != task_gid):
                    bad.append(path)
    return bad
