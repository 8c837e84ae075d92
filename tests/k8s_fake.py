"""A wire-level fake Kubernetes API server for tests (never part of the product).

Most Kubernetes tests run against a real kube-apiserver (tests/k8s_real.py).
This fake stays for what a real server cannot produce on demand: a write of
someone else, or a 409, at a chosen moment (``before``, ``fail``); a CRD
held unestablished; an older server (``version``, ``admission_versions``);
and drains, which need pods to end and PodDisruptionBudgets to be computed,
the work of a kubelet and a controller manager a test server does not have.
Each test that uses it says which.

It imitates kube-apiserver v1.36 (``GET /version`` says so) and speaks HTTP(S)
on 127.0.0.1 to the real ``kubernetes`` Python client (and to the node agent's
stdlib client) for exactly the API the cpupools modules use, with the real
server's rules wherever a forgiving fake would let a bug through:

- nodes: ``POST``/``GET /api/v1/nodes``, ``GET``/``PATCH /api/v1/nodes/{name}``
  and ``.../status`` with ``application/json-patch+json`` (RFC 6902 with the
  apiserver's rules: ``add`` under a missing parent, ``remove``/``replace`` of
  a missing member and a failed ``test`` are 422), ``application/merge-patch+json``
  (RFC 7386) and ``application/strategic-merge-patch+json`` (``spec.taints`` is
  atomic: replaced whole; ``status.conditions``/``addresses`` merge by type).
  The main resource ignores ``status``, the ``status`` subresource ignores
  ``spec``. Validation: label keys and values, taint keys, values and effects,
  quantities (extended resources are integers: ``1.5``/``500m`` are 422);
  ``6.0`` is stored as ``6``; a capacity without allocatable is copied into
  allocatable; a new Node gets the ``node.kubernetes.io/not-ready`` taint;
- ``customresourcedefinitions`` (apiextensions.k8s.io/v1): non-structural
  schemas are 422; the naming controller refuses names another CRD of the group
  holds (``NamesAccepted=False``, ``KindConflict`` ...); a CRD becomes
  ``Established`` ``crd_establish_delay`` seconds after its names are accepted,
  and its resource is served only then (before: the bare ``404 page not
  found``, text/plain, of an unknown path);
- cluster-scoped custom objects of an Established CRD: unknown fields pruned
  with a ``Warning: 299`` header (``fieldValidation=Strict``: 400), ``null`` in
  a non-nullable field dropped, a whole float accepted for an integer, type
  errors 422; a POST carrying a resourceVersion is a 400;
- pods: list with field selectors (``spec.nodeName``, ``status.phase``,
  ``metadata.*``; ``=``, ``==``, ``!=``), get, and the ``eviction``
  subresource, held to real PodDisruptionBudgets (``add_pdb``): healthy means
  Running, Ready and not being deleted; a refusal is a 429 whose
  ``details.causes`` names the budget and its counts; pods not running
  (Pending, Succeeded, Failed) are evicted whatever the budget says;
- built-in namespaced and cluster-scoped collections (``BUILTIN``: configmaps,
  secrets, services, serviceaccounts, daemonsets, deployments, RBAC cluster
  roles and bindings, mutating webhook configurations): list, get, create,
  delete; pods can be deleted too; custom objects of namespaced CRDs
  (``add_crd_raw`` stores a CRD as an old cluster kept it);
- ``resourceVersion``: one counter for the whole store, bumped on every write
  that changes something (a no-op patch or identical PUT bumps neither it nor
  ``generation``, which counts spec changes); a stale one is a 409;
  ``?dryRun=All`` answers as if done and stores nothing;
- ``admissionregistration.k8s.io``: discovery (``/apis/admissionregistration.k8s.io``
  and each version's resource list) and ``mutatingadmissionpolicies`` /
  ``mutatingadmissionpolicybindings`` in the versions of ``admission_versions``
  (v1.36: ``v1``; a 1.34/1.35 server with the feature gate: ``v1beta1``; older:
  none), with the server's defaults filled in and not validated (the real
  server checks the fields and the CEL); one stored object served by every
  enabled version;
- authorization: a bearer ``token`` (unrestricted), more ``tokens`` mapped to
  users, or TLS client certificates; a ``system:node:<name>`` user (a kubelet)
  may read and patch only its own Node (Node authorizer + NodeRestriction).

Every request is recorded (method, path, query, content type, parsed body,
user) so a test can assert that check mode wrote nothing. Knobs inject failures
(``fail``) and run a hook before a request (``before``, e.g. a concurrent
writer that makes the client's resourceVersion stale).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """Turned into a ``Status`` body with this code."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details


