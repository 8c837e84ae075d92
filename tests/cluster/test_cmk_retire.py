"""Retiring CMK's cluster pieces: the cpupools_cmk_retire role and module against the real API server.

CMK is seeded as its own v1.5.2 manifests and cluster-init install it (tests/cluster/cmk_seed.py):
in ``cmk-namespace``, with the 7 ClusterRoles and 8 ClusterRoleBindings of its rules file.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from cmk_seed import RBAC, ROLES, cleanup, seed_cmk, workload
from helpers import REPO
from k8s_real import CONTROLLER_USER, describe

pytestmark = pytest.mark.slow

PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: cpupools_cmk_retire
"""
TWO_NODES_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_cmk_retire
"""
NS = "cmk-namespace"


def node_pieces(node: str, ns: str = NS) -> list[str]:
    """What seed_cmk puts in for one node, in the order it must go."""
    return [
        f"Pod {ns}/cmk-init-install-discover-pod-{node}",
        f"DaemonSet {ns}/cmk-reconcile-nodereport-ds-{node}",
        f"ConfigMap {ns}/cmk-config-{node}",
        f"Cmk-nodereport default/{node}",
        f"Cmk-reconcilereport default/{node}",
    ]


def cluster_pieces(ns: str = NS) -> list[str]:
    return [
        f"DaemonSet {ns}/cmk-reconcile-ds-all",
        f"Pod {ns}/cmk-cluster-init-pod",
        "MutatingWebhookConfiguration cmk-webhook-config",
        f"Deployment {ns}/cmk-webhook-deployment",
        f"Service {ns}/cmk-webhook-service",
        f"Secret {ns}/cmk-webhook-certs",
        f"ConfigMap {ns}/cmk-webhook-configmap",
        "CustomResourceDefinition cmk-nodereports.intel.com",
        "CustomResourceDefinition cmk-reconcilereports.intel.com",
        *(f"ClusterRoleBinding {b}" for b in sorted([*ROLES.values(), "cmk-role-binding-node"])),
        *(
            f"ClusterRole {r}"
            for r in (
                "cmk-custom-resource-definition-controller",
                "cmk-daemonset-controller",
                "cmk-exec",
                "cmk-node-lister",
                "cmk-third-party-resource-controller",
                "cmk-version-controller",
                "cmk-webhook-installer",
            )
        ),
        f"ServiceAccount {ns}/cmk-serviceaccount",
    ]


@pytest.fixture
def cmk(cluster):
    """CMK's leftovers of a test are removed after it (the names are fixed and cluster-wide)."""
    spaces = [NS, "default"]
    yield spaces
    cleanup(cluster.real, spaces)


def play_vars(cluster, node=None):
    """The play's variables; the inventory's host is localhost, the Node ``node`` (None: the host name)."""
    out = {"cpupools_k8s_kubeconfig": str(cluster.kubeconfig())}
    if node:
        out["cpupools_k8s_node_name"] = node
    return out


def retire_result(res, host="localhost"):
    return res.result("Remove CMK's cluster pieces of the adopted nodes", host)


def cmk_left(cluster) -> list[str]:
    """CMK objects still in the cluster (what a retirement may remove)."""
    real = cluster.real
    left = []
    for ns in (NS, "default"):
        for base, kind in (("/api/v1", "pods"), ("/api/v1", "configmaps"), ("/apis/apps/v1", "daemonsets")):
            items = (real.get(f"{base}/namespaces/{ns}/{kind}") or {}).get("items") or []
            left += [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("cmk-")]
    for path in (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ):
        left += [i["metadata"]["name"] for i in real.get(path)["items"] if i["metadata"]["name"].startswith("cmk-")]
    return sorted(left)


