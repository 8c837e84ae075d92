"""Retiring CMK's cluster pieces: the cpupools_cmk_retire role and module against the fake API server."""

from __future__ import annotations

import copy

import pytest
from k8s_support import TOKEN

pytestmark = pytest.mark.slow

PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: cpupools_cmk_retire
"""
REPORT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    # As a cluster upgraded past 1.22 keeps CMK's v1beta1 CRD: namespaced, no schema of its own.
    "spec": {
        "group": "intel.com",
        "scope": "Namespaced",
        "names": {"kind": "Cmk-nodereport", "plural": "cmk-nodereports", "singular": "cmk-nodereport"},
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
RBAC = "rbac.authorization.k8s.io/v1"
#: What seed_cmk puts in for node-1 and for the cluster, in the order it must go.
NODE_1 = [
    "Pod default/cmk-init-install-discover-pod-node-1",
    "DaemonSet default/cmk-reconcile-nodereport-ds-node-1",
    "ConfigMap default/cmk-config-node-1",
    "Cmk-nodereport default/node-1",
    "Cmk-reconcilereport default/node-1",
]
CLUSTER = [
    "DaemonSet default/cmk-reconcile-ds-all",
    "Pod default/cmk-cluster-init-pod",
    "MutatingWebhookConfiguration cmk-webhook-config",
    "Deployment default/cmk-webhook-deployment",
    "Service default/cmk-webhook-service",
    "Secret default/cmk-webhook-certs",
    "ConfigMap default/cmk-webhook-configmap",
    "CustomResourceDefinition cmk-nodereports.intel.com",
    "CustomResourceDefinition cmk-reconcilereports.intel.com",
    "ClusterRoleBinding cmk-role-binding-daemonset",
    "ClusterRoleBinding cmk-role-binding-node",
    "ClusterRole cmk-daemonset-controller",
    "ClusterRole cmk-webhook-installer",
    "ServiceAccount intel-cmk/cmk-serviceaccount",
]


def seed_cmk(fake, nodes=("node-1",)):
    """CMK as cluster-init, its manifests and its webhook left it, for ``nodes``."""
    for node in nodes:
        fake.add_pod("default", f"cmk-init-install-discover-pod-{node}", node)
        fake.add_resource("apps/v1", "daemonsets", f"cmk-reconcile-nodereport-ds-{node}", "default")
        fake.add_resource("v1", "configmaps", f"cmk-config-{node}", "default", data={"config": "{}"})
    fake.add_resource("apps/v1", "daemonsets", "cmk-reconcile-ds-all", "default")
    fake.add_pod("default", "cmk-cluster-init-pod", "node-1")
    fake.add_resource(
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        "cmk-webhook-config",
        webhooks=[{"name": "cmk.intel.com", "failurePolicy": "Ignore"}],
    )
    fake.add_resource("apps/v1", "deployments", "cmk-webhook-deployment", "default")
    fake.add_resource("v1", "services", "cmk-webhook-service", "default")
    fake.add_resource("v1", "secrets", "cmk-webhook-certs", "default")
    fake.add_resource("v1", "configmaps", "cmk-webhook-configmap", "default")
    for kind, plural in (("Cmk-nodereport", "cmk-nodereports"), ("Cmk-reconcilereport", "cmk-reconcilereports")):
        crd = copy.deepcopy(REPORT_CRD)
        crd["spec"]["names"] = {"kind": kind, "plural": plural, "singular": plural[:-1]}
        fake.add_crd_raw(f"{plural}.intel.com", crd)
        for node in nodes:
            fake.add_resource("intel.com/v1", plural, node, "default", kind=kind, spec={"report": {}})
    for name in ("cmk-role-binding-daemonset", "cmk-role-binding-node"):
        fake.add_resource(RBAC, "clusterrolebindings", name)
    for name in ("cmk-daemonset-controller", "cmk-webhook-installer"):
        fake.add_resource(RBAC, "clusterroles", name)
    fake.add_resource("v1", "serviceaccounts", "cmk-serviceaccount", "intel-cmk")


def workload(fake, name="dpdk-0", namespace="telco", mutated=False, service_account=None):
    pod = fake.add_pod(namespace, name, "node-1")
    if mutated:
        pod["metadata"]["annotations"] = {"cmk.intel.com/resources-injected": "true"}
    if service_account:
        pod["spec"]["serviceAccountName"] = service_account
    return pod


def cmk_left(fake) -> list[str]:
    """Names of CMK objects still in the fake (report objects as ``plural/name``)."""
    names = [n for (_, _, _, n) in fake.resources] + [n for (_, n) in fake.pods] + list(fake.crds)
    reports = [f"{p}/{n}" for (_, p, _, n) in fake.resources if p.startswith("cmk-")]
    return sorted(n for n in names if n.startswith("cmk-")) + sorted(reports)


def deletes(fake) -> list[str]:
    return [r.path for r in fake.writes() if r.method == "DELETE"]


def play_vars(kubeconfig, node="node-1"):
    """The play's variables; the inventory's host is localhost, the Node ``node`` (None: the host name)."""
    out = {"cpupools_k8s_kubeconfig": str(kubeconfig)}
    if node:
        out["cpupools_k8s_node_name"] = node
    return out


def retire_result(res, host="localhost"):
    return res.result("Remove CMK's cluster pieces of the adopted nodes", host)


def test_check_mode_predicts_then_the_run_removes_in_order_and_reruns_change_nothing(playbook, fake, kubeconfig):
    seed_cmk(fake)
    pod = workload(fake)
    node_before = copy.deepcopy(fake.nodes["node-1"])
    res = playbook(PLAY, play_vars(kubeconfig), "--check", "--diff")
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res)
    assert out["changed"] and out["removed"] == out["found"] == NODE_1 + CLUSTER
    assert out["kept"] == [] and out["other_cmk_nodes"] == []
    assert fake.writes() == []  # check mode: reads only
    assert out["diff"]["after"] == "" and out["diff"]["before"].count("\n") == len(NODE_1 + CLUSTER)
    res = playbook(PLAY, play_vars(kubeconfig))
    assert res.rc == 0, res.stdout[-3000:]
    assert retire_result(res)["removed"] == NODE_1 + CLUSTER
    assert TOKEN not in res.stdout and TOKEN not in res.stderr
    order = deletes(fake)
    assert len(order) == len(NODE_1 + CLUSTER)
    # CMK's agents on the node first; the webhook's configuration before what serves it; bindings before roles.
    assert order[1].endswith("/daemonsets/cmk-reconcile-nodereport-ds-node-1")
    assert order.index("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/cmk-webhook-config") < (
        order.index("/apis/apps/v1/namespaces/default/deployments/cmk-webhook-deployment")
    )
    assert order[-1] == "/api/v1/namespaces/intel-cmk/serviceaccounts/cmk-serviceaccount"
    assert cmk_left(fake) == []
    # The workload and the node (label, taint, resources: cpupools' now) are untouched.
    assert fake.pods[("telco", "dpdk-0")] == pod and fake.nodes["node-1"] == node_before
    before = len(fake.writes())
    for args in ((), ("--check",)):
        res = playbook(PLAY, play_vars(kubeconfig), *args)
        assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
        assert retire_result(res)["found"] == []
    assert len(fake.writes()) == before


def test_nothing_of_cmk_changes_nothing(playbook, fake, kubeconfig):
    workload(fake)
    for args in (("--check",), ()):
        res = playbook(PLAY, play_vars(kubeconfig), *args)
        assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
        out = retire_result(res)
        assert out["found"] == out["removed"] == out["kept"] == []
    assert fake.writes() == []


def test_cluster_pieces_stay_while_cmk_runs_elsewhere_or_serves_running_pods(playbook, fake, kubeconfig, tmp_path):
    seed_cmk(fake, nodes=("node-1", "node-2"))
    workload(fake, "legacy-0", mutated=True, service_account="cmk-serviceaccount", namespace="intel-cmk")
    res = playbook(PLAY, play_vars(kubeconfig))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res)
    assert out["removed"] == NODE_1 and out["other_cmk_nodes"] == ["node-2"]
    assert out["kept"] == [
        {
            "object": "CMK's cluster-wide pieces (webhook, report CRDs, RBAC, service account, -all DaemonSets)",
            "reason": "CMK still runs on node(s) outside this run: node-2",
        }
    ]
    assert "cmk-reconcile-nodereport-ds-node-2" in cmk_left(fake) and "cmk-webhook-config" in cmk_left(fake)
    # node-2 migrated too: the rest goes, except what running pods still need.
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node-1 ansible_connection=local\nnode-2 ansible_connection=local\n")
    res = playbook(TWO_NODES_PLAY, play_vars(kubeconfig, node=None), inventory=str(inventory))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res, "node-1")  # run once, for both nodes
    kept = {k["object"]: k["reason"] for k in out["kept"]}
    assert set(kept) == {
        "MutatingWebhookConfiguration cmk-webhook-config",
        "Deployment default/cmk-webhook-deployment",
        "Service default/cmk-webhook-service",
        "Secret default/cmk-webhook-certs",
        "ConfigMap default/cmk-webhook-configmap",
        "ServiceAccount intel-cmk/cmk-serviceaccount",
    }
    assert kept["MutatingWebhookConfiguration cmk-webhook-config"].startswith(
        "1 running pod(s) were mutated by CMK's webhook (intel-cmk/legacy-0); their controllers would recreate"
    )
    assert kept["ServiceAccount intel-cmk/cmk-serviceaccount"] == (
        "1 running pod(s) use it (intel-cmk/legacy-0); a pod whose service account is gone cannot be recreated"
    )
    assert kept["Service default/cmk-webhook-service"] == "the webhook configuration that calls it is kept"
    assert "CustomResourceDefinition cmk-nodereports.intel.com" in out["removed"]
    assert "ClusterRole cmk-webhook-installer" in out["removed"]


TWO_NODES_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_cmk_retire
"""


