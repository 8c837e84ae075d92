"""cpupools_k8s_node, cpupools_k8s_drain and the cpupools_k8s role: real ansible-playbook against the real server.

The few tests that stay on the fake say why in their docstring.
"""

from __future__ import annotations

import socket

import pytest
from cpupools.cluster.k8s import layout_crd
from k8s_fake import write_kubeconfig
from k8s_support import TOKEN

pytestmark = pytest.mark.slow

EXCL = "cmk.intel.com/exclusive-cores"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
LAYOUTS = "/apis/cpupools.io/v1/cpupoollayouts"
NODE_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Node
      cpupools_k8s_node: "{{ args }}"
"""
DRAIN_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Drain
      cpupools_k8s_drain: "{{ args }}"
"""
MERGE = "application/merge-patch+json"


def node_args(kubeconfig, plan, node="node-1", **extra):
    return {"args": {"node_name": node, "plan": plan, "kubeconfig": str(kubeconfig), **extra}}


def real_args(cluster, plan, **extra):
    return node_args(cluster.kubeconfig(), plan, cluster.node, **extra)


def no_secret(res, token=TOKEN):
    assert token not in res.stdout and token not in res.stderr


def test_first_run_changes_second_does_not_and_writes_nothing(playbook, cluster, no_layout_crd, make_plan):
    plan = make_plan()
    node = cluster.node
    first = playbook(NODE_PLAY, real_args(cluster, plan, labels={"example.com/tier": "gold"}))
    assert first.rc == 0, first.stdout
    assert first.changed() == 1
    out = first.result("Node")
    assert out["capacity"] == {EXCL: "6"} and out["crd"] == "created" and out["layout"] == "created"
    stored = cluster.real.node(node)
    assert stored["metadata"]["labels"] == {
        "kubernetes.io/hostname": node,
        "team": "blue",
        "cmk.intel.com/cmk-node": "true",
        "example.com/tier": "gold",
    }
    assert stored["spec"]["taints"] == [
        {"key": "dedicated", "value": "rt", "effect": "NoExecute"},
        {"key": "cmk", "value": "true", "effect": "NoSchedule"},
    ]
    assert stored["status"]["capacity"][EXCL] == "6" and stored["status"]["allocatable"][EXCL] == "6"
    patches = [e for e in cluster.writes() if e["verb"] == "patch"]
    assert {e["requestObject"][0]["op"] for e in patches} == {"test"}  # every patch guarded by the resourceVersion
    assert {e["requestObject"][0]["path"] for e in patches} == {"/metadata/resourceVersion"}
    layout = cluster.real.get(f"{LAYOUTS}/{node}")
    assert layout["spec"]["poolCpus"] == plan["pool_cpus"] and layout["spec"]["extendedResources"] == {EXCL: 6}
    writes = len(cluster.writes())
    second = playbook(NODE_PLAY, real_args(cluster, plan, labels={"example.com/tier": "gold"}))
    assert second.rc == 0 and second.changed() == 0, second.stdout
    assert len(cluster.writes()) == writes
    no_secret(first, cluster.real.product_token)
    no_secret(second, cluster.real.product_token)


def test_check_mode_predicts_and_sends_no_write(playbook, cluster, no_layout_crd, make_plan):
    before = cluster.real.node(cluster.node)
    res = playbook(NODE_PLAY, real_args(cluster, make_plan()), "--check", "--diff")
    assert res.rc == 0 and res.changed() == 1, res.stdout
    assert cluster.writes() == []
    assert cluster.real.node(cluster.node)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    out = res.result("Node")
    assert out["capacity"] == {EXCL: "6"} and out["crd"] == "created" and out["layout"] == "created"
    assert out["diff"]["before"]["capacity"] == {} and out["diff"]["after"]["capacity"] == {EXCL: "6"}


