"""The pool state: CMK v1.4's directory layout, its lock, and how a plan changes it.

Layout under the conf dir (default ``/etc/cmk``), exactly as CMK v1.4 wrote
and read it, so CMK's own tooling still reads our state::

    <conf>/lock                                   empty file, flock()ed
    <conf>/pools/<pool>/exclusive                 "1" or "0"
    <conf>/pools/<pool>/<socket>/<cpulist>/tasks  comma-separated PIDs, no newline ("" = free)

A cpulist directory is named for its CPUs (``list_dir_name``), in the first
of three forms that fits a file name (``NAME_MAX``, 255 bytes):

* CMK's form, ids joined by commas (``2,46``); always for exclusive lists, and
  CMK's own core-by-core names (``26,70,27,71``) are read as they are;
* the compressed cpulist (``0-63,128-191``) when the comma form is longer;
* ``cpus-<count>-<digest>`` when even that is longer, with the full
  compressed cpulist in ``<cpulist>/cpus``.

Every reader goes through ``list_cpus``, which accepts exactly those forms
(a name in another form, or a range name whose comma form would have fit, is
corrupt state).

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
from stat import S_ISDIR, S_ISLNK, S_ISREG

from ..core.cpulist import format_cmk_cpulist, format_cpulist, parse_cpulist
from ..core.errors import (
    CpulistError,
    CpupoolsError,
    LockTimeoutError,
    StateError,
    StatePermissionError,
    show,
)
from ..core.names import EXCLUSIVE_POOLS

DEFAULT_CONF_DIR = "/etc/cmk"
DEFAULT_LOCK_TIMEOUT = 30.0
LOCK = "lock"
POOLS = "pools"
META = "cpupools.json"
ORDER = "cpupools.order"
#: The node agent's settings (``key=value`` lines), written by the cpupools_agent role.
AGENT_SETTINGS = "cpupools.agent"
TASKS = "tasks"
CPUS_FILE = "cpus"
#: Longest file name (bytes) of Linux file systems (ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255
HASHED_PREFIX = "cpus-"
#: Where the module builds a new tree and parks the old one during the swap.
NEW_TREE = ".pools.new"
OLD_TREE = ".pools.old"
MARKER = "task."
EXCLUSIVE_FLAG = "exclusive"
META_VERSION = 1
#: Pools whose cpulists are handed out whole (CMK derives this from the name too).
EXCLUSIVE_POOL_NAMES = EXCLUSIVE_POOLS

# Permission model (docs/agent.md "Permissions"): everything is root-owned and
# read-only for others, except the cpulist directories and their files, which
# workloads must rewrite (atomic rename needs write access to the directory).
# With a task group those are group-writable; without one only root may isolate.
MODE_DIR = 0o755
MODE_FILE = 0o644
MODE_TASK_DIR_GROUP = 0o2775
MODE_TASK_FILE_GROUP = 0o664
#: The lock: readable (so flock-able) by root and the task group only, so an
#: outsider cannot hold it and block root (docs/agent.md "Security").
MODE_LOCK = 0o600
MODE_LOCK_GROUP = 0o640
#: Temporary files: ``.<name>.<random>.tmp`` beside the file they replace.
TMP_PREFIX = "."
TMP_SUFFIX = ".tmp"
#: Largest ``tasks`` file read (a PID list of a shared pool on a big node is a few KiB).
MAX_TASKS_BYTES = 1 << 20

# Every open of a file in the state directory: never through a symlink, never
# blocking on a FIFO, never handed to a child.
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# The state directory ------------------------------------------------------------

#: Symbolic links followed while opening the state directory, at most (the kernel's MAXSYMLINKS).
MAX_SYMLINKS = 40
#: Where a descriptor's directory is reached by name: ``/proc/self/fd/<fd>``.
FD_DIR = "/proc/self/fd"
#: ``/proc/self/fd/<fd>`` -> the path it was opened as, for messages (``as_given``).
_OPENED: dict[str, str] = {}


class ConfDir:
    """The state directory, opened once; every lock, read, write and release goes through it.

    ``path`` is ``/proc/self/fd/<fd>/.``: the kernel resolves it to the
    directory this descriptor holds, whatever has become of the name since
    (renamed, replaced by another tree or by a symlink), as ``openat(fd, ...)``
    does. Every path under it (``<path>/lock``, ``<path>/pools/...``) is
    therefore in the one tree that was opened: a conf dir replaced while an
    isolate runs can never split that isolate between two trees (it takes
    and gives back its lists in the tree it opened), and the code below keeps
    taking paths. ``given_path`` is the path as given, for messages (``as_given()``).
    """

    __slots__ = ("fd", "given_path", "path")

    def __init__(self, fd: int, given_path: str) -> None:
        self.fd = fd
        self.given_path = given_path
        # "/." at the end: the last name of a path is then ".", not the magic link, so the O_NOFOLLOW
        # opens of the state code (open_dir) open the directory itself.
        self.path = f"{FD_DIR}/{fd}/."
        _OPENED[self.path] = given_path

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ConfDir:
        return self

    def __exit__(self, _type: object, exc: object, _tb: object) -> None:
        """Close; an error on the way out names the path as given, not ``/proc/self/fd/<fd>``."""
        self.close()
        if isinstance(exc, CpupoolsError) and exc.args and isinstance(exc.args[0], str):
            exc.args = (as_given(exc.args[0]), *exc.args[1:])


class MissingStateDir(StateError):
    """The state directory (or a directory on its way) does not exist."""


def as_given(text: str) -> str:
    """``text`` with every ``/proc/self/fd/<fd>`` of an opened state directory replaced by the path it was opened as."""
    for handle in sorted(_OPENED, key=len, reverse=True):
        if handle in text:
            text = text.replace(handle, _OPENED[handle])
    return text


def _others_may_write(info: os.stat_result, me: int) -> bool:
    """Whether someone but root and ``me`` may add, rename or remove names in this directory."""
    return info.st_uid not in (0, me) or bool(info.st_mode & 0o002) or bool(info.st_mode & 0o020 and info.st_gid != 0)


def open_conf(path: str, create: bool = False) -> ConfDir:
    """Open the state directory ``path`` once, refusing one that others could have planted.

    Walks ``path`` from ``/`` one name at a time (``openat`` with
    ``O_NOFOLLOW | O_DIRECTORY``). The state directory itself, and every
    directory on the way that sits in a directory someone else may write
    (not owned by root or the caller, world-writable, or group-writable by a
    group other than root's: ``/tmp``, a user's home), must be a real
    directory (not a symlink) owned by root (or by the caller, who can only
    hurt themselves). Elsewhere a symlink is followed: only root could have
    made it (``/var/run``). So a task-group member who plants the conf dir as
    a symlink, or as a directory of their own, in ``/tmp`` gets it refused
    before root reads or writes anything there. ``create`` makes the missing
    directories (mode 0755), as the state module does. Raises ``StateError``
    (``conf_dir``) naming the path and what is wrong with it.
    """
    given = os.path.abspath(path)
    me = os.geteuid()
    parts = [p for p in given.split("/") if p]
    fd = os.open("/", _O_DIR)
    try:
        parent = os.fstat(fd)
        current = "/"
        hops = 0
        while parts:
            name = parts.pop(0)
            last = not parts
            here = os.path.join(current, name)
            if name == ".":
                continue
            if name == "..":
                old, fd = fd, -1
                fd = _step_into(old, "..", here, given)
                parent = os.fstat(fd)
                current = os.path.dirname(current) or "/"
                continue
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    gap = "" if here == given else f" ({here} does not exist)"
                    raise MissingStateDir(
                        f"state directory {given} is missing{gap}: the pool state is not installed "
                        "(run the cpupools playbook, role cpupools_agent)",
                        "conf_dir",
                    ) from None
                try:  # noqa: SIM105 - contextlib costs ~1 ms of cmk start-up
                    os.mkdir(name, MODE_DIR, dir_fd=fd)
                except FileExistsError:
                    pass
                parts.insert(0, name)  # look again at what is there now
                continue
            except PermissionError:
                raise _denied(given, here) from None
            exposed = last or _others_may_write(parent, me)
            where = "" if last else f" in {current}, which others can write"
            if S_ISLNK(info.st_mode):
                hops += 1
                if exposed or hops > MAX_SYMLINKS:
                    why = "is a symlink" if exposed else f"is one of more than {MAX_SYMLINKS} symlinks"
                    raise StateError(f"refusing the state directory {given}: {here} {why}{where}", "conf_dir")
                target = os.readlink(name, dir_fd=fd)
                parts[:0] = [p for p in target.split("/") if p]
                if target.startswith("/"):
                    os.close(fd)
                    fd = -1
                    fd = os.open("/", _O_DIR)
                    parent = os.fstat(fd)
                    current = "/"
                continue
            if not S_ISDIR(info.st_mode):
                raise StateError(f"refusing the state directory {given}: {here} is not a directory", "conf_dir")
            if exposed and info.st_uid not in (0, me):
                raise StateError(
                    f"refusing the state directory {given}: {here} is owned by uid {info.st_uid}, not root{where}",
                    "conf_dir",
                )
            old, fd = fd, -1
            fd = _step_into(old, name, here, given, (info.st_dev, info.st_ino))
            parent = os.fstat(fd)
            current = here
        handle = ConfDir(fd, given)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    try:
        reached = os.stat(handle.path)
    except OSError:
        reached = None
    if reached is None or (reached.st_dev, reached.st_ino) != (parent.st_dev, parent.st_ino):
        handle.close()
        raise StateError(f"cannot reach the state directory {given} through {FD_DIR}: is /proc mounted?", "conf_dir")
    return handle


def _step_into(fd: int, name: str, here: str, given: str, expect: tuple[int, int] | None = None) -> int:
    """Open ``name`` in the directory ``fd`` (no symlink followed), close ``fd``; the new descriptor.

    ``expect`` is the ``(st_dev, st_ino)`` the caller checked: a name swapped
    in between is refused rather than used.
    """
    try:
        new = os.open(name, _O_DIR, dir_fd=fd)
    except PermissionError:
        raise _denied(given, here) from None
    except OSError:  # ELOOP, ENOTDIR: replaced meanwhile
        raise _changed(given, here) from None
    finally:
        os.close(fd)
    if expect is not None:
        info = os.fstat(new)
        if (info.st_dev, info.st_ino) != expect:
            os.close(new)
            raise _changed(given, here)
    return new


def _denied(given: str, here: str) -> StatePermissionError:
    return StatePermissionError(f"cannot open the state directory {given}: {here}: permission denied")


def _changed(given: str, here: str) -> StateError:
    return StateError(f"refusing the state directory {given}: {here} changed while it was opened", "conf_dir")


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
            self.fd = os.open(self.path, _O_READ)
        except FileNotFoundError:
            raise StateError(
                f"state lock {self.path} is missing: the pool state is not installed "
                "(run the cpupools playbook, role cpupools_agent)"
            ) from None
        except PermissionError:
            raise StatePermissionError(f"cannot open state lock {self.path}: permission denied") from None
        except OSError:  # ELOOP: a symlink
            raise StateError(f"state is corrupt: state lock {self.path} is not a regular file") from None
        if not S_ISREG(os.fstat(self.fd).st_mode):  # a FIFO or a device: flock would not mean anything
            os.close(self.fd)
            self.fd = -1
            raise StateError(f"state is corrupt: state lock {self.path} is not a regular file")
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


# Processes -------------------------------------------------------------------


def split_proc_stat(text: str) -> tuple[int, str, list[str]]:
    """``(pid, comm, fields)`` of ``/proc/<pid>/stat`` text; ``fields[0]`` is field 3 (state).

    The command name (field 2) may hold spaces and parentheses, so fields are
    counted from the last ``)``: field N of proc(5) is ``fields[N - 3]``.
    """
    head, _, rest = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    return int(pid), comm, rest.split()


def parse_proc_stat(text: str) -> tuple[int, str, int]:
    """``(pid, state, starttime)`` from ``/proc/<pid>/stat`` text; ``starttime``
    is field 22 (clock ticks since boot)."""
    pid, _, fields = split_proc_stat(text)
    return pid, fields[0], int(fields[19])


def read_proc_stat(proc_fs: str, pid: int | str) -> tuple[int, str, int] | None:
    """Parsed ``<proc_fs>/<pid>/stat``, or None when the process does not exist.

    ``PermissionError`` (a ``hidepid`` procfs) is raised: a process the caller
    may not see is not a dead one.
    """
    try:
        with open(f"{proc_fs}/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    try:
        return parse_proc_stat(text)
    except (ValueError, IndexError):
        return None


def task_alive(
    proc_fs: str, pid: int, start: int | None = None, marked: frozenset[tuple[int, int]] = frozenset()
) -> bool:
    """True while the task entry ``pid`` (recorded with marker ``start``) may be held by a running process.

    A PID that does not run is dead; a zombie too (the isolate has exited).
    A marker that disagrees with the running process's start time proves
    only that the process which took the list is gone, not that the PID
    holds nothing: CMK v1.4's reconcile drops a dead PID from ``tasks`` and
    leaves our marker behind, and a CMK isolate that gets the same PID again
    takes the list and writes no marker. So a running PID is kept whatever
    its marker says (docs/cmk-comparison.md, "Running next to CMK"), with
    one exception that is proof rather than a guess: when ``marked`` (every
    ``(pid, start)`` our markers name, over all lists) holds the running
    process's own start time, that process is one of our isolates, which
    marks every list it takes, so an entry of its PID with another start, or
    with none, belongs to an earlier process and is dead. A process the
    procfs will not show (``PermissionError``) counts as alive: never free a
    list on a guess.
    """
    try:
        stat = read_proc_stat(proc_fs, pid)
    except PermissionError:
        return True
    if stat is None or stat[1] in ("Z", "X"):
        return False
    return start == stat[2] or (pid, stat[2]) not in marked


#: Inode of the initial PID namespace (``PROC_PID_INIT_INO`` in the kernel, fixed).
INIT_PID_NS_INO = 0xEFFFFFFC


def parse_nspid(status_text: str) -> list[int]:
    """The ``NSpid:`` line of ``/proc/<pid>/status``: the PID in each namespace, outermost first."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def read_agent_setting(conf: str, key: str) -> str:
    """The value of ``key`` in ``<conf>/cpupools.agent`` (``key=value`` lines), "" when unset or no file."""
    path = os.path.join(conf, AGENT_SETTINGS)
    value = ""
    try:
        with open(path, "rb") as handle:
            # Bytes decoded here rather than a text file: opening one in ASCII imports its codec (0.2 ms of isolate).
            lines = handle.read().decode("ascii").replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            name, eq, text = line.partition("=")
            if eq and name.strip() == key:
                value = text.strip()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    return value


