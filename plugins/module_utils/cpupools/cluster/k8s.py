"""What cpupools wants on a Kubernetes Node, and the requests that get it there.

Pure functions over plain dicts (the JSON of API objects), standard library
only: no ``kubernetes`` import, so the node agent can use them too and tests
need no server. The callers do the I/O:

- ``desired_node`` turns the plan and the options into ``NodeWants``: the
  labels we manage, the ``cmk`` taint (or its absence) and the extended
  resource counts;
- ``node_changes`` compares that with a Node object and returns the labels,
  taints and capacity after the change plus the two JSON patches (one for the
  object, one for its ``status`` subresource) that make exactly that
  change, each guarded by a ``test`` of the resourceVersion that was read;
- ``layout_crd`` and ``layout_object`` are the published layout: a
  cluster-scoped custom resource per node.

What ``state: absent`` removes is exactly what ``present`` manages: the label
keys we set (the node label and the user's ``labels``), the taint with our key,
and our extended resources (both names, in capacity and allocatable).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core import kube_names
from ..core.errors import K8sError
from ..core.names import ENI, EXCLUSIVE, MANAGED_BY

DEFAULT_LABEL_DOMAIN = "cmk.intel.com"
NODE_LABEL_NAME = "cmk-node"
TAINT_KEY = "cmk"
TAINT_VALUE = "true"
TAINT_EFFECT = "NoSchedule"
DEFAULT_EXCLUSIVE_RESOURCE = "cmk.intel.com/exclusive-cores"
DEFAULT_ENI_RESOURCE = "cmk.intel.com/exclusive-non-isolcpus-cores"

# The published layout (replaces CMK's intel.com/v1beta1 Cmk-nodereport).
LAYOUT_GROUP = "cpupools.io"
LAYOUT_VERSION = "v1"
LAYOUT_KIND = "CpuPoolLayout"
LAYOUT_PLURAL = "cpupoollayouts"
LAYOUT_SINGULAR = "cpupoollayout"
LAYOUT_CRD_NAME = f"{LAYOUT_PLURAL}.{LAYOUT_GROUP}"

# Validation (the names' rules are core/kube_names.py's, which the inputs' check uses too) ---------


def check_qualified_name(text: object, what: str, field_name: str, need_prefix: bool = False) -> str:
    """A Kubernetes qualified name: ``[prefix/]name`` (label keys, resource names)."""
    if not isinstance(text, str) or not text:
        raise K8sError(f"{what} {text!r} is not a non-empty string", field_name)
    fault = kube_names.qualified_name_fault(text, need_prefix)
    if fault:
        raise K8sError(f"{what} {text!r}: {fault}", field_name)
    return text


def check_label_value(value: object, key: str, field_name: str) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str) or not kube_names.LABEL_VALUE.match(value):
        raise K8sError(
            f"label {key!r}: value {value!r} must be at most 63 characters of [A-Za-z0-9-_.], "
            "starting and ending with a letter or digit (or empty)",
            field_name,
        )
    return value


def check_node_name(name: object) -> str:
    if not kube_names.is_subdomain(name):
        raise K8sError(f"{name!r} is not a valid Kubernetes node name (a lowercase DNS subdomain)", "k8s_node_name")
    return name


def check_extended_resource(name: object, field_name: str) -> str:
    if not isinstance(name, str) or not name:
        raise K8sError(f"extended resource name {name!r} is not a non-empty string", field_name)
    fault = kube_names.extended_resource_fault(name)
    if fault:
        raise K8sError(f"extended resource name {name!r}: {fault}", field_name)
    return name


# Desired state -------------------------------------------------------------


@dataclass(frozen=True)
class NodeWants:
    """What we manage on one Node. ``None`` values mean "must not be there"."""

    labels: dict[str, str | None]
    taint_key: str | None  # None: leave every taint alone
    taint: dict[str, str] | None
    resources: dict[str, int | None]
    managed_label_keys: tuple[str, ...] = field(default=())


def count_cpulists(plan: Mapping, pool: str) -> int:
    """How many cpulists (one per physical core) a pool of the plan holds."""
    per_socket = (plan.get("pools") or {}).get(pool) or {}
    return sum(len(lists) for lists in per_socket.values())


def desired_node(
    plan: Mapping | None,
    state: str = "present",
    label_domain: str = DEFAULT_LABEL_DOMAIN,
    labels: Mapping[str, object] | None = None,
    taint: bool = True,
    exclusive_resource: str = DEFAULT_EXCLUSIVE_RESOURCE,
    eni_resource: str = DEFAULT_ENI_RESOURCE,
) -> NodeWants:
    """The labels, taint and extended resources the node should carry.

    ``present``: the node label ``<label_domain>/cmk-node=true`` plus the user's
    labels; the ``cmk=true:NoSchedule`` taint when ``taint`` (no ``cmk`` taint
    otherwise); ``exclusive_resource`` = the number of exclusive cpulists and
    ``eni_resource`` = the number of exclusive-non-isolcpus cpulists, each
    only when non-zero (CMK advertised an empty pool as 0; we advertise
    nothing, so a pod asking for it stays Pending with a clear reason).
    ``absent``: none of these.
    """
    if state not in ("present", "absent"):
        raise K8sError(f"{state!r} is not one of present, absent", "state")
    if not kube_names.is_subdomain(label_domain):
        raise K8sError(f"{label_domain!r} is not a DNS subdomain like cmk.intel.com", "label_domain")
    node_label = f"{label_domain}/{NODE_LABEL_NAME}"
    user = {}
    for key, value in (labels or {}).items():
        check_qualified_name(key, "label key", "labels")
        user[key] = check_label_value(value, key, "labels")
    if node_label in user and user[node_label] != "true":
        raise K8sError(f"label {node_label!r} is set by cpupools to 'true'; remove it from the labels", "labels")
    exclusive_resource = check_extended_resource(exclusive_resource, "exclusive_resource")
    eni_resource = check_extended_resource(eni_resource, "eni_resource")
    if exclusive_resource == eni_resource:
        raise K8sError("the exclusive and exclusive-non-isolcpus resources need two different names", "eni_resource")
    managed = (node_label, *sorted(k for k in user if k != node_label))
    if state == "absent":
        return NodeWants(
            labels=dict.fromkeys(managed),
            taint_key=TAINT_KEY,
            taint=None,
            resources={exclusive_resource: None, eni_resource: None},
            managed_label_keys=managed,
        )
    if not isinstance(plan, Mapping) or "pools" not in plan:
        raise K8sError("no plan: run the cpupools_plan role first (the variable cpupools_plan is missing)", "plan")
    excl = count_cpulists(plan, EXCLUSIVE)
    eni = count_cpulists(plan, ENI)
    return NodeWants(
        labels={node_label: "true", **user},
        taint_key=TAINT_KEY,
        taint={"key": TAINT_KEY, "value": TAINT_VALUE, "effect": TAINT_EFFECT} if taint else None,
        resources={exclusive_resource: excl or None, eni_resource: eni or None},
        managed_label_keys=managed,
    )


# Comparing and patching ----------------------------------------------------


def escape(key: str) -> str:
    """A JSON-pointer token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return key.replace("~", "~0").replace("/", "~1")


