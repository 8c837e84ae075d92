"""Pure functions of the Kubernetes part: desired state, patches, layout, kubeconfig reader, drain choice."""

from __future__ import annotations

import base64
import json

import pytest
from cpupools.cluster.k8s import (
    LAYOUT_CRD_NAME,
    desired_node,
    drain_candidates,
    is_subset,
    layout_crd,
    layout_object,
    node_changes,
    with_defaults,
)
from cpupools.cluster.k8s_advertise import parse_kubeconfig_text
from cpupools.core.errors import K8sError
from k8s_fake import ApiError, FakeKube, apply_json_patch, prune

EXCL = "cmk.intel.com/exclusive-cores"
ENI = "cmk.intel.com/exclusive-non-isolcpus-cores"


def node(labels=None, taints=None, capacity=..., allocatable=...):
    base = {"cpu": "8", "pods": "110"}
    status = {}
    if capacity is not None:
        status["capacity"] = dict(base, **(capacity if capacity is not ... else {}))
    if allocatable is not None:
        status["allocatable"] = dict(base, **(allocatable if allocatable is not ... else {}))
    obj = {
        "metadata": {"name": "n1", "resourceVersion": "7", "labels": dict(labels or {"kubernetes.io/hostname": "n1"})},
        "spec": {},
        "status": status,
    }
    if taints is not None:
        obj["spec"]["taints"] = taints
    return obj


def apply(obj, changes):
    """Apply both patches with the fake's RFC 6902 engine (the apiserver's rules)."""
    out = apply_json_patch(obj, changes.object_patch) if changes.object_patch else obj
    return apply_json_patch(out, changes.status_patch) if changes.status_patch else out


def test_counts_come_from_the_plan(make_plan):
    plan = make_plan()
    wants = desired_node(plan)
    assert wants.resources == {EXCL: 6, ENI: None}
    assert wants.labels == {"cmk.intel.com/cmk-node": "true"}
    assert wants.taint == {"key": "cmk", "value": "true", "effect": "NoSchedule"}


def test_eni_is_advertised_only_when_the_pool_has_cores(make_plan):
    plan = make_plan("2s8c-nosmt", num_exclusive_cores=2, num_shared_cores=1, excl_non_isolcpus="6")
    assert desired_node(plan).resources == {EXCL: 2, ENI: 1}


def test_present_on_a_plain_node_sets_everything_and_keeps_the_rest(make_plan):
    other = {"key": "dedicated", "value": "rt", "effect": "NoExecute"}
    before = node(labels={"team": "blue"}, taints=[other])
    changes = node_changes(before, desired_node(make_plan(), labels={"example.com/tier": "gold"}))
    after = apply(before, changes)
    assert after["metadata"]["labels"] == {"team": "blue", "cmk.intel.com/cmk-node": "true", "example.com/tier": "gold"}
    assert after["spec"]["taints"] == [other, {"key": "cmk", "value": "true", "effect": "NoSchedule"}]
    assert after["status"]["capacity"][EXCL] == "6"
    assert after["status"]["allocatable"][EXCL] == "6"
    assert changes.object_patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert node_changes(after, desired_node(make_plan(), labels={"example.com/tier": "gold"})).changed is False


def test_a_node_without_capacity_gets_the_parent_created_not_a_422(make_plan):
    bare = node(capacity=None, allocatable=None)
    naive = [{"op": "add", "path": "/status/capacity/cmk.intel.com~1exclusive-cores", "value": "6"}]
    with pytest.raises(ApiError) as exc:  # what CMK sent: a real server refuses it
        apply_json_patch(bare, naive)
    assert exc.value.code == 422
    plan = make_plan("2s8c-nosmt", num_exclusive_cores=2, num_shared_cores=1, excl_non_isolcpus="6")
    changes = node_changes(bare, desired_node(plan))
    assert apply(bare, changes)["status"]["capacity"] == {EXCL: "2", ENI: "1"}
    assert "allocatable" not in apply(bare, changes)["status"]


def test_a_cmk_taint_with_another_value_or_effect_is_replaced(make_plan):
    before = node(
        taints=[{"key": "cmk", "value": "false", "effect": "NoExecute"}, {"key": "x", "effect": "NoSchedule"}]
    )
    after = apply(before, node_changes(before, desired_node(make_plan())))
    assert after["spec"]["taints"] == [
        {"key": "x", "effect": "NoSchedule"},
        {"key": "cmk", "value": "true", "effect": "NoSchedule"},
    ]


def test_absent_removes_exactly_ours(make_plan):
    user = {"example.com/tier": "gold"}
    present = apply(
        node(labels={"team": "blue"}, taints=[{"key": "x", "effect": "NoSchedule"}]),
        node_changes(
            node(labels={"team": "blue"}, taints=[{"key": "x", "effect": "NoSchedule"}]),
            desired_node(make_plan(), labels=user),
        ),
    )
    present["status"]["capacity"][ENI] = "3"  # left behind by CMK's uninstall (its bug 14)
    gone = apply(present, node_changes(present, desired_node(None, "absent", labels=user)))
    assert gone["metadata"]["labels"] == {"team": "blue"}
    assert gone["spec"]["taints"] == [{"key": "x", "effect": "NoSchedule"}]
    assert EXCL not in gone["status"]["capacity"] and ENI not in gone["status"]["capacity"]
    assert EXCL not in gone["status"]["allocatable"]
    assert gone["status"]["capacity"]["cpu"] == "8"
    assert not node_changes(gone, desired_node(None, "absent", labels=user)).changed


