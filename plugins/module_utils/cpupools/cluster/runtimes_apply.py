"""Applying a runtime's configuration to the API server: planning.runtimes' renderings, published per group.

``ensure_runtime`` is the controller-side applier over a ``k8s_apply.Api``:
publish the node's group configuration (a ``poolconfig-<group>.yaml`` key of
CPU-Pooler's ConfigMap, or an nri-plugins policy object ``group.<group>``),
label the node with the label the runtime selects its configuration by, and
remove what no node uses any more. Only names with the ``cpupools-`` prefix
are ever changed or removed (planning/runtimes.py says why one group per
identical configuration).

Standard library only; no Ansible import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..core.errors import K8sError
from ..planning.inputs import RUNTIMES
from ..planning.runtimes import (
    CONFIG_RUNTIMES,
    GROUP_PREFIX,
    MULTI_THREADED,
    NRI_GROUP,
    NRI_GROUP_LABEL,
    NRI_KINDS,
    NRI_RUNTIMES,
    NRI_VERSION,
    POOLER,
    POOLER_CONFIGMAP,
    POOLER_LABEL,
    render,
)
from .k8s import MANAGED_BY, NodeWants, crd_version_schema, with_defaults
from .k8s_apply import FIELD_MANAGER, ensure_node, failure, node_path


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

    plural = NRI_KINDS[runtime][1]
    code, crd = api.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{NRI_GROUP}")
    return crd_version_schema(crd, NRI_VERSION) if code == 200 else None


def _nri_same(api: Any, runtime: str, current: Mapping, obj: Mapping) -> bool:
    """Our spec and label are there. The spec is compared with ours as the server stores it: the
    CRD's defaults (``agent``, ``pinCPU``, a balloon type's ``allocatorPriority`` ...) come back on
    every read and are not a difference; anything else, ours changed or a field someone added, is."""

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
