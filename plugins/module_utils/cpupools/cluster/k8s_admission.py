"""Pod injection without a server: a MutatingAdmissionPolicy for CMK-style workloads.

CMK's webhook (a Deployment with its own TLS certificates) gave every pod
that asked for an exclusive core what ``cmk isolate`` needs inside the
container. Kubernetes 1.36 applies such mutations itself, from CEL
expressions in a ``MutatingAdmissionPolicy`` (``admissionregistration.k8s.io``
v1; v1beta1 behind the ``MutatingAdmissionPolicy`` feature gate in 1.34 and
1.35). This module builds that policy and its binding, finds out which API
version the server serves, and creates, updates or deletes the two objects,
writing only when they differ.

What a matching pod gets (the pod spec of the README, which stays the way to
go on older clusters):

- the toleration ``{key: cmk, operator: Exists}`` unless a toleration already
  lets it onto a ``cmk=true:NoSchedule`` node;
- hostPath volumes ``cmk-bin`` (``/opt/bin``), ``cmk-conf`` (``/etc/cmk``) and
  ``host-proc`` (``/proc``), each unless a volume of that name exists;
- in every container: mounts at ``/opt/bin`` (read-only), ``/etc/cmk`` and
  ``/host/proc`` (read-only), each unless something is mounted there or the
  volume is mounted already; ``CMK_PROC_FS=/host/proc``; and, in a container
  that requests (else limits) one of our extended resources,
  ``CMK_NUM_CORES`` = that amount; an environment variable the pod sets
  itself is never overridden.

Every mutation adds only what is missing, so a second invocation (the policy
is reinvoked when a later plugin changes the pod) changes nothing.

Standard library only, like the rest of the package; the callers do the I/O
through a ``k8s_apply.Api``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from urllib.parse import quote

from ..core.errors import K8sError
from .k8s import (
    DEFAULT_ENI_RESOURCE,
    DEFAULT_EXCLUSIVE_RESOURCE,
    MANAGED_BY,
    TAINT_KEY,
    TAINT_VALUE,
    check_extended_resource,
    check_qualified_name,
    is_subset,
)
from .k8s_apply import FIELD_MANAGER, Api, ApiStatus

GROUP = "admissionregistration.k8s.io"
#: The versions that serve MutatingAdmissionPolicy with the schema we send, best first.
VERSIONS = ("v1", "v1beta1")
POLICY_PLURAL = "mutatingadmissionpolicies"
BINDING_PLURAL = "mutatingadmissionpolicybindings"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
#: One name for the policy and its binding (cluster-scoped, one per cluster).
NAME = "cpupools-cmk-inject"
DEFAULT_OPT_IN = "cmk.intel.com/mutate"
FAILURE_POLICIES = ("Fail", "Ignore")
#: CMK's webhook accepted these values of its opt-in annotation.
OPT_IN_VALUES = ("true", "True", "1")
STRICT = {"fieldValidation": "Strict", **FIELD_MANAGER}

PROC_FS = "/host/proc"
#: (volume name, host path, mount path in the container, read-only): the README's pod spec.
VOLUMES = (
    ("cmk-bin", "/opt/bin", "/opt/bin", True),
    ("cmk-conf", "/etc/cmk", "/etc/cmk", False),
    ("host-proc", "/proc", PROC_FS, True),
)
TOLERATION = {"key": TAINT_KEY, "operator": "Exists"}
#: What the server says when it serves no policy, and what to do instead.
FALLBACK = (
    "pods get nothing injected: give CMK workloads the toleration, mounts and CMK_PROC_FS themselves "
    "(the pod spec in README.md, docs/runtimes.md)"
)


def _cel(text: str) -> str:
    """A single-quoted CEL string literal (every literal of the policy is quoted so)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_cel(i) for i in items) + "]"


