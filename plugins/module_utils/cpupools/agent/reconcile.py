"""``cmk reconcile``, ``describe``, ``node-report`` and ``housekeep``: the agent's side that is not ``isolate``.

Split from ``agent.py`` so that ``cmk isolate``, which runs on every workload
start, does not load it.
"""

from __future__ import annotations

import collections
import os
import sys

from ..core.errors import CpupoolsError, StateError
from ..node import metrics
from ..node import state as st
from .options import (
    EXIT_OK,
    checked_path,
    conf_dir,
    lock_timeout,
    proc_fs_of,
    seconds,
    self_identity,
    sysfs_root,
    tasks_or_none,
)

# reconcile ----------------------------------------------------------------------


#: Longest time reconcile holds the lock at a stretch, and the pause after each
#: stretch: an isolate polls the lock at least every 5 ms, so it gets in
#: during the pause and never waits for more than one stretch (25 ms, a
#: quarter of the 100 ms an isolate may wait; at 10 ms a pass over 10,000
#: lists spent 3 s in pauses). The pause is the time between two stretches,
#: not a sleep after each: what reconcile does outside the lock meanwhile
#: (freeing the files replaced, preparing the next lists) counts toward it,
#: and it sleeps only for the rest. A stretch always
#: takes its first BATCH_MIN_LISTS lists, whatever the clock says, so that a
#: small state (the usual node) is rewritten under one lock hold and the
#: sequence of system calls does not depend on the machine's load.
BATCH_SECONDS = 0.025
BATCH_MIN_LISTS = 8
PAUSE_SECONDS = 0.01
#: Lists whose new ``tasks`` file is prepared before each stretch (``st.PreparedTasks``).
PREPARE_LISTS = 256


def reconcile_pass(
    conf: str, proc_fs: str, timeout: float, strays: list[str] | None = None
) -> tuple[list[dict], dict[str, metrics.PoolUsage]]:
    """``_reconcile_pass`` through one handle on the state directory (``state.ConfDir``), opened for this pass."""
    strays = [] if strays is None else strays
    with st.open_conf(conf) as handle:
        try:
            return _reconcile_pass(handle.path, proc_fs, timeout, strays)
        finally:
            strays[:] = [st.as_given(line) for line in strays]