def test_cmk_as_its_manifests_install_it_is_found_with_the_defaults_and_removed_in_order(playbook, cluster, cmk):
    node = cluster.node
    seed_cmk(cluster.real, [node])
    pod = workload(cluster.real, "dpdk-0", cluster.real.unique("telco"), node)
    cmk.append(pod["metadata"]["namespace"])
    node_before = cluster.real.node(node)
    expected = node_pieces(node) + cluster_pieces()
    res = playbook(PLAY, play_vars(cluster, node), "--check", "--diff")
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res)
    assert out["changed"] and out["found"] == expected and out["removed"] == expected, json.dumps(out, indent=1)
    assert out["kept"] == [] and out["other_cmk_nodes"] == []
    assert cluster.writes() == []  # check mode: reads only
    assert out["diff"]["after"] == "" and out["diff"]["before"].count("\n") == len(expected)
    res = playbook(PLAY, play_vars(cluster, node))
    assert res.rc == 0, res.stdout[-3000:]
    assert retire_result(res)["removed"] == expected
    assert cluster.real.product_token not in res.stdout + res.stderr
    order = [e["requestURI"].split("?")[0] for e in cluster.writes() if e["verb"] == "delete"]
    assert len(order) == len(expected)
    # CMK's agents on the node first; the webhook's configuration before what serves it; bindings before roles.
    assert order[1] == f"/apis/apps/v1/namespaces/{NS}/daemonsets/cmk-reconcile-nodereport-ds-{node}"
    assert order.index("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/cmk-webhook-config") < (
        order.index(f"/apis/apps/v1/namespaces/{NS}/deployments/cmk-webhook-deployment")
    )
    assert order[-1] == f"/api/v1/namespaces/{NS}/serviceaccounts/cmk-serviceaccount"
    # The pods bound to the node wait for their kubelet (there is none): being deleted, they count as gone.
    assert [n for n in cmk_left(cluster) if not n.endswith(("-pod", f"-pod-{node}"))] == []
    # The workload and the node (label, taint, resources: cpupools' now) are untouched.
    assert (
        cluster.real.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/dpdk-0")["metadata"]["uid"]
        == (pod["metadata"]["uid"])
    )
    assert cluster.real.node(node)["metadata"]["resourceVersion"] == node_before["metadata"]["resourceVersion"]
    before = len(cluster.writes())
    for args in ((), ("--check",)):
        res = playbook(PLAY, play_vars(cluster, node), *args)
        assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
        assert retire_result(res)["found"] == []
    assert len(cluster.writes()) == before


def test_nothing_of_cmk_changes_nothing(playbook, cluster, cmk):
    workload(cluster.real, "dpdk-0", cluster.real.unique("telco"), cluster.node)
    for args in (("--check",), ()):
        res = playbook(PLAY, play_vars(cluster, cluster.node), *args)
        assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
        out = retire_result(res)
        assert out["found"] == out["removed"] == out["kept"] == []
    assert cluster.writes() == []


def test_cluster_pieces_stay_while_cmk_runs_elsewhere_or_serves_running_pods(playbook, cluster, cmk, tmp_path):
    node_1, node_2 = cluster.node, cluster.add_node()
    seed_cmk(cluster.real, [node_1, node_2])
    workload(cluster.real, "legacy-0", NS, node_1, mutated=True, service_account="cmk-serviceaccount")
    res = playbook(PLAY, play_vars(cluster, node_1))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res)
    assert out["removed"] == node_pieces(node_1) and out["other_cmk_nodes"] == [node_2]
    assert out["kept"] == [
        {
            "object": "CMK's cluster-wide pieces (webhook, report CRDs, RBAC, service account, -all DaemonSets)",
            "reason": f"CMK still runs on node(s) outside this run: {node_2}",
        }
    ]
    assert f"cmk-reconcile-nodereport-ds-{node_2}" in cmk_left(cluster) and "cmk-webhook-config" in cmk_left(cluster)
    # The second node migrated too: the rest goes, except what running pods still need.
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"{node_1} ansible_connection=local\n{node_2} ansible_connection=local\n")
    res = playbook(TWO_NODES_PLAY, play_vars(cluster), inventory=str(inventory))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res, node_1)  # run once, for both nodes
    kept = {k["object"]: k["reason"] for k in out["kept"]}
    assert set(kept) == {
        "MutatingWebhookConfiguration cmk-webhook-config",
        f"Deployment {NS}/cmk-webhook-deployment",
        f"Service {NS}/cmk-webhook-service",
        f"Secret {NS}/cmk-webhook-certs",
        f"ConfigMap {NS}/cmk-webhook-configmap",
        f"ServiceAccount {NS}/cmk-serviceaccount",
    }
    assert kept["MutatingWebhookConfiguration cmk-webhook-config"].startswith(
        f"1 running pod(s) were mutated by CMK's webhook ({NS}/legacy-0); their controllers would recreate"
    )
    assert kept[f"ServiceAccount {NS}/cmk-serviceaccount"] == (
        f"1 running pod(s) use it ({NS}/legacy-0); a pod whose service account is gone cannot be recreated"
    )
    assert kept[f"Service {NS}/cmk-webhook-service"] == "the webhook configuration that calls it is kept"
    assert "CustomResourceDefinition cmk-nodereports.intel.com" in out["removed"]
    assert (
        "ClusterRole cmk-exec" in out["removed"] and "ClusterRoleBinding cmk-role-binding-node-lister" in out["removed"]
    )


