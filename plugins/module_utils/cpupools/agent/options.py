"""``cmk``'s options and environment, and its exit statuses: every variable the agent reads is read here.

``CMK_PROC_FS``, ``CMK_LOCK_TIMEOUT``, ``CMK_NUM_CORES``, ``CMK_NUMA_LOCALITY``,
``CMK_ISOLATE_SHELL`` (or the node's default in ``cpupools.agent``) and
``CPUPOOLS_SYSFS_ROOT``, each checked where it is read, a bad value a usage
error (64) that names it. ``agent.py`` (the entry point and ``isolate``) and
``reconcile.py`` (``reconcile``, ``describe``, ``node-report``, ``housekeep``)
both import this module and ``state.py``; neither imports the other at module
level. Standard library only, cheap to import: ``isolate`` pays for it.
"""

from __future__ import annotations

import os

from ..core.errors import StateError, UsageError, show
from ..node import state as st

EXIT_OK = 0
EXIT_USAGE = UsageError.exit_status  # 64
EXIT_INTERNAL = 70
EXIT_OSERR = 71  # setting the CPU affinity failed, or another OS error
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

#: Longest ``--interval`` accepted: a day (``time.sleep`` refuses far larger values).
MAX_INTERVAL = 86400.0


#: Longest path (bytes) an option or variable may give: what cmk appends to it
#: (``/<pid>/task/<tid>/stat``, ``/cpupools.prom``) must stay under PATH_MAX (4,096).
MAX_PATH_BYTES = 4000
#: Longest name of one path component (NAME_MAX).
MAX_NAME_BYTES = 255


def checked_path(name: str, value: str) -> str:
    """``value`` of the path option or variable ``name``; a path the kernel would refuse is a usage error (64).

    Checked before it is used, so the refusal names ``name`` and quotes the
    value shortened, instead of an OS error ("File name too long", 71) about
    a path cmk derived from it.
    """
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise UsageError(f"{name}={show(value)}: a path of {size} bytes; at most {MAX_PATH_BYTES} are accepted")
    longest = max(len(part.encode("utf-8", "surrogateescape")) for part in value.split("/"))
    if longest > MAX_NAME_BYTES:
        raise UsageError(
            f"{name}={show(value)}: holds a name of {longest} bytes; at most {MAX_NAME_BYTES} are accepted"
        )
    return value


def conf_dir(opts: dict[str, str | bool]) -> str:
    """``--conf-dir``, default ``/etc/cmk``."""
    return checked_path("--conf-dir", str(opts.get("--conf-dir") or st.DEFAULT_CONF_DIR))


def proc_fs_of(environ: dict[str, str] | os._Environ) -> str:
    """``CMK_PROC_FS``, default ``/proc``."""
    return checked_path("CMK_PROC_FS", environ.get("CMK_PROC_FS") or "/proc")


def seconds(opts: dict[str, str | bool], name: str) -> float:
    """A ``--interval``-like option: a finite number of seconds, 0 (the default) for "once"."""
    raw = str(opts.get(name, "0"))
    try:
        value = float(raw) if len(raw) <= 32 else -1.0
    except ValueError:
        value = -1.0
    # float() takes "nan", "inf" and "1e400" (= inf); none of them is a usable interval.
    if not 0 <= value <= MAX_INTERVAL:
        raise UsageError(f"{name}={show(raw)} is not a number of seconds from 0 to {MAX_INTERVAL:g}")
    return value


def tasks_or_none(cl: st.CpuList) -> list[int] | None:
    """The cpulist's tasks, or None when its ``tasks`` file is damaged (such a list is never handed out)."""
    try:
        return cl.tasks
    except StateError:
        return None


