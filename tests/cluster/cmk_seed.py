"""CMK in a real cluster, as cluster-init and its v1.5.2 manifests leave it (tests only).

Names and shapes from CMK's own files (intel/CPU-Manager-for-Kubernetes
intel/nodereport.py, intel/uninstall.py; resources/authorization/cmk-rbac-rules.yaml,
resources/webhook/*.yaml, intel/clusterinit.py): the per-node init pod,
reconcile/node-report DaemonSet and v1.5 ConfigMap; the ``-all``
DaemonSet and cluster-init pod; the webhook's configuration, Deployment,
Service, Secret and ConfigMap; the two report CRDs with one report per node;
the service account; and the RBAC of the v1.5.2 rules file: 7 ClusterRoles
and 8 ClusterRoleBindings of the service account. The objects carry only
what the API server requires; nothing runs.
"""

from __future__ import annotations

RBAC = "/apis/rbac.authorization.k8s.io/v1"
#: v1.5.2's rules file: ClusterRole -> its binding (cmk-role-binding-node binds the built-in system:node).
ROLES = {
    "cmk-third-party-resource-controller": "cmk-role-binding-tpr",
    "cmk-custom-resource-definition-controller": "cmk-role-binding-crd",
    "cmk-daemonset-controller": "cmk-role-binding-daemonset",
    "cmk-version-controller": "cmk-role-binding-version",
    "cmk-webhook-installer": "cmk-role-binding-webhook-installer",
    "cmk-node-lister": "cmk-role-binding-node-lister",
    # The name of this binding is this fixture's; the retirement finds bindings by what they bind.
    "cmk-exec": "cmk-role-binding-exec",
}
RULES = {
    "cmk-third-party-resource-controller": [{"apiGroups": ["cmk.intel.com"], "resources": ["*"], "verbs": ["*"]}],
    "cmk-custom-resource-definition-controller": [
        {"apiGroups": ["intel.com"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["*"]},
    ],
    "cmk-daemonset-controller": [{"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["*"]}],
    "cmk-version-controller": [{"nonResourceURLs": ["*"], "verbs": ["get"]}],
    "cmk-webhook-installer": [
        {
            "apiGroups": ["", "apps", "admissionregistration.k8s.io"],
            "resources": ["secrets", "configmaps", "deployments", "services", "mutatingwebhookconfigurations"],
            "verbs": ["*"],
        }
    ],
    "cmk-node-lister": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]}],
    "cmk-exec": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}],
}
REPORTS = (("Cmk-nodereport", "cmk-nodereports"), ("Cmk-reconcilereport", "cmk-reconcilereports"))
WEBHOOK = "cmk-webhook-config"
SERVICE_ACCOUNT = "cmk-serviceaccount"


def _pod_spec(node: str | None = None) -> dict:
    spec = {
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "containers": [{"name": "cmk", "image": "cmk:v1.5.2", "command": ["/cmk/cmk.py"]}],
    }
    if node:
        spec["nodeName"] = node
    return spec


def _workload(kind: str, name: str, namespace: str, **extra) -> dict:
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": dict(_pod_spec(), restartPolicy="Always")}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": labels}, "template": template, **extra},
    }


