"""A wire-level fake Kubernetes API server for tests (never part of the product).

It speaks HTTP(S) on 127.0.0.1 to the real ``kubernetes`` Python client (and to
the node agent's stdlib client) for exactly the API the cpupools modules use:

- ``GET /version``
- nodes: ``GET``/``PATCH /api/v1/nodes/{name}`` and ``GET``/``PATCH .../status``
  with ``application/json-patch+json`` (RFC 6902 with the apiserver's rules:
  ``add`` under a missing parent, ``remove``/``replace`` of a missing member and
  a failed ``test`` are 422), ``application/merge-patch+json`` (RFC 7386) and
  ``application/strategic-merge-patch+json`` (merge patch, plus ``spec.taints``
  merged by ``key`` and ``$patch: delete`` items, which is all we use);
  the main resource ignores ``status`` and the ``status`` subresource ignores
  ``spec``, like the real node strategies;
- ``customresourcedefinitions`` (apiextensions.k8s.io/v1) and cluster-scoped
  custom objects of any CRD it holds, with structural-schema pruning (unknown
  fields are dropped, as a real server does) and type checks;
- pods: list (``fieldSelector=spec.nodeName=...``), get, and the ``eviction``
  subresource (429 while a PodDisruptionBudget would be violated);
- built-in namespaced and cluster-scoped collections (``BUILTIN``: configmaps,
  secrets, services, serviceaccounts, daemonsets, deployments, RBAC cluster
  roles and bindings, mutating webhook configurations): list, get, create,
  delete; pods can be deleted too; custom objects of namespaced CRDs
  (``add_crd_raw`` stores a CRD as an old cluster kept it);
- ``resourceVersion``: one counter for the whole store, bumped on every write;
  a patch or update carrying a stale ``metadata.resourceVersion`` is a 409.

Every request is recorded (method, path, query, content type, parsed body) so a
test can assert that check mode wrote nothing. Knobs inject failures (``fail``),
run a hook before a request (``before``, e.g. a concurrent writer that makes the
client's resourceVersion stale), and require a bearer token or a client
certificate.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import ssl
import threading
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


# Lists merged by key under strategic merge patch (the fields we use).
STRATEGIC_KEYS = {("spec", "taints"): "key"}


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


# Structural schema pruning (apiextensions v1) --------------------------------


def prune(value: object, schema: dict, path: str = "") -> object:
    """Drop fields the schema does not declare and check types, like the apiserver."""
    kind = schema.get("type")
    if value is None:
        if schema.get("nullable"):
            return None
        raise ApiError(422, f'{path or "<root>"}: Invalid value: "null": must not be null')
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind in types and not isinstance(value, types[kind]):
        raise ApiError(422, f"{path}: Invalid value: {value!r}: must be of type {kind}")
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ApiError(422, f"{path}: Invalid value: {value!r}: must be of type integer")
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ApiError(422, f"{path}: Invalid value: {value!r}: must be of type number")
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            if props is not None and key in props:
                out[key] = prune(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out[key] = prune(item, extra, f"{path}.{key}")
        for key in schema.get("required", []):
            if key not in out:
                raise ApiError(422, f"{path}.{key}: Required value")
        return out
    if isinstance(value, list) and "items" in schema:
        return [prune(item, schema["items"], f"{path}[{i}]") for i, item in enumerate(value)]
    return value


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([numkMGTPE]|[KMGTPE]i)?$")


def _canonical_resources(obj: dict, path: str) -> None:
    for section in ("capacity", "allocatable"):
        values = obj.get("status", {}).get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ApiError(400, f"{path}.status.{section}: must be an object")
        for name, qty in list(values.items()):
            if isinstance(qty, bool) or not isinstance(qty, (int, str)) or not QUANTITY.match(str(qty)):
                raise ApiError(422, f"status.{section}[{name}]: Invalid value: {qty!r}: must be a quantity")
            values[name] = str(qty)


def _validate_node(node: dict) -> None:
    labels = node.get("metadata", {}).get("labels") or {}
    for key, value in labels.items():
        if not isinstance(value, str):
            raise ApiError(400, f"json: cannot unmarshal {type(value).__name__} into Go value of label {key!r}")
    seen = set()
    for taint in node.get("spec", {}).get("taints") or []:
        if not taint.get("key"):
            raise ApiError(422, "spec.taints.key: Required value")
        if taint.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ApiError(422, f"spec.taints.effect: Unsupported value: {taint.get('effect')!r}")
        if (taint["key"], taint["effect"]) in seen:
            raise ApiError(422, f"spec.taints: Duplicate value: {taint['key']}:{taint['effect']}")
        seen.add((taint["key"], taint["effect"]))
    _canonical_resources(node, "node")


# The server ------------------------------------------------------------------


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


@dataclass
class FakeKube:
    """The store and the knobs; ``start()`` serves it, ``url`` says where."""

    token: str | None = None
    tls: tuple[str, str, str] | None = None  # (server cert, server key, client CA): client certs required
    nodes: dict = field(default_factory=dict)
    pods: dict = field(default_factory=dict)
    crds: dict = field(default_factory=dict)
    objects: dict = field(default_factory=dict)  # (group, plural, name) -> object
    # (api, plural, namespace or "", name) -> object, for BUILTIN collections and namespaced custom objects
    resources: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    evict_linger: int = 0  # pod reads an evicted pod stays visible (terminating) for
    version: str = "v1.30.2"

    def __post_init__(self) -> None:
        self._rv = 1000
        self._rules: list[_Rule] = []
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._pdb: dict = {}
        self._linger: dict = {}

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

    def block_eviction(self, namespace: str, name: str, times: int) -> None:
        """A PodDisruptionBudget refuses the next ``times`` evictions of this pod (429)."""
        self._pdb[(namespace, name)] = times

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
    ) -> dict:
        base = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        status: dict = {
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": str(uuid.uuid4()),
                "containerRuntimeVersion": "containerd://1.7.13",
                "kernelVersion": "6.1.0-18-amd64",
                "kubeProxyVersion": self.version,
                "kubeletVersion": self.version,
                "machineID": uuid.uuid4().hex,
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "systemUUID": str(uuid.uuid4()),
            }
        }
        if with_capacity:
            status["capacity"] = dict(base, **(capacity or {}))
            status["allocatable"] = dict(base, **(capacity or {}))
        node = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": self._meta(name, labels=dict({"kubernetes.io/hostname": name}, **(labels or {}))),
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": status,
        }
        if taints:
            node["spec"]["taints"] = copy.deepcopy(taints)
        _validate_node(node)
        self.nodes[name] = node
        return node

    def add_pod(self, namespace: str, name: str, node: str, owner: str | None = None, mirror: bool = False) -> dict:
        meta = self._meta(name, namespace=namespace)
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
            "status": {"phase": "Running"},
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
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
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
        with self._lock:
            self.requests.append(Recorded(method, path, query, ctype, copy.deepcopy(body), user))
            if self.token is not None and auth != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized")
            for rule in self._rules:
                if rule.times != 0 and rule.method == method and rule.pattern.search(path):
                    rule.times -= 1
                    if rule.action:
                        rule.action()
                    if rule.error:
                        raise rule.error
            for pattern, handler in ROUTES:
                match = pattern.fullmatch(path)
                if match:
                    return handler(self, method, query, ctype, body, *match.groups())
            raise ApiError(404, "the server could not find the requested resource")

    def _version(self, method, query, ctype, body):
        minor = self.version.split(".")[1]
        return 200, {"major": "1", "minor": minor, "gitVersion": self.version, "platform": "linux/amd64"}

    def _node(self, method, query, ctype, body, name, sub):
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, f'nodes "{name}" not found', details={"name": name, "kind": "nodes"})
        if method == "GET":
            return 200, copy.deepcopy(node)
        if method != "PATCH":
            raise ApiError(405, f"method {method} not allowed on nodes in this fake")
        patched = self._patch(node, ctype, body, "nodes", name)
        if sub == "/status":
            patched["spec"] = copy.deepcopy(node["spec"])
        else:
            patched["status"] = copy.deepcopy(node["status"])
        _validate_node(patched)
        self._bump(patched)
        self.nodes[name] = patched
        return 200, copy.deepcopy(patched)

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
        for key in ("uid", "creationTimestamp"):
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
        selector = query.get("fieldSelector", [""])[0]
        want = {}
        for term in filter(None, selector.split(",")):
            key, _, value = term.partition("=")
            if key not in ("spec.nodeName", "metadata.namespace"):
                raise ApiError(400, f"field label not supported: {key}")
            want[key] = value
        items = []
        for (ns, _name), pod in sorted(self.pods.items()):
            if namespace and ns != namespace:
                continue
            if "spec.nodeName" in want and pod["spec"].get("nodeName") != want["spec.nodeName"]:
                continue
            if "metadata.namespace" in want and ns != want["metadata.namespace"]:
                continue
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
        if self._pdb.get((namespace, name), 0) > 0:
            self._pdb[(namespace, name)] -= 1
            raise ApiError(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
                details={"causes": [{"reason": "DisruptionBudget", "message": "needs 1 healthy pods"}]},
            )
        if "deletionTimestamp" not in pod["metadata"]:
            pod["metadata"]["deletionTimestamp"] = _now()
            self._bump(pod)
            self._linger[(namespace, name)] = self.evict_linger
        return 201, status_body(201, "", "")

    def _crds(self, method, query, ctype, body, name):
        if name is None:
            if method == "GET":
                return 200, {
                    "kind": "CustomResourceDefinitionList",
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "metadata": {},
                    "items": [copy.deepcopy(c) for _, c in sorted(self.crds.items())],
                }
            if method != "POST":
                raise ApiError(405, "method not allowed")
            crd = self._check_crd(body)
            name = crd["metadata"]["name"]
            if name in self.crds:
                raise ApiError(
                    409,
                    f'customresourcedefinitions.apiextensions.k8s.io "{name}" already exists',
                    "AlreadyExists",
                    {"name": name, "kind": "customresourcedefinitions"},
                )
            crd["metadata"] = self._meta(name, **{k: v for k, v in crd["metadata"].items() if k != "name"})
            crd["metadata"]["generation"] = 1
            self._establish(crd)
            self.crds[name] = crd
            return 201, copy.deepcopy(crd)
        current = self.crds.get(name)
        if current is None:
            raise ApiError(
                404,
                f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found',
                details={"name": name, "kind": "customresourcedefinitions"},
            )
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del self.crds[name]
            group = current["spec"]["group"]
            plural = current["spec"]["names"]["plural"]
            for key in [k for k in self.objects if k[:2] == (group, plural)]:
                del self.objects[key]
            self._rv += 1
            return 200, status_body(200, "", "")
        if method != "PUT":
            raise ApiError(405, "method not allowed")
        crd = self._check_crd(body)
        self._precondition(current, crd, "customresourcedefinitions.apiextensions.k8s.io", name)
        crd["metadata"] = dict(
            current["metadata"], **{k: v for k, v in crd["metadata"].items() if k != "resourceVersion"}
        )
        crd["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self._establish(crd)
        self._bump(crd)
        self.crds[name] = crd
        return 200, copy.deepcopy(crd)

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
        if crd.get("metadata", {}).get("name") != f"{names.get('plural')}.{spec.get('group')}":
            raise ApiError(422, 'metadata.name: Invalid value: must be spec.names.plural+"."+spec.group')
        if spec.get("scope") not in ("Cluster", "Namespaced"):
            raise ApiError(422, "spec.scope: Unsupported value")
        versions = spec.get("versions") or []
        if sum(1 for v in versions if v.get("storage")) != 1:
            raise ApiError(422, "spec.versions: Invalid value: must have exactly one version marked as storage version")
        for version in versions:
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise ApiError(
                    422,
                    f"spec.versions[{version.get('name')}].schema.openAPIV3Schema: Required value: "
                    "schemas are required",
                )
        names.setdefault("listKind", f"{names.get('kind')}List")
        names.setdefault("singular", str(names.get("kind", "")).lower())
        spec.setdefault("conversion", {"strategy": "None"})
        return crd

    @staticmethod
    def _establish(crd: dict) -> None:
        crd["status"] = {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
            ],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        }

    def _custom(self, method, query, ctype, body, group, version, plural, name):
        crd = self.crds.get(f"{plural}.{group}")
        served = crd and any(v["name"] == version and v.get("served") for v in crd["spec"]["versions"])
        if not served or crd["spec"]["scope"] != "Cluster":
            raise ApiError(404, "the server could not find the requested resource")
        kind = crd["spec"]["names"]["kind"]
        schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
        resource = f"{plural}.{group}"
        if name is None:
            if method == "GET":
                items = [copy.deepcopy(o) for k, o in sorted(self.objects.items()) if k[:2] == (group, plural)]
                return 200, {"kind": f"{kind}List", "apiVersion": f"{group}/{version}", "metadata": {}, "items": items}
            if method != "POST":
                raise ApiError(405, "method not allowed")
            obj = self._check_object(body, group, version, kind, schema)
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
            obj = self._check_object(body, group, version, kind, schema)
            self._precondition(current, obj, resource, name)
        elif method == "PATCH":
            obj = self._check_object(
                self._patch(current, ctype, body, resource, name, strategic=False), group, version, kind, schema
            )
        else:
            raise ApiError(405, "method not allowed")
        if obj["metadata"].get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        keep = {k: current["metadata"][k] for k in ("uid", "creationTimestamp", "generation")}
        obj["metadata"].update(keep)
        if obj.get("spec") != current.get("spec"):
            obj["metadata"]["generation"] = keep["generation"] + 1
        self._bump(obj)
        self.objects[(group, plural, name)] = obj
        return 200, copy.deepcopy(obj)

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
            return 201, copy.deepcopy(self.add_resource(api, plural, name, ns, kind=kind, **fields))
        current = self.resources.get((api, plural, ns, name))
        if current is None:
            raise ApiError(404, f'{resource} "{name}" not found', details={"name": name, "kind": plural})
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del self.resources[(api, plural, ns, name)]
            self._rv += 1
            return 200, status_body(200, "", "", {"name": name, "kind": plural})
        raise ApiError(405, "only get and delete are served on single objects of this collection in this fake")

    def _builtin(self, method, query, ctype, body, api, namespace, plural, name):
        entry = BUILTIN.get((api, plural))
        if entry is None or entry[0] != (namespace is not None):
            raise ApiError(404, "the server could not find the requested resource")
        return self._collection(method, query, ctype, body, api, namespace, plural, name, entry[1])

    def _core(self, method, query, ctype, body, namespace, plural, name):
        return self._builtin(method, query, ctype, body, "v1", namespace, plural, name)

    def _cluster(self, method, query, ctype, body, group, version, plural, name):
        return self._group(method, query, ctype, body, group, version, None, plural, name)

    def _group(self, method, query, ctype, body, group, version, namespace, plural, name):
        api = f"{group}/{version}"
        if (api, plural) in BUILTIN:
            return self._builtin(method, query, ctype, body, api, namespace, plural, name)
        crd = self.crds.get(f"{plural}.{group}")
        served = crd and any(v["name"] == version and v.get("served") for v in crd["spec"]["versions"])
        if not served or namespace is None or crd["spec"]["scope"] != "Namespaced":
            raise ApiError(404, "the server could not find the requested resource")
        return self._collection(method, query, ctype, body, api, namespace, plural, name, crd["spec"]["names"]["kind"])

    @staticmethod
    def _check_object(body: object, group: str, version: str, kind: str, schema: dict) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        if body.get("apiVersion") != f"{group}/{version}" or body.get("kind") != kind:
            raise ApiError(
                400, f"the body must be a {group}/{version} {kind}, not {body.get('apiVersion')} {body.get('kind')}"
            )
        metadata = copy.deepcopy(body.get("metadata") or {})
        rest = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
        pruned = prune(
            rest,
            {
                **schema,
                "properties": {
                    k: v for k, v in schema.get("properties", {}).items() if k not in ("apiVersion", "kind", "metadata")
                },
            },
        )
        return {"apiVersion": body["apiVersion"], "kind": kind, "metadata": metadata, **pruned}


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

ROUTES: list[tuple[re.Pattern, Callable]] = [
    (re.compile(r"/version/?"), FakeKube._version),
    (re.compile(r"/api/v1/nodes/([^/]+)(/status)?"), FakeKube._node),
    (re.compile(r"/api/v1/pods"), FakeKube._pods),
    (re.compile(r"/api/v1/namespaces/([^/]+)/pods"), FakeKube._pods),
    (re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(?:/(eviction))?"), FakeKube._pod),
    (re.compile(r"/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions(?:/([^/]+))?"), FakeKube._crds),
    (re.compile(r"/api/v1/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?"), FakeKube._core),
    (re.compile(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?"), FakeKube._group),
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
        try:
            try:
                body = json.loads(raw) if raw else None
            except ValueError as exc:
                raise ApiError(400, f"invalid JSON body: {exc}") from None
            code, payload = self.kube.handle(
                self.command,
                unquote(parts.path),
                parse_qs(parts.query),
                ctype,
                body,
                self.headers.get("Authorization", ""),
                user,
            )
        except ApiError as exc:
            code, payload = exc.code, status_body(exc.code, exc.message, exc.reason, exc.details)
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
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
