"""Runtimes other than ``cmk``: Nokia CPU-Pooler and the nri-plugins policies, from the one plan.

Standard library only; no Ansible import (the planner imports the checks).
Three parts:

- ``check_runtime``: what a runtime cannot express of a plan, refused in the
  plan play (``PlanError`` naming the variable) before any stage writes;
- renderers: the plan as CPU-Pooler's ``poolconfig-<group>.yaml`` (one entry
  of the ``cpu-pooler-configmap`` ConfigMap) or as an nri-plugins
  ``TopologyAwarePolicy`` / ``BalloonsPolicy`` object named ``group.<group>``;
- applying them is ``cluster/runtimes_apply.py``'s ``ensure_runtime``:
  publish the node's group configuration, label the node with the label the
  runtime selects its configuration by, and remove what is no longer used.

Nodes whose rendered configurations are identical share one group: its name
is ``cpupools-`` plus a digest of the configuration, so every host computes
the same name on its own and a re-run writes nothing. Only names with that
prefix (and only the ConfigMap keys ``poolconfig-cpupools-*``) are ever
changed or removed; other owners' files, objects and labels stay.

Facts from the projects (see docs/runtimes.md for the sources):

- CPU-Pooler (nokia/CPU-Pooler, pkg/types/pool.go): every ``poolconfig-*``
  file of the ConfigMap mounted at ``/etc/cpu-pooler``; a pool's type is its
  name's prefix (``exclusive``, ``shared``, anything else is the default
  pool); one shared pool at most; ``cpus`` is parsed by Kubernetes'
  ``cpuset.Parse``; the first file whose ``nodeSelector`` matches one label
  of the node is used. Exclusive pools list one CPU per physical core; with
  ``hyperThreadingPolicy: multiThreaded`` the siblings are found by taking
  that CPU id as the core number of ``lscpu -p=cpu,core`` (pkg/topology).
- nri-plugins (pkg/agent/agent.go, config/crd/bases): the policy reads
  ``node.<node>``, else ``group.<group>`` (the node's ``config.nri/group``
  label), else ``default`` in its namespace (``kube-system``); CPU sets are
  written ``cpuset:<cpulist>``; ``reservedResources`` is required.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import PlanError
from ..core.names import (
    ENI,
    EXCLUSIVE,
    INFRA,
    MANAGED_BY,
    NRI_BALLOONS,
    NRI_TOPOLOGY_AWARE,
    POOLER,
    SHARED,
)
from .inputs import HT_POLICIES

# Applying this to the API server is cluster.runtimes_apply's: the plan
# play's module imports this file for check_runtime on every host of every
# run, and compiling the Kubernetes side on each node was a seventh of the
# time its own imports take (docs/performance.md).

#: Runtimes whose configuration this module renders and publishes.
CONFIG_RUNTIMES = (POOLER, NRI_TOPOLOGY_AWARE, NRI_BALLOONS)
NRI_RUNTIMES = (NRI_TOPOLOGY_AWARE, NRI_BALLOONS)

SINGLE_THREADED = "singleThreaded"
MULTI_THREADED = "multiThreaded"

GROUP_PREFIX = "cpupools-"
POOLER_CONFIGMAP = "cpu-pooler-configmap"
POOLER_LABEL = "cpupools.io/pooler-config"
POOLER_KEY_PREFIX = "poolconfig-" + GROUP_PREFIX
#: Pooler pool names: the prefix is the pool type; the name is the resource (nokia.k8s.io/<name>).
POOLER_POOLS = {
    EXCLUSIVE: "exclusive_cpupools",
    ENI: "exclusive_non_isolcpus",
    SHARED: "shared_cpupools",
    INFRA: "default",
}
NRI_GROUP_LABEL = "config.nri/group"
NRI_GROUP = "config.nri"
NRI_VERSION = "v1alpha1"
#: runtime -> (kind, plural, the Helm chart that installs the policy and its CRD)
NRI_KINDS = {
    NRI_TOPOLOGY_AWARE: ("TopologyAwarePolicy", "topologyawarepolicies", "nri-resource-policy-topology-aware"),
    NRI_BALLOONS: ("BalloonsPolicy", "balloonspolicies", "nri-resource-policy-balloons"),
}
#: Balloon type names, one per pool (pods choose one with the annotation
#: balloon.balloons.resource-policy.nri.io: <name>).
BALLOON_TYPES = {EXCLUSIVE: "exclusive", ENI: "exclusive-non-isolcpus", SHARED: "shared"}


# Reading the plan ------------------------------------------------------------


def _pool_cpus(plan: Mapping, pool: str) -> list[int]:
    return parse_cpulist((plan.get("pool_cpus") or {}).get(pool) or "", pool)


def _pool_cores(plan: Mapping, pool: str) -> list[list[int]]:
    """An exclusive pool's physical cores (one cpulist each), in hand-out order."""
    return [parse_cpulist(text, pool) for text in (plan.get("handout_order") or {}).get(pool) or []]


