"""From a plan to the pool state directory, keeping the tasks of running workloads.

Pure functions (desired layout of a plan, the diff, the resize rule) and the
applier behind the ``cpupools_state`` module. ``state.py`` holds the on-disk
format and what ``cmk`` needs at run time; the node agent never imports this
file, which keeps ``cmk isolate`` starting fast. Everything that must agree happens under the state
lock: read the current state, check which tasks are alive, place them on the
new layout (``state.resize_tasks``), refuse before any write when they do
not fit, write the new tree in one swap, then re-pin workloads whose CPU
affinity is not inside their cpulists.

Cpulists are compared as CPU sets, never as directory names: the layouts
and task maps here are keyed by the ascending comma form of each list's CPUs
(``list_key``), and the directory names live in a separate map. A list whose
CPUs the new plan keeps in the same pool and socket keeps its directory and
its name, whatever form that name has (CMK's core-by-core ``26,70,27,71``
included), so a live CMK process that holds the path never loses it.

Crash safety: every step of the write path can be killed (the fault test
does, at each one, by replacing ``_step`` in its own driver process, and at
every system call from the lock to the exit, with SIGKILL under strace). Before the swap
only a dot-directory exists, which the next write removes; between the two
renames of the swap ``state.live_tree`` finishes it for any entry point;
after it, the tasks are already on their new lists and re-pinning follows
from the state (a live task whose threads run outside its lists' CPUs), not
from what the killed run meant to do.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from ..core.errors import ResizeError, StateError, show
from . import state as st

Entry = tuple[str, str, str]  # (pool, socket, list key)


def _step() -> None:
    """The end of one step of the write path, where a kill leaves a state every entry point recovers.

    Does nothing. It names the crash points for tests/agent/test_state_crash.py,
    whose driver process replaces it with one that counts the steps and ends
    the process at the N-th; no environment or setting of a node reaches it.
    """


def list_key(cpus: str) -> str:
    """The identity of a cpulist: its CPUs in ascending comma form (``"26,70,27,71"`` -> ``"26,27,70,71"``)."""
    from ..core.cpulist import format_cmk_cpulist

    return format_cmk_cpulist(int(c) for c in cpus.split(","))


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
                    checked.append(list_key(str(cpus)))
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
            "sockets": {s: sorted(list_key(cl.cpus) for cl in lists) for s, lists in pool.sockets.items()},
        }
        for name, pool in pools.items()
    }


def current_names(pools: dict[str, st.Pool]) -> dict[Entry, str]:
    """``(pool, socket, list key) -> directory name`` of a read state."""
    return {
        (name, s, list_key(cl.cpus)): cl.name
        for name, pool in pools.items()
        for s, lists in pool.sockets.items()
        for cl in lists
    }


def desired_names(layout: dict[str, dict], keep: dict[Entry, str] | None = None) -> dict[Entry, str]:
    """Directory names for ``layout``: the existing name of a list whose CPUs stay in
    the same pool and socket (from ``keep``), else ``state.list_dir_name``."""
    keep = keep or {}
    out = {}
    for pool, spec in layout.items():
        for socket, keys in spec["sockets"].items():
            for key in keys:
                entry = (pool, socket, key)
                out[entry] = keep.get(entry) or st.list_dir_name([int(c) for c in key.split(",")])
    return out


def current_tasks(pools: dict[str, st.Pool]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """``pool -> socket -> cpulist -> PIDs`` of a read state."""
    return {
        name: {s: {list_key(cl.cpus): list(cl.tasks) for cl in lists} for s, lists in pool.sockets.items()}
        for name, pool in pools.items()
    }


def current_starts(pools: dict[str, st.Pool]) -> dict[Entry, dict[int, int]]:
    """Recorded start times per list entry: a marker belongs to its list, never to the PID alone."""
    return {
        (name, s, list_key(cl.cpus)): dict(cl.starts)
        for name, pool in pools.items()
        for s, lists in pool.sockets.items()
        for cl in lists
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
    stale: set[tuple[str, str, str, int]] | frozenset = frozenset(),
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], list[dict]]:
    """Place the live tasks of the current state on the desired layout.

    Rules: an exclusive holder keeps its cpulist when the desired layout still
    has it in the same pool, else moves to a free cpulist of that pool (same
    socket first, then the hand-out order); a shared/infra task keeps that
    pool's cpulist on the same socket (or the pool's first one when that
    socket has none). ``stale`` names ``(pool, socket, key, pid)`` entries of
    PIDs in ``live`` whose marker on that list says another process (a reused
    PID): those count as dead on that list only. Dead PIDs are dropped only from cpulists that go away;
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
                keep = [pid for pid in pids if pid in live and (pool_name, socket, cpus, pid) not in stale]
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
    old: dict[str, dict[str, dict[str, list[int]]]],
    new: dict[str, dict[str, dict[str, list[int]]]],
    live: set[int],
    stale: set[tuple[str, str, str, int]] | frozenset = frozenset(),
) -> dict[int, list[int]]:
    """``pid -> new CPU set`` for every live PID whose assigned CPUs differ between two task maps."""
    before, after = assigned_cpus(old, stale), assigned_cpus(new, stale)
    return {pid: sorted(after[pid]) for pid in sorted(after) if pid in live and before.get(pid) != after[pid]}


