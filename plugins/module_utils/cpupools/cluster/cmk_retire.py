"""Retire CMK's cluster pieces from nodes that cpupools has adopted.

Standard library only; talks to the API through ``k8s_apply.Api`` (any
transport). What CMK put into a cluster (cluster-init, its manifests, its
webhook: CMK's intel/clusterinit.py, intel/nodereport.py, intel/uninstall.py,
intel/webhook.py) is looked up by name, and
removed in an order that keeps running workloads running:

1. CMK's agents of the node: its init/install/discover and reconfigure pods
   and its ``cmk-reconcile-nodereport-ds-<node>`` DaemonSet (they run
   ``cmk isolate --pool=infra cmk -- reconcile``; once gone, only cpupools
   reconciles the node);
2. the node's data: ``cmk-config-<node>`` (v1.5 state), ``cmk-reconfigure-<node>``,
   its NodeReport and ReconcileReport objects. ``cmk-config-<node>`` is kept
   while it names a task the node did not find dead: a running v1.5 workload
   (the agent stage carried it into the node's pool state), or one the node
   was not asked about in this run;

and, only when no node outside the run still runs CMK:

3. the fleet-wide agents: ``cmk-node-report-ds-all``, ``cmk-reconcile-ds-all``
   and the cluster-init pods;
4. the webhook: its MutatingWebhookConfiguration first (the API server stops
   calling it), then its Deployment, Service, Secret and ConfigMap; kept
   while running pods carry its mutation (their controllers would recreate
   them without CMK's mounts and environment);
5. the old report CRDs (``cmk-nodereports.intel.com``, ``cmk-reconcilereports.intel.com``);
6. CMK's ClusterRoleBindings (found by what they bind: a ``cmk-`` binding of
   one of CMK's ClusterRoles, or of CMK's service account and nobody else),
   then its ClusterRoles;
7. the ``cmk-serviceaccount`` ServiceAccount, kept while a running pod uses it
   (the webhook put it into every CMK pod; a pod whose service account is
   gone cannot be recreated).

Nothing of cpupools' own (label, taint, extended resources, which CMK
named the same) is touched. In check mode only reads are sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from .k8s_apply import Api

SERVICE_ACCOUNT = "cmk-serviceaccount"
#: The annotation CMK's webhook put on every pod it mutated.
MUTATED_ANNOTATION = "cmk.intel.com/resources-injected"
REPORT_NAMESPACE = "default"  # CMK wrote its report objects there, whatever --namespace said
NODE_DAEMONSET_PREFIX = "cmk-reconcile-nodereport-ds-"
CONFIG_PREFIX = "cmk-config-"
DELETE_OPTIONS = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
#: What a refusal (403) of the retirement's requests, and of the agent stage's read of a CMK v1.5
#: ConfigMap, says the credentials need: the k8s stage's list would not help.
RBAC_HINT = (
    'the credentials need the ClusterRole of docs/cmk-comparison.md, "The retirement\'s credentials" '
    "(bound with a ClusterRoleBinding)"
)

#: CMK's ClusterRoles: those of its v1.5.2 resources/authorization/cmk-rbac-rules.yaml (7) and of its Helm chart.
CLUSTER_ROLES = (
    "cmk-custom-resource-definition-controller",
    "cmk-daemonset-controller",
    "cmk-exec",
    "cmk-node-lister",
    "cmk-third-party-resource-controller",
    "cmk-version-controller",
    "cmk-webhook-installer",
)
#: Every ClusterRoleBinding of CMK's manifests is named so (its v1.5.2 rules file has 8).
BINDING_PREFIX = "cmk-"
REPORT_CRDS = ("cmk-nodereports.intel.com", "cmk-reconcilereports.intel.com")
CLUSTER_PODS = ("cmk-cluster-init-pod", "cmk-discover-pod", "cmk-init-pod", "cmk-install-pod")
RBAC = "rbac.authorization.k8s.io/v1"
ADMISSION = "admissionregistration.k8s.io/v1"
CRDS = "apiextensions.k8s.io/v1"


@dataclass(frozen=True)
class Piece:
    """One object CMK may have left, and the step of the removal order it belongs to."""

    step: int
    kind: str
    api: str  # "v1" or "group/version"
    plural: str
    name: str
    namespace: str = ""
    node: str = ""  # the node whose piece it is (steps 1-2)

    @property
    def path(self) -> str:
        base = "/api/v1" if self.api == "v1" else f"/apis/{self.api}"
        where = f"/namespaces/{quote(self.namespace, safe='')}" if self.namespace else ""
        return f"{base}{where}/{self.plural}/{quote(self.name, safe='')}"

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


def report_name(node: str) -> str:
    """CMK's name of a node's report objects: lowercased, anything but ``[-a-z0-9]`` turned into ``-``."""
    return re.sub(r"[^-a-z0-9]", "-", node.lower())


def node_pieces(node: str, namespaces: list[str]) -> list[Piece]:
    """What CMK kept for one node: its agents (step 1) and its data (step 2)."""
    out = []
    for ns in namespaces:
        out += [
            Piece(1, "Pod", "v1", "pods", f"cmk-init-install-discover-pod-{node}", ns),
            Piece(1, "Pod", "v1", "pods", f"cmk-reconfigure-pod-{node}", ns),
            Piece(1, "DaemonSet", "apps/v1", "daemonsets", f"{NODE_DAEMONSET_PREFIX}{node}", ns),
            Piece(2, "ConfigMap", "v1", "configmaps", f"{CONFIG_PREFIX}{node}", ns, node),
            Piece(2, "ConfigMap", "v1", "configmaps", f"cmk-reconfigure-{node}", ns),
        ]
    for plural, kind in (("cmk-nodereports", "Cmk-nodereport"), ("cmk-reconcilereports", "Cmk-reconcilereport")):
        out.append(Piece(2, kind, "intel.com/v1", plural, report_name(node), REPORT_NAMESPACE))
    return out


def cluster_pieces(namespaces: list[str], bindings: list[str]) -> list[Piece]:
    """What CMK kept for the whole cluster (steps 3-7); ``bindings``: CMK's ClusterRoleBindings (``cmk_bindings``)."""
    out = []
    for ns in namespaces:
        out += [
            Piece(3, "DaemonSet", "apps/v1", "daemonsets", n, ns)
            for n in ("cmk-node-report-ds-all", "cmk-reconcile-ds-all")
        ]
        out += [Piece(3, "Pod", "v1", "pods", n, ns) for n in CLUSTER_PODS]
    out.append(
        Piece(4, "MutatingWebhookConfiguration", ADMISSION, "mutatingwebhookconfigurations", "cmk-webhook-config")
    )
    for ns in namespaces:
        out += [
            Piece(4, "Deployment", "apps/v1", "deployments", "cmk-webhook-deployment", ns),
            Piece(4, "Service", "v1", "services", "cmk-webhook-service", ns),
            Piece(4, "Secret", "v1", "secrets", "cmk-webhook-certs", ns),
            Piece(4, "ConfigMap", "v1", "configmaps", "cmk-webhook-configmap", ns),
        ]
    out += [Piece(5, "CustomResourceDefinition", CRDS, "customresourcedefinitions", n) for n in REPORT_CRDS]
    out += [Piece(6, "ClusterRoleBinding", RBAC, "clusterrolebindings", n) for n in bindings]
    out += [Piece(6, "ClusterRole", RBAC, "clusterroles", n) for n in CLUSTER_ROLES]
    out += [Piece(7, "ServiceAccount", "v1", "serviceaccounts", SERVICE_ACCOUNT, ns) for ns in namespaces]
    return out