def _reconcile_pass(
    conf: str, proc_fs: str, timeout: float, strays: list[str] | None = None
) -> tuple[list[dict], dict[str, metrics.PoolUsage]]:
    """One pass: free the cpulists of dead tasks and of reused PIDs; remove crash leftovers.

    The state is scanned without the lock; only the lists with something to
    remove are then re-read and written under the lock, a few at a time
    (``BATCH_SECONDS``), so isolates never wait long however big the state.
    Their new ``tasks`` files are written (and flushed, unless empty) before the lock is
    taken (``st.PreparedTasks``): under it, a list costs a read and a rename,
    so a busy disk does not stretch the hold.
    Under the lock a PID is removed only if it is still recorded with the
    start time seen in the scan and still does not run: our isolate that took
    the list meanwhile wrote its own marker, and a CMK v1.4 isolate that got
    the PID again after CMK's reconcile dropped it writes none, so only
    ``/proc`` tells it apart. A running PID is never freed, whatever its
    marker says (``state.task_alive``). Also under the lock: temporary files of killed writers and
    markers whose PID is not in ``tasks`` are removed.

    Stray entries and damaged ``tasks`` files are appended to ``strays`` (one
    line each) and skipped. Refuses (``UsageError``) when ``proc_fs`` cannot
    show every process (``state.proc_view_problem``). Returns CMK's
    ``reclaimedCpuLists`` entries (``pid``, ``pool``, ``cpus``) sorted by PID,
    and per pool ``(cpulists, free cpulists)`` after the pass.
    """
    import time

    self_identity(proc_fs, "reclaim tasks", conf)
    strays = [] if strays is None else strays
    try:
        pools = st.read_state(conf, strays=strays)
    except StateError:
        # Scanned while the module swapped the tree in (or a real error): read again under the lock.
        strays.clear()
        with st.StateLock(conf, timeout):
            pools = st.read_state(conf, strays=strays)
    work: list[tuple[st.CpuList, set[tuple[int, int | None]], list[int] | None]] = []
    scanned: list[tuple[st.CpuList, list[str], list[int]]] = []
    for pool in pools.values():
        for cl in pool.cpulists():
            try:
                names = os.listdir(cl.path)
                tasks = cl.tasks
            except (OSError, StateError):
                work.append((cl, set(), None))  # damaged, or replaced meanwhile: look again under the lock
                continue
            cl._starts = st.parse_start_markers(names)
            scanned.append((cl, names, tasks))
    # Every (PID, start) one of our isolates marked: proof of which process holds what (state.task_alive).
    marked = frozenset((pid, start) for cl, _, _ in scanned for pid, start in cl.starts.items())
    seen: dict[tuple[int, int | None], bool] = {}  # a shared task sits in several lists: read /proc once
    for cl, names, tasks in scanned:
        dead = set()
        for pid in tasks:
            key = (pid, cl.starts.get(pid))
            if key not in seen:
                seen[key] = st.task_alive(proc_fs, pid, key[1], marked)
            if not seen[key]:
                dead.add(key)
        leftovers = any(st.is_temporary(n) for n in names) or any(p not in tasks for p in cl.starts)
        if leftovers:
            work.append((cl, dead, None))
        elif dead:
            work.append((cl, dead, tasks))
    reclaimed: list[dict] = []
    damaged: set[str] = set()

    def reclaim_plain(cl: st.CpuList, dead: set[tuple[int, int | None]]) -> None:
        fresh = st.CpuList(cl.pool, cl.socket, cl.cpus, cl.path)
        try:
            removed = _reclaim_list(fresh, dead, proc_fs, marked)
        except StateError as exc:
            # Still there: damaged. Gone: the module dropped it meanwhile, nothing to say.
            if os.path.isdir(cl.path):
                strays.append(str(exc).removeprefix("state is corrupt: "))
                damaged.add(cl.path)
            return
        cl._tasks = fresh.tasks
        reclaimed.extend({"pid": pid, "pool": cl.pool, "cpus": cl.cpus} for pid in removed)

    def reclaim_prepared(cl: st.CpuList, dead: set[tuple[int, int | None]], prep: st.PreparedTasks) -> None:
        """Under the lock: rename the prepared file in if the list is as scanned; else the plain way.

        The markers of the PIDs removed are deleted by ``prep.close()``, after the lock.
        """
        try:
            now = prep.current()
        except (OSError, StateError):
            now = None
        if now is not None:
            tasks, names = now
            starts = st.parse_start_markers(names)
            removed = _still_dead(tasks, starts, dead, proc_fs, marked)
            kept = [pid for pid in tasks if pid not in removed]
            if tasks == prep.base and kept == prep.tasks and prep.commit():
                cl._tasks = kept
                reclaimed.extend({"pid": pid, "pool": cl.pool, "cpus": cl.cpus} for pid in removed)
                prep.markers = [st.marker_name(pid, starts[pid]) for pid in removed if pid in starts]
                return
        reclaim_plain(cl, dead)

    # Lists whose only change is dropping dead PIDs get their new tasks file
    # written (and flushed, unless empty) before the lock is taken (st.PreparedTasks); under
    # the lock each costs one read and one rename. Damaged lists and lists
    # with crash leftovers are rewritten under the lock as before.
    queue = collections.deque(work)
    pending: collections.deque = collections.deque()
    released = None  # when the lock was last released: what is done outside it counts as the pause
    try:
        while queue or pending:
            while queue and len(pending) < PREPARE_LISTS:
                cl, dead, tasks = queue.popleft()
                prep = None
                if tasks is not None:
                    kept = [p for p in tasks if (p, cl.starts.get(p)) not in dead]
                    try:
                        prep = st.PreparedTasks(cl.path, tasks, kept)
                    except (OSError, StateError):
                        prep = None  # written the plain way under the lock, which says what is wrong
                pending.append((cl, dead, prep))
            if released is not None:
                rest = PAUSE_SECONDS - (time.monotonic() - released)
                if rest > 0:
                    time.sleep(rest)
            done: list[st.PreparedTasks] = []
            try:
                with st.StateLock(conf, timeout):
                    until = time.monotonic() + BATCH_SECONDS
                    count = 0
                    while pending and (count < BATCH_MIN_LISTS or time.monotonic() < until):
                        cl, dead, prep = pending.popleft()
                        count += 1
                        if prep is None:
                            reclaim_plain(cl, dead)
                        else:
                            done.append(prep)
                            reclaim_prepared(cl, dead, prep)
            finally:
                released = time.monotonic()
                for prep in done:  # markers of removed PIDs name dead processes: no lock needed
                    prep.close()
    finally:
        for _, _, prep in pending:
            if prep is not None:
                prep.close()
    sizes: dict[str, metrics.PoolUsage] = {}
    for name, pool in pools.items():
        lists = pool.cpulists()
        free_lists = []
        held_lists = []
        for cl in lists:
            tasks = None if cl.path in damaged else tasks_or_none(cl)
            if tasks == []:
                free_lists.append(cl.cpus)
            elif tasks:
                held_lists.append(cl.cpus)
        sizes[name] = metrics.PoolUsage(
            len(lists), len(free_lists), metrics.cpus_of(held_lists), metrics.cpus_of(free_lists)
        )
    reclaimed.sort(key=lambda r: (r["pid"], r["pool"], r["cpus"]))
    return reclaimed, sizes