def assigned_cpus(
    tasks: dict[str, dict[str, dict[str, list[int]]]], stale: set[tuple[str, str, str, int]] | frozenset = frozenset()
) -> dict[int, set[int]]:
    """``pid -> the CPUs of every list it holds`` (entries in ``stale`` left out)."""
    out: dict[int, set[int]] = {}
    for pool_name, pool in tasks.items():
        for socket, lists in pool.items():
            for cpus, pids in lists.items():
                for pid in pids:
                    if (pool_name, socket, cpus, pid) not in stale:
                        out.setdefault(pid, set()).update(int(c) for c in cpus.split(","))
    return out


def carry_starts(
    old_starts: dict[Entry, dict[int, int]],
    new_tasks: dict[str, dict[str, dict[str, list[int]]]],
    moves: list[dict],
) -> dict[Entry, dict[int, int]]:
    """Start-time markers of the new task map: each stays with its list, or goes
    with its task when the task moves; never merged across lists."""
    source = {}
    for move in moves:
        for (pool, _socket, key), starts in old_starts.items():
            if pool == move["pool"] and key == move["from"] and move["pid"] in starts:
                source[(pool, move["to"], move["pid"])] = starts[move["pid"]]
    out: dict[Entry, dict[int, int]] = {}
    for pool, sockets in new_tasks.items():
        for socket, lists in sockets.items():
            for key, pids in lists.items():
                kept = old_starts.get((pool, socket, key), {})
                starts = {}
                for pid in pids:
                    start = kept.get(pid, source.get((pool, key, pid)))
                    if start is not None:
                        starts[pid] = start
                if starts:
                    out[(pool, socket, key)] = starts
    return out


def render_state(
    layout: dict[str, dict],
    tasks: dict[str, dict[str, dict[str, list[int]]]],
    meta: dict,
    names: dict[Entry, str] | None = None,
) -> str:
    """A text picture of a state (one line per pool flag and per cpulist) for ``--diff``."""
    import json

    names = names or {}
    lines = []
    for pool, spec in sorted(layout.items()):
        lines.append(f"pools/{pool}/exclusive: {int(spec['exclusive'])}")
        for socket, lists in sorted(spec["sockets"].items(), key=lambda kv: int(kv[0])):
            if not lists:
                lines.append(f"pools/{pool}/{socket}/")
            for cpus in lists:
                pids = tasks.get(pool, {}).get(socket, {}).get(cpus, [])
                name = names.get((pool, socket, cpus)) or st.list_dir_name([int(c) for c in cpus.split(",")])
                lines.append(f"pools/{pool}/{socket}/{name}/tasks: {st.format_tasks(pids)}")
    if meta:
        lines.append(f"{st.META}: {json.dumps(meta, sort_keys=True)}")
    return "\n".join(lines) + "\n"


