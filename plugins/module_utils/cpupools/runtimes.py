"""Runtimes other than ``cmk``: Nokia CPU-Pooler and the nri-plugins policies, from the one plan.

Standard library only; no Ansible import (the planner imports the checks).
Three parts:

- ``check_runtime``: what a runtime cannot express of a plan, refused in the
  plan play (``PlanError`` naming the variable) before any stage writes;
- renderers: the plan as CPU-Pooler's ``poolconfig-<group>.yaml`` (one entry
  of the ``cpu-pooler-configmap`` ConfigMap) or as an nri-plugins
  ``TopologyAwarePolicy`` / ``BalloonsPolicy`` object named ``group.<group>``;
- ``ensure_runtime``: the controller-side applier over a ``k8s_apply.Api``:
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
from urllib.parse import quote

from .cpulist import format_cpulist, parse_cpulist
from .errors import K8sError, PlanError
from .inputs import HT_POLICIES, RUNTIMES
from .plan import ENI, EXCLUSIVE, INFRA, SHARED

# The Kubernetes side (k8s, k8s_apply) is imported by the functions that talk
# to the API server, not here: the plan play's module imports this file for
# check_runtime on every host of every run, and compiling those two files on
# each node was a seventh of the time its own imports take (docs/performance.md).

CMK = "cmk"
KUBELET = "kubelet"
POOLER = "cpu-pooler"
NRI_TOPOLOGY_AWARE = "nri-topology-aware"
NRI_BALLOONS = "nri-balloons"
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
    allocations; balloons gets one balloon type per pool: an exclusive type
    makes a new balloon per container (``preferNewBalloons``), at most one
    per core of the pool (``maxBalloons``) and none larger than the pool,
    preferring isolated CPUs where the plan isolates the pool and, on a
    hybrid node, the pool's core type (``preferCoreType``); the shared type
    is one balloon of exactly the shared pool's size, on its core type.
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
    types = []
    for pool in (EXCLUSIVE, ENI):
        cpus = _pool_cpus(plan, pool)
        if cpus:
            entry: dict[str, Any] = {
                "name": BALLOON_TYPES[pool],
                "maxBalloons": len(_pool_cores(plan, pool)) or len(cpus),
                "maxCPUs": len(cpus),
                "preferNewBalloons": True,
                "preferIsolCpus": any(cpu in isolated for cpu in cpus),
                "allocatorPriority": "high",
            }
            kind = _core_type_of(plan, cpus)
            if kind:
                entry["preferCoreType"] = kind
            types.append(entry)
    shared = _pool_cpus(plan, SHARED)
    if shared:
        entry = {
            "name": BALLOON_TYPES[SHARED],
            "minBalloons": 1,
            "maxBalloons": 1,
            "minCPUs": len(shared),
            "maxCPUs": len(shared),
            "preferIsolCpus": any(cpu in isolated for cpu in shared),
            "allocatorPriority": "normal",
        }
        kind = _core_type_of(plan, shared)
        if kind:
            entry["preferCoreType"] = kind
        types.append(entry)
    spec["balloonTypes"] = types
    return spec


def nri_object(runtime: str, spec: Mapping, group: str, namespace: str) -> dict:
    from .k8s import MANAGED_BY

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


# Applying (controller side) ----------------------------------------------------


def _configmap_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps"
    return f"{base}/{quote(name, safe='')}" if name else base


def _nri_path(runtime: str, namespace: str, name: str = "") -> str:
    base = f"/apis/{NRI_GROUP}/{NRI_VERSION}/namespaces/{quote(namespace, safe='')}/{NRI_KINDS[runtime][1]}"
    return f"{base}/{quote(name, safe='')}" if name else base


def _object_missing(body: object, name: str) -> bool:
    """A 404 about the object itself (its Status names it), not about a resource the server does not serve."""
    details = body.get("details") if isinstance(body, Mapping) else None
    return isinstance(details, Mapping) and details.get("name") == name


def _not_served(api: Any, runtime: str) -> K8sError:
    kind, plural, chart = NRI_KINDS[runtime]
    return K8sError(
        f"API server {api.server} does not serve {plural}.{NRI_GROUP} ({kind}): install the nri-plugins "
        f"policy first (Helm chart {chart}, which brings its CRD), or choose another cpupools_runtime",
        "runtime",
    )


def _ensure_pooler_file(api: Any, namespace: str, key: str, text: str | None, check_mode: bool) -> str:
    """Put (``text``) or remove (``None``) one key of Pooler's ConfigMap.

    Returns ``created``, ``updated``, ``deleted`` or ``unchanged``.

    Updates are PUTs of the object that was read (its resourceVersion
    guards them); a 409 means another host wrote in between: read again.
    A ConfigMap cpupools created and left without keys is deleted.
    """
    from .k8s import MANAGED_BY
    from .k8s_apply import FIELD_MANAGER, failure

    path = _configmap_path(namespace, POOLER_CONFIGMAP)
    for _ in range(api.attempts * 2):
        code, current = api.raw("GET", path)
        if code == 404 and _object_missing(current, POOLER_CONFIGMAP):
            if text is None:
                return "unchanged"
            if check_mode:
                return "created"
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": POOLER_CONFIGMAP, "namespace": namespace, "labels": dict(MANAGED_BY)},
                "data": {key: text},
            }
            code, answer = api.raw("POST", _configmap_path(namespace), body, query=FIELD_MANAGER)
            if code in (200, 201):
                return "created"
            if code != 409:
                raise failure(code, answer, "POST", _configmap_path(namespace), api.node, api.server)
            continue
        if code != 200:
            raise failure(code, current, "GET", path, api.node, api.server)
        data = dict(current.get("data") or {})
        if data.get(key) == text:
            return "unchanged"
        if text is None:
            data.pop(key)
        else:
            data[key] = text
        if check_mode:
            return "deleted" if text is None else ("updated" if key in (current.get("data") or {}) else "created")
        labels = (current.get("metadata") or {}).get("labels") or {}
        if not data and all(labels.get(k) == v for k, v in MANAGED_BY.items()):
            method = "DELETE"
            code, answer = api.raw(
                "DELETE", path, {"preconditions": {"resourceVersion": current["metadata"]["resourceVersion"]}}
            )
            if code in (200, 202, 404):
                return "deleted"
        else:
            method = "PUT"
            code, answer = api.raw(method, path, dict(current, data=data), query=FIELD_MANAGER)
            if code == 200:
                return "deleted" if text is None else ("updated" if key in (current.get("data") or {}) else "created")
        if code != 409:
            raise failure(code, answer, method, path, api.node, api.server)
    raise api.conflict_error(f"the ConfigMap {namespace}/{POOLER_CONFIGMAP}")


def _nri_defaults(api: Any, runtime: str) -> Mapping | None:
    """The schema of the policy object as the server's CRD declares it (its defaults), or ``None`` when unreadable."""
    from .k8s import crd_version_schema

    plural = NRI_KINDS[runtime][1]
    code, crd = api.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{NRI_GROUP}")
    return crd_version_schema(crd, NRI_VERSION) if code == 200 else None