def test_taint_false_removes_only_the_cmk_taint(make_plan):
    before = node(taints=[{"key": "cmk", "value": "true", "effect": "NoSchedule"}])
    after = apply(before, node_changes(before, desired_node(make_plan(), taint=False)))
    assert "taints" not in after["spec"]


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"labels": {"bad key!": "x"}}, "labels", "name part"),
        ({"labels": {"a": "x" * 64}}, "labels", "at most 63"),
        ({"exclusive_resource": "exclusive-cores"}, "exclusive_resource", "domain prefix"),
        ({"eni_resource": "kubernetes.io/cores"}, "eni_resource", "kubernetes.io"),
        ({"label_domain": "Not A Domain"}, "label_domain", "DNS subdomain"),
    ],
)
def test_bad_options_name_the_variable(make_plan, kwargs, field, text):
    with pytest.raises(K8sError) as exc:
        desired_node(make_plan(), **kwargs)
    assert exc.value.field == field and text in str(exc.value)
    assert exc.value.describe("w1").startswith(f"host w1: cpupools_{field}: ")


def test_present_without_a_plan_is_refused():
    with pytest.raises(K8sError, match="cpupools_plan role"):
        desired_node(None)


def test_crd_is_structural_and_has_the_printer_columns():
    crd = layout_crd()
    assert crd["metadata"]["name"] == LAYOUT_CRD_NAME
    assert crd["spec"]["scope"] == "Cluster"
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Node",
        "Exclusive",
        "Shared",
        "Infra",
        "Pending Reboot",
        "Age",
    ]
    fake = FakeKube()  # the fake's CRD validation is the apiserver's, minus what we do not use
    assert fake._check_crd(crd)["spec"]["names"]["listKind"] == "CpuPoolLayoutList"


def test_layout_survives_pruning_unchanged_and_is_deterministic(make_plan):
    plan = make_plan()
    obj = layout_object("node-1", plan, {EXCL: 6, ENI: None}, pending_reboot=True, applied={"runningIsolcpus": ""})
    schema = layout_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    assert prune(json.loads(json.dumps(body)), schema) == body  # nothing we send is dropped by the server
    assert obj == layout_object("node-1", plan, {EXCL: 6, ENI: None}, True, {"runningIsolcpus": ""})
    assert obj["spec"]["poolCpus"]["exclusive"] == plan["pool_cpus"]["exclusive"]
    assert obj["spec"]["extendedResources"] == {EXCL: 6}


def test_is_subset_ignores_server_defaults():
    want = layout_crd()["spec"]
    have = json.loads(json.dumps(want))
    have["conversion"] = {"strategy": "None"}
    have["versions"][0]["additionalPrinterColumns"][0]["priority"] = 0
    assert is_subset(want, have)
    have["versions"][0]["additionalPrinterColumns"][1]["jsonPath"] = ".spec.other"
    assert not is_subset(want, have)


KUBEADM_KUBELET_CONF = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://10.0.0.1:6443
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {{}}
users:
- name: default-auth
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: "/var/lib/kubelet/pki/kubelet-client-current.pem"   # comment
"""


def test_kubeconfig_reader_reads_kubeadm_kubelet_conf():
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()
    data = parse_kubeconfig_text(KUBEADM_KUBELET_CONF.format(ca=ca))
    assert data["clusters"][0] == {
        "cluster": {"certificate-authority-data": ca, "server": "https://10.0.0.1:6443"},
        "name": "default-cluster",
    }
    assert data["users"][0]["user"]["client-key"] == "/var/lib/kubelet/pki/kubelet-client-current.pem"
    assert data["contexts"][0]["context"]["user"] == "default-auth"
    assert data["preferences"] == {}
    assert parse_kubeconfig_text(json.dumps(data)) == data


def test_kubeconfig_reader_refuses_what_it_cannot_read_without_echoing_it():
    with pytest.raises(K8sError) as exc:
        parse_kubeconfig_text("users:\n- name: a\n  user:\n    token: |\n      s3cr3t-token\n")
    assert "line 4" in str(exc.value) and "s3cr3t" not in str(exc.value)


def test_drain_candidates_skip_daemonsets_and_mirror_pods():
    fake = FakeKube()
    pods = [
        fake.add_pod("a", "web-1", "n1", owner="ReplicaSet"),
        fake.add_pod("kube-system", "proxy", "n1", owner="DaemonSet"),
        fake.add_pod("kube-system", "etcd-n1", "n1", mirror=True),
        fake.add_pod("a", "bare", "n1"),
    ]
    out = drain_candidates(pods)
    assert out["evict"] == [{"namespace": "a", "name": "bare"}, {"namespace": "a", "name": "web-1"}]
    assert out["unmanaged"] == [{"namespace": "a", "name": "bare"}]
    assert out["daemonset"] == [{"namespace": "kube-system", "name": "proxy"}]
    assert out["mirror"] == [{"namespace": "kube-system", "name": "etcd-n1"}]


def test_with_defaults_fills_what_a_crd_defaults_recursively_and_leaves_the_rest():
    schema = {
        "type": "object",
        "properties": {
            "agent": {"type": "object", "default": {}, "properties": {"on": {"type": "boolean", "default": True}}},
            "pin": {"type": "boolean", "default": True},
            "types": {
                "type": "array",
                "items": {"type": "object", "properties": {"prio": {"type": "string", "default": "high"}}},
            },
            "named": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"n": {"default": 1}}},
            },
        },
    }
    value = {"pin": False, "types": [{"name": "a"}, {"prio": "low"}], "named": {"x": {}}, "other": None}
    assert with_defaults(value, schema) == {
        "agent": {"on": True},  # a default is itself defaulted
        "pin": False,
        "types": [{"name": "a", "prio": "high"}, {"prio": "low"}],
        "named": {"x": {"n": 1}},
        "other": None,
    }
    assert value["types"][0] == {"name": "a"}  # the input is not changed