def test_a_concurrent_writer_is_retried_not_overwritten(playbook, fake, kubeconfig, make_plan):
    """Fake: the other writer must land between our read and our patch, a moment a real server cannot be held at."""
    # Someone changes the node between our read and our patch: the resourceVersion test fails (422), we re-read.
    fake.before("PATCH", r"^/api/v1/nodes/node-1$", lambda: fake.touch_node("node-1", "example.com/racer"))
    fake.fail("PATCH", r"^/api/v1/nodes/node-1/status$", 409)  # and a plain 409 on the status write
    res = playbook(NODE_PLAY, node_args(kubeconfig, make_plan(), publish=False))
    assert res.rc == 0, res.stdout
    assert res.result("Node")["conflicts"] == 2
    # One read per conflict: GET, PATCH (422), GET, PATCH, PATCH status (409), GET, PATCH status.
    reads = [r.method for r in fake.requests if r.path.startswith("/api/v1/nodes/node-1")]
    assert reads == ["GET", "PATCH", "GET", "PATCH", "PATCH", "GET", "PATCH"]
    labels = fake.nodes["node-1"]["metadata"]["labels"]
    assert "example.com/racer" in labels and labels["cmk.intel.com/cmk-node"] == "true"
    assert fake.nodes["node-1"]["status"]["capacity"][EXCL] == "6"


def test_forbidden_and_not_found_give_one_clear_message(playbook, cluster, make_plan):
    # A user the server knows but has granted nothing: every request is refused (403).
    nobody = cluster.kubeconfig("nobody.conf", token=cluster.real.controller_token)
    res = playbook(NODE_PLAY, node_args(nobody, make_plan(), cluster.node))
    assert res.rc != 0
    msg = res.messages()
    assert f"node '{cluster.node}' on API server {cluster.url}" in msg and "forbidden (403)" in msg, msg
    assert 'User "cpupools" cannot get resource "nodes"' in msg
    assert "nodes/status" in msg and "Traceback" not in res.stdout + res.stderr
    no_secret(res, cluster.real.controller_token)
    missing = playbook(NODE_PLAY, node_args(cluster.kubeconfig(), make_plan(), "node-9"))
    assert missing.rc != 0
    assert "cpupools_k8s_node_name: node 'node-9' on API server" in missing.messages()
    assert "no such node (404)" in missing.messages()


def test_unreachable_server_and_invalid_kubeconfig(playbook, tmp_path, make_plan):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = write_kubeconfig(tmp_path / "dead", f"http://127.0.0.1:{port}", token=TOKEN)
    res = playbook(NODE_PLAY, node_args(dead, make_plan()))
    assert res.rc != 0 and f"cannot reach the API server http://127.0.0.1:{port}" in res.messages()
    no_secret(res)
    broken = tmp_path / "broken"
    broken.write_text(f"users:\n- name: x\n  user:\n    token: {TOKEN}\n  : [\n")
    res = playbook(NODE_PLAY, node_args(broken, make_plan()))
    assert res.rc != 0 and f"kubeconfig {broken}" in res.messages()
    assert "Traceback" not in res.messages()
    no_secret(res)


def test_absent_removes_only_ours_and_the_layout(playbook, cluster, make_plan):
    user = {"example.com/tier": "gold"}
    node = cluster.node
    assert playbook(NODE_PLAY, real_args(cluster, make_plan(), labels=user)).rc == 0
    later = {"metadata": {"labels": {"example.com/later": "yes"}}}  # a label someone else added meanwhile
    cluster.real.ok("PATCH", f"/api/v1/nodes/{node}", later, content_type=MERGE)
    args = {"args": {"node_name": node, "state": "absent", "labels": user, "kubeconfig": str(cluster.kubeconfig())}}
    res = playbook(NODE_PLAY, args)
    assert res.rc == 0 and res.changed() == 1, res.stdout
    stored = cluster.real.node(node)
    assert set(stored["metadata"]["labels"]) == {"kubernetes.io/hostname", "team", "example.com/later"}
    assert stored["spec"]["taints"] == [{"key": "dedicated", "value": "rt", "effect": "NoExecute"}]
    assert EXCL not in stored["status"]["capacity"] and stored["status"]["capacity"]["cpu"] == "8"
    assert cluster.real.get(f"{LAYOUTS}/{node}") is None
    assert cluster.real.get(f"{CRDS}/cpupoollayouts.cpupools.io") is not None  # other nodes use it
    again = playbook(NODE_PLAY, args)
    assert again.rc == 0 and again.changed() == 0