def node_pid_ns(conf: str) -> int | None:
    """The inode of the node's PID namespace as the cpupools_agent role recorded it (``node_pid_ns``), or None.

    On a real node it is the initial namespace; on a node that is itself a
    container (kind, a molecule instance) it is that container's, in which
    the reconcile timer and every holder's PID live.
    """
    raw = read_agent_setting(conf, "node_pid_ns")
    return int(raw) if raw.isdigit() and len(raw) < 20 else None


def proc_view_problem(proc_fs: str, pid: int, node_ns: int | None = None) -> str | None:
    """Why ``proc_fs`` cannot judge whether the state's tasks are alive, or None.

    ``pid`` is what the caller read as its own PID from ``<proc_fs>/self``.
    The state holds the node's PIDs, so the procfs must show the node's PID
    namespace (the initial one, or ``node_ns`` when the node is itself a
    container) and every process in it:

    * the caller in a PID namespace of its own whose procfs shows only that
      namespace (``NSpid`` has one entry while the namespace is neither the
      initial one nor the node's): its PID and its view of the others are
      not the node's;
    * ``hidepid``: PID 1 (the host's init, owned by root) is not visible, so
      other users' holders would look dead.
    """
    try:
        with open(f"{proc_fs}/self/status", "rb") as handle:
            nspid = parse_nspid(handle.read().decode("ascii", "replace"))
        ns_ino = os.stat(f"{proc_fs}/self/ns/pid").st_ino
    except (OSError, ValueError):
        nspid, ns_ino = [], INIT_PID_NS_INO  # an old kernel or a fake procfs: nothing to compare
    shown = show(proc_fs)
    if len(nspid) == 1 and ns_ino not in (INIT_PID_NS_INO, node_ns):
        return (
            f"CMK_PROC_FS={shown} shows only the PID namespace cmk runs in (its PID there is {pid}), not the host's: "
            "mount the host /proc and set CMK_PROC_FS to it"
        )
    if nspid and nspid[0] != pid:
        return f"CMK_PROC_FS={shown}: its self/status gives PID {nspid[0]}, its self/stat gives {pid}"
    try:
        visible = read_proc_stat(proc_fs, 1) is not None
    except PermissionError:
        visible = False
    if not visible:
        return (
            f"CMK_PROC_FS={shown} hides other users' processes (PID 1 is not visible: hidepid?), so live holders "
            "would look dead: mount a procfs without hidepid and set CMK_PROC_FS to it"
        )
    return None


