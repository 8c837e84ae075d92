"""Converge the pool state directory on a plan, keeping the tasks of running workloads.

The applier behind the ``cpupools_state`` module (the node agent never
imports this file). Everything that must agree happens under the state
lock: read the current state, check which tasks are alive, place them on the
new layout (``state.resize_tasks``), refuse before any write when they do
not fit, write the new tree in one swap, then re-pin moved workloads.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from . import state as st
from .errors import ResizeError, StateError


def process_tree(proc_fs: str, pid: int) -> list[int]:
    """``pid`` and all its descendants (by parent PID in ``<proc_fs>/<n>/stat``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc_fs):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_fs}/{name}/stat", "rb") as handle:
                text = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in out:
            continue
        out.append(current)
        todo.extend(children.get(current, []))
    return sorted(out)


def set_affinity_tree(proc_fs: str, pid: int, cpus: list[int]) -> list[int]:
    """Pin every thread of ``pid`` and of its descendants to ``cpus``; return the thread ids pinned.

    The recorded PID is the ``cmk isolate`` process; the workload is its
    child, so the whole tree is re-pinned. Threads that exit meanwhile are skipped.
    """
    pinned = []
    for proc in process_tree(proc_fs, pid):
        try:
            threads = [int(t) for t in os.listdir(f"{proc_fs}/{proc}/task") if t.isdigit()]
        except OSError:
            continue
        for tid in threads:
            try:
                os.sched_setaffinity(tid, cpus)
                pinned.append(tid)
            except (ProcessLookupError, PermissionError):
                continue
    return sorted(pinned)


def _tasks_and_starts(pools: dict[str, st.Pool]) -> tuple[dict, dict[int, int]]:
    tasks = st.current_tasks(pools)
    starts: dict[int, int] = {}
    for pool in pools.values():
        for cl in pool.cpulists():
            starts.update(cl.starts)
    return tasks, starts


def _live(tasks: dict, starts: dict[int, int], proc_fs: str) -> set[int]:
    pids = {pid for pool in tasks.values() for lists in pool.values() for pids in lists.values() for pid in pids}
    return {pid for pid in pids if st.task_alive(proc_fs, pid, starts.get(pid))}


def _holders(tasks: dict, live: set[int]) -> list[str]:
    return [
        f"PID {pid} on {pool}:{cpus}"
        for pool, sockets in sorted(tasks.items())
        for lists in sockets.values()
        for cpus, pids in sorted(lists.items())
        for pid in pids
        if pid in live
    ]


def _order_text(conf_dir: str) -> str | None:
    try:
        with open(os.path.join(conf_dir, st.ORDER), encoding="ascii") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def converge(
    conf_dir: str,
    plan: dict | None,
    *,
    present: bool = True,
    force: bool = False,
    task_gid: int | None = None,
    proc_fs: str = "/proc",
    lock_timeout: float = st.DEFAULT_LOCK_TIMEOUT,
    check_mode: bool = False,
    update_affinity: bool = True,
) -> dict:
    """Make ``conf_dir`` hold ``plan``'s state (or nothing when not ``present``).

    Returns ``changed``, ``before``/``after`` (text for ``--diff``), ``moves``,
    ``live_tasks``, ``affinity`` (pid -> CPUs re-pinned) and ``fingerprint``.
    Raises ``StateError`` (corrupt state without ``force``, lock timeout) or
    ``ResizeError`` (live tasks that do not fit) before writing anything.
    """
    if present:
        if plan is None:
            raise StateError("a plan is required when state is present", "plan")
        desired = st.desired_layout(plan)
        meta = st.desired_meta(plan, desired)
    result: dict = {"changed": False, "moves": [], "live_tasks": [], "affinity": {}, "before": "", "after": ""}
    pools_dir = os.path.join(conf_dir, st.POOLS)
    lock_path = os.path.join(conf_dir, st.LOCK)
    has_state = os.path.isdir(pools_dir)
    if (
        not present
        and not has_state
        and not os.path.exists(lock_path)
        and not os.path.exists(os.path.join(conf_dir, st.META))
    ):
        return result
    created = False
    if not os.path.exists(lock_path):
        created = True
        if not check_mode:
            st.ensure_lock_file(conf_dir)
    locked = st.StateLock(conf_dir, lock_timeout) if os.path.exists(lock_path) else None
    if locked is not None:
        locked.__enter__()
    try:
        cur_layout: dict = {}
        cur_tasks: dict = {}
        starts: dict[int, int] = {}
        if has_state:
            try:
                pools = st.read_state(conf_dir)
                cur_layout = st.current_layout(pools)
                cur_tasks, starts = _tasks_and_starts(pools)
            except StateError as exc:
                if not force:
                    raise StateError(
                        f"{exc}; repair it, or set force to rewrite the state (its task lists are lost)", "state"
                    ) from None
                cur_layout, cur_tasks, starts = {"<corrupt>": {"exclusive": False, "sockets": {}}}, {}, {}
        try:
            cur_meta = st.read_meta(conf_dir) if has_state else {}
        except StateError:
            cur_meta = {"corrupt": True}
        live = _live(cur_tasks, starts, proc_fs)
        result["live_tasks"] = sorted(live)
        result["before"] = st.render_state(cur_layout, cur_tasks, cur_meta) if has_state else ""
        if not present:
            if live and not force:
                raise ResizeError(
                    "refusing to remove the pool state while tasks are live: "
                    + ", ".join(_holders(cur_tasks, live))
                    + "; stop those workloads, or force the removal",
                    "state",
                )
            result["changed"] = True
            if not check_mode:
                shutil.rmtree(pools_dir, ignore_errors=True)
                for name in (st.META, st.ORDER, st.LOCK):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(conf_dir, name))
                with contextlib.suppress(OSError):  # not empty: something else lives there; leave it
                    os.rmdir(conf_dir)
            return result
        new_tasks, moves = st.resize_tasks(cur_tasks, live, desired, meta["handout_order"])
        result["moves"] = moves
        result["fingerprint"] = meta["fingerprint"]
        result["after"] = st.render_state(desired, new_tasks, meta)
        need_tree = (
            not has_state
            or cur_layout != desired
            or new_tasks != cur_tasks
            or bool(st.tree_mode_problems(conf_dir, desired, task_gid))
        )
        need_meta = cur_meta != meta or _order_text(conf_dir) != st.format_handout_order(meta["handout_order"])
        result["changed"] = created or need_tree or need_meta
        affinity = st.affinity_changes(cur_tasks, new_tasks, live)
        result["affinity"] = {str(pid): cpus for pid, cpus in affinity.items()}
        if check_mode or not result["changed"]:
            return result
        if need_tree:
            st.write_state(conf_dir, desired, new_tasks, starts, meta, task_gid)
        elif need_meta:
            st.write_meta(conf_dir, meta)
        if update_affinity:
            for pid, cpus in affinity.items():
                set_affinity_tree(proc_fs, pid, cpus)
        return result
    finally:
        if locked is not None:
            locked.__exit__(None, None, None)