def _isolated(plan: Mapping) -> set[int]:
    return set(parse_cpulist(plan.get("isolated_cpus") or "", "isolated_cpus"))


def _reserved(plan: Mapping) -> list[int]:
    """The housekeeping cores (what no runtime hands out); the infra pool for a plan without them."""
    text = plan.get("reserved_cpus")
    return parse_cpulist(text, "reserved_cpus") if text is not None else _pool_cpus(plan, INFRA)


#: The plan's core types in balloons' ``preferCoreType`` terms.
BALLOON_CORE_TYPES = {"performance": "performance", "efficiency": "efficient"}


def _core_type_of(plan: Mapping, cpus: list[int]) -> str | None:
    """``performance`` or ``efficient`` when every CPU of ``cpus`` is of that type (hybrid nodes only)."""
    types = plan.get("core_types") or {}
    if not cpus or len(types) < 2:
        return None
    for kind, text in types.items():
        if set(cpus) <= set(parse_cpulist(text or "", f"core_types.{kind}")):
            return BALLOON_CORE_TYPES.get(kind)
    return None


def _all_cpus(plan: Mapping) -> list[int]:
    return sorted({cpu for pool in (plan.get("pool_cpus") or {}) for cpu in _pool_cpus(plan, pool)})


# Refusals (plan play) --------------------------------------------------------


def check_runtime(plan: Mapping, core_index: Mapping[int, int], runtime: str, ht_policy: str) -> None:
    """Refuse a plan ``runtime`` cannot express; ``core_index``: first CPU of a core -> its lscpu core number.

    The rules, each with the variable to change:

    - every runtime here runs the node's ordinary and kube-system containers
      on the infra pool: infra CPUs that are isolated (an adopted
      ``isolcpus``) would run them without load balancing;
    - CPU-Pooler with ``multiThreaded`` finds a core's siblings by taking
      the listed CPU id as an lscpu core number: on a host where the first
      thread of an exclusive core is not numbered like its core (adjacent
      sibling numbering, offline CPUs before it), Pooler would hand out the
      threads of another core;
    - nri-topology-aware has no named pools: an exclusive-non-isolcpus pool
      cannot be told apart, and it treats every isolated CPU as exclusive,
      so an isolated shared pool would stop being shared.
    """
    if runtime not in CONFIG_RUNTIMES:
        return
    isolated = _isolated(plan)
    infra_isolated = [cpu for cpu in _pool_cpus(plan, INFRA) if cpu in isolated]
    if infra_isolated:
        raise PlanError(
            f"{runtime} runs ordinary and kube-system containers on the infra pool, but its CPU(s) "
            f"{format_cpulist(infra_isolated)} are isolated (adopted isolcpus) and get no load balancing; "
            "use cpupools_isolcpus_source: generate or cpupools_runtime: cmk",
            "runtime",
        )
    if runtime == POOLER and ht_policy == MULTI_THREADED:
        for pool in (EXCLUSIVE, ENI):
            for core in _pool_cores(plan, pool):
                if len(core) > 1 and core_index.get(core[0]) != core[0]:
                    raise PlanError(
                        f"CPU-Pooler's multiThreaded policy takes the listed CPU id as the lscpu core number to "
                        f"find its siblings; core {format_cpulist(core)} of pool {pool} is lscpu core "
                        f"{core_index.get(core[0])}, not {core[0]}, so Pooler would add the threads of another "
                        "core; set cpupools_pooler_ht_policy: singleThreaded",
                        "pooler_ht_policy",
                    )
    if runtime == NRI_BALLOONS:
        shared_isolated = [cpu for cpu in _pool_cpus(plan, SHARED) if cpu in isolated]
        if shared_isolated:
            raise PlanError(
                f"nri-balloons finds the exclusive pool by the CPUs the kernel isolates, so with the shared pool "
                f"({format_cpulist(shared_isolated)}) isolated too an exclusive balloon could get a shared CPU; "
                "set cpupools_isolated_pools: [exclusive]",
                "isolated_pools",
            )
        sizes = sorted({len(core) for core in _pool_cores(plan, ENI)})
        if len(sizes) > 1:
            raise PlanError(
                f"nri-balloons holds each exclusive-non-isolcpus core in a balloon of one size, but the pool's "
                f"cores have {' and '.join(map(str, sizes))} threads; give the pool cores of one kind",
                "excl_non_isolcpus",
            )
    if runtime == NRI_TOPOLOGY_AWARE:
        if _pool_cpus(plan, ENI):
            raise PlanError(
                f"nri-topology-aware has no named pools, so the exclusive-non-isolcpus pool "
                f"({(plan.get('pool_cpus') or {}).get(ENI)}) cannot be expressed; remove it or use "
                "cpupools_runtime: nri-balloons",
                "excl_non_isolcpus",
            )
        shared_isolated = [cpu for cpu in _pool_cpus(plan, SHARED) if cpu in isolated]
        if shared_isolated:
            raise PlanError(
                f"nri-topology-aware hands isolated CPUs out only exclusively, so the isolated shared pool "
                f"({format_cpulist(shared_isolated)}) would not be shared; set cpupools_isolated_pools: [exclusive]",
                "isolated_pools",
            )