# Reading ---------------------------------------------------------------------


class CpuList:
    """One cpulist directory; ``tasks`` and ``starts`` are read on first use.

    ``name`` is the directory name; ``cpus`` the CPUs in CMK's comma form
    (the name itself when it is in that form, so CMK's core-by-core order is
    kept), which is what ``CMK_CPUS_*`` and ``describe`` show.
    """

    __slots__ = ("_starts", "_tasks", "cpus", "name", "path", "pool", "socket")

    def __init__(self, pool: str, socket: str, cpus: str, path: str, name: str | None = None) -> None:
        self.pool = pool
        self.socket = socket
        self.cpus = cpus
        self.name = cpus if name is None else name
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


def _read_text(path: str, dir_fd: int | None = None, limit: int = MAX_TASKS_BYTES) -> str:
    """Text of the regular file ``path`` (relative to ``dir_fd`` when given).

    Opened without following a symlink and without blocking on a FIFO, then
    checked with ``fstat``: a symlink, FIFO, directory, device or a file with
    other hard links is refused, so root never reads (nor reports) a file
    outside the state directory. Messages name the path, never the content.
    """
    try:
        fd = os.open(path, _O_READ, dir_fd=dir_fd)
    except FileNotFoundError:
        raise StateError(f"state is corrupt: {path} is missing") from None
    except PermissionError:
        raise StatePermissionError(f"cannot read {path}: permission denied") from None
    except OSError:  # ELOOP: a symlink
        raise StateError(f"state is corrupt: {path} is not a regular file") from None
    try:
        info = os.fstat(fd)
        if not S_ISREG(info.st_mode):
            kind = "a directory" if S_ISDIR(info.st_mode) else "not a regular file"
            raise StateError(f"state is corrupt: {path} is {kind}")
        if info.st_nlink != 1:
            raise StateError(f"state is corrupt: {path} has {info.st_nlink} hard links (expected 1)")
        data = os.read(fd, min(info.st_size, limit) + 1)  # one more: a file that grew beyond the limit
    finally:
        os.close(fd)
    if len(data) > limit:
        raise StateError(f"state is corrupt: {path} is larger than {limit} bytes")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
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
    """CMK's tasks file: comma-separated PIDs, ``""`` when free.

    The error names ``where`` but does not quote the text: it may be a file
    the caller was tricked into reading.
    """
    text = text.strip()
    if not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not item.isascii() or len(item) > 10:
            raise StateError(f"state is corrupt: {where} holds something else; expected comma-separated PIDs")
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