def _remove(path: str) -> None:
    """Remove a file or a whole tree at ``path``, if anything is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(path)


def write_state(
    conf_dir: str,
    layout: dict[str, dict],
    tasks: dict[str, dict[str, dict[str, list[int]]]],
    starts: dict[int, int],
    meta: dict,
    task_gid: int | None = None,
    *,
    names: dict[Entry, str] | None = None,
    entry_starts: dict[Entry, dict[int, int]] | None = None,
) -> None:
    """Write the whole ``pools`` tree, then swap it in; call with the state lock held.

    The new tree is built beside the old one (``<conf>/.pools.new``), fsynced,
    and renamed into place, so a reader under the lock sees either the old or
    the new state, never a mix; an interrupted build leaves only a
    dot-directory that the next write removes, and a kill between the two
    renames is finished by ``state.live_tree``. ``cpupools.json`` is replaced
    atomically after the swap (a stale hand-out order is harmless: unknown
    lists follow in CMK order).

    ``names`` gives the directory name of each ``(pool, socket, key)``
    (default ``state.list_dir_name``); ``entry_starts`` the start-time markers
    per list, and ``starts`` a marker per PID for lists that ``entry_starts``
    does not name (tests write states that way).
    """
    names = names or {}
    entry_starts = entry_starts or {}
    pools_dir = os.path.join(conf_dir, st.POOLS)
    new_dir = os.path.join(conf_dir, st.NEW_TREE)
    old_dir = os.path.join(conf_dir, st.OLD_TREE)
    if not os.path.lexists(pools_dir) and os.path.isdir(old_dir) and os.path.isdir(new_dir):
        # state.live_tree could not finish an interrupted swap: .pools.new is the only copy
        raise StateError(f"{new_dir} holds the state of an interrupted write and cannot be moved to {pools_dir}")
    for stale in (new_dir, old_dir):
        _step()
        _remove(stale)
    task_dir_mode = st.MODE_DIR if task_gid is None else st.MODE_TASK_DIR_GROUP
    task_file_mode = st.MODE_FILE if task_gid is None else st.MODE_TASK_FILE_GROUP
    _step()
    os.mkdir(new_dir, st.MODE_DIR)
    _step()
    os.chmod(new_dir, st.MODE_DIR)
    for pool, spec in layout.items():
        pool_dir = os.path.join(new_dir, pool)
        _step()
        os.mkdir(pool_dir)
        _step()
        os.chmod(pool_dir, st.MODE_DIR)
        _step()
        st.atomic_write(os.path.join(pool_dir, st.EXCLUSIVE_FLAG), "1" if spec["exclusive"] else "0", st.MODE_FILE)
        for socket, lists in spec["sockets"].items():
            socket_dir = os.path.join(pool_dir, socket)
            _step()
            os.mkdir(socket_dir)
            _step()
            os.chmod(socket_dir, st.MODE_DIR)
            for cpus in lists:
                cpu_ids = [int(c) for c in cpus.split(",")]
                name = names.get((pool, socket, cpus)) or st.list_dir_name(cpu_ids)
                list_dir = os.path.join(socket_dir, name)
                _step()
                os.mkdir(list_dir)
                if task_gid is not None:
                    _step()
                    os.chown(list_dir, -1, task_gid)
                _step()
                os.chmod(list_dir, task_dir_mode)
                if name.startswith(st.HASHED_PREFIX):
                    from ..core.cpulist import format_cpulist

                    _step()
                    st.atomic_write(os.path.join(list_dir, st.CPUS_FILE), format_cpulist(cpu_ids) + "\n", st.MODE_FILE)
                pids = tasks.get(pool, {}).get(socket, {}).get(cpus, [])
                _step()
                st.atomic_write(os.path.join(list_dir, st.TASKS), st.format_tasks(pids), task_file_mode, task_gid)
                own = entry_starts.get((pool, socket, cpus))
                for pid in pids:
                    start = own.get(pid) if own is not None else starts.get(pid)
                    if start is not None:
                        marker = os.path.join(list_dir, st.marker_name(pid, start))
                        _step()
                        st._create_empty(marker, task_file_mode)
                        if task_gid is not None:
                            _step()
                            os.chown(marker, -1, task_gid)
    _step()
    _fsync_tree(new_dir)
    if os.path.lexists(pools_dir):
        _step()
        os.rename(pools_dir, old_dir)
    _step()
    os.rename(new_dir, pools_dir)
    _step()
    _fsync_dir(conf_dir)
    _step()
    _remove(old_dir)
    write_meta(conf_dir, meta, names)


def order_text(meta: dict, names: dict[Entry, str] | None = None) -> str:
    """``cpupools.order``: the hand-out order by directory name (what ``cmk isolate`` reads)."""
    by_key = {(pool, key): name for (pool, _socket, key), name in (names or {}).items()}
    order = {
        pool: [by_key.get((pool, key), key) for key in keys] for pool, keys in meta.get("handout_order", {}).items()
    }
    return st.format_handout_order(order)


def write_meta(conf_dir: str, meta: dict, names: dict[Entry, str] | None = None) -> None:
    import json

    for name, text in (
        (st.META, json.dumps(meta, indent=2, sort_keys=True) + "\n"),
        (st.ORDER, order_text(meta, names)),
    ):
        path = os.path.join(conf_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            _step()
            _remove(path)  # only reached with force: apply_state refuses this damage otherwise
        _step()
        st.atomic_write(path, text, st.MODE_FILE, fsync=True)


def group_id(group: str | None) -> int | None:
    """The gid ``cpupools_task_group`` names: digits as they are, a name looked up on this node; None for none.

    A name the node does not know is a ``StateError`` about ``task_group``.
    """
    if not group:
        return None
    if group.isdigit():
        return int(group)
    import grp  # only where a group is named: not on cmk's way, not on every platform the unit tests run on

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StateError(f"group {show(group)} does not exist on the node", "task_group") from None


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


def tree_mode_problems(
    conf_dir: str, layout: dict[str, dict], task_gid: int | None, names: dict[Entry, str] | None = None
) -> list[str]:
    """Paths whose mode or group differ from the permission model (the module repairs them)."""
    bad = []
    names = names or {}
    want_dir = st.MODE_DIR if task_gid is None else st.MODE_TASK_DIR_GROUP
    for pool, spec in layout.items():
        for socket, lists in spec["sockets"].items():
            for cpus in lists:
                name = names.get((pool, socket, cpus)) or st.list_dir_name([int(c) for c in cpus.split(",")])
                path = os.path.join(conf_dir, st.POOLS, pool, socket, name)
                try:
                    info = os.stat(path)
                except FileNotFoundError:
                    continue
                if info.st_mode & 0o7777 != want_dir or (task_gid is not None and info.st_gid != task_gid):
                    bad.append(path)
    return bad


def _children(proc_fs: str) -> dict[int, list[int]]:
    """Parent PID -> child PIDs, from ``<proc_fs>/<n>/stat`` (one scan of the process table)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc_fs):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_fs}/{name}/stat", "rb") as handle:
                text = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        try:
            fields = st.split_proc_stat(text)[2]
        except ValueError:  # not a process's stat line
            continue
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(proc_fs: str, pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and all its descendants (by parent PID in ``<proc_fs>/<n>/stat``)."""
    if children is None:
        children = _children(proc_fs)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in out:
            continue
        out.append(current)
        todo.extend(children.get(current, []))
    return sorted(out)


def _threads(proc_fs: str, procs: list[int]) -> list[int]:
    out = []
    for proc in procs:
        try:
            out.extend(int(t) for t in os.listdir(f"{proc_fs}/{proc}/task") if t.isdigit())
        except OSError:
            continue
    return out


def set_affinity_tree(
    proc_fs: str, pid: int, cpus: list[int], children: dict[int, list[int]] | None = None
) -> list[int]:
    """Pin every thread of ``pid`` and of its descendants to ``cpus``; return the thread ids pinned.

    The recorded PID is the ``cmk isolate`` process; the workload is its
    child, so the whole tree is re-pinned. Threads that exit meanwhile are skipped.
    """
    pinned = []
    for tid in _threads(proc_fs, process_tree(proc_fs, pid, children)):
        _step()
        try:
            os.sched_setaffinity(tid, cpus)
            pinned.append(tid)
        except OSError:  # exited meanwhile, not ours to pin, or none of the CPUs is online (EINVAL)
            continue
    return sorted(pinned)


def misplaced_tasks(
    proc_fs: str, assigned: dict[int, set[int]], live: set[int], layout_cpus: set[int], children: dict[int, list[int]]
) -> dict[int, list[int]]:
    """``pid -> its lists' CPUs`` for each live task with a thread allowed outside them.

    This is how re-pinning follows from the state rather than from one run's
    moves (a run killed after the swap and before re-pinning is finished by
    the next). A thread pinned to part of its lists is fine (a workload may
    place its own threads); a thread allowed every CPU of the layout is a
    task started with ``--no-affinity`` and is left alone.
    """
    out = {}
    for pid in sorted(live):
        cpus = assigned.get(pid)
        if not cpus:
            continue
        for tid in _threads(proc_fs, process_tree(proc_fs, pid, children)):
            try:
                allowed = os.sched_getaffinity(tid)
            except OSError:
                continue
            if not allowed <= cpus and not allowed >= layout_cpus:
                out[pid] = sorted(cpus)
                break
    return out


def _entry_live(tasks: dict, starts: dict[Entry, dict[int, int]], proc_fs: str) -> set[tuple[str, str, str, int]]:
    """``(pool, socket, key, pid)`` of every task entry whose process runs, checked against that list's own marker."""
    seen: dict[tuple[int, int | None], bool] = {}
    out = set()
    for pool, sockets in tasks.items():
        for socket, lists in sockets.items():
            for key, pids in lists.items():
                own = starts.get((pool, socket, key), {})
                for pid in pids:
                    probe = (pid, own.get(pid))
                    if probe not in seen:
                        seen[probe] = st.task_alive(proc_fs, pid, probe[1])
                    if seen[probe]:
                        out.add((pool, socket, key, pid))
    return out


def carry_v15(
    tasks: dict[str, dict[str, dict[str, list[int]]]], cmk_v15: dict, desired: dict[str, dict], proc_fs: str
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], dict, list[str]]:
    """The task map of the state with the live tasks of CMK v1.5's ConfigMap added: ``(tasks, summary, warnings)``.

    A PID of the ConfigMap that runs is added to its cpulist (matched by its
    CPUs, in the same pool, on whatever socket the plan puts them), as the
    PID of a v1.4 ``tasks`` file is kept: it holds the list until it exits
    (``cmk reconcile`` frees it then), and a list the new plan does not have
    moves it or refuses the change (``resize_tasks``). A PID the state holds
    already (carried before, or one of ours) is not added again; a PID that
    does not run is left out. ``summary``: ``configmaps``, and ``live``,
    ``dead``, ``carried`` (this run) among the PIDs the ConfigMap names.
    Warns when a v1.5 task and a task of the state hold one exclusive list.
    """
    from . import cmk15

    v15 = cmk15.parse_config(cmk_v15.get("tasks") or {}, "cmk_v15")
    named = cmk15.named_pids(v15)
    live = {pid for pid in named if st.task_alive(proc_fs, pid)}
    held = {pid for sockets in tasks.values() for lists in sockets.values() for pids in lists.values() for pid in pids}
    where = {
        (pool, key): socket
        for pool, spec in desired.items()
        for socket, keys in spec["sockets"].items()
        for key in keys
    }
    merged = {
        p: {s: {c: list(pids) for c, pids in lists.items()} for s, lists in sk.items()} for p, sk in tasks.items()
    }
    carried: set[int] = set()
    warnings = []
    for pool, sockets in v15.items():
        for socket, lists in sockets.items():
            for cpus, pids in lists.items():
                key = list_key(cpus)
                add = [pid for pid in pids if pid in live and pid not in held]
                if not add:
                    continue
                entry = merged.setdefault(pool, {}).setdefault(where.get((pool, key), socket), {}).setdefault(key, [])
                others = [pid for pid in entry if st.task_alive(proc_fs, pid)]
                if others and desired.get(pool, {}).get("exclusive"):
                    warnings.append(
                        f"exclusive cpulist {pool}:{key} is held by PID {', '.join(map(str, add))} of CMK v1.5 "
                        f"and by PID {', '.join(map(str, others))} of the state: both keep it until they exit"
                    )
                entry.extend(pid for pid in add if pid not in entry)
                carried.update(add)
    summary = {
        "configmaps": list(cmk_v15.get("configmaps") or []),
        "live": sorted(live),
        "dead": sorted(set(named) - live),
        "carried": sorted(carried),
    }
    return merged, summary, warnings


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