def test_a_changed_plan_updates_the_count_and_the_layout(playbook, cluster, make_plan):
    node = cluster.node
    assert playbook(NODE_PLAY, real_args(cluster, make_plan())).rc == 0
    rv = cluster.real.get(f"{LAYOUTS}/{node}")["metadata"]["resourceVersion"]
    res = playbook(NODE_PLAY, real_args(cluster, make_plan(num_exclusive_cores=4), pending_reboot=True))
    assert res.rc == 0 and res.result("Node")["layout"] == "updated" and res.result("Node")["crd"] == "unchanged"
    layout = cluster.real.get(f"{LAYOUTS}/{node}")
    assert layout["metadata"]["resourceVersion"] != rv and layout["spec"]["pendingReboot"] is True
    assert cluster.real.node(node)["status"]["capacity"][EXCL] == "4"
    puts = [e for e in cluster.writes() if e["verb"] == "update"]
    assert puts and all(e["requestObject"]["metadata"]["resourceVersion"] for e in puts)


def test_a_crd_another_host_just_created_is_waited_for(playbook, fake, kubeconfig, make_plan):
    """Fake: our POST must get the 409 of another host's CRD not yet Established, a moment a real server does not
    hold; tests/cluster/test_k8s_apply.py races two hosts on the real server."""
    # Two hosts race on a fresh cluster: the other POST lands first, ours gets 409, and that CRD is not
    # Established yet, so its group is not served: a layout POST now would get the bare "404 page not found".
    fake.crd_establish_delay = 2.0
    fake.before("POST", r"/customresourcedefinitions$", lambda: fake.add_crd(layout_crd(), established=False))
    res = playbook(NODE_PLAY, node_args(kubeconfig, make_plan()))
    assert res.rc == 0, res.messages()
    out = res.result("Node")
    assert out["crd"] == "unchanged" and out["layout"] == "created"
    assert ("cpupools.io", "cpupoollayouts", "node-1") in fake.objects
    assert [(r.method, r.path) for r in fake.writes() if r.method == "POST"] == [("POST", CRDS), ("POST", LAYOUTS)]


def test_a_crd_update_keeps_what_other_owners_put_on_it(playbook, cluster, no_layout_crd, make_plan):
    older = layout_crd()  # as an older cpupools installed it, then a GitOps tool labelled and annotated it
    del older["spec"]["versions"][0]["additionalPrinterColumns"][4]
    older["metadata"]["labels"]["argocd.argoproj.io/instance"] = "platform"
    older["metadata"]["annotations"] = {"gitops.example.com/revision": "4f2a9c1"}
    cluster.real.ensure_crd(older)
    res = playbook(NODE_PLAY, real_args(cluster, make_plan()))
    assert res.rc == 0 and res.result("Node")["crd"] == "updated", res.messages()
    crd = cluster.real.get(f"{CRDS}/cpupoollayouts.cpupools.io")
    assert crd["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "cpupools",
        "argocd.argoproj.io/instance": "platform",
    }
    assert crd["metadata"]["annotations"] == {"gitops.example.com/revision": "4f2a9c1"}
    assert len(crd["spec"]["versions"][0]["additionalPrinterColumns"]) == 6
    crd_writes = [e for e in cluster.writes() if e["objectRef"]["resource"] == "customresourcedefinitions"]
    assert [(e["verb"], e["requestURI"].split("?")[0]) for e in crd_writes] == [
        ("patch", f"{CRDS}/cpupoollayouts.cpupools.io")
    ]
    writes = len(cluster.writes())
    again = playbook(NODE_PLAY, real_args(cluster, make_plan()))
    assert again.rc == 0 and again.changed() == 0 and again.result("Node")["crd"] == "unchanged"
    assert len(cluster.writes()) == writes


