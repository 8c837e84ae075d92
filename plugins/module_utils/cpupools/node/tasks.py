"""The node's tasks as ``/proc`` shows them, and the files they are judged against: read by ``verify``
(what runs where) and the housekeeper (``housekeep``: what to move), the same way.

``Facts`` reads under a root (``/`` on a node, a fixture tree in tests); a
file that vanished or may not be read is ``None``, as tasks and IRQs come and
go while they are read. ``read_tasks`` gives every thread of every process
with the fields of ``/proc/PID/task/TID/stat`` both need, its allowed CPUs
(``Cpus_allowed_list``) and, on a Kubernetes node, the pod whose cgroup it is
in.
"""

from __future__ import annotations

import os
import re

from ..core.cpulist import parse_cpulist
from ..core.errors import CpulistError, StateError
from .state import read_state, split_proc_stat, task_alive


class Facts:
    """Reads under ``root``: a file that vanished or may not be read is ``None``
    (tasks and IRQs come and go while they are read)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel), "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError:
            return []


def kernel_cpus(text: str | None) -> list[int]:
    """A cpulist read from the kernel; ``[]`` for a missing file or ``(null)``."""
    if text is None or text.strip() in ("", "(null)"):
        return []
    return parse_cpulist(text)


def parse_allowed(status_text: str) -> list[int] | None:
    """``Cpus_allowed_list`` of ``/proc/PID/status`` text (``None`` when absent)."""
    for line in status_text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.partition(":")[2])
    return None


def parse_task_stat(text: str) -> dict:
    """The fields verify uses of ``/proc/PID/task/TID/stat``: pid (the TID), comm, state,
    ppid (field 4), flags (9), starttime (22), processor (39)."""
    pid, comm, fields = split_proc_stat(text)
    return {
        "pid": pid,
        "comm": comm,
        "state": fields[0],
        "ppid": int(fields[1]),
        "flags": int(fields[6]),
        "starttime": int(fields[19]),
        "processor": int(fields[36]) if len(fields) > 36 else None,
    }


#: A pod's cgroup, as the kubelet names it with either driver: ``kubepods-burstable-pod<uid>.slice``
#: (systemd: the UID's dashes as underscores) or ``kubepods/burstable/pod<uid>`` (cgroupfs). A static
#: pod's UID is a hash without dashes.
_UID = r"[0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12}"
_POD_CGROUP = re.compile(rf"kubepods[^\n]*?pod({_UID})")


def pod_of_cgroup(text: str) -> str:
    """The UID of the pod whose cgroup ``/proc/PID/cgroup`` names ("" for a task outside every pod)."""
    match = _POD_CGROUP.search(text)
    return match.group(1).replace("_", "-") if match else ""


def read_tasks(facts: Facts, pods: bool = False) -> list[dict]:
    """Every task (thread) of every process: its stat fields, tgid and ``allowed`` CPUs.

    ``pods``: also ``pod``, the UID of the Kubernetes pod whose cgroup the
    process is in ("" outside every pod, ``None`` when ``/proc/PID/cgroup``
    cannot be read), read once per process.
    """
    tasks = []
    for pid in facts.listdir("proc"):
        if not pid.isdigit():
            continue
        pod = None
        if pods:
            text = facts.read(f"proc/{pid}/cgroup")
            pod = None if text is None else pod_of_cgroup(text)
        for tid in facts.listdir(f"proc/{pid}/task") or [pid]:
            stat = facts.read(f"proc/{pid}/task/{tid}/stat")
            if stat is None and tid == pid:
                stat = facts.read(f"proc/{pid}/stat")
            if stat is None:
                continue
            try:
                task = parse_task_stat(stat)
            except (ValueError, IndexError):
                continue
            status = facts.read(f"proc/{pid}/task/{tid}/status") or facts.read(f"proc/{pid}/status") or ""
            try:
                task["allowed"] = parse_allowed(status)
            except CpulistError:
                task["allowed"] = None
            task["tgid"] = int(pid)
            if pods:
                task["pod"] = pod
            tasks.append(task)
    return tasks


def read_node_masks(facts: Facts) -> list[frozenset[int]]:
    """Each NUMA node's CPUs (``/sys/devices/system/node/node<N>/cpulist``)."""
    base = facts.path("sys/devices/system/node")
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return []
    return [frozenset(kernel_cpus(facts.read(f"sys/devices/system/node/{name}/cpulist"))) for name in names]


def read_cmk_held(conf_dir: str, proc_fs: str) -> tuple[list[dict], list[dict], str | None]:
    """CMK's exclusive lists that hold tasks: ``(held, stale, problem)``.

    ``held``: ``{"pool", "cpus": [...], "pids": [...]}`` for live PIDs;
    ``stale``: the same for PIDs that no longer run (a reconcile frees them).
    ``problem`` says why the state could not be read (``None`` when it could).
    """
    try:
        pools = read_state(conf_dir, strays=[], finish_swap=False)
    except (StateError, OSError) as exc:
        return [], [], str(exc)
    marked = frozenset(
        (pid, start) for pool in pools.values() for cl in pool.cpulists() for pid, start in cl.starts.items()
    )
    held, stale = [], []
    for pool in pools.values():
        if not pool.exclusive:
            continue
        for cl in pool.cpulists():
            try:
                tasks = cl.tasks
            except StateError:
                continue
            live = [pid for pid in tasks if task_alive(proc_fs, pid, cl.starts.get(pid), marked)]
            dead = [pid for pid in tasks if pid not in live]
            if live:
                held.append({"pool": pool.name, "cpus": cl.cpu_ids, "pids": live})
            if dead:
                stale.append({"pool": pool.name, "cpus": cl.cpu_ids, "pids": dead})
    return held, stale, None