def test_without_a_kubeconfig_it_says_so_and_does_nothing(playbook):
    res = playbook(PLAY, {})
    assert res.rc == 0 and res.changed() == 0, res.stdout[-3000:]
    assert "no kubeconfig is configured" in res.result("Say why CMK's cluster pieces are not retired")["msg"]


def test_the_first_host_without_a_kubeconfig_does_not_stop_the_others(playbook, cluster, cmk, tmp_path):
    """Issue 25: the module runs once per cluster, from a host connected to it, whichever host comes first.

    The first host has no kubeconfig; the second has one. Before, the first
    host's missing kubeconfig skipped the module for the whole play.
    """
    unconnected, node = cluster.real.unique("bare"), cluster.node
    seed_cmk(cluster.real, [node])
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"{unconnected} ansible_connection=local\n"
        f"{node} ansible_connection=local cpupools_k8s_kubeconfig={cluster.kubeconfig()}\n"
    )
    res = playbook(TWO_NODES_PLAY, {}, inventory=str(inventory))
    assert res.rc == 0, res.stdout[-3000:]
    out = retire_result(res, node)
    assert out["removed"] == node_pieces(node) + cluster_pieces()
    assert out["other_cmk_nodes"] == []
    assert retire_result(res, unconnected).get("skipped")
    said = res.result("Say why CMK's cluster pieces are not retired", unconnected)["msg"]
    assert said.startswith(f"CMK's cluster pieces not retired for {unconnected}: no kubeconfig is configured"), said


# The retirement's RBAC, as docs/cmk-comparison.md gives it -------------------------------------------------


def documented_retire_role() -> dict:
    """The ClusterRole of docs/cmk-comparison.md's "The retirement's credentials", as the operator would apply it."""
    text = (REPO / "docs" / "cmk-comparison.md").read_text()
    section = text[text.index("#### The retirement's credentials") :]
    role = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    assert role["kind"] == "ClusterRole" and role["rules"], role
    return role


def granted(role: dict) -> set[tuple[str, str, str, str]]:
    """``(group, resource, verb, name)`` of every rule (name ``""``: any name)."""
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def test_the_documented_rbac_is_exactly_what_retiring_two_nodes_sends(playbook, cluster, cmk, tmp_path):
    """Node by node, as docs/cmk-comparison.md says to migrate: the first keeps the cluster's pieces, the last
    removes them. Every request is allowed, and every rule of the documented ClusterRole was needed."""
    real = cluster.real
    first, last = cluster.node, cluster.add_node()
    seed_cmk(real, [first, last])
    workload(real, "dpdk-0", real.unique("telco"), first)
    name = real.unique("cpupools-cmk-retire")
    role = documented_retire_role()
    kubeconfig = cluster.kubeconfig("retire.conf", token=real.controller_token)
    retire_first = {"cpupools_k8s_kubeconfig": str(kubeconfig), "cpupools_k8s_node_name": first}
    # Without it, the refusal names it (not the k8s stage's ClusterRole of docs/kubernetes.md).
    res = playbook(PLAY, retire_first)
    assert res.rc != 0 and "is forbidden (403)" in res.messages(), res.stdout[-3000:]
    assert res.messages().endswith(
        'the credentials need the ClusterRole of docs/cmk-comparison.md, "The retirement\'s credentials" '
        "(bound with a ClusterRoleBinding)"
    ), res.messages()
    real.bind_cluster_role(name, role, CONTROLLER_USER)
    mark = real.audit_mark()
    try:
        for node, removed in ((first, node_pieces(first)), (last, node_pieces(last) + cluster_pieces())):
            res = playbook(PLAY, dict(retire_first, cpupools_k8s_node_name=node))
            assert res.rc == 0, res.messages() or res.stdout[-3000:]
            assert retire_result(res)["removed"] == removed
    finally:
        real.request("DELETE", f"{RBAC}/clusterrolebindings/{name}")
        real.request("DELETE", f"{RBAC}/clusterroles/{name}")
    events = [e for e in real.audit(mark, CONTROLLER_USER) if "objectRef" in e]
    refused = [describe(e) for e in events if e["responseStatus"]["code"] in (401, 403)]
    assert refused == [], refused
    sent = {
        (e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"], e["verb"], e["objectRef"].get("name", ""))
        for e in events
    }
    unused = sorted(
        rule for rule in granted(role) if not any(rule[:3] == s[:3] and rule[3] in ("", s[3]) for s in sent)
    )
    assert unused == [], f"the documented ClusterRole grants what the retirement never sends: {unused}"