def test_a_just_registered_node_without_status_capacity(playbook, cluster, make_plan):
    node = cluster.add_node(with_capacity=False, ready=False)  # still carries node.kubernetes.io/not-ready
    args = {"args": dict(real_args(cluster, make_plan(), publish=False)["args"], node_name=node)}
    res = playbook(NODE_PLAY, args)
    assert res.rc == 0, res.stdout
    stored = cluster.real.node(node)
    assert stored["status"]["capacity"] == {EXCL: "6"}
    assert stored["status"]["allocatable"] == {EXCL: "6"}  # the server copies a capacity set without allocatable
    assert [(t["key"], t["effect"]) for t in stored["spec"]["taints"]] == [
        ("node.kubernetes.io/not-ready", "NoSchedule"),
        ("cmk", "NoSchedule"),
    ]
    writes = len(cluster.writes())
    again = playbook(NODE_PLAY, args)
    assert again.rc == 0 and again.changed() == 0 and len(cluster.writes()) == writes


def test_drain_respects_pdbs_skips_daemonsets_and_uncordons(playbook, fake, kubeconfig):
    """Fake: with no controller manager and no kubelet, a real test server computes no PodDisruptionBudget
    status (evictions are refused until it does) and never ends an evicted pod; the fake does both."""
    fake.add_pod("shop", "web-1", "node-1", owner="ReplicaSet")
    fake.add_pod("shop", "db-0", "node-1", owner="StatefulSet", labels={"app": "db"})
    fake.add_pod("shop", "db-1", "node-2", owner="StatefulSet", labels={"app": "db"})
    fake.add_pod("shop", "db-2", "node-2", owner="StatefulSet", labels={"app": "db"}, ready=False)
    fake.add_pdb("shop", "db-budget", {"app": "db"}, min_available=2)
    # Not running yet: its budget does not count it, it is evicted at once.
    fake.add_pod(
        "shop", "cache-0", "node-1", owner="StatefulSet", labels={"app": "cache"}, phase="Pending", ready=False
    )
    fake.add_pdb("shop", "cache-budget", {"app": "cache"}, min_available=1)
    fake.add_pod("kube-system", "proxy-x", "node-1", owner="DaemonSet")
    fake.add_pod("kube-system", "etcd-node-1", "node-1", mirror=True)
    fake.add_pod("shop", "web-2", "node-2", owner="ReplicaSet")
    tries = []

    def db_2_ready_on_the_third_try():
        tries.append(1)
        if len(tries) == 3:
            fake.set_pod("shop", "db-2", ready=True)

    fake.before("POST", r"/pods/db-0/eviction$", db_2_ready_on_the_third_try, times=-1)
    fake.evict_linger = 1
    args = {"node_name": "node-1", "kubeconfig": str(kubeconfig), "poll_interval": 0.1, "timeout": 30}
    check = playbook(DRAIN_PLAY, {"args": args}, "--check")
    assert check.rc == 0 and check.changed() == 1 and fake.writes() == []
    res = playbook(DRAIN_PLAY, {"args": args})
    assert res.rc == 0, res.stdout
    out = res.result("Drain")
    assert out["cordoned"] and out["blocked_retries"] == 2
    assert out["evicted"] == [
        {"namespace": "shop", "name": "cache-0"},
        {"namespace": "shop", "name": "db-0"},
        {"namespace": "shop", "name": "web-1"},
    ]
    assert fake.nodes["node-1"]["spec"]["unschedulable"] is True
    assert set(fake.pods) == {
        ("kube-system", "proxy-x"),
        ("kube-system", "etcd-node-1"),
        ("shop", "web-2"),
        ("shop", "db-1"),
        ("shop", "db-2"),
    }
    evictions = [r for r in fake.writes() if r.path.endswith("/eviction")]
    assert {r.body["apiVersion"] for r in evictions} == {"policy/v1"}
    assert [r.path.split("/")[-2] for r in evictions].count("cache-0") == 1
    assert playbook(DRAIN_PLAY, {"args": args}).changed() == 0
    up = playbook(DRAIN_PLAY, {"args": dict(args, state="uncordoned")})
    assert up.rc == 0 and up.changed() == 1 and "unschedulable" not in fake.nodes["node-1"]["spec"]
    assert playbook(DRAIN_PLAY, {"args": dict(args, state="uncordoned")}).changed() == 0