def _taint_id(taint: Mapping) -> tuple:
    return (taint.get("key"), taint.get("value") or "", taint.get("effect"))


def quantity_int(value: object) -> int | None:
    """A plain integer quantity (``"6"`` or ``6``); ``None`` for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


@dataclass
class NodeChanges:
    """The outcome of comparing a Node with ``NodeWants``."""

    before: dict
    after: dict
    object_patch: list = field(default_factory=list)  # JSON patch for /api/v1/nodes/{name}
    status_patch: list = field(default_factory=list)  # JSON patch for .../status

    @property
    def changed(self) -> bool:
        return bool(self.object_patch or self.status_patch)


def _set_ops(doc: Mapping, parts: list[str], value: object) -> list[dict]:
    """``add`` ops that set ``parts`` to ``value``, creating missing parents.

    A JSON-patch ``add`` fails (422) when the parent does not exist, so the
    first missing ancestor is added as a nested object instead.
    """
    cur: object = doc
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(cur, Mapping) or part not in cur or not isinstance(cur[part], Mapping):
            nested: object = value
            for name in reversed(parts[depth + 1 :]):
                nested = {name: nested}
            return [{"op": "add", "path": "/" + "/".join(escape(p) for p in parts[: depth + 1]), "value": nested}]
        cur = cur[part]
    return [{"op": "add", "path": "/" + "/".join(escape(p) for p in parts), "value": value}]


def _guard(node: Mapping) -> dict:
    return {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]}


def observe(node: Mapping, wants: NodeWants) -> dict:
    """The parts of a Node we report on: all labels and taints, our resources."""
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    return {
        "labels": dict(sorted(((node.get("metadata") or {}).get("labels") or {}).items())),
        "taints": [dict(t) for t in (node.get("spec") or {}).get("taints") or []],
        "capacity": {name: capacity[name] for name in sorted(wants.resources) if name in capacity},
    }


def node_changes(node: Mapping, wants: NodeWants) -> NodeChanges:
    """Compare a Node (API JSON) with what we want; build the guarded patches."""
    before = observe(node, wants)
    labels = dict(before["labels"])
    for key, value in wants.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    taints = before["taints"]
    ours = [t for t in taints if t.get("key") == wants.taint_key]
    if wants.taint_key is None:
        new_taints = taints
    elif wants.taint is None:
        new_taints = [t for t in taints if t.get("key") != wants.taint_key]
    elif len(ours) == 1 and _taint_id(ours[0]) == _taint_id(wants.taint):
        new_taints = taints
    else:
        new_taints = [t for t in taints if t.get("key") != wants.taint_key] + [dict(wants.taint)]
    status = node.get("status") or {}
    capacity = dict(before["capacity"])
    status_ops: list[dict] = []
    for section in ("capacity", "allocatable"):
        for name, count in sorted(wants.resources.items()):
            present = (status.get(section) or {}).get(name)
            if count is None and present is not None:
                status_ops.append({"op": "remove", "path": f"/status/{section}/{escape(name)}"})
            elif count is not None and quantity_int(present) != count:
                if section == "allocatable" and status.get("allocatable") is None:
                    continue  # kubelet derives allocatable; do not invent the section
                status_ops.extend(_set_ops(node, ["status", section, name], str(count)))
    for name, count in wants.resources.items():
        if count is None:
            capacity.pop(name, None)
        else:
            capacity[name] = str(count)
    status_ops = _merge_adds(status_ops)
    object_ops: list[dict] = []
    if labels != before["labels"]:
        meta = node.get("metadata") or {}
        if meta.get("labels") is None:
            object_ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
        else:
            for key in sorted(set(before["labels"]) | set(labels)):
                if key not in labels:
                    object_ops.append({"op": "remove", "path": f"/metadata/labels/{escape(key)}"})
                elif before["labels"].get(key) != labels[key]:
                    object_ops.append({"op": "add", "path": f"/metadata/labels/{escape(key)}", "value": labels[key]})
    if [_taint_id(t) for t in new_taints] != [_taint_id(t) for t in taints]:
        if new_taints:
            object_ops.extend(_set_ops(node, ["spec", "taints"], new_taints))
        else:
            object_ops.append({"op": "remove", "path": "/spec/taints"})
    after = {
        "labels": dict(sorted(labels.items())),
        "taints": new_taints,
        "capacity": dict(sorted(capacity.items())),
    }
    return NodeChanges(
        before=before,
        after=after,
        object_patch=[_guard(node), *object_ops] if object_ops else [],
        status_patch=[_guard(node), *status_ops] if status_ops else [],
    )


def _merge_adds(ops: list[dict]) -> list[dict]:
    """Fold several ``add`` ops that create the same missing parent into one."""
    out: list[dict] = []
    for op in ops:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev["op"] == op["op"] == "add"
            and prev["path"] == op["path"]
            and isinstance(prev["value"], dict)
            and isinstance(op["value"], dict)
        ):
            prev["value"] = _deep_merge(prev["value"], op["value"])
        else:
            out.append(copy.deepcopy(op))
    return out


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _deep_merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def capacity_patch(node: Mapping, expected: Mapping[str, int]) -> list[dict]:
    """The guarded status patch that makes ``expected`` advertised (empty if it is).

    Used by the node agent's re-advertiser: only sets, never removes.
    """
    return node_changes(node, advertise_only(expected)).status_patch


def advertise_only(expected: Mapping[str, int]) -> NodeWants:
    """Wants that touch nothing but these extended resources (labels and taints are left alone)."""
    return NodeWants(labels={}, taint_key=None, taint=None, resources=dict(expected))


# The published layout ------------------------------------------------------


def layout_crd() -> dict:
    """The CustomResourceDefinition of the published layout (apiextensions.k8s.io/v1)."""
    cpulist = {"type": "string", "description": "cpulist, compressed form (0-3,8)"}
    per_pool_lists = {
        "type": "object",
        "description": "pool -> socket id -> cpulists in CMK form (0,1,2,3)",
        "additionalProperties": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    }
    spec_schema = {
        "type": "object",
        "required": ["node", "poolCpus"],
        "properties": {
            "node": {"type": "string", "description": "the Kubernetes node name"},
            "mode": {"type": "string", "description": "how isolcpus is decided: generate or adopt"},
            "poolCpus": {
                "type": "object",
                "description": "pool -> all its CPUs",
                "additionalProperties": cpulist,
            },
            "pools": per_pool_lists,
            "counts": {
                "type": "object",
                "description": "pool -> physical cores",
                "additionalProperties": {"type": "integer"},
            },
            "isolatedCpus": cpulist,
            "housekeepingCpus": cpulist,
            "strandedCpus": cpulist,
            "extendedResources": {
                "type": "object",
                "description": "extended resource name -> count advertised on the node",
                "additionalProperties": {"type": "integer"},
            },
            "pendingReboot": {
                "type": "boolean",
                "description": "the boot configuration differs from the running kernel",
            },
            "warnings": {"type": "array", "items": {"type": "string"}},
            "applied": {
                "type": "object",
                "description": "applied state reported by the roles (kernel, state directory, agent)",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "plan": {
                "type": "object",
                "description": "the full cpupools plan this node was configured from",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }
    columns = [
        {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
        {"name": "Exclusive", "type": "string", "jsonPath": ".spec.poolCpus.exclusive"},
        {"name": "Shared", "type": "string", "jsonPath": ".spec.poolCpus.shared"},
        {"name": "Infra", "type": "string", "jsonPath": ".spec.poolCpus.infra"},
        {"name": "Pending Reboot", "type": "boolean", "jsonPath": ".spec.pendingReboot"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": LAYOUT_CRD_NAME, "labels": dict(MANAGED_BY)},
        "spec": {
            "group": LAYOUT_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": LAYOUT_KIND,
                "plural": LAYOUT_PLURAL,
                "singular": LAYOUT_SINGULAR,
                "listKind": f"{LAYOUT_KIND}List",
                "shortNames": ["cpl"],
                "categories": ["cpupools"],
            },
            "versions": [
                {
                    "name": LAYOUT_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "The CPU pool layout of one node, published by cpupools.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                            },
                        }
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def layout_object(
    node_name: str,
    plan: Mapping,
    resources: Mapping[str, int | None],
    pending_reboot: bool = False,
    applied: Mapping | None = None,
) -> dict:
    """The node's published layout: the plan plus its applied state.

    Deterministic (no timestamps), so a re-run compares equal and writes nothing.
    """
    check_node_name(node_name)
    spec = {
        "node": node_name,
        "mode": str(plan.get("mode", "")),
        "poolCpus": {str(k): str(v) for k, v in (plan.get("pool_cpus") or {}).items()},
        "pools": copy.deepcopy(dict(plan.get("pools") or {})),
        "counts": {str(k): int(v) for k, v in (plan.get("counts") or {}).items()},
        "isolatedCpus": str(plan.get("isolated_cpus", "")),
        "housekeepingCpus": str(plan.get("housekeeping_cpus", "")),
        "strandedCpus": str(plan.get("stranded_cpus", "")),
        "extendedResources": {k: int(v) for k, v in sorted(resources.items()) if v is not None},
        "pendingReboot": bool(pending_reboot),
        "warnings": [str(w) for w in plan.get("warnings") or []],
        "applied": copy.deepcopy(dict(applied or {})),
        "plan": copy.deepcopy(dict(plan)),
    }
    return {
        "apiVersion": f"{LAYOUT_GROUP}/{LAYOUT_VERSION}",
        "kind": LAYOUT_KIND,
        "metadata": {"name": node_name, "labels": dict(MANAGED_BY)},
        "spec": spec,
    }


def is_subset(want: object, have: object) -> bool:
    """``want`` is contained in ``have`` (dicts by key, lists element-wise).

    Server-side defaults (``conversion``, ``listKind``, printer column
    ``priority`` ...) then do not count as a difference.
    """
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have


def with_defaults(value: object, schema: object) -> object:
    """``value`` as a server stores it under a CRD's structural ``schema``: every ``default`` filled in.

    The apiserver's defaulting: a property with a default that is missing
    (or ``null`` where not nullable) gets a copy of the default, then every
    property, map value and array item is defaulted in turn, defaults
    included. Comparing what we want, defaulted so, with what the server
    returns tells a real difference from the defaults the CRD adds on every
    read.
    """
    if not isinstance(schema, Mapping):
        return copy.deepcopy(value)
    if isinstance(value, Mapping):
        out = {k: copy.deepcopy(v) for k, v in value.items()}
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        for key, prop in props.items():
            if not isinstance(prop, Mapping) or "default" not in prop:
                continue
            if key not in out or (out[key] is None and not prop.get("nullable")):
                out[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key in list(out):
            sub = props.get(key, extra if isinstance(extra, Mapping) else None)
            out[key] = with_defaults(out[key], sub)
        return out
    if isinstance(value, list):
        return [with_defaults(item, schema.get("items")) for item in value]
    return copy.deepcopy(value)


def crd_version_schema(crd: Mapping, version: str) -> Mapping | None:
    """The ``openAPIV3Schema`` of one version of a CRD, or ``None``."""
    for entry in ((crd.get("spec") or {}).get("versions") or []) if isinstance(crd, Mapping) else []:
        if isinstance(entry, Mapping) and entry.get("name") == version:
            schema = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, Mapping) else None
    return None


def _crd_conditions(crd: Mapping) -> list[Mapping]:
    status = crd.get("status") if isinstance(crd, Mapping) else None
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conditions or [] if isinstance(c, Mapping)]


def crd_established(crd: Mapping) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in _crd_conditions(crd))


def _condition_text(c: Mapping) -> str:
    why = ": ".join(str(c[k]) for k in ("reason", "message") if c.get(k))
    return f"{c.get('type')}={c.get('status')}" + (f" ({why})" if why else "")


def crd_conditions_text(crd: Mapping) -> str:
    """``Type=Status (Reason: message)`` of every condition, for messages."""
    return ", ".join(_condition_text(c) for c in _crd_conditions(crd))


def crd_deleting(crd: Mapping) -> bool:
    """The CRD is being deleted: it goes away by itself, and a new one can be created then.

    The server marks it with ``metadata.deletionTimestamp``; ``Terminating=True``
    shows only while its objects are deleted, after which it may still be
    ``Established`` (and refuse new objects) until its last finalizer is gone.
    """
    meta = crd.get("metadata") if isinstance(crd, Mapping) else None
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return True
    return any(c.get("type") == "Terminating" and c.get("status") == "True" for c in _crd_conditions(crd))


def crd_blocked(crd: Mapping) -> str:
    """Why a CRD will not become usable by waiting (a sentence), or ``""``.

    ``NamesAccepted=False``: another CRD of the same group holds one of its
    names (plural, singular, short names, kind or list kind); the server will
    not serve it until that CRD is gone. Every other state (no conditions yet,
    ``Established=False``, being deleted) changes by itself.
    """
    spec = crd.get("spec") if isinstance(crd, Mapping) else None
    group = spec.get("group", "") if isinstance(spec, Mapping) else ""
    for c in _crd_conditions(crd):
        if c.get("type") == "NamesAccepted" and c.get("status") == "False":
            return (
                f"{_condition_text(c)}: another CustomResourceDefinition of group {group} holds these names; "
                f"find it with `kubectl get crd | grep {group}` and remove or rename it"
            )
    return ""


# Drain ---------------------------------------------------------------------


def drain_candidates(pods: list[Mapping]) -> dict[str, list[dict]]:
    """Sort the pods bound to a node into what a drain evicts and what it leaves.

    ``evict``: every pod except DaemonSet-owned ones (their controller
    recreates them on the node at once and tolerates cordons) and mirror
    pods (static pods of the kubelet; the API cannot evict them); pods already
    terminating are only waited for (``terminating``). ``unmanaged`` lists the
    evictable pods with no controller: evicting them deletes them for good.
    """
    out: dict[str, list[dict]] = {"evict": [], "terminating": [], "daemonset": [], "mirror": [], "unmanaged": []}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ref = {"namespace": meta.get("namespace", "default"), "name": meta.get("name", "")}
        owners = meta.get("ownerReferences") or []
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            out["mirror"].append(ref)
        elif any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners):
            out["daemonset"].append(ref)
        elif meta.get("deletionTimestamp"):
            out["terminating"].append(ref)
        else:
            out["evict"].append(ref)
            if not any(o.get("controller") for o in owners):
                out["unmanaged"].append(ref)
    for refs in out.values():
        refs.sort(key=lambda r: (r["namespace"], r["name"]))
    return out


def eviction_body(namespace: str, name: str) -> dict:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