def _nri_same(api: Any, runtime: str, current: Mapping, obj: Mapping) -> bool:
    """Our spec and label are there. The spec is compared with ours as the server stores it: the
    CRD's defaults (``agent``, ``pinCPU``, a balloon type's ``allocatorPriority`` ...) come back on
    every read and are not a difference; anything else, ours changed or a field someone added, is."""
    from .k8s import MANAGED_BY, with_defaults

    labels = (current.get("metadata") or {}).get("labels") or {}
    if not all(labels.get(k) == v for k, v in MANAGED_BY.items()):
        return False
    if current.get("spec") == obj["spec"]:
        return True
    schema = _nri_defaults(api, runtime)
    spec_schema = ((schema or {}).get("properties") or {}).get("spec")
    return spec_schema is not None and current.get("spec") == with_defaults(obj["spec"], spec_schema)


def _ensure_nri_object(api: Any, runtime: str, namespace: str, name: str, obj: dict | None, check_mode: bool) -> str:
    """Create, replace or delete (``obj`` None) one nri-plugins policy object."""
    from .k8s import MANAGED_BY
    from .k8s_apply import FIELD_MANAGER, failure

    path = _nri_path(runtime, namespace, name)
    for _ in range(api.attempts * 2):
        code, current = api.raw("GET", path)
        if code == 404 and not _object_missing(current, name):
            if obj is None:
                return "unchanged"  # nothing of this kind can exist
            raise _not_served(api, runtime)
        if code == 404:
            if obj is None:
                return "unchanged"
            if check_mode:
                return "created"
            code, answer = api.raw("POST", _nri_path(runtime, namespace), obj, query=FIELD_MANAGER)
            if code in (200, 201):
                return "created"
            if code != 409:
                raise failure(code, answer, "POST", _nri_path(runtime, namespace), api.node, api.server)
            continue
        if code != 200:
            raise failure(code, current, "GET", path, api.node, api.server)
        if obj is None:
            if check_mode:
                return "deleted"
            code, answer = api.raw("DELETE", path)
            if code in (200, 202, 404):
                return "deleted"
            raise failure(code, answer, "DELETE", path, api.node, api.server)
        if _nri_same(api, runtime, current, obj):
            return "unchanged"
        if check_mode:
            return "updated"
        labels = (current.get("metadata") or {}).get("labels") or {}
        meta = dict(current["metadata"], labels=dict(labels, **MANAGED_BY))
        code, answer = api.raw("PUT", path, dict(obj, metadata=meta), query=FIELD_MANAGER)
        if code == 200:
            return "updated"
        if code != 409:
            raise failure(code, answer, "PUT", path, api.node, api.server)
    raise api.conflict_error(f"the {NRI_KINDS[runtime][0]} {namespace}/{name}")


