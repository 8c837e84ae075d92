"""From a plan to the pool state directory, keeping the tasks of running workloads.

Pure functions (desired layout of a plan, the diff, the resize rule) and the
applier behind the ``cpupools_state`` module. ``state.py`` holds the on-disk
format and what ``cmk`` needs at run time; the node agent never imports this
file, which keeps ``cmk isolate`` starting fast. Everything that must agree happens under the state
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

# Plans -> desired state (pure) -------------------------------------------------


def desired_layout(plan: dict) -> dict[str, dict]:
    """``pool -> {"exclusive": bool, "sockets": {socket: [cpulists sorted as CMK lists them]}}``.

    Every socket of the plan gets a directory in every pool, as CMK creates
    them (an empty socket map for a pool with no CPU there).
    """
    try:
        pools = plan["pools"]
        exclusive_pools = set(plan.get("exclusive_pools", st.EXCLUSIVE_POOL_NAMES))
        layout = {}
        for name in sorted(pools):
            sockets = {}
            for socket, lists in pools[name].items():
                checked = []
                for cpus in lists:
                    _check_plan_cpulist(str(cpus), name, str(socket))
                    checked.append(str(cpus))
                if not st._socket_ok(str(socket)):
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
    if not st.is_cmk_cpulist(cpus):
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
        "version": st.META_VERSION,
        "fingerprint": hashlib.sha256(canonical.encode()).hexdigest(),
        "handout_order": order,
    }


def current_layout(pools: dict[str, st.Pool]) -> dict[str, dict]:
    """The layout part of a read state, in the shape of ``desired_layout``."""
    return {
        name: {
            "exclusive": pool.exclusive,
            "sockets": {s: [cl.cpus for cl in lists] for s, lists in pool.sockets.items()},
        }
        for name, pool in pools.items()
    }


def current_tasks(pools: dict[str, st.Pool]) -> dict[str, dict[str, dict[str, list[int]]]]:
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
                lines.append(f"pools/{pool}/{socket}/{cpus}/tasks: {st.format_tasks(pids)}")
    if meta:
        lines.append(f"{st.META}: {json.dumps(meta, sort_keys=True)}")
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

    pools_dir = os.path.join(conf_dir, st.POOLS)
    new_dir = os.path.join(conf_dir, ".pools.new")
    old_dir = os.path.join(conf_dir, ".pools.old")
    for stale in (new_dir, old_dir):
        shutil.rmtree(stale, ignore_errors=True)
    task_dir_mode = st.MODE_DIR if task_gid is None else st.MODE_TASK_DIR_GROUP
    task_file_mode = st.MODE_FILE if task_gid is None else st.MODE_TASK_FILE_GROUP
    os.mkdir(new_dir, st.MODE_DIR)
    os.chmod(new_dir, st.MODE_DIR)
    for pool, spec in layout.items():
        pool_dir = os.path.join(new_dir, pool)
        os.mkdir(pool_dir)
        os.chmod(pool_dir, st.MODE_DIR)
        st.atomic_write(os.path.join(pool_dir, st.EXCLUSIVE_FLAG), "1" if spec["exclusive"] else "0", st.MODE_FILE)
        for socket, lists in spec["sockets"].items():
            socket_dir = os.path.join(pool_dir, socket)
            os.mkdir(socket_dir)
            os.chmod(socket_dir, st.MODE_DIR)
            for cpus in lists:
                list_dir = os.path.join(socket_dir, cpus)
                os.mkdir(list_dir)
                if task_gid is not None:
                    os.chown(list_dir, -1, task_gid)
                os.chmod(list_dir, task_dir_mode)
                pids = tasks.get(pool, {}).get(socket, {}).get(cpus, [])
                st.atomic_write(os.path.join(list_dir, st.TASKS), st.format_tasks(pids), task_file_mode, task_gid)
                for pid in pids:
                    if pid in starts:
                        marker = os.path.join(list_dir, st.marker_name(pid, starts[pid]))
                        st._create_empty(marker, task_file_mode)
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

    st.atomic_write(
        os.path.join(conf_dir, st.META), json.dumps(meta, indent=2, sort_keys=True) + "\n", st.MODE_FILE, fsync=True
    )
    st.atomic_write(
        os.path.join(conf_dir, st.ORDER),
        st.format_handout_order(meta.get("handout_order", {})),
        st.MODE_FILE,
        fsync=True,
    )


def ensure_lock_file(conf_dir: str, task_gid: int | None = None) -> bool:
    """Create ``<conf>`` and ``<conf>/lock`` when missing, and give the lock its mode and group.

    The lock is ``root:<task group> 0640`` (``root 0600`` without a task
    group): only those who must lock can open it, so no outsider can hold it
    and block root (docs/agent.md "Security"). True when something changed.
    """
    created = False
    if not os.path.isdir(conf_dir):
        os.makedirs(conf_dir, st.MODE_DIR)
        created = True
    path = os.path.join(conf_dir, st.LOCK)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        created = True
    if lock_mode_wrong(conf_dir, task_gid):
        os.chown(path, -1, 0 if task_gid is None else task_gid, follow_symlinks=False)
        os.chmod(path, st.MODE_LOCK if task_gid is None else st.MODE_LOCK_GROUP)
        created = True
    return created


def lock_mode_wrong(conf_dir: str, task_gid: int | None) -> bool:
    """True when ``<conf>/lock`` exists with another mode or group than the permission model's."""
    try:
        info = os.lstat(os.path.join(conf_dir, st.LOCK))
    except FileNotFoundError:
        return False
    want = st.MODE_LOCK if task_gid is None else st.MODE_LOCK_GROUP
    return info.st_mode & 0o7777 != want or info.st_gid != (0 if task_gid is None else task_gid)


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
    want_dir = st.MODE_DIR if task_gid is None else st.MODE_TASK_DIR_GROUP
    for pool, spec in layout.items():
        for socket, lists in spec["sockets"].items():
            for cpus in lists:
                path = os.path.join(conf_dir, st.POOLS, pool, socket, cpus)
                try:
                    info = os.stat(path)
                except FileNotFoundError:
                    continue
                if info.st_mode & 0o7777 != want_dir or (task_gid is not None and info.st_gid != task_gid):
                    bad.append(path)
    return bad


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
    tasks = current_tasks(pools)
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
    ``live_tasks``, ``affinity`` (pid -> CPUs re-pinned), ``fingerprint`` and
    ``tasks`` (pool -> cpulist -> PIDs after the run).
    Raises ``StateError`` (corrupt state without ``force``, lock timeout) or
    ``ResizeError`` (live tasks that do not fit) before writing anything.
    """
    if present:
        if plan is None:
            raise StateError("a plan is required when state is present", "plan")
        desired = desired_layout(plan)
        meta = desired_meta(plan, desired)
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
    if not os.path.exists(lock_path) or lock_mode_wrong(conf_dir, task_gid):
        created = True
        if not check_mode:
            ensure_lock_file(conf_dir, task_gid)
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
                cur_layout = current_layout(pools)
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
        result["before"] = render_state(cur_layout, cur_tasks, cur_meta) if has_state else ""
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
                for name in (st.META, st.ORDER, st.AGENT_SETTINGS, st.LOCK):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(conf_dir, name))
                with contextlib.suppress(OSError):  # not empty: something else lives there; leave it
                    os.rmdir(conf_dir)
            return result
        new_tasks, moves = resize_tasks(cur_tasks, live, desired, meta["handout_order"])
        result["moves"] = moves
        result["fingerprint"] = meta["fingerprint"]
        # What the state holds after this run, pool -> cpulist -> PIDs (every
        # cpulist, [] when free): the report's "live tasks".
        result["tasks"] = {
            pool: {cpus: list(pids) for lists in sockets.values() for cpus, pids in lists.items()}
            for pool, sockets in new_tasks.items()
        }
        result["after"] = render_state(desired, new_tasks, meta)
        need_tree = (
            not has_state
            or cur_layout != desired
            or new_tasks != cur_tasks
            or bool(tree_mode_problems(conf_dir, desired, task_gid))
        )
        need_meta = cur_meta != meta or _order_text(conf_dir) != st.format_handout_order(meta["handout_order"])
        result["changed"] = created or need_tree or need_meta
        affinity = affinity_changes(cur_tasks, new_tasks, live)
        result["affinity"] = {str(pid): cpus for pid, cpus in affinity.items()}
        if check_mode or not result["changed"]:
            return result
        if need_tree:
            write_state(conf_dir, desired, new_tasks, starts, meta, task_gid)
        elif need_meta:
            write_meta(conf_dir, meta)
        if update_affinity:
            for pid, cpus in affinity.items():
                set_affinity_tree(proc_fs, pid, cpus)
        return result
    finally:
        if locked is not None:
            locked.__exit__(None, None, None)