def check_options(exclusive_resource: object, eni_resource: object, opt_in: object, failure_policy: object) -> None:
    """Refuse options the server would refuse (or that would make CEL of a typo)."""
    check_extended_resource(exclusive_resource, "k8s_exclusive_resource")
    check_extended_resource(eni_resource, "k8s_eni_resource")
    check_qualified_name(opt_in, "opt-in label", "k8s_admission_opt_in", need_prefix=True)
    if failure_policy not in FAILURE_POLICIES:
        raise K8sError(
            f"{failure_policy!r} is not a failure policy; use one of {', '.join(FAILURE_POLICIES)}",
            "k8s_admission_failure_policy",
        )


RBAC = (
    f"the credentials need: {POLICY_PLURAL} and {BINDING_PLURAL} ({GROUP}) get/create/update/delete, "
    "nodes list; see docs/kubernetes.md"
)


def failure(code: int, body: object, method: str, path: str, api: Api) -> ApiStatus:
    """One sentence for an error status of the cluster-wide requests, naming the server."""
    detail = body.get("message") if isinstance(body, Mapping) else ""
    where = f"API server {api.server}"
    if code == 401:
        text = f"{where}: the credentials were rejected (401 Unauthorized); check the kubeconfig's user"
    elif code == 403:
        text = f"{where}: {method} {path} is forbidden (403): {detail or 'no reason given'}; {RBAC}"
    else:
        text = f"{where}: {method} {path} failed with {code}" + (f": {detail}" if detail else "")
    return ApiStatus(text, code)


# The CEL -------------------------------------------------------------------


def match_expression(resources: tuple[str, ...], opt_in: str) -> str:
    """True for a pod with a container requesting or limiting one of ``resources``, or opted in."""
    asks = (
        "object.spec.containers.exists(c, has(c.resources) && ("
        f"(has(c.resources.requests) && c.resources.requests.exists(k, k in {_cel_list(list(resources))})) || "
        f"(has(c.resources.limits) && c.resources.limits.exists(k, k in {_cel_list(list(resources))}))))"
    )
    flag = _cel(opt_in)
    values = _cel_list(OPT_IN_VALUES)
    labelled = (
        f"(has(object.metadata.labels) && {flag} in object.metadata.labels "
        f"&& object.metadata.labels[{flag}] in {values})"
    )
    annotated = (
        f"(has(object.metadata.annotations) && {flag} in object.metadata.annotations "
        f"&& object.metadata.annotations[{flag}] in {values})"
    )
    return f"{asks} || {labelled} || {annotated}"


def toleration_expression() -> str:
    """JSON patches adding the ``cmk`` toleration unless one already tolerates the taint.

    Tolerations are an atomic list, which an apply configuration may not
    touch; a JSON patch appends to it instead.
    """
    key, value = _cel(TAINT_KEY), _cel(TAINT_VALUE)
    tolerates = (
        "((!has(t.key) || t.key == '') ? (has(t.operator) && t.operator == 'Exists') : "
        f"(t.key == {key} && ((has(t.operator) && t.operator == 'Exists') || (has(t.value) && t.value == {value}))))"
        " && (!has(t.effect) || t.effect in ['', 'NoSchedule'])"
    )
    item = f"Object.spec.tolerations{{key: {key}, operator: 'Exists'}}"
    return (
        f"!has(object.spec.tolerations) ? [JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{item}]}}] : "
        f"object.spec.tolerations.exists(t, {tolerates}) ? [] : "
        f"[JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {item}}}]"
    )


def _num_cores(resources: tuple[str, ...], container_type: str = "Object.spec.containers") -> str:
    """The ``CMK_NUM_CORES`` entries of container ``c``: its request, else its limit, of the first resource found."""
    cases = []
    for name in resources:
        lit = _cel(name)
        for kind in ("requests", "limits"):
            cases.append(
                (
                    f"(has(c.resources) && has(c.resources.{kind}) && {lit} in c.resources.{kind})",
                    f"[{container_type}.env{{name: 'CMK_NUM_CORES', value: string(c.resources.{kind}[{lit}])}}]",
                )
            )
    text = "[]"
    for cond, value in reversed(cases):
        text = f"{cond} ? {value} : {text}"
    return f"({text})"


#: The policy's variables naming, per host path of ``VOLUMES``, the volume that mounts it.
VOLUME_VARIABLES = ("binVolume", "confVolume", "procVolume")