def cmk_bindings(api: Api, namespaces: list[str]) -> list[str]:
    """The names of CMK's ClusterRoleBindings, found by what they bind, not by a list of names.

    CMK's manifests name every binding ``cmk-...``; one is CMK's when it binds
    one of CMK's ClusterRoles, or binds a role (``system:node``, for one) to
    CMK's service account in one of ``namespaces`` and to nobody else.
    """
    path = f"/apis/{RBAC}/clusterrolebindings"
    code, data = api.raw("GET", path)
    if code == 404:
        return []
    if code != 200:
        api.call("GET", path)  # raises the one clear message for that status
    out = []
    for item in data.get("items") or []:
        name = str((item.get("metadata") or {}).get("name", ""))
        role = item.get("roleRef") or {}
        subjects = item.get("subjects") or []
        ours = role.get("kind") == "ClusterRole" and role.get("name") in CLUSTER_ROLES
        only_cmk = bool(subjects) and all(
            s.get("kind") == "ServiceAccount" and s.get("name") == SERVICE_ACCOUNT and s.get("namespace") in namespaces
            for s in subjects
        )
        if name.startswith(BINDING_PREFIX) and (ours or only_cmk):
            out.append(name)
    return sorted(out)


def exists(api: Api, piece: Piece) -> bool:
    """Whether the object is there and not already going.

    A missing namespace, API or CRD counts as not there; so does an object
    being deleted (``deletionTimestamp``): a pod bound to a node stays so
    until its kubelet has stopped it, up to its grace period, and deleting it
    again would change nothing.
    """
    code, body = api.raw("GET", piece.path)
    if code == 404:
        return False
    if code != 200:
        api.call("GET", piece.path)  # raises the one clear message for that status
    return not ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("deletionTimestamp")