def live_tree(conf_dir: str, finish: bool = True) -> str:
    """The directory that holds the pools: ``<conf>/pools``, or the new tree of an interrupted swap.

    The module swaps a changed layout in with two renames (``pools`` ->
    ``.pools.old``, then ``.pools.new`` -> ``pools``), and starts them only
    once the new tree is complete and fsynced. A kill between the two leaves
    ``pools`` missing beside both trees; the new one is then the state (it
    was written under the lock from the state of that moment, and nothing
    could change it since). Whoever comes next finishes the swap; a caller
    that may not rename in ``<conf>`` (a task-group member) reads and writes
    the new tree in place, and the next root run renames it. ``finish=False``
    only says where the state is (check mode). Call with the state lock held.
    """
    pools = os.path.join(conf_dir, POOLS)
    if os.path.lexists(pools):
        return pools
    new = os.path.join(conf_dir, NEW_TREE)
    if not (os.path.isdir(new) and os.path.isdir(os.path.join(conf_dir, OLD_TREE))):
        return pools  # no swap was under way: a fresh .pools.new alone may be incomplete
    if not finish:
        return new
    try:
        os.rename(new, pools)
    except OSError:
        return new
    return pools


def read_state(
    conf_dir: str,
    only_pools: tuple[str, ...] | None = None,
    strays: list[str] | None = None,
    finish_swap: bool = True,
) -> dict[str, Pool]:
    """Read the layout under ``conf_dir`` (pool -> Pool), validating every name.

    ``only_pools`` reads just those pools' sockets and cpulists (the others
    get empty socket maps), which keeps ``cmk isolate`` fast. Task files are read
    lazily. Anything that is not CMK's layout raises ``StateError`` naming
    the path; with a ``strays`` list, a stray pool, socket or cpulist entry
    (anything that is not part of CMK's layout, a cpulist name in none of the
    three forms included) is appended to it (one line naming the path) and
    skipped instead, so one stray entry does not take the whole state down.
    """
    pools_dir = live_tree(conf_dir, finish_swap)
    if not os.path.isdir(pools_dir):
        if os.path.lexists(pools_dir):
            raise StateError(f"state is corrupt: {pools_dir} is not a directory")
        raise StateError(
            f"state directory {pools_dir} is missing: the pool state is not installed "
            "(run the cpupools playbook, role cpupools_agent)"
        )

    def stray(message: str) -> None:
        if strays is None:
            raise StateError(f"state is corrupt: {message}")
        strays.append(message)

    pools: dict[str, Pool] = {}
    for name in _listdir(pools_dir):
        if name.startswith("."):
            continue  # a temporary tree of an interrupted write (never CMK's)
        pool_path = os.path.join(pools_dir, name)
        flag_path = os.path.join(pool_path, EXCLUSIVE_FLAG)
        try:
            if not os.path.isdir(pool_path) or os.path.islink(pool_path):
                raise StateError(f"state is corrupt: {pool_path} is not a pool directory")
            flag = _read_text(flag_path, limit=16).strip()
            if flag not in ("0", "1"):
                raise StateError(f"state is corrupt: {flag_path} holds something else; expected 1 or 0")
        except StatePermissionError:
            raise
        except StateError as exc:
            stray(str(exc).removeprefix("state is corrupt: "))
            continue
        sockets: dict[str, list[CpuList]] = {}
        if only_pools is None or name in only_pools:
            for socket in _listdir(pool_path):
                if socket == EXCLUSIVE_FLAG:
                    continue
                socket_path = os.path.join(pool_path, socket)
                if not _socket_ok(socket) or not os.path.isdir(socket_path) or os.path.islink(socket_path):
                    stray(f"{socket_path} is not a socket directory (name must be a number)")
                    continue
                lists = []
                for entry in _listdir(socket_path):
                    list_path = os.path.join(socket_path, entry)
                    try:
                        cpus = list_cpus(entry, list_path)
                    except StatePermissionError:
                        raise
                    except StateError as exc:
                        stray(str(exc).removeprefix("state is corrupt: "))
                        continue
                    lists.append(CpuList(name, socket, cpus, list_path, entry))
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