def volume_variables() -> list[dict]:
    """The name of the pod's volume for each host path: its own hostPath volume of that path, else ours.

    A pod written for CMK's webhook-less spec calls them ``cmk-install-dir``,
    ``cmk-conf-dir`` and ``cmk-host-proc``: what a volume mounts decides,
    not its name.
    """
    out = []
    for variable, (name, host, _, _) in zip(VOLUME_VARIABLES, VOLUMES, strict=True):
        paths = _cel_list([host, host + "/"])
        same = f"has(v.hostPath) && v.hostPath.path in {paths}"
        out.append(
            {
                "name": variable,
                "expression": (
                    f"has(object.spec.volumes) && object.spec.volumes.exists(v, {same}) ? "
                    f"object.spec.volumes.filter(v, {same})[0].name : {_cel(name)}"
                ),
            }
        )
    return out


def _containers_expression(field: str, resources: tuple[str, ...]) -> str:
    """The apply configuration of ``spec.<field>`` (containers or initContainers): each one's missing env and mounts."""
    kind = f"Object.spec.{field}"
    mounts = ", ".join(
        f"{kind}.volumeMounts{{name: variables.{variable}, mountPath: {_cel(m)}" + (", readOnly: true}" if ro else "}")
        for variable, (_, _, m, ro) in zip(VOLUME_VARIABLES, VOLUMES, strict=True)
    )
    env = f"[{kind}.env{{name: 'CMK_PROC_FS', value: {_cel(PROC_FS)}}}] + {_num_cores(resources, kind)}"
    each = (
        f"{kind}{{name: c.name, "
        f"env: ({env}).filter(e, !has(c.env) || !c.env.exists(x, x.name == e.name)), "
        f"volumeMounts: [{mounts}].filter(m, !has(c.volumeMounts) || "
        "!c.volumeMounts.exists(x, x.mountPath == m.mountPath || x.name == m.name))}"
    )
    return f"(has(object.spec.{field}) ? object.spec.{field}.map(c, {each}) : [])"


def apply_expression(resources: tuple[str, ...]) -> str:
    """The apply configuration: missing volumes, and in every container and init container the missing env and mounts.

    Volumes, containers, init containers, env and volumeMounts are map lists
    (keyed by name, name, name, name and mountPath), which server-side apply
    merges entry by entry; each list holds only entries that are missing, so
    nothing a pod sets is overwritten and a reinvocation adds nothing. A host
    path the pod already mounts under another volume name is mounted under
    that name (``volume_variables``); init containers get what containers get,
    as CMK's webhook gave them.
    """
    volumes = ", ".join(
        f"Object.spec.volumes{{name: variables.{variable}, hostPath: Object.spec.volumes.hostPath{{path: {_cel(h)}}}}}"
        for variable, (_, h, _, _) in zip(VOLUME_VARIABLES, VOLUMES, strict=True)
    )
    return (
        "Object{spec: Object.spec{"
        f"volumes: [{volumes}].filter(v, !has(object.spec.volumes) || "
        "!object.spec.volumes.exists(x, x.name == v.name)), "
        f"initContainers: {_containers_expression('initContainers', resources)}, "
        f"containers: {_containers_expression('containers', resources)}"
        "}}"
    )


# The objects ---------------------------------------------------------------


def desired_policy(
    version: str,
    exclusive_resource: str = DEFAULT_EXCLUSIVE_RESOURCE,
    eni_resource: str = DEFAULT_ENI_RESOURCE,
    opt_in: str = DEFAULT_OPT_IN,
    failure_policy: str = "Fail",
) -> dict:
    """The MutatingAdmissionPolicy (``version``: the served API version)."""
    resources = tuple(dict.fromkeys((exclusive_resource, eni_resource)))
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": POLICY_KIND,
        "metadata": {"name": NAME, "labels": dict(MANAGED_BY)},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ]
            },
            "matchConditions": [{"name": "cmk-workload", "expression": match_expression(resources, opt_in)}],
            "failurePolicy": failure_policy,
            "reinvocationPolicy": "IfNeeded",
            "variables": volume_variables(),
            "mutations": [
                {"patchType": "JSONPatch", "jsonPatch": {"expression": toleration_expression()}},
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": apply_expression(resources)}},
            ],
        },
    }