def other_cmk_nodes(api: Api, nodes: list[str], namespaces: list[str]) -> list[str]:
    """Nodes outside ``nodes`` that CMK still runs on (their DaemonSet or v1.5 ConfigMap is there)."""
    others = set()
    for ns in namespaces:
        for api_path, prefix in (
            (f"/apis/apps/v1/namespaces/{quote(ns, safe='')}/daemonsets", NODE_DAEMONSET_PREFIX),
            (f"/api/v1/namespaces/{quote(ns, safe='')}/configmaps", CONFIG_PREFIX),
        ):
            code, data = api.raw("GET", api_path)
            if code == 404:
                continue
            if code != 200:
                api.call("GET", api_path)
            for item in data.get("items") or []:
                name = str(item.get("metadata", {}).get("name", ""))
                if name.startswith(prefix) and name[len(prefix) :] not in nodes:
                    others.add(name[len(prefix) :])
    return sorted(others)


def _pods(api: Api) -> list[dict]:
    return list(api.call("GET", "/api/v1/pods").get("items") or [])


def _workload_pods(pods: list[dict]) -> list[dict]:
    """Running pods that are not CMK's own agents (those go with their DaemonSets and Deployment)."""
    return [
        p
        for p in pods
        if not str(p.get("metadata", {}).get("name", "")).startswith("cmk-")
        and "deletionTimestamp" not in p.get("metadata", {})
    ]


def _pod_names(pods: list[dict]) -> str:
    names = sorted(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods)
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


def keep_reason(piece: Piece, pods: list[dict]) -> str:
    """Why a present piece must stay for now ("" = it can go)."""
    if piece.kind == "ServiceAccount":
        users = [
            p
            for p in pods
            if p["metadata"].get("namespace") == piece.namespace
            and (p.get("spec") or {}).get("serviceAccountName") == piece.name
        ]
        if users:
            return (
                f"{len(users)} running pod(s) use it ({_pod_names(users)}); "
                "a pod whose service account is gone cannot be recreated"
            )
    if piece.kind == "MutatingWebhookConfiguration":
        mutated = [
            p
            for p in pods
            if str((p["metadata"].get("annotations") or {}).get(MUTATED_ANNOTATION, "")).lower() in ("true", "1")
        ]
        if mutated:
            return (
                f"{len(mutated)} running pod(s) were mutated by CMK's webhook ({_pod_names(mutated)}); their "
                "controllers would recreate them without CMK's mounts and environment: give their pod specs "
                "the mounts and CMK_PROC_FS themselves (docs/cmk-comparison.md), then run again"
            )
    return ""