def _still_dead(
    tasks: list[int], starts: dict[int, int], dead: set[tuple[int, int | None]], proc_fs: str, marked: frozenset
) -> list[int]:
    """Under the lock: the PIDs of ``tasks`` found dead in the scan with the same start, and dead still."""
    return [
        pid
        for pid in tasks
        if (pid, starts.get(pid)) in dead and not st.task_alive(proc_fs, pid, starts.get(pid), marked)
    ]


def _reclaim_list(
    cl: st.CpuList, dead: set[tuple[int, int | None]], proc_fs: str, marked: frozenset = frozenset()
) -> list[int]:
    """Under the lock: drop the PIDs of ``dead`` still recorded with the same start; clean leftovers."""
    dfd = st.open_dir(cl.path)
    try:
        names = os.listdir(dfd)
        tasks = cl.tasks
        cl._starts = st.parse_start_markers(names)
        # Same PID and same recorded start as when found dead, and still dead: a CMK v1.4 isolate
        # may have taken the list under the same PID since the scan, and it writes no marker. A
        # process started since the scan has a start time no marker of the scan names, so it is kept.
        removed = _still_dead(tasks, cl.starts, dead, proc_fs, marked)
        for name in names:
            if st.is_temporary(name):
                try:  # noqa: SIM105 - contextlib costs ~1 ms of start-up
                    os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass
    finally:
        os.close(dfd)
    # write_tasks also removes the markers of PIDs not in the list (those of crashed writers too).
    st.write_tasks(cl, [pid for pid in tasks if pid not in removed], {})
    return removed


#: CMK's extended resource names; CPUPOOLS_EXCLUSIVE_RESOURCE and
#: CPUPOOLS_ENI_RESOURCE override them (the role sets them to the names the
#: cpupools_k8s stage advertises).
EXCLUSIVE_RESOURCE = "cmk.intel.com/exclusive-cores"
ENI_RESOURCE = "cmk.intel.com/exclusive-non-isolcpus-cores"