def report_crd(kind: str, plural: str) -> dict:
    """CMK's report CRD as a cluster upgraded past 1.22 keeps it: namespaced, no schema of its own."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.intel.com"},
        "spec": {
            "group": "intel.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def seed_node(real, node: str, namespace: str) -> None:
    """What cluster-init leaves for one node."""
    post = real.ok
    post("POST", f"/api/v1/namespaces/{namespace}/pods", _pod(f"cmk-init-install-discover-pod-{node}", namespace, node))
    post(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
        _workload("DaemonSet", f"cmk-reconcile-nodereport-ds-{node}", namespace),
    )
    post("POST", f"/api/v1/namespaces/{namespace}/configmaps", _configmap(f"cmk-config-{node}", {"config": "{}"}))
    for kind, plural in REPORTS:
        body = {"apiVersion": "intel.com/v1", "kind": kind, "metadata": {"name": node}, "spec": {"report": {}}}
        post("POST", f"/apis/intel.com/v1/namespaces/default/{plural}", body)


def _pod(name: str, namespace: str, node: str | None = None, **meta) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": _pod_spec(node),
    }


def _configmap(name: str, data: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def seed_cmk(real, nodes: list[str], namespace: str = "cmk-namespace") -> None:
    """CMK for ``nodes`` and the cluster, in ``namespace`` (its v1.5 manifests: cmk-namespace)."""
    real.namespace(namespace)
    real.ok(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}},
    )
    for kind, plural in REPORTS:
        real.ensure_crd(report_crd(kind, plural))
    for node in nodes:
        seed_node(real, node, namespace)
    real.ok(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
        _workload("DaemonSet", "cmk-reconcile-ds-all", namespace),
    )
    real.ok("POST", f"/api/v1/namespaces/{namespace}/pods", _pod("cmk-cluster-init-pod", namespace, nodes[0]))
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK},
        "webhooks": [
            {
                "name": "cmk.intel.com",
                "clientConfig": {"service": {"name": "cmk-webhook-service", "namespace": namespace, "path": "/mutate"}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                # Calls nothing in these tests: only pods labelled so would be sent to it.
                "objectSelector": {"matchLabels": {"cmk.intel.com/never": "true"}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }
    real.ok("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", webhook)
    real.ok(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        _workload("Deployment", "cmk-webhook-deployment", namespace),
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "cmk-webhook-service"},
        "spec": {"ports": [{"port": 443, "targetPort": 443}], "selector": {"app": "cmk-webhook-deployment"}},
    }
    real.ok("POST", f"/api/v1/namespaces/{namespace}/services", service)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cmk-webhook-certs"}, "data": {}}
    real.ok("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    real.ok(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        _configmap("cmk-webhook-configmap", {"webhook.yaml": "server: {}\n"}),
    )
    subject = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]
    for role, binding in ROLES.items():
        real.ok(
            "POST",
            f"{RBAC}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": RULES[role],
            },
        )
        _bind(real, binding, role, subject)
    _bind(real, "cmk-role-binding-node", "system:node", subject)


def _bind(real, name: str, role: str, subjects: list[dict]) -> None:
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    }
    real.ok("POST", f"{RBAC}/clusterrolebindings", body)


def workload(
    real, name: str, namespace: str, node: str, mutated: bool = False, service_account: str | None = None
) -> dict:
    """A running workload pod (no controller of cpupools' or CMK's)."""
    real.namespace(namespace)
    meta = {"annotations": {"cmk.intel.com/resources-injected": "true"}} if mutated else {}
    body = _pod(name, namespace, node, **meta)
    if service_account:
        body["spec"]["serviceAccountName"] = service_account
    return real.ok("POST", f"/api/v1/namespaces/{namespace}/pods", body)


def cleanup(real, namespaces: list[str]) -> None:
    """Remove what of CMK a test left (cluster-wide names are fixed), finishing pod deletions as a kubelet would."""
    for role, binding in ROLES.items():
        real.request("DELETE", f"{RBAC}/clusterrolebindings/{binding}")
        real.request("DELETE", f"{RBAC}/clusterroles/{role}")
    real.request("DELETE", f"{RBAC}/clusterrolebindings/cmk-role-binding-node")
    real.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK}")
    for _, plural in REPORTS:
        real.delete_crd(f"{plural}.intel.com")
    for ns in namespaces:
        for kind in ("pods", "configmaps", "secrets", "services", "serviceaccounts"):
            for item in (real.get(f"/api/v1/namespaces/{ns}/{kind}") or {}).get("items") or []:
                name = item["metadata"]["name"]
                if kind == "pods" or name.startswith("cmk-"):
                    real.request("DELETE", f"/api/v1/namespaces/{ns}/{kind}/{name}", query={"gracePeriodSeconds": "0"})
        for kind in ("daemonsets", "deployments"):
            for item in (real.get(f"/apis/apps/v1/namespaces/{ns}/{kind}") or {}).get("items") or []:
                real.request("DELETE", f"/apis/apps/v1/namespaces/{ns}/{kind}/{item['metadata']['name']}")