def v15_reason(api: Api, piece: Piece, checked: dict, load: Callable[[str], object] | None) -> str:
    """Why CMK v1.5's ConfigMap of a node stays ("" = it can go): it names a task not found dead on the node.

    ``checked`` maps a node to what its pool state module found of the PIDs
    the ConfigMap named (``live``, ``dead``: ``state_writer.carry_v15``); a PID
    it did not check (taken after it read the ConfigMap, or a node the run did
    not check) counts as alive. ``load`` parses the YAML of ``data.config``.
    """
    from ..node.cmk15 import named_pids, parse_config

    code, data = api.raw("GET", piece.path)
    if code != 200:
        return ""
    text = (data.get("data") or {}).get("config")
    if not isinstance(text, str) or load is None:
        return "its data.config cannot be read here: remove it by hand once no CMK v1.5 workload runs on the node"
    try:
        named = named_pids(parse_config(load(text), f"ConfigMap {piece.namespace}/{piece.name}"))
    except Exception:  # not CMK v1.5's format: nothing of it was carried either
        return "its data.config is not CMK v1.5's format: remove it by hand once no CMK v1.5 workload runs on the node"
    seen = checked.get(piece.node) or {}
    dead, live = set(seen.get("dead") or ()), set(seen.get("live") or ())
    running = [pid for pid in named if pid in live]
    unchecked = [pid for pid in named if pid not in live and pid not in dead]
    reasons = []
    if running:
        reasons.append(
            f"it names running CMK v1.5 task(s) PID {', '.join(map(str, running))}, carried into the node's "
            "pool state; it goes once they have ended"
        )
    if unchecked:
        reasons.append(
            f"it names PID(s) {', '.join(map(str, unchecked))} that the node did not check in this run "
            "(taken after its pool state was written, or the node's agent stage did not run): run "
            "playbooks/migrate-cmk.yml again to carry them"
        )
    return "; ".join(reasons)


def retire(
    api: Api,
    nodes: list[str],
    namespaces: list[str],
    check_mode: bool,
    checked: dict | None = None,
    load: Callable[[str], object] | None = None,
) -> dict:
    """Find CMK's pieces for ``nodes`` (and the cluster's when no other CMK node is left) and remove them in order.

    ``checked`` and ``load``: see ``v15_reason`` (CMK v1.5's ConfigMap stays
    while it names a task not found dead). Returns ``found``, ``removed`` (in
    check mode: what would be), ``kept`` (``{"object", "reason"}``),
    ``other_cmk_nodes`` and ``changed``.
    """
    checked = checked or {}
    others = other_cmk_nodes(api, nodes, namespaces)
    pieces = [p for node in nodes for p in node_pieces(node, namespaces)]
    if not others:
        pieces += cluster_pieces(namespaces, cmk_bindings(api, namespaces))
    found = [p for p in pieces if exists(api, p)]
    pods = _workload_pods(_pods(api)) if any(p.step >= 4 for p in found) else []
    removed: list[str] = []
    kept: list[dict] = []
    blocked_webhook = False
    for piece in sorted(found, key=lambda p: p.step):  # stable: the listed order within a step
        reason = keep_reason(piece, pods)
        if not reason and piece.node and piece.kind == "ConfigMap" and piece.name.startswith(CONFIG_PREFIX):
            reason = v15_reason(api, piece, checked, load)
        if piece.step == 4 and blocked_webhook and not reason:
            reason = "the webhook configuration that calls it is kept"
        if reason:
            blocked_webhook = blocked_webhook or piece.kind == "MutatingWebhookConfiguration"
            kept.append({"object": piece.describe(), "reason": reason})
            continue
        if not check_mode:
            code, _ = api.raw("DELETE", piece.path, body=DELETE_OPTIONS)
            if code == 404:
                continue  # someone else removed it meanwhile
            if code not in (200, 202):
                api.call("DELETE", piece.path, body=DELETE_OPTIONS)
        removed.append(piece.describe())
    if others:
        kept.append(
            {
                "object": "CMK's cluster-wide pieces (webhook, report CRDs, RBAC, service account, -all DaemonSets)",
                "reason": f"CMK still runs on node(s) outside this run: {', '.join(others)}",
            }
        )
    return {
        "changed": bool(removed),
        "found": [p.describe() for p in found],
        "removed": removed,
        "kept": kept,
        "other_cmk_nodes": others,
    }
