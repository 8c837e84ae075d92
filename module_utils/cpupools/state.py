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
    <conf>/cpupools.agent                                       the agent's node defaults
                                                                (``isolate_shell=0|1``)
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
#: The node agent's settings (``key=value`` lines), written by the cpupools_agent role.
AGENT_SETTINGS = "cpupools.agent"
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
                "(run the cpupools playbook, role cpupools_agent)"
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


def task_alive(proc_fs: str, pid: int, start: int | None = None) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (the isolate has exited).

    ``start``, the start time a marker recorded, does not decide: a marker
    that disagrees proves only that the process which took the list is gone,
    not that the PID holds nothing. CMK v1.4's reconcile drops a dead PID from
    ``tasks`` and leaves our marker behind; a CMK isolate that gets the same
    PID again takes the list and writes no marker. A running PID is therefore
    kept, whatever its marker says; only a PID that does not run is freed
    (docs/cmk-comparison.md, "Running next to CMK").
    """
    del start  # kept in the signature: callers pass what they recorded, see above
    stat = read_proc_stat(proc_fs, pid)
    return stat is not None and stat[1] not in ("Z", "X")


def drop_stale_markers(cpulist: CpuList, proc_fs: str) -> list[int]:
    """Remove the markers that no longer describe a task of ``cpulist``; call under the lock.

    A marker is stale when its PID is not in ``tasks`` (an orphan: CMK's
    reconcile or a crash removed the PID and not the marker) or when that PID
    runs with another start time (the process that took the list is gone; the
    PID, kept while it runs, is then a task without a marker, as CMK writes
    them). Returns the PIDs of the second kind.
    """
    tasks = cpulist.tasks
    starts = cpulist.starts
    reused = []
    for pid, start in sorted(starts.items()):
        if pid in tasks:
            stat = read_proc_stat(proc_fs, pid)
            if stat is None or stat[2] == start:
                continue  # ours and running, or dead: reconcile frees it with its marker
            reused.append(pid)
        _unlink(os.path.join(cpulist.path, marker_name(pid, start)))
        del starts[pid]
    return reused


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
            "(run the cpupools playbook, role cpupools_agent)"
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