def list_dir_name(cpus: list[int] | tuple[int, ...]) -> str:
    """The directory name of a cpulist of ``cpus``: the first of CMK's comma form,
    the compressed cpulist, and ``cpus-<count>-<digest>`` that fits ``NAME_MAX``."""
    comma = format_cmk_cpulist(cpus)
    if len(comma) <= NAME_MAX:
        return comma
    compressed = format_cpulist(cpus)
    if len(compressed) <= NAME_MAX:
        return compressed
    import hashlib

    return f"{HASHED_PREFIX}{len(set(cpus))}-{hashlib.sha256(compressed.encode()).hexdigest()[:16]}"


def list_cpus(name: str, path: str) -> str:
    """The CPUs (CMK's comma form) of the cpulist directory ``path`` named ``name``.

    The one reader of the three name forms (see the module docstring). A
    name in another form, or one that is not the name ``list_dir_name``
    gives its CPUs (a range name whose comma form fits, a digest that does not
    match ``cpus``), is corrupt state.
    """
    if not os.path.isdir(path) or os.path.islink(path):
        raise StateError(f"state is corrupt: {path} is not a directory")
    if is_cmk_cpulist(name):
        cpus = name
    else:
        if name.startswith(HASHED_PREFIX):
            try:
                cpu_ids = parse_cpulist(_read_text(os.path.join(path, CPUS_FILE)))
            except (StateError, CpulistError):  # a missing, unreadable or malformed cpus file
                cpu_ids = []
        else:
            try:
                cpu_ids = parse_cpulist(name)
            except CpulistError:
                cpu_ids = []
        if not cpu_ids or list_dir_name(cpu_ids) != name:
            raise StateError(f"state is corrupt: {path} is not a cpulist directory (expected a name like 2,46)")
        cpus = format_cmk_cpulist(cpu_ids)
    return cpus


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
    (and ``re`` with it) would cost ``cmk isolate`` several milliseconds. Read
    like every state file (no symlink, no FIFO, a regular file).
    """
    path = os.path.join(conf_dir, ORDER)
    if not os.path.lexists(path):
        return []
    try:
        text = _read_text(path)
    except StatePermissionError:
        raise
    except StateError:
        raise StateError(f"state is corrupt: {path} is not readable text") from None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == pool:
            return fields[1:]
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


def open_dir(path: str) -> int:
    """A descriptor of the directory ``path`` (not through a symlink), for the ``*at`` calls below."""
    try:
        return os.open(path, _O_DIR)
    except FileNotFoundError:
        raise StateError(f"state is corrupt: {path} is missing") from None
    except PermissionError:
        raise StatePermissionError(f"cannot open {path}: permission denied") from None
    except OSError:  # ENOTDIR, ELOOP
        raise StateError(f"state is corrupt: {path} is not a directory") from None


def is_temporary(name: str) -> bool:
    """A temporary file of ``atomic_write`` (``.<name>.<random>.tmp``)."""
    return name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)


def _new_file(dir_fd: int, name: str, where: str) -> tuple[int, str]:
    """Create a temporary file for ``name`` in ``dir_fd``: ``(fd, its name)``.

    ``O_EXCL | O_NOFOLLOW`` with a random name: a file, FIFO or symlink planted
    under any name makes the create fail, never redirects it.
    """
    for _ in range(8):
        tmp = f"{TMP_PREFIX}{name}.{os.urandom(6).hex()}{TMP_SUFFIX}"
        try:
            return os.open(tmp, _O_NEW, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
        except PermissionError:
            raise StatePermissionError(f"cannot write in {where}: permission denied") from None
    raise StateError(f"cannot create a temporary file in {where}: every name tried exists")


def _file_mode(dir_fd: int) -> int:
    """The mode a file in this directory gets: group-writable in a group-writable (cpulist) directory.

    Derived from the directory, which only root can change, never from the
    file being replaced, which a task-group member may have planted.
    """
    return MODE_TASK_FILE_GROUP if os.fstat(dir_fd).st_mode & 0o020 else MODE_FILE


def atomic_write(
    path: str,
    text: str | bytes,
    mode: int | None = None,
    gid: int | None = None,
    fsync: bool = False,
    dir_fd: int | None = None,
) -> None:
    """Replace ``path`` by a file holding ``text`` (ASCII, or bytes as they are): temporary file in the
    same directory, then rename.

    Everything happens relative to a descriptor of the directory (``dir_fd``,
    or one opened here without following a symlink): the temporary file is
    created with a random name, ``O_EXCL | O_NOFOLLOW``, mode 0600, then given
    ``mode`` (default: 0664 in a group-writable directory, else 0644) and
    ``gid``, and renamed over ``path``. ``rename`` replaces whatever entry is
    there (a planted symlink is replaced, its target untouched). A temporary
    file left by a crash is removed by ``cmk reconcile`` (``is_temporary``).
    """
    directory, name = os.path.split(path)
    own_fd = dir_fd is None
    dfd = open_dir(directory or ".") if dir_fd is None else dir_fd
    try:
        if mode is None:
            mode = _file_mode(dfd)
        fd, tmp = _new_file(dfd, name, directory)
        try:
            try:
                data = text if isinstance(text, bytes) else text.encode("ascii")
                while data:  # a short write (a signal, a nearly full file system) goes on where it stopped
                    data = data[os.write(fd, data) :]
                if gid is not None:
                    os.fchown(fd, -1, gid)
                os.fchmod(fd, mode)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            try:  # noqa: SIM105 - contextlib costs ~1 ms of cmk start-up
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(exc, IsADirectoryError):
                raise StateError(f"state is corrupt: {path} is a directory") from None
            raise
    finally:
        if own_fd:
            os.close(dfd)


def write_tasks(cpulist: CpuList, tasks: list[int], starts: dict[int, int]) -> None:
    """Record ``tasks`` for one cpulist (CMK's format) and the start times of new PIDs.

    ``tasks`` is replaced atomically. Markers of added PIDs are created
    before it is written and markers of removed PIDs deleted after, so a crash
    in between leaves only a marker without its PID (ignored, and removed by
    the next write of that cpulist or by reconcile); a PID without a marker
    falls back to CMK's existence check. All of it relative to one descriptor
    of the cpulist directory.
    """
    dfd = open_dir(cpulist.path)
    try:
        old_starts = cpulist.starts
        current = cpulist.tasks
        for pid in tasks:
            start = starts.get(pid)
            if start is None:
                continue
            if old_starts.get(pid) != start:
                if pid in old_starts:
                    _unlink_at(dfd, marker_name(pid, old_starts.pop(pid)))
                _create_marker(dfd, marker_name(pid, start), cpulist.path)
                old_starts[pid] = start
            elif pid not in current:  # a marker of that name is there already (left over, or planted)
                _create_marker(dfd, marker_name(pid, start), cpulist.path)
        if tasks != current:
            atomic_write(os.path.join(cpulist.path, TASKS), format_tasks(tasks), dir_fd=dfd)
        for pid in [p for p in old_starts if p not in tasks]:
            _unlink_at(dfd, marker_name(pid, old_starts.pop(pid)))
    finally:
        os.close(dfd)
    cpulist._tasks = list(tasks)


class PreparedTasks:
    """A replacement ``tasks`` file of one cpulist, written (and flushed, unless empty) before the lock is taken.

    ``cmk reconcile`` prepares these for many lists outside the lock, so that
    under the lock only a read and a rename remain per list (``commit``): the
    slow part of a write (creating the file, its data reaching the disk) never
    delays an isolate waiting for the lock, even on a busy disk, and neither
    does freeing the file replaced (``commit``).
    """

    __slots__ = ("base", "dev_ino", "dfd", "markers", "path", "tasks", "tmp")

    def __init__(self, path: str, base: list[int], tasks: list[int]) -> None:
        self.path = path
        self.base = list(base)
        self.tasks = list(tasks)
        self.markers: list[str] = []  # of the PIDs removed by commit, deleted by close
        self.tmp = ""
        self.dfd = open_dir(path)
        try:
            info = os.fstat(self.dfd)
            self.dev_ino = (info.st_dev, info.st_ino)
            fd, self.tmp = _new_file(self.dfd, TASKS, path)
            try:
                data = format_tasks(tasks).encode("ascii")
                os.write(fd, data)
                os.fchmod(fd, _file_mode(self.dfd))
                # The flush is here, outside the lock, so that the rename under it has no data to wait for
                # (not for a power loss, after which every task is dead anyway). A list all of whose PIDs
                # died gets an empty file: no data, nothing for the rename to wait for, no flush (one per
                # list was half of a 10,000-list pass).
                if data:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            if self.tmp:
                _unlink_at(self.dfd, self.tmp)
            os.close(self.dfd)
            raise

    def current(self) -> tuple[list[int], list[str]] | None:
        """Under the lock: ``(tasks, names)`` of the list now, or None when its directory was replaced.

        None also when the prepared file is gone (another reconcile removed it
        as a crash leftover): the caller then writes the list the plain way.
        """
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return None
        if (info.st_dev, info.st_ino) != self.dev_ino:
            return None  # the module swapped the tree in meanwhile
        names = os.listdir(self.dfd)
        if self.tmp not in names:
            return None
        return parse_tasks(_read_text(TASKS, dir_fd=self.dfd), os.path.join(self.path, TASKS)), names

    def commit(self) -> bool:
        """Under the lock, after ``current`` showed ``base``: put the prepared file in as ``tasks``.

        ``renameat2(RENAME_EXCHANGE)`` swaps the two names, so the file
        replaced lives on under the temporary name and ``close`` frees it,
        after the lock: freeing its data block was most of a rename's cost
        on a journalled file system (220-290 us against 20 for the swap, on
        this project's CI disk). ``tasks`` never has a second name, which
        every reader refuses as planted (``_read_text``), and a kill after
        the swap leaves only a temporary file for the next pass to remove.
        Where the C library, kernel or file system cannot swap, a rename.
        """
        try:
            if not _exchange_at(self.dfd, self.tmp, TASKS):
                os.rename(self.tmp, TASKS, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
                self.tmp = ""
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        """Remove the temporary file (the prepared one, or after a swap the one replaced) and ``markers``;
        release the directory.

        Needs no lock: a marker names one process (PID and start time), dead
        here, so no isolate can have written the same name meanwhile.
        """
        if self.tmp:
            _unlink_at(self.dfd, self.tmp)
            self.tmp = ""
        for name in self.markers:
            _unlink_at(self.dfd, name)
        self.markers = []
        os.close(self.dfd)


#: ``renameat2``'s flag that swaps two names atomically (Linux 3.15; ext4, XFS, Btrfs, tmpfs).
_RENAME_EXCHANGE = 2
#: ``(renameat2, get_errno)`` of the C library once looked up; False when it has none or the swap is not supported.
_renameat2: tuple | bool | None = None


def _exchange_at(dir_fd: int, name: str, other: str) -> bool:
    """Swap the entries ``name`` and ``other`` of ``dir_fd`` atomically; False when that cannot be done here.

    False (and never tried again by this process) when the C library has no
    ``renameat2`` (glibc before 2.28, some musl builds), Python has no
    ``ctypes``, or the kernel or file system does not know the flag; False
    for this call on any other failure but a missing name: the caller then
    renames, as before the swap, and meets the same error where it is real.
    ``FileNotFoundError`` when either name is gone. ``ctypes`` is imported
    only here: the lists ``cmk reconcile`` frees are its only caller.
    """
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes

            call = ctypes.CDLL(None, use_errno=True).renameat2
            call.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
            call.restype = ctypes.c_int
            _renameat2 = (call, ctypes.get_errno)
        except (ImportError, OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    call, get_errno = _renameat2
    if call(dir_fd, os.fsencode(name), dir_fd, os.fsencode(other), _RENAME_EXCHANGE) == 0:
        return True
    import errno

    number = get_errno()
    if number == errno.ENOENT:
        raise FileNotFoundError(number, os.strerror(number))
    if number in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _renameat2 = False
    return False


def _create_marker(dir_fd: int, name: str, where: str, mode: int | None = None) -> None:
    """Create the empty marker ``name`` in ``dir_fd`` unless a regular file of that name is there.

    ``O_EXCL | O_NOFOLLOW``: a symlink or FIFO planted under the marker's name
    is removed and the marker created in its place; nothing outside the
    directory is ever created or opened.
    """
    for _ in range(2):
        try:
            fd = os.open(name, _O_NEW, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if S_ISREG(info.st_mode):
                return
            if S_ISDIR(info.st_mode):
                raise StateError(f"state is corrupt: {where}/{name} is a directory") from None
            _unlink_at(dir_fd, name)
            continue
        except PermissionError:
            raise StatePermissionError(f"cannot write in {where}: permission denied") from None
        try:
            os.fchmod(fd, _file_mode(dir_fd) if mode is None else mode)
        finally:
            os.close(fd)
        return
    raise StateError(f"state is corrupt: {where}/{name} keeps being replaced")


def _create_empty(path: str, mode: int = MODE_FILE) -> None:
    """Create the empty file ``path`` (a marker) without following a planted symlink."""
    directory, name = os.path.split(path)
    dfd = open_dir(directory)
    try:
        _create_marker(dfd, name, directory, mode)
    finally:
        os.close(dfd)


def _unlink_at(dir_fd: int, name: str) -> None:
    try:  # noqa: SIM105 - contextlib costs ~1 ms of cmk start-up
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