def desired_binding(version: str) -> dict:
    """The binding: no parameters, no further restriction than the policy's own."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": BINDING_KIND,
        "metadata": {"name": NAME, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": NAME},
    }


# Discovery -----------------------------------------------------------------


def server_version(api: Api) -> str:
    """The server's ``gitVersion`` (``unknown`` when /version does not say)."""
    code, body = api.raw("GET", "/version")
    if code == 200 and isinstance(body, Mapping) and body.get("gitVersion"):
        return str(body["gitVersion"])
    if code in (401, 403):
        raise failure(code, body, "GET", "/version", api)
    return "unknown"


def served_version(api: Api) -> str | None:
    """The best version of ``VERSIONS`` that serves both policies and bindings, or ``None``."""
    code, group = api.raw("GET", f"/apis/{GROUP}")
    if code == 404:
        return None
    if code != 200:
        raise failure(code, group, "GET", f"/apis/{GROUP}", api)
    offered = {v.get("version") for v in (group or {}).get("versions") or [] if isinstance(v, Mapping)}
    for version in VERSIONS:
        if version not in offered:
            continue
        code, listing = api.raw("GET", f"/apis/{GROUP}/{version}")
        if code == 404:
            continue
        if code != 200:
            raise failure(code, listing, "GET", f"/apis/{GROUP}/{version}", api)
        names = {r.get("name") for r in (listing or {}).get("resources") or [] if isinstance(r, Mapping)}
        if {POLICY_PLURAL, BINDING_PLURAL} <= names:
            return version
    return None


def unsupported_warning(server: str, version: str) -> str:
    return (
        f"API server {server} ({version}) serves no MutatingAdmissionPolicy ({GROUP}/v1 is GA from Kubernetes "
        "1.36; v1beta1 needs 1.34 or 1.35 with the MutatingAdmissionPolicy feature gate and "
        f"--runtime-config={GROUP}/v1beta1=true): {FALLBACK}"
    )


# Apply ---------------------------------------------------------------------


