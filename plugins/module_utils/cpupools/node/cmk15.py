"""CMK v1.5's state: the task lists it keeps in the ConfigMap ``cmk-config-<node>``, and its traces on a node.

CMK v1.5 keeps no state directory on the node (its intel/init.py and
intel/config.py): the pools and their task lists live only in the ConfigMap
``cmk-config-<node>`` of its ``--namespace``, ``data.config`` a YAML map
``pool -> socket (int) -> cpulist (CMK's comma form) -> [PIDs as strings]``,
locked by the annotation ``Owner`` (the pod name of the holder, ``""`` when
free). Migrating such a node must carry those lists into the pool state as
CMK v1.4's ``tasks`` files are carried, or the next ``cmk isolate`` would hand
out CPUs a live v1.5 workload holds.

This module is the one reader of that format, and says whether a node shows
CMK v1.5 (``traces_on_node``). Standard library only: the YAML text is parsed
by the caller (the controller has PyYAML) and handed here as data; the API is
reached through ``k8s_apply.Api`` (any transport).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..core.errors import K8sError, show

CONFIG_PREFIX = "cmk-config-"
#: The namespaces CMK is found in unless the inventory says otherwise (``cpupools_cmk_retire_namespaces``,
#: read by the agent stage and the retirement): its cluster-init's ``--namespace`` default, ``intel-cmk``
#: (its manifests' service account up to v1.4) and ``cmk-namespace`` (v1.5's manifests: service account,
#: webhook, pods and the v1.5 ConfigMaps).
CMK_NAMESPACES = ("default", "intel-cmk", "cmk-namespace")
#: The annotation CMK v1.5's isolate and reconcile lock the ConfigMap with (capital O).
OWNER = "Owner"
#: Pools CMK v1.5 knows (``intel/config.py``'s exclusivity map; another name is a KeyError there).
POOLS = ("exclusive", "exclusive-non-isolcpus", "shared", "infra")
#: Largest PID Linux hands out (``PID_MAX_LIMIT`` on 64-bit).
PID_MAX = 4194304
#: What the cpupools launcher starts with (scripts/build_agent.py), to tell it from CMK's binary.
OUR_LAUNCHER = b'"""cmk: the cpupools node agent.'

Tasks = dict[str, dict[str, dict[str, list[int]]]]  # pool -> socket -> cpulist (CMK's form) -> PIDs


def configmap_name(node: str) -> str:
    return f"{CONFIG_PREFIX}{node}"


def parse_config(data: object, where: str) -> Tasks:
    """The task lists of a parsed ``data.config``: ``pool -> socket -> cpulist -> PIDs`` (ints, as listed).

    Everything is checked, as the content may come from anyone who can write
    the ConfigMap: known pool names, socket numbers, cpulists of distinct CPU
    ids in CMK's comma form, PIDs from 1 to ``PID_MAX``. ``where`` names the
    ConfigMap in the message of the ``K8sError`` raised otherwise (values
    quoted shortened).
    """
    if not isinstance(data, dict):
        raise K8sError(f"{where}: data.config is not a map of pools (CMK v1.5's format)")
    out: Tasks = {}
    for pool, sockets in data.items():
        if pool not in POOLS:
            raise K8sError(f"{where}: data.config names pool {show(pool)}; CMK v1.5 knows {', '.join(POOLS)}")
        if not isinstance(sockets, dict):
            raise K8sError(f"{where}: pool {pool} is not a map of sockets")
        out[pool] = {}
        for socket, lists in sockets.items():
            text = str(socket)
            if isinstance(socket, bool) or not (text.isdigit() and text.isascii() and len(text) <= 6):
                raise K8sError(f"{where}: pool {pool}: socket {show(socket)} is not a socket number")
            if lists is None:
                lists = {}
            if not isinstance(lists, dict):
                raise K8sError(f"{where}: pool {pool} socket {text} is not a map of cpulists")
            entries = out[pool].setdefault(str(int(text)), {})
            for cpus, pids in lists.items():
                entries[_cpulist(cpus, where, pool)] = _pids(pids, where, pool, str(cpus))
    return out


def _cpulist(cpus: object, where: str, pool: str) -> str:
    text = str(cpus) if isinstance(cpus, (str, int)) and not isinstance(cpus, bool) else ""
    ids = text.split(",")
    if not text or not all(i.isdigit() and i.isascii() and len(i) <= 5 for i in ids) or len(set(ids)) != len(ids):
        raise K8sError(f"{where}: pool {pool}: {show(cpus)} is not a cpulist in CMK's form (like 2,46)")
    return ",".join(str(int(i)) for i in ids)