def _group_in_use(api: Any, label: str, group: str) -> list[str]:
    """Names of the other nodes that carry ``label=group`` (filtered here too: a selector is only a hint)."""
    data = api.call("GET", "/api/v1/nodes", query={"labelSelector": f"{label}={group}"})
    return sorted(
        n["metadata"]["name"]
        for n in data.get("items") or []
        if ((n.get("metadata") or {}).get("labels") or {}).get(label) == group and n["metadata"]["name"] != api.node
    )


def _publish(api: Any, want: Mapping, namespace: str, check_mode: bool) -> str:
    if want["runtime"] == POOLER:
        return _ensure_pooler_file(api, namespace, want["key"], want["file"], check_mode)
    obj = want["object"]
    return _ensure_nri_object(api, want["runtime"], namespace, obj["metadata"]["name"], obj, check_mode)


def _retire(api: Any, label: str, group: str, namespace: str, check_mode: bool) -> list[str]:
    """Remove a group's configuration once no other node uses it; returns what was removed."""
    if _group_in_use(api, label, group):
        return []
    removed = []
    if label == POOLER_LABEL:
        key = f"poolconfig-{group}.yaml"
        if _ensure_pooler_file(api, namespace, key, None, check_mode) == "deleted":
            removed.append(f"ConfigMap {namespace}/{POOLER_CONFIGMAP} key {key}")
    else:
        for runtime in NRI_RUNTIMES:
            if _ensure_nri_object(api, runtime, namespace, f"group.{group}", None, check_mode) == "deleted":
                removed.append(f"{NRI_KINDS[runtime][0]} {namespace}/group.{group}")
    return removed


# How the group's configuration looked before and after, per action (for --diff).
_CONFIG_STATES = {
    "created": ("absent", "current"),
    "updated": ("outdated", "current"),
    "skipped": ("none", "none"),
}


def ensure_runtime(
    api: Any,
    runtime: str,
    plan: Mapping | None,
    state: str = "present",
    ht_policy: str = MULTI_THREADED,
    namespace: str = "kube-system",
    check_mode: bool = False,
) -> dict:
    """Make the node use ``runtime``'s configuration for its plan, and nothing of the other runtimes.

    Order: publish the group's configuration, then label the node (a
    runtime never sees a label without its file), then retire the groups
    the node left when no other node uses them, then read the group's
    configuration once more (a host that retired the same group in between
    is undone). ``state: absent`` (or a runtime with nothing to publish)
    removes our labels and retires their groups.
    """
    from .k8s import NodeWants
    from .k8s_apply import ensure_node, node_path

    if runtime not in RUNTIMES:
        raise K8sError(f"{runtime!r} is not one of {', '.join(RUNTIMES)}", "runtime")
    node = api.call("GET", node_path(api.node))
    labels = (node.get("metadata") or {}).get("labels") or {}
    want = (
        render(plan or {}, runtime, ht_policy, namespace) if state == "present" and runtime in CONFIG_RUNTIMES else None
    )
    published = "skipped"
    if want is not None:
        published = _publish(api, want, namespace, check_mode)
    wanted_labels: dict[str, str | None] = {}
    leaving = []
    for label in (POOLER_LABEL, NRI_GROUP_LABEL):
        value = want["group"] if want is not None and want["label"] == label else None
        current = labels.get(label)
        ours = isinstance(current, str) and current.startswith(GROUP_PREFIX)
        if value is not None or ours:
            wanted_labels[label] = value
        if ours and current != value:
            leaving.append((label, current))
    outcome = {"changed": False, "before": {}, "after": {}}
    if any(labels.get(key) != value for key, value in wanted_labels.items()):  # the node read above is current
        wants = NodeWants(labels=wanted_labels, taint_key=None, taint=None, resources={})
        outcome = ensure_node(api, wants, check_mode)
    retired: list[str] = []
    for label, group in leaving:
        retired += _retire(api, label, group, namespace, check_mode)
    if want is not None and not check_mode and outcome["changed"]:
        # A host that left this group may have retired it between our publish and our label.
        again = _publish(api, want, namespace, check_mode)
        published = published if again == "unchanged" else again
    before = {k: labels.get(k) for k in wanted_labels}
    after = dict(wanted_labels)
    return {
        "changed": outcome["changed"] or published not in ("unchanged", "skipped") or bool(retired),
        "runtime": runtime,
        "group": want["group"] if want else None,
        "published": published,
        "retired": retired,
        "labels": after,
        "diff": {
            "before": {"labels": before, "config": _CONFIG_STATES.get(published, ("current", "current"))[0]},
            "after": {"labels": after, "config": _CONFIG_STATES.get(published, ("current", "current"))[1]},
        },
    }