def after_pass_hook(opts: dict[str, str | bool], environ: dict[str, str] | os._Environ):
    """The callable ``reconcile`` runs after each pass, or None.

    With ``--kubeconfig`` (the node's own kubelet credentials, typically
    ``/etc/kubernetes/kubelet.conf``), it re-advertises the exclusive pools'
    extended resources when the kubelet dropped them on re-registering
    (module ``k8s_advertise``, standard library HTTPS only). A kubeconfig
    path that does not exist turns it off quietly. Errors are one line on
    stderr; the reconcile loop goes on.
    """
    kubeconfig = str(opts.get("--kubeconfig") or environ.get("CPUPOOLS_KUBECONFIG") or "")
    if not kubeconfig:
        return None
    checked_path("--kubeconfig" if opts.get("--kubeconfig") else "CPUPOOLS_KUBECONFIG", kubeconfig)
    import socket

    node = str(opts.get("--node-name") or environ.get("NODE_NAME") or socket.gethostname())
    names = {
        "exclusive": environ.get("CPUPOOLS_EXCLUSIVE_RESOURCE") or EXCLUSIVE_RESOURCE,
        "exclusive-non-isolcpus": environ.get("CPUPOOLS_ENI_RESOURCE") or ENI_RESOURCE,
    }

    def readvertise_hook(report: dict, sizes: dict[str, metrics.PoolUsage]) -> None:
        from ..cluster.k8s_advertise import readvertise

        expected = {names[pool]: sizes[pool][0] for pool in names if pool in sizes}
        result = readvertise(kubeconfig, node, expected)
        if result.get("error"):
            sys.stderr.write(f"cmk reconcile: re-advertising on node {node}: {result['error']}\n")
        elif result.get("changed"):
            after = ", ".join(f"{k}={v}" for k, v in sorted((result.get("after") or {}).items()))
            sys.stderr.write(f"cmk reconcile: re-advertised {after} on node {node}\n")

    return readvertise_hook


def cmd_reconcile(opts: dict[str, str | bool], environ: dict[str, str] | os._Environ) -> int:
    import json
    import time

    conf = conf_dir(opts)
    interval = seconds(opts, "--interval")
    timeout = lock_timeout(environ)
    proc_fs = proc_fs_of(environ)
    metrics_dir = str(opts.get("--metrics-dir") or environ.get("CPUPOOLS_METRICS_DIR") or "")
    if metrics_dir:
        checked_path("--metrics-dir" if opts.get("--metrics-dir") else "CPUPOOLS_METRICS_DIR", metrics_dir)
    hook = after_pass_hook(opts, environ)
    while True:
        try:
            strays: list[str] = []
            reclaimed, sizes = reconcile_pass(conf, proc_fs, timeout, strays)
            for line in strays:
                sys.stderr.write(f"cmk reconcile: skipped: {line}\n")
            report = {"reclaimedCpuLists": reclaimed}
            sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()
            if metrics_dir:
                metrics.write_reconcile(metrics_dir, sizes, len(reclaimed))
            if hook is not None:
                hook(report, sizes)
        except CpupoolsError as exc:
            if interval <= 0:
                raise
            sys.stderr.write(f"cmk reconcile: {st.as_given(str(exc))}\n")
        if interval <= 0:
            return EXIT_OK
        time.sleep(interval)


# describe / node-report ----------------------------------------------------------


def describe(conf: str, timeout: float, strays: list[str] | None = None) -> dict:
    """CMK's describe dict (its intel/describe.py): pools with their cpulists and task PIDs.

    Stray entries and cpulists with a damaged ``tasks`` file are left out and
    appended to ``strays`` (one line each).
    """
    strays = [] if strays is None else strays
    with st.open_conf(conf) as handle, st.StateLock(handle.path, timeout):
        pools = st.read_state(handle.path, strays=strays)
        tasks = {}
        for pool in pools.values():
            for cl in pool.cpulists():
                try:
                    tasks[cl.path] = list(cl.tasks)
                except StateError as exc:
                    strays.append(str(exc).removeprefix("state is corrupt: "))
        strays[:] = [st.as_given(line) for line in strays]
    return {
        "pools": {
            name: {
                "cpuLists": {
                    cl.cpus: {"cpus": cl.cpus, "tasks": tasks[cl.path]} for cl in pool.cpulists() if cl.path in tasks
                },
                "exclusive": pool.exclusive,
                "name": name,
            }
            for name, pool in pools.items()
        }
    }


def overlap_errors(description: dict) -> list[str]:
    """CMK's check: every pair of cpulists (any pools) sharing a CPU."""
    entries = [
        (pool, cpus, set(cpus.split(",")))
        for pool, spec in sorted(description["pools"].items())
        for cpus in spec["cpuLists"]
    ]
    errors = []
    for i, (pa, la, ca) in enumerate(entries):
        for pb, lb, cb in entries[i + 1 :]:
            both = ca & cb
            if both:
                common = ",".join(sorted(both, key=int))
                errors.append(f"CPU list overlap detected in {pa}:{la} and {pb}:{lb} (in both: {common})")
    return errors