def test_without_a_kubeconfig_it_says_so_and_does_nothing(playbook):
    res = playbook(PLAY, {})
    assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
    assert "no kubeconfig is configured" in res.result("Say why CMK's cluster pieces are not retired")["msg"]


def test_the_first_host_without_a_kubeconfig_does_not_stop_the_others(playbook, fake, kubeconfig, tmp_path):
    """Issue 25: the module runs once per cluster, from a host connected to it, whichever host comes first.

    node-1 (first) has no kubeconfig; node-2 has one. Before, the first host's
    missing kubeconfig skipped the module for the whole play.
    """
    seed_cmk(fake, nodes=("node-2",))
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"node-1 ansible_connection=local\nnode-2 ansible_connection=local cpupools_k8s_kubeconfig={kubeconfig}\n"
    )
    res = playbook(TWO_NODES_PLAY, {}, inventory=str(inventory))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res, "node-2")
    assert out["removed"][0] == "Pod default/cmk-init-install-discover-pod-node-2"
    assert "CustomResourceDefinition cmk-nodereports.intel.com" in out["removed"]
    assert out["other_cmk_nodes"] == []
    assert retire_result(res, "node-1").get("skipped")
    said = res.result("Say why CMK's cluster pieces are not retired", "node-1")["msg"]
    assert said.startswith("CMK's cluster pieces not retired for node-1: no kubeconfig is configured"), said