def status_body(code: int, message: str, reason: str = "", details: dict | None = None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# JSON patch (RFC 6902) -------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: object, parts: list[str], op: str, path: str) -> object:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise ApiError(422, f"{op} operation does not apply: doc is missing path: {path!r}")
    if not isinstance(cur, (dict, list)):
        raise ApiError(422, f"{op} operation does not apply: doc is missing path: {path!r}")
    return cur


def _get(doc: object, path: str) -> tuple[bool, object]:
    cur = doc
    for part in _pointer(path):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return False, None
    return True, cur


def _list_index(container: list, key: str, op: str, path: str, insert: bool) -> int:
    if key == "-" and insert:
        return len(container)
    if not key.isdigit():
        raise ApiError(422, f"{op} operation does not apply: invalid array index in {path!r}")
    idx = int(key)
    if idx > len(container) or (idx == len(container) and not insert):
        raise ApiError(422, f"{op} operation does not apply: index out of range in {path!r}")
    return idx


def _add(doc: object, path: str, value: object, op: str = "add") -> object:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _parent(doc, parts, op, path)
    key = parts[-1]
    if isinstance(parent, dict):
        parent[key] = copy.deepcopy(value)
    else:
        parent.insert(_list_index(parent, key, op, path, insert=True), copy.deepcopy(value))
    return doc


def _remove(doc: object, path: str, op: str = "remove") -> object:
    parts = _pointer(path)
    if not parts:
        raise ApiError(422, f"{op} operation does not apply: cannot remove the document root")
    parent = _parent(doc, parts, op, path)
    key = parts[-1]
    if isinstance(parent, dict):
        if key not in parent:
            raise ApiError(422, f"{op} operation does not apply: doc is missing key: {path!r}")
        value = parent.pop(key)
    else:
        value = parent.pop(_list_index(parent, key, op, path, insert=False))
    return doc, value


def apply_json_patch(doc: object, ops: object) -> object:
    if not isinstance(ops, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise ApiError(400, f"{kind} operation is missing 'value'")
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            doc, _ = _remove(doc, path, "replace")
            doc = _add(doc, path, op["value"], "replace")
        elif kind == "test":
            found, value = _get(doc, path)
            # evanphx/json-patch (used by the apiserver) treats a missing member as null.
            if (value if found else None) != op["value"]:
                raise ApiError(422, f"testing value {path} failed: test failed")
        elif kind in ("move", "copy"):
            found, value = _get(doc, op.get("from", ""))
            if not found:
                raise ApiError(422, f"{kind} operation does not apply: doc is missing from path: {op.get('from')!r}")
            if kind == "move":
                doc, value = _remove(doc, op["from"], "move")
            doc = _add(doc, path, value, kind)
        else:
            raise ApiError(400, f"unexpected kind of JSON patch operation: {kind!r}")
    return doc


# Merge patches ---------------------------------------------------------------


def apply_merge_patch(target: object, patch: object) -> object:
    """RFC 7386: a strategic merge patch with no list merged by key."""
    return apply_strategic_patch(target, patch, keys={})


# Lists of a Node merged by key under strategic merge patch (``patchStrategy:
# merge`` in k8s.io/api core/v1). ``spec.taints`` has no patch strategy: it is
# atomic, a strategic patch replaces the whole list like a merge patch does.
STRATEGIC_KEYS = {("status", "conditions"): "type", ("status", "addresses"): "type"}


def apply_strategic_patch(
    target: object, patch: object, where: tuple[str, ...] = (), keys: dict = STRATEGIC_KEYS
) -> object:
    if not isinstance(patch, dict):
        if isinstance(patch, list) and where in keys and isinstance(target, list):
            key = keys[where]
            out = copy.deepcopy(target)
            for item in patch:
                if not isinstance(item, dict):
                    raise ApiError(400, f"strategic merge list {'.'.join(where)} needs objects")
                out = [o for o in out if o.get(key) != item.get(key)]
                if item.get("$patch") != "delete":
                    out.append(copy.deepcopy(item))
            return out
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_strategic_patch(result.get(key), value, (*where, key), keys)
    return result


# Structural schemas (apiextensions v1) ---------------------------------------


def structural_errors(schema: object, path: str) -> list[str]:
    """Why a schema is not structural: every node needs a ``type`` (the apiserver's rule)."""
    if not isinstance(schema, dict):
        return [f"{path}: Invalid value: must be an object"]
    errors = []
    if not schema.get("type") and not (
        schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        errors.append(f"{path}.type: Required value: must not be empty for specified object fields")
    for key, sub in (schema.get("properties") or {}).items():
        errors += structural_errors(sub, f"{path}.properties[{key}]")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        errors += structural_errors(extra, f"{path}.additionalProperties")
    if "items" in schema:
        errors += structural_errors(schema["items"], f"{path}.items")
    return errors


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}
_DROP = object()


def prune(value: object, schema: dict, path: str = "", unknown: list | None = None) -> object:
    """Prune and type-check a custom object like the apiserver (fieldValidation=Warn).

    Fields the schema does not declare are dropped and their paths appended to
    ``unknown`` (the server's warning headers); ``null`` in a field that is not
    ``nullable`` is dropped; a whole number sent as a float (``6.0``) is an
    integer; anything else of the wrong type is a 422.
    """
    unknown = [] if unknown is None else unknown
    kind = schema.get("type")
    where = path.lstrip(".") or "<root>"
    if value is None:
        if schema.get("nullable"):
            return None
        raise ApiError(422, f'{where}: Invalid value: "null": {where} in body must be of type {kind}: "null"')
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    bad = (
        (kind in _TYPES and not isinstance(value, _TYPES[kind]))
        or (kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)))
        or (kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))))
    )
    if bad:
        raise ApiError(
            422, f'{where}: Invalid value: "{type(value).__name__}": {where} in body must be of type {kind}: {value!r}'
        )
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props[key] if props is not None and key in props else extra if isinstance(extra, dict) else None
            if sub is None:
                unknown.append(f"{path}.{key}".lstrip("."))
            elif item is None and not sub.get("nullable"):
                continue  # dropped, not refused (apiextensions v1)
            else:
                out[key] = prune(item, sub, f"{path}.{key}", unknown)
        for key in schema.get("required", []):
            if key not in out:
                raise ApiError(422, f"{path}.{key}: Required value".lstrip("."))
        return out
    if isinstance(value, list) and "items" in schema:
        return [prune(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


# Node validation and defaulting ----------------------------------------------

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?$")
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def qualified_name_error(text: str) -> str | None:
    """Why ``text`` is not a qualified name (label keys, taint keys), or ``None``."""
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
            "an alphanumeric character"
        )
    return None


def _extended(name: str) -> bool:
    """Extended resources: a domain-prefixed name outside kubernetes.io (integers only)."""
    prefix = name.rpartition("/")[0]
    return bool(prefix) and prefix != "kubernetes.io" and not prefix.endswith(".kubernetes.io")


def _canonical_quantity(qty: str) -> str:
    """``6.0`` is stored as ``6``, like the apiserver's canonical quantity form (for plain numbers)."""
    if re.fullmatch(r"[0-9]+\.0*", qty):
        return qty.split(".")[0]
    return qty


def _validate_resources(node: dict, name: str) -> None:
    status = node.get("status") or {}
    if status.get("capacity") is not None and status.get("allocatable") is None:
        status["allocatable"] = copy.deepcopy(status["capacity"])  # SetDefaults_NodeStatus
    for section in ("capacity", "allocatable"):
        values = status.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ApiError(
                400, f"json: cannot unmarshal {type(values).__name__} into Go struct field of status.{section}"
            )
        for res, qty in list(values.items()):
            if isinstance(qty, bool) or not isinstance(qty, (int, float, str)) or not QUANTITY.match(str(qty)):
                raise ApiError(400, f"quantities must match the regular expression '{QUANTITY.pattern}'")
            text = _canonical_quantity(str(qty))
            where = f"status.{section}[{res}]"
            if text.startswith("-"):
                raise ApiError(
                    422,
                    f'Node "{name}" is invalid: {where}: Invalid value: "{text}": must be greater than or equal to 0',
                )
            if _extended(res) and not re.fullmatch(r"[0-9]+", text):
                raise ApiError(422, f'Node "{name}" is invalid: {where}: Invalid value: "{text}": must be an integer')
            values[res] = text


def validate_node(node: dict) -> None:
    """The apiserver's checks of a Node that cpupools can trip over, plus its status defaulting."""
    name = node.get("metadata", {}).get("name", "")
    labels = node.get("metadata", {}).get("labels") or {}
    for key, value in labels.items():
        if not isinstance(value, str):
            raise ApiError(400, f"json: cannot unmarshal {type(value).__name__} into Go value of type string")
        why = qualified_name_error(key)
        if why:
            raise ApiError(422, f'Node "{name}" is invalid: metadata.labels: Invalid value: "{key}": {why}')
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ApiError(
                422,
                f'Node "{name}" is invalid: metadata.labels: Invalid value: "{value}": a valid label must be an '
                "empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                "an alphanumeric character",
            )
    seen = set()
    for i, taint in enumerate(node.get("spec", {}).get("taints") or []):
        where = f'Node "{name}" is invalid: spec.taints[{i}]'
        if not taint.get("key"):
            raise ApiError(422, f"{where}.key: Required value")
        why = qualified_name_error(taint["key"])
        if why:
            raise ApiError(422, f'{where}.key: Invalid value: "{taint["key"]}": {why}')
        value = taint.get("value") or ""
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ApiError(
                422,
                f'{where}.value: Invalid value: "{value}": a valid label must be an empty string or consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            )
        if taint.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ApiError(
                422,
                f'{where}.effect: Unsupported value: "{taint.get("effect")}": supported values: '
                '"NoSchedule", "PreferNoSchedule", "NoExecute"',
            )
        if (taint["key"], taint["effect"]) in seen:
            raise ApiError(422, f"{where}: Duplicate value: {taint['key']}:{taint['effect']}")
        seen.add((taint["key"], taint["effect"]))
    _validate_resources(node, name)


# The server ------------------------------------------------------------------


class PageNotFound(ApiError):
    """The bare ``404 page not found`` (text/plain) of a path no API group serves."""

    def __init__(self) -> None:
        super().__init__(404, "404 page not found")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    content_type: str
    body: object
    user: str = ""


@dataclass
class _Rule:
    method: str
    pattern: re.Pattern
    times: int
    action: Callable[[], None] | None = None
    error: ApiError | None = None


VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# Fields a real server keeps on an update whatever the body says.
SYSTEM_META = ("uid", "creationTimestamp", "generation", "resourceVersion", "deletionTimestamp", "managedFields")


@dataclass
class FakeKube:
    """The store and the knobs; ``start()`` serves it, ``url`` says where.

    ``token`` is the bearer token of an unrestricted user (the controller);
    ``tokens`` maps more bearer tokens to user names. A user named
    ``system:node:<name>`` (also a TLS client certificate with that common
    name, like a kubelet's) is held to what the Node authorizer and the
    NodeRestriction admission plugin allow: its own Node only.
    """

    token: str | None = None
    tls: tuple[str, str, str] | None = None  # (server cert, server key, client CA): client certs required
    tokens: dict = field(default_factory=dict)  # more bearer tokens -> user name
    nodes: dict = field(default_factory=dict)
    pods: dict = field(default_factory=dict)
    pdbs: dict = field(default_factory=dict)  # (namespace, name) -> PodDisruptionBudget
    crds: dict = field(default_factory=dict)
    objects: dict = field(default_factory=dict)  # (group, plural, name) -> object
    # (api, plural, namespace or "", name) -> object, for BUILTIN collections and namespaced custom objects
    resources: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    evict_linger: int = 0  # pod reads an evicted pod stays visible (terminating) for
    crd_establish_delay: float = 0.3  # seconds from a CRD's creation to Established (and its group served)
    version: str = "v1.36.1"
    # admissionregistration.k8s.io versions serving MutatingAdmissionPolicy ("v1" from 1.36; () before 1.34)
    admission_versions: tuple = ("v1",)
    admission: dict = field(default_factory=dict)  # (plural, name) -> MutatingAdmissionPolicy[Binding]

    def __post_init__(self) -> None:
        self._rv = 1000
        self._rules: list[_Rule] = []
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._linger: dict = {}
        self._establish_at: dict = {}  # CRD name -> monotonic time it becomes Established
        self._warnings: list[str] = []

    # -- knobs
    def fail(self, method: str, path_regex: str, code: int, message: str = "", times: int = 1) -> None:
        """The next ``times`` matching requests get this status (``times=-1``: all of them)."""
        msg = message or {
            403: 'nodes is forbidden: User "system:serviceaccount:default:ci" cannot patch resource "nodes" '
            'in API group "" at the cluster scope',
        }.get(code, f"injected {code}")
        self._rules.append(_Rule(method.upper(), re.compile(path_regex), times, error=ApiError(code, msg)))

    def before(self, method: str, path_regex: str, action: Callable[[], None], times: int = 1) -> None:
        """Run ``action`` just before the next ``times`` matching requests are served."""
        self._rules.append(_Rule(method.upper(), re.compile(path_regex), times, action=action))

    def touch_node(self, name: str, label: str = "example.com/touched") -> None:
        """A concurrent writer: changes the node so any resourceVersion read before is stale."""
        with self._lock:
            node = self.nodes[name]
            node["metadata"].setdefault("labels", {})[label] = str(self._rv)
            self._bump(node)

    def add_crd(self, crd: dict, established: bool = True) -> dict:
        """Create a CRD as a POST would; ``established``: as if the controllers had run already."""
        with self._lock:
            self._create_crd(self._check_crd(crd))
            name = crd["metadata"]["name"]
            if established:
                self._establish_at[name] = 0.0
            self._tick()
            return self.crds[name]

    def add_pdb(
        self,
        namespace: str,
        name: str,
        match_labels: dict,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> dict:
        """A policy/v1 PodDisruptionBudget; its status is computed from the pods on every eviction."""
        spec: dict = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": self._meta(name), "spec": spec}
        pdb["metadata"]["namespace"] = namespace
        self.pdbs[(namespace, name)] = pdb
        return pdb

    def set_pod(self, namespace: str, name: str, phase: str | None = None, ready: bool | None = None) -> None:
        """What the kubelet would report: the pod's phase and its Ready condition."""
        with self._lock:
            pod = self.pods[(namespace, name)]
            if phase is not None:
                pod["status"]["phase"] = phase
            if ready is not None:
                pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
            self._bump(pod)

    # -- objects
    def _bump(self, obj: dict) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def _meta(self, name: str, **extra: object) -> dict:
        self._rv += 1
        meta = {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(self._rv),
            "creationTimestamp": _now(),
        }
        meta.update(extra)
        return meta

    def add_node(
        self,
        name: str,
        labels: dict | None = None,
        taints: list | None = None,
        capacity: dict | None = None,
        with_capacity: bool = True,
        ready: bool = True,
    ) -> dict:
        """Register a node as its kubelet does (a POST); ``ready``: the node controller has since seen it Ready.

        A new Node gets the ``node.kubernetes.io/not-ready:NoSchedule`` taint;
        it is removed once the node is Ready, so a ready node carries only ``taints``.
        """
        base = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        status: dict = {
            "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": str(uuid.uuid4()),
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.12.48-1-amd64",
                "kubeProxyVersion": "",
                "kubeletVersion": self.version,
                "machineID": uuid.uuid4().hex,
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 13 (trixie)",
                "systemUUID": str(uuid.uuid4()),
            },
        }
        if with_capacity:
            status["capacity"] = dict(base, **(capacity or {}))
            status["allocatable"] = dict(base, **(capacity or {}))
        body = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name}, **(labels or {}))},
            "spec": {"podCIDR": "10.244.0.0/24", "taints": copy.deepcopy(taints or [])},
            "status": status,
        }
        with self._lock:
            node = self._create_node(body)
            if ready:
                node["spec"]["taints"] = [t for t in node["spec"]["taints"] if t["key"] != NOT_READY_TAINT["key"]]
            if not node["spec"]["taints"]:
                del node["spec"]["taints"]
            return node

    def _create_node(self, body: dict) -> dict:
        node = copy.deepcopy(body)
        name = node.get("metadata", {}).get("name")
        if name in self.nodes:
            raise ApiError(409, f'nodes "{name}" already exists', "AlreadyExists", {"name": name, "kind": "nodes"})
        spec = node.setdefault("spec", {})
        taints = [t for t in spec.get("taints") or [] if t.get("key") != NOT_READY_TAINT["key"]]
        spec["taints"] = [*taints, dict(NOT_READY_TAINT, timeAdded=_now())]  # TaintNodesByCondition admission
        node["metadata"] = self._meta(name, **{k: v for k, v in node["metadata"].items() if k != "name"})
        validate_node(node)
        self.nodes[name] = node
        return node

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        owner: str | None = None,
        mirror: bool = False,
        labels: dict | None = None,
        phase: str = "Running",
        ready: bool = True,
    ) -> dict:
        meta = self._meta(name, namespace=namespace)
        if labels:
            meta["labels"] = dict(labels)
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner,
                    "name": f"{name}-owner",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ]
        if mirror:
            meta["annotations"] = {"kubernetes.io/config.mirror": "abc123"}
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
        self.pods[(namespace, name)] = pod
        return pod

    def add_resource(self, api: str, plural: str, name: str, namespace: str = "", **fields: object) -> dict:
        """Store an object of a BUILTIN collection or a namespaced custom one (``api``: ``v1``, ``group/version``)."""
        kind = BUILTIN.get((api, plural), (None, fields.pop("kind", plural)))[1]
        meta = self._meta(name, **({"namespace": namespace} if namespace else {}))
        meta.update(fields.pop("metadata", {}))
        obj = {"apiVersion": api, "kind": kind, "metadata": meta, **copy.deepcopy(fields)}
        self.resources[(api, plural, namespace, name)] = obj
        return obj

    def add_crd_raw(self, name: str, crd: dict) -> None:
        """Store a CRD as it is, without the v1 checks (an old CRD a cluster upgrade kept)."""
        crd = copy.deepcopy(crd)
        crd["metadata"] = self._meta(name, **{k: v for k, v in crd.get("metadata", {}).items() if k != "name"})
        crd["status"] = {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
            ],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        }
        self.crds[name] = crd

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in WRITE_METHODS]

    # -- serving
    @property
    def url(self) -> str:
        assert self._server is not None, "call start() first"
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            kube = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls:
            cert, key, ca = self.tls
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- dispatch
    def handle(self, method: str, path: str, query: dict, ctype: str, body: object, auth: str, user: str) -> tuple:
        """``(code, payload, warnings)`` for one request."""
        with self._lock:
            self.requests.append(Recorded(method, path, query, ctype, copy.deepcopy(body), user))
            self._warnings = []
            if auth.startswith("Bearer ") and auth[7:] in self.tokens:
                user = self.tokens[auth[7:]]
                self.requests[-1].user = user
            elif self.token is not None and auth != f"Bearer {self.token}" and not user:
                raise ApiError(401, "Unauthorized")
            if user.startswith("system:node:"):
                self._authorize_node(user, method, path, body)
            for rule in self._rules:
                if rule.times != 0 and rule.method == method and rule.pattern.search(path):
                    rule.times -= 1
                    if rule.action:
                        rule.action()
                    if rule.error:
                        raise rule.error
            self._tick()
            dry_run = query.get("dryRun", [])
            if dry_run and (method not in WRITE_METHODS or dry_run != ["All"]):
                raise ApiError(400, f'dryRun: Unsupported value: "{dry_run[0]}": supported values: "All"')
            for pattern, handler in ROUTES:
                match = pattern.fullmatch(path)
                if match:
                    if not dry_run:
                        return (*handler(self, method, query, ctype, body, *match.groups()), self._warnings)
                    saved = copy.deepcopy(
                        (self.nodes, self.pods, self.crds, self.objects, self._linger, self._establish_at, self._rv)
                    )
                    try:
                        return (*handler(self, method, query, ctype, body, *match.groups()), self._warnings)
                    finally:  # a dry run is answered as if it were done, and stores nothing
                        self.nodes, self.pods, self.crds, self.objects, self._linger, self._establish_at, self._rv = (
                            saved
                        )
            raise PageNotFound()

    def _authorize_node(self, user: str, method: str, path: str, body: object) -> None:
        """The Node authorizer and NodeRestriction: a kubelet reads and patches only its own Node."""
        own = user[len("system:node:") :]
        if path.rstrip("/") == "/version":
            return
        match = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
        if match and method in ("GET", "PATCH"):
            name = match.group(1)
            if name == own:
                return
            if method == "GET":
                raise ApiError(
                    403,
                    f'nodes "{name}" is forbidden: User "{user}" cannot get resource "nodes" in API group "" at the '
                    f"cluster scope: node '{own}' cannot read '{name}', only its own Node object",
                    "Forbidden",
                    {"name": name, "kind": "nodes"},
                )
            raise ApiError(
                403,
                f'nodes "{name}" is forbidden: node "{own}" is not allowed to modify node "{name}"',
                "Forbidden",
                {"name": name, "kind": "nodes"},
            )
        group, resource, name = _describe(path)
        verb = "list" if method == "GET" and name is None else VERBS.get(method, method.lower())
        what = f"{resource}.{group}" if group else resource
        named = f' "{name}"' if name else ""
        raise ApiError(
            403,
            f'{what}{named} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" '
            "at the cluster scope",
            "Forbidden",
            {"name": name or "", "group": group, "kind": resource},
        )

    def _version(self, method, query, ctype, body):
        major, minor = self.version.lstrip("v").split(".")[:2]
        return 200, {
            "major": major,
            "minor": minor,
            "emulationMajor": major,
            "emulationMinor": minor,
            "minCompatibilityMajor": major,
            "minCompatibilityMinor": str(int(minor) - 1),
            "gitVersion": self.version,
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25.5",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _nodes(self, method, query, ctype, body):
        if method == "GET":
            selector = _label_selector(query.get("labelSelector", [""])[0])
            items = [
                copy.deepcopy(n)
                for _, n in sorted(self.nodes.items())
                if _selected(n["metadata"].get("labels") or {}, selector)
            ]
            return 200, {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        if method != "POST":
            raise ApiError(405, f"method {method} not allowed on the node collection")
        if not isinstance(body, dict) or body.get("kind") != "Node":
            raise ApiError(400, "the body must be a v1 Node")
        _no_resource_version(body)
        return 201, copy.deepcopy(self._create_node(body))

    def _node(self, method, query, ctype, body, name, sub):
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, f'nodes "{name}" not found', details={"name": name, "kind": "nodes"})
        if method == "GET":
            shown = copy.deepcopy(node)
            for condition in shown.get("status", {}).get("conditions") or []:
                if condition.get("type") == "Ready" and condition.get("status") == "True":
                    # A live kubelet's heartbeat: what a rollout waits for after a restart.
                    condition["lastHeartbeatTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            return 200, shown
        if method != "PATCH":
            raise ApiError(405, f"method {method} not allowed on nodes in this fake")
        patched = self._patch(node, ctype, body, "nodes", name)
        if sub == "/status":
            patched["spec"] = copy.deepcopy(node["spec"])
        else:
            patched["status"] = copy.deepcopy(node["status"])
        user = self.requests[-1].user
        if user.startswith("system:node:") and patched.get("spec", {}).get("taints") != node["spec"].get("taints"):
            raise ApiError(403, f'nodes "{name}" is forbidden: node "{name}" is not allowed to modify taints')
        validate_node(patched)
        return self._store(self.nodes, name, node, patched, generation=False)

    def _store(self, table: dict, key: object, current: dict, new: dict, generation: bool = True) -> tuple:
        """Keep ``new`` unless it equals ``current``: a no-op write bumps neither resourceVersion nor generation."""
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return 200, copy.deepcopy(current)
        if generation and "generation" in current["metadata"]:
            spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
                k: v for k, v in current.items() if k not in ("metadata", "status")
            }
            new["metadata"]["generation"] = current["metadata"]["generation"] + (1 if spec_changed else 0)
        self._bump(new)
        table[key] = new
        return 200, copy.deepcopy(new)

    def _patch(self, current: dict, ctype: str, body: object, kind: str, name: str, strategic: bool = True) -> dict:
        if ctype == JSON_PATCH:
            patched = apply_json_patch(current, body)
        elif ctype == MERGE_PATCH:
            patched = apply_merge_patch(current, body)
        elif ctype == STRATEGIC_PATCH and strategic:
            patched = apply_strategic_patch(current, body)
        else:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{JSON_PATCH}, {MERGE_PATCH}" + (f", {STRATEGIC_PATCH}" if strategic else ""),
            )
        if not isinstance(patched, dict):
            raise ApiError(422, "the patched object is not an object")
        meta = patched.setdefault("metadata", {})
        if meta.get("name") != name:
            raise ApiError(
                400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if meta.get("resourceVersion") not in (None, "", current["metadata"]["resourceVersion"]):
            raise self._conflict(kind, name)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        for key in ("uid", "creationTimestamp", "generation"):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        return patched

    @staticmethod
    def _conflict(kind: str, name: str) -> ApiError:
        return ApiError(
            409,
            f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            details={"name": name, "kind": kind},
        )

    def _pods(self, method, query, ctype, body, namespace=None):
        if method != "GET":
            raise ApiError(405, "only list is served on the pod collection")
        terms = _field_selector(query.get("fieldSelector", [""])[0])
        items = []
        for (ns, _name), pod in sorted(self.pods.items()):
            if namespace and ns != namespace:
                continue
            if all((_pod_field(pod, key) == value) == equal for key, equal, value in terms):
                items.append(copy.deepcopy(pod))
        self._age_evicted()
        return 200, {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _age_evicted(self) -> None:
        for key in list(self._linger):
            self._linger[key] -= 1
            if self._linger[key] < 0:
                del self._linger[key]
                self.pods.pop(key, None)
                self._rv += 1

    def _pod(self, method, query, ctype, body, namespace, name, sub):
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found', details={"name": name, "kind": "pods"})
        if sub is None:
            if method == "DELETE":
                del self.pods[(namespace, name)]
                self._rv += 1
                return 200, pod
            if method != "GET":
                raise ApiError(405, "only get and delete are served on pods in this fake")
            result = copy.deepcopy(pod)
            self._age_evicted()
            return 200, result
        if method != "POST":
            raise ApiError(405, "eviction takes POST")
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiError(400, "the body must be an Eviction")
        if body.get("metadata", {}).get("name") != name:
            raise ApiError(400, "the Eviction's name must match the pod's")
        if "deletionTimestamp" not in pod["metadata"]:
            self._check_budgets(pod)
            pod["metadata"]["deletionTimestamp"] = _now()
            self._bump(pod)
            self._linger[(namespace, name)] = self.evict_linger
        return 201, status_body(201, "", "")

    def _check_budgets(self, pod: dict) -> None:
        """The eviction subresource's budget rules (policy/v1, unhealthyPodEvictionPolicy IfHealthyBudget)."""
        if pod["status"].get("phase") in ("Pending", "Succeeded", "Failed"):
            return  # not running: no budget counts it
        namespace = pod["metadata"]["namespace"]
        budgets = [p for (ns, _), p in sorted(self.pdbs.items()) if ns == namespace and _selects(p, pod)]
        if len(budgets) > 1:
            raise ApiError(
                500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            )
        if not budgets:
            return
        pdb = budgets[0]
        status = self._budget_status(pdb)
        if not _healthy(pod) and status["currentHealthy"] >= status["desiredHealthy"]:
            return  # an unhealthy pod may go while the budget is met
        if status["disruptionsAllowed"] == 0:
            raise ApiError(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
                "TooManyRequests",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb['metadata']['name']} needs "
                            f"{status['desiredHealthy']} healthy pods and has {status['currentHealthy']} currently",
                        }
                    ],
                    "retryAfterSeconds": 0,
                },
            )

    def _budget_status(self, pdb: dict) -> dict:
        """What the disruption controller would write: healthy = Running, Ready and not being deleted."""
        namespace = pdb["metadata"]["namespace"]
        pods = [p for (ns, _), p in self.pods.items() if ns == namespace and _selects(pdb, p)]
        expected = len(pods)
        healthy = sum(1 for p in pods if _healthy(p))
        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = _scaled(spec["minAvailable"], expected)
        else:
            desired = max(expected - _scaled(spec.get("maxUnavailable", 0), expected), 0)
        return {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": max(healthy - desired, 0),
        }

    # -- CustomResourceDefinitions
    def _tick(self) -> None:
        """The naming and establishing controllers: names accepted at once, Established after a delay."""
        now = time.monotonic()
        for name, crd in sorted(self.crds.items()):
            conditions = {c["type"]: c for c in crd["status"]["conditions"]}
            if conditions["NamesAccepted"]["status"] != "True":
                self._name_crd(crd)
            elif conditions["Established"]["status"] != "True" and now >= self._establish_at.get(name, 0.0):
                conditions["Established"].update(
                    status="True", reason="InitialNamesAccepted", message="the initial names have been accepted"
                )
                self._rv += 1
                crd["metadata"]["resourceVersion"] = str(self._rv)
                crd["status"]["conditions"] = list(conditions.values())

    def _name_crd(self, crd: dict) -> None:
        """The naming controller: accept the names unless another CRD of the group holds one of them."""
        names = crd["spec"]["names"]
        resources, kinds = set(), set()
        for other in self.crds.values():
            if other is crd or other["spec"]["group"] != crd["spec"]["group"]:
                continue
            taken = other["status"].get("acceptedNames") or {}
            resources.update([taken.get("plural"), taken.get("singular"), *(taken.get("shortNames") or [])])
            kinds.update([taken.get("kind"), taken.get("listKind")])
        resources.discard(None)
        kinds.discard(None)
        conflicts = [
            (reason, value)
            for reason, value, taken in (
                ("PluralConflict", names.get("plural"), resources),
                ("SingularConflict", names.get("singular"), resources),
                *(("ShortNamesConflict", s, resources) for s in names.get("shortNames") or []),
                ("KindConflict", names.get("kind"), kinds),
                ("ListKindConflict", names.get("listKind"), kinds),
            )
            if value in taken
        ]
        # The real naming controller checks the names in this order and the last conflict found is the one reported.
        conflict = conflicts[-1] if conflicts else None
        old = {c["type"]: c for c in crd["status"].get("conditions") or []}
        if conflict:
            accepted = {
                "type": "NamesAccepted",
                "status": "False",
                "reason": conflict[0],
                "message": f'"{conflict[1]}" is already in use',
            }
            established = old.get("Established") or {
                "type": "Established",
                "status": "False",
                "reason": "NotAccepted",
                "message": "not all names are accepted",
            }
        else:
            crd["status"]["acceptedNames"] = copy.deepcopy(names)
            accepted = {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            }
            established = old.get("Established")
            if not established or established["status"] != "True":
                established = {
                    "type": "Established",
                    "status": "False",
                    "reason": "Installing",
                    "message": "the initial names have been accepted",
                }
                self._establish_at.setdefault(crd["metadata"]["name"], time.monotonic() + self.crd_establish_delay)
        crd["status"]["conditions"] = [accepted, established]

    def _create_crd(self, crd: dict) -> dict:
        name = crd["metadata"]["name"]
        if name in self.crds:
            raise ApiError(
                409,
                f'customresourcedefinitions.apiextensions.k8s.io "{name}" already exists',
                "AlreadyExists",
                {"name": name, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"},
            )
        crd["metadata"] = self._meta(name, **{k: v for k, v in crd["metadata"].items() if k != "name"})
        crd["metadata"]["generation"] = 1
        crd["status"] = {
            "acceptedNames": {"kind": "", "plural": ""},
            "conditions": [],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        }
        self.crds[name] = crd
        self._name_crd(crd)
        return crd

    def _crds(self, method, query, ctype, body, name):
        if name is None:
            if method == "GET":
                return 200, {
                    "kind": "CustomResourceDefinitionList",
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": [copy.deepcopy(c) for _, c in sorted(self.crds.items())],
                }
            if method != "POST":
                raise ApiError(405, "method not allowed")
            crd = self._check_crd(body)
            _no_resource_version(crd)
            return 201, copy.deepcopy(self._create_crd(crd))
        current = self.crds.get(name)
        if current is None:
            raise ApiError(
                404,
                f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found',
                details={"name": name, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"},
            )
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del self.crds[name]
            self._establish_at.pop(name, None)
            group = current["spec"]["group"]
            plural = current["spec"]["names"]["plural"]
            for key in [k for k in self.objects if k[:2] == (group, plural)]:
                del self.objects[key]
            self._rv += 1
            return 200, status_body(200, "", "")
        if method == "PUT":
            crd = self._check_crd(body)
            self._precondition(current, crd, "customresourcedefinitions.apiextensions.k8s.io", name)
            # An update replaces the whole object: labels and annotations it does not carry are gone.
            crd["metadata"] = dict(
                {k: v for k, v in crd["metadata"].items() if k not in SYSTEM_META},
                **{k: current["metadata"][k] for k in SYSTEM_META if k in current["metadata"]},
            )
        elif method == "PATCH":
            crd = self._check_crd(
                self._patch(current, ctype, body, "customresourcedefinitions.apiextensions.k8s.io", name)
            )
        else:
            raise ApiError(405, "method not allowed")
        crd["status"] = copy.deepcopy(current["status"])  # the main resource ignores status
        code, stored = self._store(self.crds, name, current, crd)
        if crd["spec"]["names"] != current["spec"]["names"]:
            self._name_crd(self.crds[name])
            stored = copy.deepcopy(self.crds[name])
        return code, stored

    def _precondition(self, current: dict, new: dict, kind: str, name: str) -> None:
        rv = new.get("metadata", {}).get("resourceVersion")
        if not rv:
            raise ApiError(
                422,
                f'{kind} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
                "must be specified for an update",
            )
        if rv != current["metadata"]["resourceVersion"]:
            raise self._conflict(kind, name)

    @staticmethod
    def _check_crd(body: object) -> dict:
        if not isinstance(body, dict) or body.get("apiVersion") != "apiextensions.k8s.io/v1":
            raise ApiError(400, "the body must be an apiextensions.k8s.io/v1 CustomResourceDefinition")
        crd = copy.deepcopy(body)
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        name = crd.get("metadata", {}).get("name")
        invalid = f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: '
        if name != f"{names.get('plural')}.{spec.get('group')}":
            raise ApiError(422, invalid + 'metadata.name: Invalid value: must be spec.names.plural+"."+spec.group')
        if spec.get("scope") not in ("Cluster", "Namespaced"):
            raise ApiError(422, invalid + "spec.scope: Unsupported value")
        versions = spec.get("versions") or []
        if sum(1 for v in versions if v.get("storage")) != 1:
            raise ApiError(
                422, invalid + "spec.versions: Invalid value: must have exactly one version marked as storage version"
            )
        for i, version in enumerate(versions):
            schema = version.get("schema", {}).get("openAPIV3Schema")
            where = f"spec.versions[{i}].schema.openAPIV3Schema"
            if not isinstance(schema, dict):
                raise ApiError(422, invalid + f"{where}: Required value: schemas are required")
            errors = structural_errors(schema, where)
            if errors:
                raise ApiError(422, invalid + "[" + ", ".join(errors) + "]")
        names.setdefault("listKind", f"{names.get('kind')}List")
        names.setdefault("singular", str(names.get("kind", "")).lower())
        spec.setdefault("conversion", {"strategy": "None"})
        return crd

    def _custom(self, method, query, ctype, body, group, version, plural, name):
        crd = self.crds.get(f"{plural}.{group}")
        established = crd is not None and any(
            c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]
        )
        served = established and any(v["name"] == version and v.get("served") for v in crd["spec"]["versions"])
        if not served or crd["spec"]["scope"] != "Cluster":
            raise PageNotFound()  # the group is served only once a CRD is Established
        kind = crd["spec"]["names"]["kind"]
        schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
        resource = f"{plural}.{group}"
        strict = query.get("fieldValidation", ["Warn"])[0]
        if name is None:
            if method == "GET":
                items = [copy.deepcopy(o) for k, o in sorted(self.objects.items()) if k[:2] == (group, plural)]
                return 200, {"kind": f"{kind}List", "apiVersion": f"{group}/{version}", "metadata": {}, "items": items}
            if method != "POST":
                raise ApiError(405, "method not allowed")
            obj = self._check_object(body, group, version, kind, schema, strict)
            _no_resource_version(obj)
            name = obj["metadata"].get("name")
            if (group, plural, name) in self.objects:
                raise ApiError(
                    409,
                    f'{resource} "{name}" already exists',
                    "AlreadyExists",
                    {"name": name, "group": group, "kind": plural},
                )
            obj["metadata"] = self._meta(name, **{k: v for k, v in obj["metadata"].items() if k != "name"})
            obj["metadata"]["generation"] = 1
            self.objects[(group, plural, name)] = obj
            return 201, copy.deepcopy(obj)
        current = self.objects.get((group, plural, name))
        if current is None:
            raise ApiError(
                404, f'{resource} "{name}" not found', details={"name": name, "group": group, "kind": plural}
            )
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del self.objects[(group, plural, name)]
            self._rv += 1
            return 200, status_body(200, "", "", {"name": name, "group": group, "kind": plural})
        if method == "PUT":
            obj = self._check_object(body, group, version, kind, schema, strict)
            self._precondition(current, obj, resource, name)
        elif method == "PATCH":
            obj = self._check_object(
                self._patch(current, ctype, body, resource, name, strategic=False), group, version, kind, schema, strict
            )
        else:
            raise ApiError(405, "method not allowed")
        if obj["metadata"].get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        obj["metadata"].update({k: current["metadata"][k] for k in ("uid", "creationTimestamp", "generation")})
        return self._store(self.objects, (group, plural, name), current, obj)

    def _collection(self, method, query, ctype, body, api, namespace, plural, name, kind):
        """List, get, create and delete in a BUILTIN collection or a namespaced custom one."""
        ns = namespace or ""
        resource = plural if "/" not in api else f"{plural}.{api.split('/')[0]}"
        if name is None:
            if method == "GET":
                items = [
                    copy.deepcopy(o)
                    for (a, p, n, _), o in sorted(self.resources.items())
                    if (a, p) == (api, plural) and (namespace is None or n == ns)
                ]
                return 200, {
                    "kind": f"{kind}List",
                    "apiVersion": api,
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            if method != "POST":
                raise ApiError(405, "method not allowed")
            if not isinstance(body, dict) or body.get("kind") != kind or not body.get("metadata", {}).get("name"):
                raise ApiError(400, f"the body must be a {kind} with a name")
            name = body["metadata"]["name"]
            if (api, plural, ns, name) in self.resources:
                raise ApiError(
                    409, f'{resource} "{name}" already exists', "AlreadyExists", {"name": name, "kind": plural}
                )
            fields = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
            kept = {k: v for k, v in body["metadata"].items() if k in ("labels", "annotations")}
            if kept:
                fields["metadata"] = kept
            return 201, copy.deepcopy(self.add_resource(api, plural, name, ns, kind=kind, **fields))
        current = self.resources.get((api, plural, ns, name))
        if current is None:
            raise ApiError(404, f'{resource} "{name}" not found', details={"name": name, "kind": plural})
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            wanted = ((body or {}).get("preconditions") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise self._conflict(resource, name)
            del self.resources[(api, plural, ns, name)]
            self._rv += 1
            return 200, status_body(200, "", "", {"name": name, "kind": plural})
        if method == "PUT":  # a replace: same kind and name, guarded by the resourceVersion it carries
            if not isinstance(body, dict) or body.get("kind") != kind or body.get("metadata", {}).get("name") != name:
                raise ApiError(400, f"the body must be a {kind} named {name}")
            self._precondition(current, body, resource, name)
            new = copy.deepcopy(body)
            new["apiVersion"] = api
            new["metadata"].update({k: current["metadata"][k] for k in SYSTEM_META if k in current["metadata"]})
            return self._store(self.resources, (api, plural, ns, name), current, new)
        raise ApiError(405, "only get, replace and delete are served on single objects of this collection in this fake")

    def _builtin(self, method, query, ctype, body, api, namespace, plural, name):
        entry = BUILTIN.get((api, plural))
        if entry is None or entry[0] != (namespace is not None):
            raise ApiError(404, "the server could not find the requested resource")
        return self._collection(method, query, ctype, body, api, namespace, plural, name, entry[1])

    def _core(self, method, query, ctype, body, namespace, plural, name):
        return self._builtin(method, query, ctype, body, "v1", namespace, plural, name)

    def _cluster(self, method, query, ctype, body, group, version, plural, name):
        return self._group(method, query, ctype, body, group, version, None, plural, name)

    # -- admissionregistration.k8s.io: MutatingAdmissionPolicy and its binding
    def _admission_group(self, method, query, ctype, body):
        versions = ["v1"] + [v for v in ("v1beta1", "v1alpha1") if v in self.admission_versions]
        return 200, {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": ADMISSION_GROUP,
            "versions": [{"groupVersion": f"{ADMISSION_GROUP}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{ADMISSION_GROUP}/v1", "version": "v1"},
        }

    def _admission_resources(self, method, query, ctype, body, version):
        if version != "v1" and version not in self.admission_versions:
            raise PageNotFound()
        names = [
            ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
            ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
            ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
        ]
        if version != "v1":
            names = []
        if version in self.admission_versions:
            names += list(ADMISSION_KINDS.items())
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        return 200, {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{ADMISSION_GROUP}/{version}",
            "resources": [
                {"name": p, "singularName": "", "namespaced": False, "kind": k, "verbs": verbs} for p, k in names
            ],
        }

    def _admission(self, method, query, ctype, body, version, plural, name):
        if version not in self.admission_versions:
            if version == "v1":
                raise ApiError(404, "the server could not find the requested resource")
            raise PageNotFound()
        kind = ADMISSION_KINDS[plural]
        resource = f"{plural}.{ADMISSION_GROUP}"
        api = f"{ADMISSION_GROUP}/{version}"

        def served(obj: dict) -> dict:
            return dict(copy.deepcopy(obj), apiVersion=api)

        if name is None:
            if method == "GET":
                items = [served(o) for (p, _), o in sorted(self.admission.items()) if p == plural]
                return 200, {"kind": f"{kind}List", "apiVersion": api, "metadata": {}, "items": items}
            if method != "POST":
                raise ApiError(405, "method not allowed")
            obj = self._admission_object(body, api, kind, resource)
            _no_resource_version(obj)
            name = obj["metadata"]["name"]
            if (plural, name) in self.admission:
                raise ApiError(409, f'{resource} "{name}" already exists', "AlreadyExists", {"name": name})
            obj["metadata"] = self._meta(name, **{k: v for k, v in obj["metadata"].items() if k != "name"})
            obj["metadata"]["generation"] = 1
            self.admission[(plural, name)] = obj
            return 201, served(obj)
        current = self.admission.get((plural, name))
        if current is None:
            raise ApiError(404, f'{resource} "{name}" not found', "NotFound", {"name": name, "kind": plural})
        if method == "GET":
            return 200, served(current)
        if method == "DELETE":
            del self.admission[(plural, name)]
            self._rv += 1
            return 200, status_body(200, "", "", {"name": name, "group": ADMISSION_GROUP, "kind": plural})
        if method != "PUT":
            raise ApiError(405, "only get, create, update (PUT) and delete are served here in this fake")
        obj = self._admission_object(body, api, kind, resource)
        if obj["metadata"].get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        self._precondition(current, obj, resource, name)
        obj["metadata"].update({k: current["metadata"][k] for k in ("uid", "creationTimestamp", "generation")})
        obj["apiVersion"] = current["apiVersion"]
        code, stored = self._store(self.admission, (plural, name), current, obj)
        return code, served(stored)

    def _admission_object(self, body, api, kind, resource) -> dict:
        """The object with the server's defaults. Not validated: the real server of the tests checks the
        policy's fields and CEL (tests/cluster/test_admission_cel.py); the fake serves older servers only."""
        if not isinstance(body, dict) or body.get("apiVersion") != api or body.get("kind") != kind:
            raise ApiError(400, f"the body must be a {api} {kind}")
        name = (body.get("metadata") or {}).get("name") or ""
        if not name or len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            raise ApiError(422, f'{resource} "{name}" is invalid: metadata.name: Invalid value', "Invalid")
        return _admission_defaults(copy.deepcopy(body))

    def _group(self, method, query, ctype, body, group, version, namespace, plural, name):
        api = f"{group}/{version}"
        if (api, plural) in BUILTIN:
            return self._builtin(method, query, ctype, body, api, namespace, plural, name)
        crd = self.crds.get(f"{plural}.{group}")
        served = crd and any(v["name"] == version and v.get("served") for v in crd["spec"]["versions"])
        if not served or namespace is None or crd["spec"]["scope"] != "Namespaced":
            raise ApiError(404, "the server could not find the requested resource")
        return self._collection(method, query, ctype, body, api, namespace, plural, name, crd["spec"]["names"]["kind"])

    def _check_object(self, body: object, group: str, version: str, kind: str, schema: dict, validation: str) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        if body.get("apiVersion") != f"{group}/{version}" or body.get("kind") != kind:
            raise ApiError(
                400, f"the body must be a {group}/{version} {kind}, not {body.get('apiVersion')} {body.get('kind')}"
            )
        metadata = copy.deepcopy(body.get("metadata") or {})
        rest = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
        unknown: list[str] = []
        pruned = prune(
            rest,
            {
                **schema,
                "properties": {
                    k: v for k, v in schema.get("properties", {}).items() if k not in ("apiVersion", "kind", "metadata")
                },
            },
            unknown=unknown,
        )
        if unknown and validation == "Strict":
            raise ApiError(400, "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
        if validation != "Ignore":
            self._warnings += [f'unknown field "{u}"' for u in unknown]
        return {"apiVersion": body["apiVersion"], "kind": kind, "metadata": metadata, **pruned}


# admissionregistration.k8s.io: MutatingAdmissionPolicy(Binding) as v1.36 validates it ----------

ADMISSION_GROUP = "admissionregistration.k8s.io"
_ANY = "any"
_STR = "string"
_STRS = [_STR]
_META = {
    k: _ANY
    for k in (
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    )
}
_SELECTOR = {"matchLabels": _ANY, "matchExpressions": [{"key": _STR, "operator": _STR, "values": _STRS}]}
_RULE = {
    "apiGroups": _STRS,
    "apiVersions": _STRS,
    "operations": _STRS,
    "resources": _STRS,
    "resourceNames": _STRS,
    "scope": _STR,
}
_MATCH = {
    "namespaceSelector": _SELECTOR,
    "objectSelector": _SELECTOR,
    "resourceRules": [_RULE],
    "excludeResourceRules": [_RULE],
    "matchPolicy": _STR,
}
_EXPRESSION = {"expression": _STR}


def _admission_defaults(obj: dict) -> dict:
    """What the server fills in on create and update."""
    spec = obj.setdefault("spec", {})
    for key in ("matchConstraints", "matchResources"):
        match = spec.get(key)
        if isinstance(match, dict):
            match.setdefault("matchPolicy", "Equivalent")
            match.setdefault("namespaceSelector", {})
            match.setdefault("objectSelector", {})
            for rule in match.get("resourceRules") or []:
                rule.setdefault("scope", "*")
    if obj.get("kind") == "MutatingAdmissionPolicy":
        spec.setdefault("failurePolicy", "Fail")
    return obj


#: plural -> (kind, validator)
ADMISSION_KINDS = {
    "mutatingadmissionpolicies": "MutatingAdmissionPolicy",
    "mutatingadmissionpolicybindings": "MutatingAdmissionPolicyBinding",
}


def _label_selector(text: str) -> list[tuple[str, str, str]]:
    """``labelSelector`` terms as ``(key, op, value)``: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    terms = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(!?)([^=!]+?)\s*(?:(==|=|!=)\s*(.*))?", part)
        if not match or (match.group(1) and match.group(3)):
            raise ApiError(400, f"unable to parse requirement: {part!r}")
        bang, key, op, value = match.groups()
        terms.append((key, "!" if bang else (op or "exists").replace("==", "="), value or ""))
    return terms


def _selected(labels: dict, terms: list[tuple[str, str, str]]) -> bool:
    for key, op, value in terms:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


#: Built-in collections served generically: (api, plural) -> (namespaced, kind).
BUILTIN = {
    ("v1", "configmaps"): (True, "ConfigMap"),
    ("v1", "secrets"): (True, "Secret"),
    ("v1", "services"): (True, "Service"),
    ("v1", "serviceaccounts"): (True, "ServiceAccount"),
    ("apps/v1", "daemonsets"): (True, "DaemonSet"),
    ("apps/v1", "deployments"): (True, "Deployment"),
    ("rbac.authorization.k8s.io/v1", "clusterroles"): (False, "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings"): (False, "ClusterRoleBinding"),
    ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"): (False, "MutatingWebhookConfiguration"),
}


def _no_resource_version(obj: dict) -> None:
    if (obj.get("metadata") or {}).get("resourceVersion"):
        raise ApiError(400, "resourceVersion should not be set on objects to be created")


def _describe(path: str) -> tuple[str, str, str | None]:
    """``(group, resource, name)`` of an API path, for 403 messages."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest, group = parts[2:], ""
    elif parts[:1] == ["apis"] and len(parts) > 2:
        rest, group = parts[3:], parts[1]
    else:
        return "", path, None
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = "/".join(rest[::2]) if len(rest) > 2 else (rest[0] if rest else "")
    return group, resource, rest[1] if len(rest) > 1 else None


_POD_FIELDS = {
    "metadata.name": lambda p: p["metadata"]["name"],
    "metadata.namespace": lambda p: p["metadata"].get("namespace", "default"),
    "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
    "spec.restartPolicy": lambda p: p["spec"].get("restartPolicy", "Always"),
    "spec.schedulerName": lambda p: p["spec"].get("schedulerName", "default-scheduler"),
    "status.phase": lambda p: p["status"].get("phase", ""),
}


def _field_selector(text: str) -> list[tuple[str, bool, str]]:
    """``key=value``, ``key==value`` and ``key!=value`` terms, comma-separated (the pod fields a server indexes)."""
    terms = []
    for term in filter(None, text.split(",")):
        match = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if not match:
            raise ApiError(400, f'invalid selector: "{text}"; can\'t understand "{term}"')
        key, op, value = match.groups()
        if key not in _POD_FIELDS:
            raise ApiError(400, f"field label not supported: {key}")
        terms.append((key, op != "!=", value))
    return terms


def _pod_field(pod: dict, key: str) -> str:
    return _POD_FIELDS[key](pod)


def _selects(pdb: dict, pod: dict) -> bool:
    want = pdb["spec"]["selector"].get("matchLabels") or {}
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in want.items())


def _healthy(pod: dict) -> bool:
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
    return pod["status"].get("phase") == "Running" and ready and "deletionTimestamp" not in pod["metadata"]


def _scaled(value: int | str, expected: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * expected / 100)
    return int(value)


ROUTES: list[tuple[re.Pattern, Callable]] = [
    (re.compile(r"/version/?"), FakeKube._version),
    (re.compile(r"/api/v1/nodes"), FakeKube._nodes),
    (re.compile(r"/api/v1/nodes/([^/]+)(/status)?"), FakeKube._node),
    (re.compile(r"/api/v1/pods"), FakeKube._pods),
    (re.compile(r"/api/v1/namespaces/([^/]+)/pods"), FakeKube._pods),
    (re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(?:/(eviction))?"), FakeKube._pod),
    (re.compile(r"/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions(?:/([^/]+))?"), FakeKube._crds),
    (re.compile(r"/api/v1/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?"), FakeKube._core),
    (re.compile(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?"), FakeKube._group),
    (re.compile(r"/apis/admissionregistration\.k8s\.io/?"), FakeKube._admission_group),
    (re.compile(r"/apis/admissionregistration\.k8s\.io/([^/]+)/?"), FakeKube._admission_resources),
    (
        re.compile(
            r"/apis/admissionregistration\.k8s\.io/([^/]+)/(mutatingadmissionpolic(?:ies|ybindings))(?:/([^/]+))?"
        ),
        FakeKube._admission,
    ),
    (
        re.compile(r"/apis/(rbac\.authorization\.k8s\.io|admissionregistration\.k8s\.io)/(v1)/([^/]+)(?:/([^/]+))?"),
        FakeKube._cluster,
    ),
    (re.compile(r"/apis/([^/]+)/([^/]+)/([^/]+)(?:/([^/]+))?"), FakeKube._custom),
]


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        user = ""
        if isinstance(self.connection, ssl.SSLSocket):
            cert = self.connection.getpeercert() or {}
            user = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        warnings: list[str] = []
        content_type = "application/json"
        try:
            try:
                body = json.loads(raw) if raw else None
            except ValueError as exc:
                raise ApiError(400, f"invalid JSON body: {exc}") from None
            code, payload, warnings = self.kube.handle(
                self.command,
                unquote(parts.path),
                parse_qs(parts.query),
                ctype,
                body,
                self.headers.get("Authorization", ""),
                user,
            )
            data = json.dumps(payload).encode()
        except PageNotFound:
            code, data, content_type = 404, b"404 page not found\n", "text/plain; charset=utf-8"
        except ApiError as exc:
            code, data = exc.code, json.dumps(status_body(exc.code, exc.message, exc.reason, exc.details)).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        for warning in warnings:
            self.send_header("Warning", "299 - " + json.dumps(warning))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


# Test PKI and kubeconfigs ----------------------------------------------------


def make_pki(directory: Path, node: str = "node-1") -> dict[str, Path]:
    """A throwaway CA, a server cert for 127.0.0.1 and a kubelet-style client cert.

    Returns paths: ``ca``, ``server_cert``, ``server_key``, ``client_cert``,
    ``client_key`` and ``client_pem`` (cert and key in one file, like
    ``/var/lib/kubelet/pki/kubelet-client-current.pem``).
    """
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("fake-kube-ca"))
        .issuer_name(name("fake-kube-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(subject: x509.Name, usage, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf(
        name("fake-kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_cert, client_key = leaf(name(f"system:node:{node}", "system:nodes"), ExtendedKeyUsageOID.CLIENT_AUTH)
    pem = serialization.Encoding.PEM
    paths = {
        "ca": directory / "ca.crt",
        "server_cert": directory / "apiserver.crt",
        "server_key": directory / "apiserver.key",
        "client_cert": directory / "client.crt",
        "client_key": directory / "client.key",
        "client_pem": directory / "kubelet-client-current.pem",
    }
    paths["ca"].write_bytes(ca_cert.public_bytes(pem))
    paths["server_cert"].write_bytes(server_cert.public_bytes(pem))
    paths["server_key"].write_bytes(pem_key(server_key))
    paths["client_cert"].write_bytes(client_cert.public_bytes(pem))
    paths["client_key"].write_bytes(pem_key(client_key))
    paths["client_pem"].write_bytes(client_cert.public_bytes(pem) + pem_key(client_key))
    for key in ("server_key", "client_key", "client_pem"):
        paths[key].chmod(0o600)
    return paths


def write_kubeconfig(
    path: Path,
    server: str,
    token: str | None = None,
    context: str = "fake",
    user: dict | None = None,
    cluster: dict | None = None,
) -> Path:
    """A kubeconfig (YAML, block style like kubeadm writes) pointing at ``server``."""
    user_fields = dict(user or ({"token": token} if token else {}))
    cluster_fields = dict({"server": server}, **(cluster or {}))

    def block(fields: dict, indent: str) -> str:
        return "".join(f"{indent}{k}: {v}\n" for k, v in fields.items()) or f"{indent}{{}}\n"

    text = (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- cluster:\n" + block(cluster_fields, "    ") + f"  name: {context}-cluster\n"
        "contexts:\n"
        "- context:\n"
        f"    cluster: {context}-cluster\n"
        f"    user: {context}-user\n"
        f"  name: {context}\n"
        f"current-context: {context}\n"
        "preferences: {}\n"
        "users:\n"
        f"- name: {context}-user\n"
        "  user:\n" + (block(user_fields, "    ") if user_fields else "    {}\n")
    )
    path.write_text(text)
    path.chmod(0o600)
    return path
