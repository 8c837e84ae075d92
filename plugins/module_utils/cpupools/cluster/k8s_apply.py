"""Read, compare, patch: the API conversations, over any transport.

Standard library only. A *transport* is a callable
``transport(method, path, body=None, content_type=None, query=None)`` that
returns ``(http_status, parsed_json_body)`` for every HTTP answer and raises
``K8sError`` only when the server cannot be reached. The Ansible modules pass
one built on the ``kubernetes`` client (``module_utils/cpupools_kube.py``);
the node agent passes one built on ``http.client`` (``k8s_advertise``).

Every write is guarded: node patches carry a JSON-patch ``test`` of the
resourceVersion that was read, custom objects are replaced with their
resourceVersion, the CRD is merge-patched with its resourceVersion (only the
fields cpupools owns: others' labels and annotations stay). A 409 (or a
failed ``test``: a 422 after which the node's resourceVersion has moved)
means someone else wrote in between: read again, recompute, retry. In check
mode only reads are sent.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from ..core.errors import K8sError
from .k8s import (
    LAYOUT_CRD_NAME,
    LAYOUT_GROUP,
    LAYOUT_PLURAL,
    LAYOUT_VERSION,
    NodeWants,
    crd_blocked,
    crd_conditions_text,
    crd_deleting,
    crd_established,
    drain_candidates,
    eviction_body,
    is_subset,
    layout_crd,
    node_changes,
)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = {"fieldManager": "cpupools"}
Transport = Callable[..., tuple[int, Any]]

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
LAYOUT_PATH = f"/apis/{LAYOUT_GROUP}/{LAYOUT_VERSION}/{LAYOUT_PLURAL}"

RBAC_HINT = (
    "the credentials need: nodes get/patch, nodes/status patch, customresourcedefinitions get/create/patch, "
    f"{LAYOUT_PLURAL}.{LAYOUT_GROUP} get/create/update/delete (drain: pods list, pods/eviction create); "
    "see docs/kubernetes.md"
)


class ApiStatus(K8sError):
    """The API server answered with an error status."""

    def __init__(self, message: str, code: int, field: str | None = None) -> None:
        super().__init__(message, field)
        self.code = code


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def _server_message(body: object) -> str:
    if isinstance(body, Mapping) and body.get("message"):
        return str(body["message"])
    return ""


def failure(
    code: int, body: object, method: str, path: str, node: str, server: str, rbac_hint: str = RBAC_HINT
) -> ApiStatus:
    """One clear sentence for an error status, naming the node and the server (a 403: and ``rbac_hint``)."""
    detail = _server_message(body)
    where = f"node {node!r} on API server {server}"
    if code == 401:
        text = f"{where}: the credentials were rejected (401 Unauthorized); check the kubeconfig's user"
    elif code == 403 and _kubelet_identity(detail):
        text = (
            f"{where}: {method} {path} is forbidden (403): {detail}; these are the credentials of the kubelet of "
            f"node {_kubelet_identity(detail)!r}, which may read and patch only its own Node: the node name must be "
            "the one that kubelet registered"
        )
    elif code == 403:
        text = f"{where}: {method} {path} is forbidden (403): {detail or 'no reason given'}; {rbac_hint}"
    elif code == 404 and path.startswith("/api/v1/nodes/"):
        text = f"{where}: no such node (404); cpupools_k8s_node_name must be the name `kubectl get nodes` shows"
    else:
        text = f"{where}: {method} {path} failed with {code}" + (f": {detail}" if detail else "")
    return ApiStatus(text, code, "k8s_node_name" if code == 404 else None)


def _kubelet_identity(detail: str) -> str:
    """The node whose kubelet credentials a 403 names (Node authorizer or NodeRestriction), or ``""``."""
    match = re.search(r'User "system:node:([^"]+)"', detail) or re.search(r'node "([^"]+)" is not allowed to', detail)
    return match.group(1) if match else ""


def _causes(body: object) -> str:
    """The ``details.causes`` messages of a Status (a refused eviction names its budget there)."""
    details = body.get("details") if isinstance(body, Mapping) else None
    causes = details.get("causes") if isinstance(details, Mapping) else None
    texts = [str(c["message"]) for c in causes or [] if isinstance(c, Mapping) and c.get("message")]
    return "; ".join(texts)


class Api:
    """A transport plus the context every message needs.

    ``rbac_hint`` says, in a refusal (403), which rights the credentials need and where they are
    documented: the k8s stage's by default; the CMK retirement's modules name theirs.
    """

    def __init__(
        self, transport: Transport, server: str, node: str, attempts: int = 5, rbac_hint: str = RBAC_HINT
    ) -> None:
        self.transport = transport
        self.server = server
        self.node = node
        self.attempts = attempts
        self.rbac_hint = rbac_hint

    def raw(self, method: str, path: str, body: object = None, content_type: str | None = None, query=None):
        return self.transport(method, path, body=body, content_type=content_type, query=query)

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str | None = None,
        query=None,
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        code, data = self.raw(method, path, body, content_type, query)
        if code not in ok:
            raise failure(code, data, method, path, self.node, self.server, self.rbac_hint)
        return data

    def conflict_error(self, what: str) -> ApiStatus:
        return ApiStatus(
            f"node {self.node!r} on API server {self.server}: {what} kept changing under us; "
            f"gave up after {self.attempts} conflicting writes",
            409,
        )


# Node labels, taints, extended resources -----------------------------------


def ensure_node(api: Api, wants: NodeWants, check_mode: bool) -> dict:
    """Make the node carry ``wants``; returns ``changed``, ``before``, ``after``, ``requests``."""
    path = node_path(api.node)
    node = api.call("GET", path)
    first = node_changes(node, wants)
    sent: list[dict] = []
    conflicts = 0
    changes = first
    for _ in range(api.attempts * 3):
        if not changes.changed or check_mode:
            break
        ops, sub = (changes.object_patch, "") if changes.object_patch else (changes.status_patch, "/status")
        code, body = api.raw("PATCH", path + sub, ops, JSON_PATCH)
        if code == 200:
            sent.append({"path": path + sub, "patch": ops})
            node = body
        else:
            fresh = _reread_if_conflict(api, path, code, ops) if code in (409, 422) else None
            if fresh is None:
                raise failure(code, body, "PATCH", path + sub, api.node, api.server)
            conflicts += 1
            if conflicts >= api.attempts:
                raise api.conflict_error("the node")
            node = fresh
        changes = node_changes(node, wants)
    else:
        raise ApiStatus(
            f"node {api.node!r} on API server {api.server}: the server accepted our patches but the node "
            "still differs (is an admission webhook rewriting it?)",
            500,
        )
    return {
        "changed": first.changed,
        "before": first.before,
        "after": first.after if check_mode else changes.after,
        "requests": sent,
        "conflicts": conflicts,
    }


def _reread_if_conflict(api: Api, path: str, code: int, ops: list[dict]) -> dict | None:
    """The node read again after a 409, or after a 422 from our resourceVersion ``test``; ``None``: no conflict.

    A 422 is a conflict only when the node's resourceVersion moved since we
    read it; the read that tells is also the one the retry starts from.
    """
    current = api.call("GET", path)
    if code == 409:
        return current
    guarded = ops[0]["value"] if ops and ops[0].get("op") == "test" else None
    return current if guarded is not None and current["metadata"]["resourceVersion"] != guarded else None


# The published layout ------------------------------------------------------


def ensure_crd(
    api: Api,
    check_mode: bool,
    wait: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Install or update our CRD and see it usable. Returns ``created``, ``updated`` or ``unchanged``.

    Usable means ``Established``: only then does the server serve its group (a
    layout written before gets a bare ``404 page not found``). That holds
    whoever created the CRD: us, another host a moment ago (our POST got 409),
    or an earlier run. A CRD that is being deleted (an uninstall, a person)
    is waited for until it is gone, then created again: a CRD with a
    ``deletionTimestamp`` may still say ``Established`` but takes no new
    objects and vanishes with whatever was written meanwhile. All waiting
    shares one deadline, ``wait`` seconds from the call. An update is a merge
    patch of the fields we own (our label, the spec), guarded by the
    resourceVersion, so labels and annotations of other owners stay. The one
    state that does not change by waiting fails at once: names another CRD of
    the group holds (``NamesAccepted=False``), an error naming the condition.
    """
    want = layout_crd()
    path = f"{CRD_PATH}/{LAYOUT_CRD_NAME}"
    deadline = clock() + wait
    conflicts = 0
    while True:
        code, current = api.raw("GET", path)
        if code == 200 and crd_deleting(current):
            if check_mode:
                return "created"  # it will be gone; the real run creates it again
            _check_deadline(api, current, deadline, wait, "was still being deleted after", clock)
            sleep(0.5)
            continue
        if code == 404:
            if check_mode:
                return "created"
            code, body = api.raw("POST", CRD_PATH, want, query=FIELD_MANAGER)
            if code == 409:  # created concurrently, or the old one is still being deleted: read again
                conflicts += 1
                if conflicts >= api.attempts * 4:
                    raise api.conflict_error(f"the CustomResourceDefinition {LAYOUT_CRD_NAME}")
                continue
            if code not in (200, 201):
                raise failure(code, body, "POST", CRD_PATH, api.node, api.server)
            if _wait_established(api, path, body, deadline, wait, sleep, clock):
                return "created"
            continue
        if code != 200:
            raise failure(code, current, "GET", path, api.node, api.server)
        if is_subset(want["spec"], current.get("spec")) and is_subset(want["metadata"], current.get("metadata")):
            if _wait_established(api, path, current, deadline, wait, sleep, clock):
                return "unchanged"
            continue
        if check_mode:
            return "updated"
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "labels": want["metadata"]["labels"],
            },
            "spec": want["spec"],
        }
        code, answer = api.raw("PATCH", path, patch, MERGE_PATCH, query=FIELD_MANAGER)
        if code == 200:
            if _wait_established(api, path, answer, deadline, wait, sleep, clock):
                return "updated"
            continue
        if code != 409:
            raise failure(code, answer, "PATCH", path, api.node, api.server)
        conflicts += 1
        if conflicts >= api.attempts:
            raise api.conflict_error(f"the CustomResourceDefinition {LAYOUT_CRD_NAME}")