def _path(version: str, plural: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{version}/{plural}"
    return f"{base}/{quote(name, safe='')}" if name else base


def _same(want: Mapping, have: Mapping) -> bool:
    """Our spec and labels are there (server defaults such as ``matchPolicy`` do not count)."""
    return is_subset(want["spec"], have.get("spec")) and is_subset(want["metadata"], have.get("metadata"))


def ensure_object(api: Api, version: str, plural: str, want: dict, check_mode: bool) -> tuple[str, dict | None]:
    """Create or replace one object. Returns (``created``/``updated``/``unchanged``, what was there before).

    A replace keeps the labels and annotations others put on the object and is
    guarded by the resourceVersion read; a conflict is read again and retried.
    Requests ask for strict field validation, so a field the server does not
    know is an error instead of being dropped silently.
    """
    name = want["metadata"]["name"]
    path = _path(version, plural, name)
    for _ in range(api.attempts):
        code, current = api.raw("GET", path)
        if code == 404:
            if check_mode:
                return "created", None
            code, body = api.raw("POST", _path(version, plural), want, query=STRICT)
            if code in (200, 201):
                return "created", None
            if code != 409:
                raise failure(code, body, "POST", _path(version, plural), api)
            continue
        if code != 200:
            raise failure(code, current, "GET", path, api)
        if _same(want, current):
            return "unchanged", current
        if check_mode:
            return "updated", current
        meta = copy.deepcopy(current["metadata"])
        meta["labels"] = dict(meta.get("labels") or {}, **want["metadata"]["labels"])
        code, body = api.raw("PUT", path, dict(want, metadata=meta), query=STRICT)
        if code == 200:
            return "updated", current
        if code != 409:
            raise failure(code, body, "PUT", path, api)
    raise ApiStatus(
        f"API server {api.server}: the {plural} object {name!r} kept changing under us; "
        f"gave up after {api.attempts} conflicting writes",
        409,
    )


def remove_object(api: Api, version: str, plural: str, check_mode: bool) -> tuple[str, dict | None]:
    """Delete our object. Returns (``deleted``/``absent``, what was there before)."""
    path = _path(version, plural, NAME)
    code, current = api.raw("GET", path)
    if code == 404:
        return "absent", None
    if code != 200:
        raise failure(code, current, "GET", path, api)
    if not check_mode:
        code, body = api.raw("DELETE", path)
        if code not in (200, 202, 404):
            raise failure(code, body, "DELETE", path, api)
    return "deleted", current


def nodes_still_labelled(api: Api, label: str, departing: list[str]) -> list[str]:
    """Nodes that carry the cpupools node label and are not being uninstalled by this run."""
    query = {"labelSelector": f"{label}=true"}
    code, body = api.raw("GET", "/api/v1/nodes", query=query)
    if code != 200:
        raise failure(code, body, "GET", "/api/v1/nodes", api)
    names = sorted(str(n["metadata"]["name"]) for n in body.get("items") or [])
    gone = set(departing)
    return [n for n in names if n not in gone]


def _summary(obj: Mapping | None) -> dict | None:
    if obj is None:
        return None
    return {"apiVersion": obj.get("apiVersion"), "spec": obj.get("spec")}


def ensure_admission(
    api: Api,
    state: str,
    check_mode: bool,
    exclusive_resource: str = DEFAULT_EXCLUSIVE_RESOURCE,
    eni_resource: str = DEFAULT_ENI_RESOURCE,
    opt_in: str = DEFAULT_OPT_IN,
    failure_policy: str = "Fail",
    node_label: str = "cmk.intel.com/cmk-node",
    departing: list[str] | None = None,
) -> dict:
    """Publish (``present``) or remove (``absent``) the policy and its binding.

    ``absent`` keeps both while Nodes other than ``departing`` (the nodes this
    run uninstalls) still carry ``node_label``: uninstalling some nodes must
    not take the injection away from the workloads of the others. An empty
    ``node_label`` removes them regardless (the operator turned the policy off).
    """
    if state == "present":
        check_options(exclusive_resource, eni_resource, opt_in, failure_policy)
    version_text = server_version(api)
    version = served_version(api)
    result: dict = {
        "changed": False,
        "server_version": version_text,
        "api_version": f"{GROUP}/{version}" if version else None,
        "policy": "unsupported",
        "binding": "unsupported",
        "kept_for": [],
        "warnings": [],
        "diff": {"before": {}, "after": {}},
    }
    if version is None:
        if state == "present":
            result["warnings"].append(unsupported_warning(api.server, version_text))
        else:
            result["policy"] = result["binding"] = "absent"
        return result
    if state == "present":
        policy = desired_policy(version, exclusive_resource, eni_resource, opt_in, failure_policy)
        binding = desired_binding(version)
        result["policy"], before_policy = ensure_object(api, version, POLICY_PLURAL, policy, check_mode)
        result["binding"], before_binding = ensure_object(api, version, BINDING_PLURAL, binding, check_mode)
        after = {"policy": _summary(policy), "binding": _summary(binding)}
        # Unchanged objects differ from ours only by server defaults: show them as they are wanted.
        before_policy = policy if result["policy"] == "unchanged" else before_policy
        before_binding = binding if result["binding"] == "unchanged" else before_binding
    else:
        remaining = nodes_still_labelled(api, node_label, departing or []) if node_label else []
        if remaining:
            result["policy"] = result["binding"] = "kept"
            result["kept_for"] = remaining
            return result
        result["binding"], before_binding = remove_object(api, version, BINDING_PLURAL, check_mode)
        result["policy"], before_policy = remove_object(api, version, POLICY_PLURAL, check_mode)
        after = {"policy": None, "binding": None}
    result["changed"] = result["policy"] not in ("unchanged", "absent") or result["binding"] not in (
        "unchanged",
        "absent",
    )
    result["diff"] = {
        "before": {"policy": _summary(before_policy), "binding": _summary(before_binding)},
        "after": after,
    }
    return result