def test_drain_times_out_naming_the_blocked_pod_and_refuses_bare_pods(playbook, fake, kubeconfig):
    """Fake: as above, a budget's status is the disruption controller's, which a test server does not run."""
    fake.add_pod("shop", "db-0", "node-1", owner="StatefulSet", labels={"app": "db"})
    fake.add_pdb("shop", "db-budget", {"app": "db"}, min_available=1)
    args = {"node_name": "node-1", "kubeconfig": str(kubeconfig), "poll_interval": 0.2, "timeout": 1}
    res = playbook(DRAIN_PLAY, {"args": args})
    assert res.rc != 0
    assert "shop/db-0" in res.messages() and "PodDisruptionBudget" in res.messages()
    assert "The disruption budget db-budget needs 1 healthy pods and has 1 currently" in res.messages()
    assert "host node-1: cpupools_k8s_drain_timeout: node 'node-1' on API server" in res.messages()
    assert "the node stays cordoned" in res.messages()
    fake.add_pod("shop", "bare", "node-1")
    res = playbook(DRAIN_PLAY, {"args": args})
    assert res.rc != 0 and "shop/bare" in res.messages() and "cpupools_k8s_drain_delete_unmanaged" in res.messages()


ROLE_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_k8s
"""


def test_role_is_skipped_with_a_reason_without_a_kubeconfig(playbook, make_plan):
    res = playbook(ROLE_PLAY, {"cpupools_plan": make_plan()})
    assert res.rc == 0 and res.changed() == 0
    assert (
        "no kubeconfig is configured"
        in res.result("cpupools_k8s : Say why the Kubernetes node is not configured")["msg"]
    )


def test_a_missing_kubeconfig_is_refused_by_its_variable_name(playbook, make_plan, tmp_path):
    missing = tmp_path / "nowhere" / "kubeconfig"
    res = playbook(ROLE_PLAY, {"cpupools_plan": make_plan(), "cpupools_k8s_kubeconfig": str(missing)})
    assert res.rc != 0
    assert f"host localhost: cpupools_k8s_kubeconfig: kubeconfig {missing} does not exist or is not a file" in (
        res.messages()
    )


def test_role_configures_the_node_then_changes_nothing(playbook, cluster, no_admission, make_plan):
    extra = {
        "cpupools_plan": make_plan(),
        "cpupools_k8s_kubeconfig": str(cluster.kubeconfig()),
        "cpupools_k8s_node_name": cluster.node,
    }
    first = playbook(ROLE_PLAY, extra)
    # the Node, and the cluster's pod injection policy (tests/cluster/test_admission_role.py)
    assert first.rc == 0 and first.changed() == 2, first.stdout
    writes = len(cluster.writes())
    second = playbook(ROLE_PLAY, extra)
    assert second.rc == 0 and second.changed() == 0 and len(cluster.writes()) == writes
    assert cluster.real.node(cluster.node)["metadata"]["labels"]["cmk.intel.com/cmk-node"] == "true"