def node_report(conf: str, timeout: float, sysfs_root: str, strays: list[str] | None = None) -> dict:
    from ..hardware.topology import gather_topology

    errors: list[str] = []
    try:
        description: dict | None = describe(conf, timeout, strays)
    except CpupoolsError as exc:
        description = None
        errors.append(f"Unable to read CMK configuration directory {conf}: {exc}")
    topo = gather_topology(sysfs_root)
    isolated = set(topo.kernel.isolcpus)
    sockets: dict[str, dict] = {}
    for core in topo.cores:
        entry = sockets.setdefault(str(core.socket), {"id": core.socket, "cores": []})
        entry["cores"].append({"id": core.index, "cpus": [{"id": c, "isolated": c in isolated} for c in core.cpus]})
    if description is not None:
        errors.extend(overlap_errors(description))
        online = set(topo.cpus)
        for pool, spec in sorted(description["pools"].items()):
            for cpus in spec["cpuLists"]:
                missing = [c for c in cpus.split(",") if int(c) not in online]
                if missing:
                    errors.append(f"CPU list {pool}:{cpus} names CPU(s) {','.join(missing)} that are not online")
    return {
        "checks": {"configDirectory": {"errors": errors, "ok": not errors}},
        "description": description,
        "topology": {"sockets": sockets},
    }


def cmd_json(sub: str, opts: dict[str, str | bool], environ: dict[str, str] | os._Environ) -> int:
    import json
    import time

    conf = conf_dir(opts)
    timeout = lock_timeout(environ)
    interval = seconds(opts, "--interval") if sub == "node-report" else 0
    while True:
        strays: list[str] = []
        if sub == "describe":
            data = describe(conf, timeout, strays)
        else:
            sysfs = sysfs_root(environ)
            data = node_report(conf, timeout, sysfs, strays)
        for line in strays:
            sys.stderr.write(f"cmk {sub}: skipped: {line}\n")
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()
        if interval <= 0:
            return EXIT_OK
        time.sleep(interval)


# housekeep ----------------------------------------------------------------------


def cmd_housekeep(opts: dict[str, str | bool], environ: dict[str, str] | os._Environ) -> int:
    """``cmk housekeep``: one pass of the housekeeper (node/housekeep.py), its result as JSON on stdout and
    its summary on stderr (the journal's line). A configuration that cannot be used is status 78."""
    import json

    from ..node import housekeep as hk
    from ..node.tasks import Facts

    sysfs = sysfs_root(environ)
    check = bool(opts.get("--check"))
    if opts.get("--restore"):
        # The uninstall: every power setting the housekeeper changed goes back; nothing else is read.
        from ..node.power import power_pass

        restored = power_pass(None, Facts(sysfs), check=check)
        result = {"check": check, "moves": [], "workqueues": [], "power": restored["writes"]}
        result["summary"] = restored["summary"]
    else:
        path = checked_path("--config", str(opts.get("--config") or hk.CONFIG_PATH))
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise StateError(f"{path}: {exc.strerror}") from None
        config = hk.parse_config(text, path)
        proc_fs = proc_fs_of(environ)
        if os.path.basename(proc_fs.rstrip("/")) != "proc":
            raise StateError(f"CMK_PROC_FS={proc_fs}: housekeep reads a directory named proc")
        result = hk.housekeep(
            config,
            Facts(os.path.dirname(proc_fs.rstrip("/")) or "/"),
            Facts(sysfs),
            proc_fs=proc_fs,
            check=check,
            power_only=bool(opts.get("--power-only")),
        )
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    power = result["power"]
    lines = [
        result["summary"],
        *(f"{q['path']}: {q['from']} -> {q['to']} {q['status']}" for q in result["workqueues"]),
        *(f"{w['path']}: {w['from']} -> {w['to']} {w['status']} {w.get('error', '')}".rstrip() for w in power),
    ]
    if "problem" in result:
        lines.append(result["problem"])
    for line in lines:
        sys.stderr.write(f"cmk housekeep: {line}\n")
    return EXIT_OK