def _unusable(api: Api, blocked: str) -> ApiStatus:
    return ApiStatus(
        f"API server {api.server}: the CustomResourceDefinition {LAYOUT_CRD_NAME} cannot be used: {blocked}", 409
    )


def _check_deadline(
    api: Api, crd: Mapping, deadline: float, wait: float, what: str, clock: Callable[[], float]
) -> None:
    if clock() > deadline:
        raise ApiStatus(
            f"API server {api.server}: the CustomResourceDefinition {LAYOUT_CRD_NAME} {what} {wait:.0f}s "
            f"(conditions: {crd_conditions_text(crd) or 'none reported'})",
            504,
        )


def _wait_established(
    api: Api,
    path: str,
    crd: Mapping,
    deadline: float,
    wait: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> bool:
    """``True`` once the CRD is Established; ``False`` if it is being deleted (start over).

    Fails at once on names another CRD holds, and at the deadline naming the conditions.
    """
    while True:
        blocked = crd_blocked(crd)
        if blocked:
            raise _unusable(api, blocked)
        if crd_deleting(crd):
            return False
        if crd_established(crd):
            return True
        _check_deadline(api, crd, deadline, wait, "was not Established within", clock)
        sleep(0.5)
        code, crd = api.raw("GET", path)
        if code == 404:
            return False  # deleted meanwhile: start over
        if code != 200:
            raise failure(code, crd, "GET", path, api.node, api.server)


def _not_served_yet(code: int, body: object) -> bool:
    """The answer of a CRD's resource in the moment after it became Established or was updated.

    The server builds the resource's storage then: a 429 ``storage is
    (re)initializing``, or the bare ``404 page not found`` of a path no group
    serves (no Status naming an object). After an update of the CRD (ours,
    from an older cpupools) it tears the previous storage down, and a request
    that reached that storage is refused unprocessed with ``503 apiserver is
    shutting down`` (seen on kube-apiserver 1.36 in a POST right after the
    update); a 503 of a server that really stops lasts past the deadline.
    """
    details = body.get("details") if isinstance(body, Mapping) else None
    return code in (429, 503) or (code == 404 and not (isinstance(details, Mapping) and details.get("name")))


def _served(
    api: Api,
    method: str,
    path: str,
    body: object,
    deadline: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> tuple[int, object]:
    """``api.raw(method, path, body)``, repeated while the resource is not served yet, until ``deadline``.

    A write is repeated too: those answers come before the storage did
    anything, and a PUT carries the resourceVersion it read (a repeat of one
    that did land is a 409, read again by the caller).
    """
    code, answer = api.raw(method, path, body)
    while _not_served_yet(code, answer) and clock() < deadline:
        sleep(0.2)
        code, answer = api.raw(method, path, body)
    return code, answer


def ensure_layout(
    api: Api,
    obj: dict,
    check_mode: bool,
    crd_exists: bool = True,
    wait: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Publish the node's layout object. Returns ``created``, ``updated`` or ``unchanged``.

    Right after its CRD is Established or updated the server may not serve
    the resource yet (``_not_served_yet``): each request is repeated for up to
    ``wait`` seconds in all.
    """
    if not crd_exists:  # check mode before the CRD exists: nothing to read
        return "created"
    name = obj["metadata"]["name"]
    path = f"{LAYOUT_PATH}/{quote(name, safe='')}"
    deadline = clock() + wait
    for _ in range(api.attempts):
        code, current = _served(api, "GET", path, None, deadline, sleep, clock)
        if code == 404:
            if check_mode:
                return "created"
            code, body = _served(api, "POST", LAYOUT_PATH, obj, deadline, sleep, clock)
            if code in (200, 201):
                return "created"
            if code != 409:
                raise failure(code, body, "POST", LAYOUT_PATH, api.node, api.server)
            continue
        if code != 200:
            raise failure(code, current, "GET", path, api.node, api.server)
        if current.get("spec") == obj["spec"] and is_subset(obj["metadata"], current.get("metadata")):
            return "unchanged"
        if check_mode:
            return "updated"
        labels = dict((current.get("metadata") or {}).get("labels") or {}, **obj["metadata"].get("labels", {}))
        meta = dict(current["metadata"], labels=labels)
        code, answer = _served(api, "PUT", path, dict(obj, metadata=meta), deadline, sleep, clock)
        if code == 200:
            return "updated"
        if code != 409:
            raise failure(code, answer, "PUT", path, api.node, api.server)
    raise api.conflict_error(f"the {LAYOUT_PLURAL}.{LAYOUT_GROUP} object {name!r}")


def remove_layout(api: Api, name: str, check_mode: bool) -> str:
    """Delete the node's layout object (not the CRD: other nodes use it)."""
    path = f"{LAYOUT_PATH}/{quote(name, safe='')}"
    code, body = api.raw("GET", path)
    if code == 404:
        return "unchanged"
    if code != 200:
        raise failure(code, body, "GET", path, api.node, api.server)
    if check_mode:
        return "deleted"
    api.call("DELETE", path, ok=(200, 202, 404))
    return "deleted"


# Drain ---------------------------------------------------------------------


def set_unschedulable(api: Api, on: bool, check_mode: bool) -> bool:
    """Cordon (``on``) or uncordon the node; ``True`` when it changed."""
    path = node_path(api.node)
    for _ in range(api.attempts):
        node = api.call("GET", path)
        if bool((node.get("spec") or {}).get("unschedulable")) == on:
            return False
        if check_mode:
            return True
        patch = {
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"unschedulable": True if on else None},
        }
        code, body = api.raw("PATCH", path, patch, MERGE_PATCH)
        if code == 200:
            return True
        if code != 409:
            raise failure(code, body, "PATCH", path, api.node, api.server)
    raise api.conflict_error("the node")


def ready_condition(node: Mapping) -> dict:
    """The node's ``Ready`` condition ({} when the kubelet has not posted one)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


def wait_ready(
    api: Api,
    since: str = "",
    timeout: float = 300.0,
    poll: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """The node's ``Ready`` condition once it is ``True`` and, with ``since``, posted after that heartbeat.

    After a restart of its kubelet or a reboot a node's object still says
    what the kubelet posted before; a ``Ready`` heartbeat newer than the one
    read after the drain (``since``: both times from the node's own clock,
    so a controller's clock that differs does not matter) tells that the
    new kubelet runs and has reported.
    """
    path = node_path(api.node)
    deadline = clock() + timeout
    while True:
        ready = ready_condition(api.call("GET", path))
        if ready.get("status") == "True" and (not since or str(ready.get("lastHeartbeatTime") or "") > since):
            return ready
        if clock() >= deadline:
            keys = ("status", "reason", "message", "lastHeartbeatTime")
            said = ", ".join(f"{k} {ready[k]}" for k in keys if ready.get(k))
            raise K8sError(
                f"node {api.node!r} on API server {api.server}: not Ready {timeout:.0f}s after its kubelet was "
                f"restarted (Ready: {said or 'not posted'}); the node stays cordoned",
                "k8s_drain_timeout",
            )
        sleep(poll)


def node_pods(api: Api) -> list[dict]:
    data = api.call("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={api.node}"})
    return list(data.get("items") or [])


def drain(
    api: Api,
    check_mode: bool,
    timeout: float = 300.0,
    poll: float = 2.0,
    delete_unmanaged: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Cordon, evict through the Eviction API (PDBs respected), wait until gone.

    A 429 (a PodDisruptionBudget would be violated) is retried every
    ``poll`` seconds until ``timeout``; then the drain fails naming the pods
    still blocked. DaemonSet and mirror pods are left alone. Pods without a
    controller are refused unless ``delete_unmanaged``: evicting them
    deletes them for good. Idempotent: a drained node is cordoned with
    nothing to evict, so a re-run changes nothing.
    """
    pods = node_pods(api)
    plan = drain_candidates(pods)
    if plan["unmanaged"] and not delete_unmanaged:
        names = ", ".join(f"{p['namespace']}/{p['name']}" for p in plan["unmanaged"])
        raise K8sError(
            f"node {api.node!r}: pods without a controller would be deleted for good by a drain: {names}; "
            "move them away or set cpupools_k8s_drain_delete_unmanaged: true",
            "k8s_drain_delete_unmanaged",
        )
    cordoned = set_unschedulable(api, True, check_mode)
    report = {
        "changed": cordoned or bool(plan["evict"]),
        "cordoned": cordoned,
        "evicted": plan["evict"],
        "skipped_daemonset": plan["daemonset"],
        "skipped_mirror": plan["mirror"],
        "waited_for": plan["terminating"],
        "blocked_retries": 0,
    }
    if check_mode:
        return report
    uids = {(p["metadata"].get("namespace", "default"), p["metadata"]["name"]): p["metadata"].get("uid") for p in pods}
    deadline = clock() + timeout
    pending = [(p["namespace"], p["name"]) for p in plan["evict"]]
    while pending:
        blocked = []
        for namespace, name in pending:
            path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/eviction"
            code, body = api.raw("POST", path, eviction_body(namespace, name))
            if code == 429:
                blocked.append((namespace, name, _causes(body) or _server_message(body)))
            elif code not in (200, 201, 404):
                raise failure(code, body, "POST", path, api.node, api.server)
        pending = [(ns, n) for ns, n, _ in blocked]
        if not pending:
            break
        report["blocked_retries"] += 1
        if clock() >= deadline:
            names = "; ".join(f"{ns}/{n}: {why or 'disruption budget'}" for ns, n, why in blocked)
            raise K8sError(
                f"node {api.node!r} on API server {api.server}: eviction still refused after {timeout:.0f}s "
                f"(PodDisruptionBudget): {names}; the node stays cordoned",
                "k8s_drain_timeout",
            )
        sleep(poll)
    waiting = {k for k in uids if k in {(p["namespace"], p["name"]) for p in plan["evict"] + plan["terminating"]}}
    while waiting:
        current = {
            (p["metadata"].get("namespace", "default"), p["metadata"]["name"]): p["metadata"].get("uid")
            for p in node_pods(api)
        }
        waiting = {k for k in waiting if current.get(k) is not None and current.get(k) == uids[k]}
        if not waiting:
            break
        if clock() >= deadline:
            names = ", ".join(f"{ns}/{n}" for ns, n in sorted(waiting))
            raise K8sError(
                f"node {api.node!r} on API server {api.server}: evicted pods still running after {timeout:.0f}s: "
                f"{names}; the node stays cordoned",
                "k8s_drain_timeout",
            )
        sleep(poll)
    # What the node's kubelet last reported, read once the node is drained: the uncordon after the
    # reboot or kubelet restart waits for a newer one (wait_ready).
    ready = ready_condition(api.call("GET", node_path(api.node)))
    report["ready_heartbeat"] = str(ready.get("lastHeartbeatTime") or "")
    return report