def core_numbers(cores: list[list[int]]) -> dict[int, int]:
    """First CPU of each core -> its lscpu core number (cores numbered in order of their first online CPU)."""
    firsts = sorted(min(core) for core in cores if core)
    return {first: index for index, first in enumerate(firsts)}


# Renderers -------------------------------------------------------------------


def group_name(config: Mapping) -> str:
    """The group of every node whose rendered configuration is ``config``: a digest, the same on every host."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return GROUP_PREFIX + digest[:12]


def render_pooler(plan: Mapping, ht_policy: str = MULTI_THREADED) -> dict:
    """CPU-Pooler's pools for the plan: ``{"pools": {name: {"cpus": ..., ...}}}``.

    Exclusive pools list the first thread of each core (Pooler's "physical
    core IDs"): with ``multiThreaded`` Pooler adds the siblings, with
    ``singleThreaded`` they stay idle. Shared and default list every thread.
    Empty pools are left out (Pooler would advertise a resource of 0).
    """
    if ht_policy not in HT_POLICIES:
        raise PlanError(f"{ht_policy!r} is not one of {', '.join(HT_POLICIES)}", "pooler_ht_policy")
    pools: dict[str, dict[str, str]] = {}
    for pool in (EXCLUSIVE, ENI):
        firsts = sorted(core[0] for core in _pool_cores(plan, pool))
        if firsts:
            pools[POOLER_POOLS[pool]] = {"cpus": format_cpulist(firsts), "hyperThreadingPolicy": ht_policy}
    for pool in (SHARED, INFRA):
        cpus = _pool_cpus(plan, pool)
        if cpus:
            pools[POOLER_POOLS[pool]] = {"cpus": format_cpulist(cpus)}
    return {"pools": dict(sorted(pools.items()))}


def pooler_file(config: Mapping, group: str) -> tuple[str, str]:
    """The ConfigMap key and YAML text of a group's pool configuration (deterministic)."""
    lines = [
        f"# Written by cpupools for the nodes labelled {POOLER_LABEL}={group}; do not edit (re-run cpupools).",
        "pools:",
    ]
    for name, pool in config["pools"].items():
        lines.append(f"  {name}:")
        for key, value in pool.items():
            lines.append(f"    {key}: {json.dumps(value)}")
    lines += ["nodeSelector:", f"  {POOLER_LABEL}: {json.dumps(group)}", ""]
    return f"poolconfig-{group}.yaml", "\n".join(lines)


def render_nri(plan: Mapping, runtime: str) -> dict:
    """The ``spec`` of the nri-plugins policy object for the plan.

    Reserved: the plan's housekeeping cores (``reserved_cpus``) as an explicit
    cpuset (kube-system and the reserved-pool namespaces run there), not the
    cores no pool took: those stay the policy's to share; available: every
    CPU of the plan. topology-aware prefers isolated CPUs for exclusive
    allocations; balloons gets the balloon types of ``balloon_types``.
    """
    isolated = _isolated(plan)
    spec: dict[str, Any] = {
        "reservedResources": {"cpu": "cpuset:" + format_cpulist(_reserved(plan))},
        "availableResources": {"cpu": "cpuset:" + format_cpulist(_all_cpus(plan))},
        "pinCPU": True,
        "pinMemory": True,
    }
    if runtime == NRI_TOPOLOGY_AWARE:
        spec["preferIsolatedCPUs"] = bool(isolated)
        return spec
    if runtime != NRI_BALLOONS:
        raise PlanError(f"{runtime!r} is not an nri-plugins runtime ({', '.join(NRI_RUNTIMES)})", "runtime")
    spec["balloonTypes"] = balloon_types(plan, spec)
    return spec


def balloon_types(plan: Mapping, spec: dict) -> list[dict]:
    """Balloon types that cannot hand an exclusive workload a CPU the plan did not isolate.

    The balloons policy finds isolated CPUs in ``/sys/devices/system/cpu/isolated``
    and only *prefers* them (``preferIsolCpus``: a balloon that cannot get
    enough takes others); no balloon type can be fenced to a cpuset. So the
    fence is made of whole balloons: everything but the exclusive pool is
    held by balloons of a fixed size that the policy makes at its start
    (``minBalloons``, ``minCPUs`` = ``maxCPUs``), while every CPU is still
    free and away from the isolated ones (which are the exclusive pool and
    no other: ``check_runtime`` keeps the shared pool out of ``isolcpus``),
    and never resizes: the reserved CPUs, the cores no pool took
    (``default``, where pods without a balloon annotation go), the shared
    pool and each exclusive-non-isolcpus core. What stays free is the
    exclusive pool, from which the exclusive type's balloons are made, one
    per container (``preferNewBalloons``), at most one per core. Which of the
    fixed balloons gets which non-isolated CPU is the policy's preference
    (the reserved cpuset, the pools' core types), not a fence.
    """
    isolated = _isolated(plan)
    reserved = _reserved(plan)
    pools = {pool: _pool_cpus(plan, pool) for pool in (EXCLUSIVE, ENI, SHARED)}
    leftovers = sorted(set(_all_cpus(plan)) - set(reserved) - {cpu for cpus in pools.values() for cpu in cpus})
    types: list[dict[str, Any]] = []
    exclusive = pools[EXCLUSIVE]
    if exclusive:
        entry: dict[str, Any] = {
            "name": BALLOON_TYPES[EXCLUSIVE],
            "maxBalloons": len(_pool_cores(plan, EXCLUSIVE)) or len(exclusive),
            "maxCPUs": len(exclusive),
            "preferNewBalloons": True,
            "preferIsolCpus": any(cpu in isolated for cpu in exclusive),
            "allocatorPriority": "high",
        }
        kind = _core_type_of(plan, exclusive)
        if kind:
            entry["preferCoreType"] = kind
        types.append(entry)
    types.append(_fixed("reserved", len(reserved)))
    if leftovers:
        types.append(_fixed("default", len(leftovers)))
    shared = pools[SHARED]
    if shared:
        entry = _fixed(BALLOON_TYPES[SHARED], len(shared))
        entry["preferIsolCpus"] = False
        if not leftovers:
            entry["namespaces"] = ["*"]  # pods without an annotation: here, not a balloon of free CPUs
        kind = _core_type_of(plan, shared)
        if kind:
            entry["preferCoreType"] = kind
        types.append(entry)
    eni_cores = _pool_cores(plan, ENI)
    if eni_cores:
        entry = _fixed(BALLOON_TYPES[ENI], len(eni_cores[0]), count=len(eni_cores))
        entry["preferIsolCpus"] = False
        kind = _core_type_of(plan, pools[ENI])
        if kind:
            entry["preferCoreType"] = kind
        types.append(entry)
    if not leftovers and not shared:
        spec["reservedPoolNamespaces"] = ["*"]  # nothing else is left for pods without an annotation
    return types


def _fixed(name: str, cpus: int, count: int = 1) -> dict[str, Any]:
    """A balloon type of ``count`` balloons of exactly ``cpus`` CPUs, made when the policy starts."""
    return {
        "name": name,
        "minBalloons": count,
        "maxBalloons": count,
        "minCPUs": cpus,
        "maxCPUs": cpus,
        "allocatorPriority": "normal",
    }


def nri_object(runtime: str, spec: Mapping, group: str, namespace: str) -> dict:
    kind = NRI_KINDS[runtime][0]
    return {
        "apiVersion": f"{NRI_GROUP}/{NRI_VERSION}",
        "kind": kind,
        "metadata": {"name": f"group.{group}", "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": dict(spec),
    }


def render(plan: Mapping, runtime: str, ht_policy: str = MULTI_THREADED, namespace: str = "kube-system") -> dict:
    """Everything ``runtime`` gets for this plan: ``group``, ``label`` and the ``file`` or ``object``."""
    if runtime == POOLER:
        config = render_pooler(plan, ht_policy)
        group = group_name(config)
        key, text = pooler_file(config, group)
        return {"runtime": runtime, "group": group, "label": POOLER_LABEL, "key": key, "file": text}
    if runtime in NRI_RUNTIMES:
        spec = render_nri(plan, runtime)
        group = group_name({"kind": NRI_KINDS[runtime][0], "spec": spec})
        return {
            "runtime": runtime,
            "group": group,
            "label": NRI_GROUP_LABEL,
            "object": nri_object(runtime, spec, group, namespace),
        }
    raise PlanError(f"{runtime!r} has no configuration to render (one of {', '.join(CONFIG_RUNTIMES)})", "runtime")