def _meta_temporaries(conf_dir: str) -> list[str]:
    """Temporary files of ``cpupools.json``/``cpupools.order`` a killed run left (only the
    module writes them, under the lock, so any found under the lock are dead)."""
    try:
        names = os.listdir(conf_dir)
    except OSError:
        return []
    prefixes = (f".{st.META}.", f".{st.ORDER}.")
    return sorted(os.path.join(conf_dir, n) for n in names if n.startswith(prefixes) and n.endswith(".tmp"))


def _check_conf_files(conf_dir: str, force: bool) -> list[str]:
    """Refuse a lock, ``cpupools.json`` or ``cpupools.order`` that is not a regular file
    (a FIFO as the lock would block every reader); with ``force`` they are replaced.
    Returns the paths to replace."""
    import stat

    bad = []
    for name in (st.LOCK, st.META, st.ORDER):
        path = os.path.join(conf_dir, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            if not force:
                raise StateError(
                    f"state is corrupt: {path} is not a regular file; repair it, or set force to rewrite the state",
                    "state",
                )
            bad.append(path)
    return bad


def apply_state(
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
    cmk_v15: dict | None = None,
    cmk15_traces: str = "",
) -> dict:
    """Make ``conf_dir`` hold ``plan``'s state (or nothing when not ``present``).

    Returns ``changed``, ``before``/``after`` (text for ``--diff``), ``moves``,
    ``live_tasks``, ``affinity`` (pid -> CPUs re-pinned), ``fingerprint``,
    ``tasks`` (pool -> cpulist -> PIDs after the run) and ``warnings``
    (stray entries in the state, ignored).
    Raises ``StateError`` (a conf dir others could have planted, corrupt state
    without ``force``, lock timeout) or ``ResizeError`` (live tasks that do
    not fit) before writing anything.

    The conf dir is opened once (``state.open_conf``: refused when it, or a
    directory on its way that others may write, is a symlink, not a
    directory, or not root's), and the lock, the reads and the writes all go
    through that one handle, so a conf dir replaced meanwhile is never half
    written. It is created (mode 0755) when missing, except in check mode and
    for ``present=False``, where a missing one means "nothing there".

    ``cmk_v15`` is what ``cmk15.read_tasks`` read from the node's CMK v1.5
    ConfigMap (``configmaps``, ``tasks``): its live tasks are carried into the
    state as the tasks of the directory are (``carry_v15``), and the result
    says which of the PIDs it names run (``cmk_v15``: ``live``, ``dead``,
    ``carried``). ``cmk15_traces`` says why the node looks like a CMK v1.5 node
    (``cmk15.traces_on_node``): without ``cmk_v15`` such a node is refused,
    since its running workloads' lists would be handed out again.
    """
    if present and cmk15_traces and cmk_v15 is None:
        raise StateError(
            f"CMK v1.5 runs on this node ({cmk15_traces}) and keeps its task lists only in its ConfigMap "
            "cmk-config-<node>, which was not read: adopting now would hand out the CPUs of its running "
            "workloads again; set cpupools_k8s_kubeconfig (or cpupools_k8s_in_cluster) so that the "
            "cpupools_agent role reads it",
            "k8s_kubeconfig",
        )
    options = {
        "present": present,
        "force": force,
        "task_gid": task_gid,
        "proc_fs": proc_fs,
        "lock_timeout": lock_timeout,
        "check_mode": check_mode,
        "update_affinity": update_affinity,
        "cmk_v15": cmk_v15,
    }
    try:
        handle = st.open_conf(conf_dir, create=present and not check_mode)
    except st.MissingStateDir:
        # Check mode, or state absent: nothing is there to lock, read or remove (nothing is written).
        return _apply_state(conf_dir, plan, **options)
    with handle:
        result = _apply_state(handle.path, plan, **options)
        identity = os.fstat(handle.fd)
    result["warnings"] = [st.as_given(line) for line in result["warnings"]]
    if not present and result["changed"] and not check_mode:
        _remove_dir_if(conf_dir, identity)
    return result


def _remove_dir_if(path: str, identity: os.stat_result) -> None:
    """Remove the emptied conf dir, if the name still holds the directory that was emptied (and it is empty)."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if (info.st_dev, info.st_ino) == (identity.st_dev, identity.st_ino):
        with contextlib.suppress(OSError):  # not empty: something else lives there; leave it
            os.rmdir(path)


def _apply_state(
    conf_dir: str,
    plan: dict | None,
    *,
    present: bool,
    force: bool,
    task_gid: int | None,
    proc_fs: str,
    lock_timeout: float,
    check_mode: bool,
    update_affinity: bool,
    cmk_v15: dict | None,
) -> dict:
    """``apply_state`` on the conf dir ``conf_dir``, as opened (a ``/proc/self/fd/<fd>`` path)."""
    if present:
        if plan is None:
            raise StateError("a plan is required when state is present", "plan")
        desired = desired_layout(plan)
        meta = desired_meta(plan, desired)
    result: dict = {
        "changed": False,
        "moves": [],
        "live_tasks": [],
        "affinity": {},
        "before": "",
        "after": "",
        "warnings": [],
    }
    pools_dir = os.path.join(conf_dir, st.POOLS)
    lock_path = os.path.join(conf_dir, st.LOCK)
    if not present and not any(
        os.path.lexists(os.path.join(conf_dir, name)) for name in (st.POOLS, st.LOCK, st.META, st.NEW_TREE)
    ):
        return result
    replace = _check_conf_files(conf_dir, force)
    if lock_path in replace and not check_mode:
        _remove(lock_path)
    created = False
    if not os.path.exists(lock_path) or lock_mode_wrong(conf_dir, task_gid):
        created = True
        if not check_mode:
            ensure_lock_file(conf_dir, task_gid)
    locked = st.StateLock(conf_dir, lock_timeout) if os.path.exists(lock_path) else None
    if locked is not None:
        locked.__enter__()
    try:
        candidate = st.live_tree(conf_dir, finish=False)
        swap_pending = not os.path.lexists(pools_dir) and candidate != pools_dir
        tree = st.live_tree(conf_dir, finish=not check_mode)
        has_state = os.path.lexists(tree)
        if swap_pending:
            # The same words in check mode (the plan play's check) and when it is moved: said once a run.
            result["warnings"].append(
                f"{pools_dir} was missing after an interrupted write; the complete new tree {candidate} takes its place"
            )
        cur_layout: dict = {}
        cur_tasks: dict = {}
        cur_starts: dict[Entry, dict[int, int]] = {}
        cur_names: dict[Entry, str] = {}
        if has_state:
            strays: list[str] = []
            try:
                pools = st.read_state(conf_dir, strays=strays, finish_swap=not check_mode)
                cur_layout = current_layout(pools)
                cur_tasks = current_tasks(pools)
                cur_starts = current_starts(pools)
                cur_names = current_names(pools)
            except StateError as exc:
                if not force:
                    raise StateError(
                        f"{exc}; repair it, or set force to rewrite the state (its task lists are lost)", "state"
                    ) from None
                cur_layout, cur_tasks, cur_starts = {"<corrupt>": {"exclusive": False, "sockets": {}}}, {}, {}
                strays = []
            result["warnings"].extend(f"{entry}; ignored" for entry in strays)
        try:
            cur_meta = st.read_meta(conf_dir) if has_state else {}
        except StateError:
            cur_meta = {"corrupt": True}
        disk_tasks = cur_tasks
        if cmk_v15 is not None and present:
            cur_tasks, result["cmk_v15"], notes = carry_v15(cur_tasks, cmk_v15, desired, proc_fs)
            result["warnings"].extend(notes)
        entries = _entry_live(cur_tasks, cur_starts, proc_fs)
        live = {entry[3] for entry in entries}
        stale = {
            (pool, socket, key, pid)
            for pool, sockets in cur_tasks.items()
            for socket, lists in sockets.items()
            for key, pids in lists.items()
            for pid in pids
            if pid in live and (pool, socket, key, pid) not in entries
        }
        result["live_tasks"] = sorted(live)
        result["before"] = render_state(cur_layout, disk_tasks, cur_meta, cur_names) if has_state else ""
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
                for name in (st.NEW_TREE, st.OLD_TREE, st.POOLS):
                    _remove(os.path.join(conf_dir, name))
                for name in (st.META, st.ORDER, st.AGENT_SETTINGS, st.LOCK):
                    _remove(os.path.join(conf_dir, name))
            return result
        new_tasks, moves = resize_tasks(cur_tasks, live, desired, meta["handout_order"], stale)
        names = desired_names(desired, cur_names)
        result["moves"] = moves
        result["fingerprint"] = meta["fingerprint"]
        # What the state holds after this run, pool -> cpulist -> PIDs (every
        # cpulist, [] when free): the report's "live tasks".
        result["tasks"] = {
            pool: {cpus: list(pids) for lists in sockets.values() for cpus, pids in lists.items()}
            for pool, sockets in new_tasks.items()
        }
        result["after"] = render_state(desired, new_tasks, meta, names)
        new_starts = carry_starts(cur_starts, new_tasks, moves)
        need_tree = (
            not has_state
            or cur_layout != desired
            or names != cur_names
            or new_tasks != disk_tasks
            or new_starts != {e: s for e, s in cur_starts.items() if s}
            or bool(tree_mode_problems(conf_dir, desired, task_gid, names))
        )
        need_meta = bool(replace) or cur_meta != meta or _order_text(conf_dir) != order_text(meta, names)
        affinity = affinity_changes(cur_tasks, new_tasks, live, stale)
        if update_affinity and live:
            children = _children(proc_fs)
            layout_cpus = {
                int(c)
                for spec in desired.values()
                for keys in spec["sockets"].values()
                for k in keys
                for c in k.split(",")
            }
            for pid, cpus in misplaced_tasks(
                proc_fs, assigned_cpus(new_tasks, stale), live, layout_cpus, children
            ).items():
                affinity.setdefault(pid, cpus)
        else:
            children = {}
        affinity = dict(sorted(affinity.items()))
        result["affinity"] = {str(pid): cpus for pid, cpus in affinity.items()}
        # Dot-trees of an interrupted write (a partial .pools.new, a .pools.old the swap left) go too.
        leftovers = [
            path
            for path in (os.path.join(conf_dir, st.NEW_TREE), os.path.join(conf_dir, st.OLD_TREE))
            if path != tree and os.path.lexists(path)
        ] + _meta_temporaries(conf_dir)
        result["changed"] = (
            created or swap_pending or need_tree or need_meta or bool(leftovers) or (update_affinity and bool(affinity))
        )
        if check_mode or not result["changed"]:
            return result
        if need_tree:
            write_state(conf_dir, desired, new_tasks, {}, meta, task_gid, names=names, entry_starts=new_starts)
        elif need_meta:
            write_meta(conf_dir, meta, names)
        for path in leftovers:
            if os.path.lexists(path):  # write_state removed the dot-trees already
                _step()
                _remove(path)
        if update_affinity:
            for pid, cpus in affinity.items():
                set_affinity_tree(proc_fs, pid, cpus, children)
        return result
    finally:
        if locked is not None:
            locked.__exit__(None, None, None)