def _pids(pids: object, where: str, pool: str, cpus: str) -> list[int]:
    if pids is None:
        return []
    if not isinstance(pids, list):
        raise K8sError(f"{where}: pool {pool} cpulist {show(cpus)}: the tasks are not a list")
    out = []
    for pid in pids:
        text = str(pid) if isinstance(pid, (str, int)) and not isinstance(pid, bool) else ""
        if not (text.isdigit() and text.isascii() and len(text) <= 7 and 0 < int(text) <= PID_MAX):
            raise K8sError(f"{where}: pool {pool} cpulist {show(cpus)}: task {show(pid)} is not a PID")
        if int(text) not in out:
            out.append(int(text))
    return out


def named_pids(tasks: Tasks) -> list[int]:
    """Every PID the task lists name, ascending."""
    return sorted(
        {pid for sockets in tasks.values() for lists in sockets.values() for pids in lists.values() for pid in pids}
    )


def read_tasks(
    api: object,
    node: str,
    namespaces: list[str],
    load: Callable[[str], object],
    wait: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Read ``cmk-config-<node>`` in each of ``namespaces``; its task lists once no v1.5 holder locks it.

    While the ``Owner`` annotation names a holder, a v1.5 isolate or reconcile
    is between reading and writing back the lists: read again every second,
    for at most ``wait`` seconds (then read as it is, with a warning: CMK
    v1.5 never frees a lock whose holder died, item 9 of "What CMK got wrong" in
    docs/cmk-comparison.md, and a ConfigMap nobody
    can lock does not change). ``load`` parses the YAML text (the caller's
    ``yaml.safe_load``). Only GETs are sent.

    Returns ``configmaps`` (``namespace/name`` found), ``tasks`` (``parse_config``
    of all of them together), ``pids`` (every PID named) and ``warnings``.
    """
    from urllib.parse import quote  # here: every converged check imports this module, none calls this

    name = configmap_name(node)
    found: list[str] = []
    tasks: Tasks = {}
    warnings: list[str] = []
    for ns in namespaces:
        path = f"/api/v1/namespaces/{quote(ns, safe='')}/configmaps/{quote(name, safe='')}"
        deadline = time.monotonic() + wait
        while True:
            code, data = api.raw("GET", path)  # type: ignore[attr-defined]
            if code == 404:
                data = None
                break
            if code != 200:
                api.call("GET", path)  # type: ignore[attr-defined]  # raises the one clear message
            owner = str(((data.get("metadata") or {}).get("annotations") or {}).get(OWNER) or "")
            if not owner:
                break
            if time.monotonic() >= deadline:
                warnings.append(
                    f"{ns}/{name} stayed locked by {show(owner)} for {wait:g} s (a holder that died keeps "
                    "CMK v1.5's lock for ever); its task lists were read as they are"
                )
                break
            sleep(1.0)
        if data is None:
            continue
        where = f"ConfigMap {ns}/{name}"
        text = (data.get("data") or {}).get("config")
        if not isinstance(text, str):
            raise K8sError(f"{where} has no data.config: not CMK v1.5's state")
        try:
            parsed = load(text)
        except Exception as exc:  # the caller's YAML parser: any of its errors means "not YAML"
            raise K8sError(f"{where}: data.config is not YAML ({type(exc).__name__})") from None
        found.append(f"{ns}/{name}")
        for pool, sockets in parse_config(parsed, where).items():
            for socket, lists in sockets.items():
                into = tasks.setdefault(pool, {}).setdefault(socket, {})
                for cpus, pids in lists.items():
                    into[cpus] = into.get(cpus, []) + [p for p in pids if p not in into.get(cpus, [])]
    return {"configmaps": found, "tasks": tasks, "pids": named_pids(tasks), "warnings": warnings}


def traces_on_node(root: str, conf_dir: str, agent: str) -> str:
    """Why this node looks like a CMK v1.5 node (``""`` when it does not).

    ``conf_dir`` and ``agent`` are the paths on the node (``cpupools_conf_dir``,
    ``cpupools_agent_path``), ``root`` what they are under. CMK v1.5 installs
    its ``cmk`` binary (``cluster-init``'s install step, ``/opt/bin/cmk`` by
    default) and keeps its state only in the ConfigMap, so: a ``cmk`` there
    that is not cpupools' launcher, and no pool state (no ``pools``) in the
    conf dir (CMK v1.4 and cpupools keep theirs there). CMK v1.4 and v1.5
    both install a PyInstaller binary; the missing state directory is what
    tells v1.5 apart.
    """
    binary = os.path.join(root, agent.lstrip("/"))
    pools = os.path.join(root, conf_dir.lstrip("/"), "pools")
    try:
        with open(binary, "rb") as handle:
            head = handle.read(512)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""
    except OSError:
        head = b""
    if OUR_LAUNCHER in head or os.path.lexists(pools):
        return ""
    return f"{agent} is CMK's cmk, not cpupools', and {conf_dir} holds no pool state"