def self_identity(proc_fs: str, doing: str, conf: str) -> tuple[int, int]:
    """Host PID and start time of this process, from ``<CMK_PROC_FS>/self/stat`` (as CMK's intel/isolate.py).

    Refused (usage error, 64) when that procfs cannot show the host's PIDs
    (``state.proc_view_problem``): a PID from a PID namespace of its own
    would be recorded wrongly, and holders it cannot see would look dead.
    ``doing`` says what is refused, for the message; ``conf`` holds the
    node's PID namespace (``state.node_pid_ns``).
    """
    try:
        stat = st.read_proc_stat(proc_fs, "self")
    except PermissionError:
        stat = None
    if stat is None:
        raise UsageError(f"CMK_PROC_FS={show(proc_fs)}: its self/stat is not readable; mount the host /proc there")
    problem = st.proc_view_problem(proc_fs, stat[0], st.node_pid_ns(conf))
    if problem is not None:
        raise UsageError(f"refusing to {doing}: {problem}")
    return stat[0], stat[2]


def lock_timeout(environ: dict[str, str] | os._Environ) -> float:
    """``CMK_LOCK_TIMEOUT`` in seconds (default 30); a bad value is a usage error."""
    raw = environ.get("CMK_LOCK_TIMEOUT")
    if raw is None or raw == "":
        return st.DEFAULT_LOCK_TIMEOUT
    try:
        value = float(raw) if len(raw) <= 32 else -1.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"CMK_LOCK_TIMEOUT={show(raw)} is not a positive number of seconds")
    return value


def num_cores(environ: dict[str, str] | os._Environ) -> int:
    """``CMK_NUM_CORES``: how many exclusive cpulists ``isolate`` takes (default 1)."""
    raw = environ.get("CMK_NUM_CORES", "") or "1"
    text = raw.strip()
    # Bounded before int(): thousands of digits would make int() itself fail.
    if not (text.isdigit() and text.isascii()) or len(text) > 9 or int(text) < 1:
        shown = raw if len(raw) <= 20 else f"{raw[:20]}... ({len(raw)} characters)"
        raise UsageError(f"CMK_NUM_CORES={shown!r}: requested numbers of cores must be a positive integer")
    return int(text)


_SWITCH = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def isolate_shell(environ: dict[str, str] | os._Environ, conf: str) -> bool:
    """Whether ``isolate`` runs its command through ``/bin/sh -c`` (CMK v1.4) instead of as argv.

    The workload's ``CMK_ISOLATE_SHELL`` decides; without it, the node's
    default ``isolate_shell`` in ``<conf>/cpupools.agent`` (written by the
    cpupools_agent role); without that, argv.
    """
    raw = environ.get("CMK_ISOLATE_SHELL", "")
    where = "CMK_ISOLATE_SHELL"
    if not raw:
        raw = st.read_agent_setting(conf, "isolate_shell")
        where = f"{os.path.join(conf, st.AGENT_SETTINGS)}: isolate_shell"
    if not raw:
        return False
    value = _SWITCH.get(raw.strip().lower())
    if value is None:
        raise UsageError(f"{where}={show(raw)}: expected 1 (run the command through /bin/sh -c) or 0")
    return value


def locality_wanted(environ: dict[str, str] | os._Environ) -> bool:
    """``CMK_NUMA_LOCALITY``: whether several exclusive cpulists are kept on one NUMA node (default 1)."""
    raw = environ.get("CMK_NUMA_LOCALITY", "")
    if not raw:
        return True
    value = _SWITCH.get(raw.strip().lower())
    if value is None:
        raise UsageError(
            f"CMK_NUMA_LOCALITY={show(raw)}: expected 1 (one NUMA node, fewest L3 caches) or 0 (hand-out order)"
        )
    return value


def sysfs_root(environ: dict[str, str] | os._Environ) -> str:
    """``CPUPOOLS_SYSFS_ROOT``: the directory whose ``sys/`` is read (default ``/``; tests point it at a fixture)."""
    return checked_path("CPUPOOLS_SYSFS_ROOT", environ.get("CPUPOOLS_SYSFS_ROOT") or "/")
