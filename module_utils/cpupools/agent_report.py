"""``cmk reconcile``, ``describe`` and ``node-report``: the agent's reporting side.

Split from ``agent.py`` so that ``cmk isolate``, which runs on every workload
start, does not load it.
"""

from __future__ import annotations

import os
import sys

from . import state as st
from .agent import EXIT_OK, _conf, _seconds
from .errors import CpupoolsError

# reconcile ----------------------------------------------------------------------


def reconcile_pass(conf: str, proc_fs: str, timeout: float) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """One pass under the lock: free the cpulists of dead tasks, drop stale start-time markers.

    Only a PID that does not run is freed (``state.task_alive``): a running
    PID whose marker disagrees may belong to a CMK isolate that took the list
    after CMK's reconcile dropped our dead task, so it is kept, its marker
    removed, and a line on stderr says so. Returns CMK's
    ``reclaimedCpuLists`` entries (``pid``, ``pool``, ``cpus``) sorted by PID,
    and per pool ``(cpulists, free cpulists)`` after the pass.
    """
    reclaimed: list[dict] = []
    sizes: dict[str, tuple[int, int]] = {}
    seen: dict[tuple[int, int | None], bool] = {}  # a shared task sits in several lists: read /proc once
    with st.StateLock(conf, timeout):
        pools = st.read_state(conf)
        for name, pool in pools.items():
            lists = pool.cpulists()
            for cl in lists:
                tasks = cl.tasks
                for pid in st.drop_stale_markers(cl, proc_fs):
                    sys.stderr.write(
                        f"cmk reconcile: PID {pid} on {name}:{cl.cpus} is not the process that took the list "
                        "(other start time); kept while it runs (a CMK isolate may hold it)\n"
                    )
                if not tasks:
                    continue
                starts = cl.starts
                alive = []
                for pid in tasks:
                    key = (pid, starts.get(pid))
                    if key not in seen:
                        seen[key] = st.task_alive(proc_fs, pid, key[1])
                    if seen[key]:
                        alive.append(pid)
                    else:
                        reclaimed.append({"pid": pid, "pool": name, "cpus": cl.cpus})
                if len(alive) != len(tasks):
                    st.write_tasks(cl, alive, {})
            sizes[name] = (len(lists), sum(1 for cl in lists if not cl.tasks))
    reclaimed.sort(key=lambda r: (r["pid"], r["pool"], r["cpus"]))
    return reclaimed, sizes


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
    import socket

    node = str(opts.get("--node-name") or environ.get("NODE_NAME") or socket.gethostname())
    names = {
        "exclusive": environ.get("CPUPOOLS_EXCLUSIVE_RESOURCE") or EXCLUSIVE_RESOURCE,
        "exclusive-non-isolcpus": environ.get("CPUPOOLS_ENI_RESOURCE") or ENI_RESOURCE,
    }

    def readvertise_hook(report: dict, sizes: dict[str, tuple[int, int]]) -> None:
        from .k8s_advertise import readvertise

        expected = {names[pool]: sizes[pool][0] for pool in names if pool in sizes}
        result = readvertise(kubeconfig, node, expected)
        if result.get("error"):
            sys.stderr.write(f"cmk reconcile: re-advertising on node {node}: {result['error']}\n")
        elif result.get("changed"):
            after = ", ".join(f"{k}={v}" for k, v in sorted((result.get("after") or {}).items()))
            sys.stderr.write(f"cmk reconcile: re-advertised {after} on node {node}\n")

    return readvertise_hook


def write_metrics(directory: str, sizes: dict[str, tuple[int, int]], reclaimed: int) -> None:
    """node_exporter textfile ``cpupools.prom``: pool sizes, free lists, reclaimed total."""
    path = os.path.join(directory, "cpupools.prom")
    total = reclaimed
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("cpupools_reclaimed_cpulists_total "):
                    total += int(float(line.split()[1]))
    except (OSError, ValueError):
        pass
    lines = [
        "# HELP cpupools_pool_cpulists Cpulists in the pool.",
        "# TYPE cpupools_pool_cpulists gauge",
        *(f'cpupools_pool_cpulists{{pool="{p}"}} {n}' for p, (n, _) in sorted(sizes.items())),
        "# HELP cpupools_pool_free_cpulists Cpulists with no task.",
        "# TYPE cpupools_pool_free_cpulists gauge",
        *(f'cpupools_pool_free_cpulists{{pool="{p}"}} {f}' for p, (_, f) in sorted(sizes.items())),
        "# HELP cpupools_reclaimed_cpulists_total Task entries freed by reconcile (dead or reused PIDs).",
        "# TYPE cpupools_reclaimed_cpulists_total counter",
        f"cpupools_reclaimed_cpulists_total {total}",
    ]
    st.atomic_write(path, "\n".join(lines) + "\n", 0o644)


def cmd_reconcile(opts: dict[str, str | bool], environ: dict[str, str] | os._Environ) -> int:
    import json
    import time

    conf = _conf(opts)
    interval = _seconds(opts, "--interval")
    timeout = st.lock_timeout(environ)
    proc_fs = environ.get("CMK_PROC_FS") or "/proc"
    metrics = str(opts.get("--metrics-dir") or environ.get("CPUPOOLS_METRICS_DIR") or "")
    hook = after_pass_hook(opts, environ)
    while True:
        try:
            reclaimed, sizes = reconcile_pass(conf, proc_fs, timeout)
            report = {"reclaimedCpuLists": reclaimed}
            sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()
            if metrics:
                write_metrics(metrics, sizes, len(reclaimed))
            if hook is not None:
                hook(report, sizes)
        except CpupoolsError as exc:
            if interval <= 0:
                raise
            sys.stderr.write(f"cmk reconcile: {exc}\n")
        if interval <= 0:
            return EXIT_OK
        time.sleep(interval)


# describe / node-report ----------------------------------------------------------


def describe(conf: str, timeout: float) -> dict:
    """CMK's describe dict (§6): pools with their cpulists and task PIDs."""
    with st.StateLock(conf, timeout):
        pools = st.read_state(conf)
        return {
            "pools": {
                name: {
                    "cpuLists": {cl.cpus: {"cpus": cl.cpus, "tasks": list(cl.tasks)} for cl in pool.cpulists()},
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


def node_report(conf: str, timeout: float, sysfs_root: str) -> dict:
    from .topology import gather_topology

    errors: list[str] = []
    try:
        description: dict | None = describe(conf, timeout)
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

    conf = _conf(opts)
    timeout = st.lock_timeout(environ)
    interval = _seconds(opts, "--interval") if sub == "node-report" else 0
    while True:
        if sub == "describe":
            data = describe(conf, timeout)
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        else:
            data = node_report(conf, timeout, environ.get("CPUPOOLS_SYSFS_ROOT") or "/")
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()
        if interval <= 0:
            return EXIT_OK
        time.sleep(interval)
