"""The fake API server's own behaviour, pinned where a real kube-apiserver (v1.36) is stricter than a naive fake.

Each test speaks HTTP to the running fake, as a client would, and checks one
rule of the real server that the tests still on the fake rely on (a writer or
a 409 at a chosen moment, a CRD held unestablished, an older server, drains
without a kubelet or a disruption controller). Every other Kubernetes test
runs against the real server (tests/k8s_real.py); moving them there showed
where the fake had answered otherwise, and those answers are the real
server's now (the reported name conflict, for one).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from cpupools.cluster.k8s import layout_crd
from helpers import wait_for
from k8s_fake import FakeKube
from k8s_support import TOKEN

NODE_TOKEN = "tok-kubelet-node-1"
LAYOUTS = "/apis/cpupools.io/v1/cpupoollayouts"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def kube():
    with FakeKube(token=TOKEN, tokens={NODE_TOKEN: "system:node:node-1"}, crd_establish_delay=0.3) as fake:
        fake.add_node("node-1")
        fake.add_node("node-2")
        yield fake


def call(kube, method, path, body=None, ctype="application/json", token=TOKEN):
    """``(status, parsed body or text, headers)``."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(kube.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read(), exc.headers
    text = raw.decode()
    parsed = json.loads(text) if headers.get("Content-Type", "").startswith("application/json") else text
    return status, parsed, headers


def wait_established(kube, name, deadline=10.0):
    def established() -> bool:
        conditions = {c["type"]: c["status"] for c in call(kube, "GET", f"{CRDS}/{name}")[1]["status"]["conditions"]}
        return conditions.get("Established") == "True"

    wait_for(established, f"{name} not Established within {deadline}s", deadline)


def layout(name="node-1", **spec):
    return {
        "apiVersion": "cpupools.io/v1",
        "kind": "CpuPoolLayout",
        "metadata": {"name": name},
        "spec": {"node": name, "poolCpus": {"exclusive": "1-3"}, **spec},
    }


def conditions(crd):
    return {c["type"]: (c["status"], c["reason"]) for c in crd["status"]["conditions"]}


def test_it_reports_the_version_it_imitates(kube):
    status, body, _ = call(kube, "GET", "/version")
    assert status == 200 and body["gitVersion"].startswith("v1.36.") and (body["major"], body["minor"]) == ("1", "36")
    assert kube.nodes["node-1"]["status"]["nodeInfo"]["kubeletVersion"] == body["gitVersion"]


def test_a_new_crd_is_established_only_later_and_its_group_served_only_then(kube):
    status, crd, _ = call(kube, "POST", CRDS, layout_crd())
    assert status == 201
    assert conditions(crd) == {"NamesAccepted": ("True", "NoConflicts"), "Established": ("False", "Installing")}
    status, text, headers = call(kube, "GET", LAYOUTS)
    assert status == 404 and text == "404 page not found\n" and headers["Content-Type"].startswith("text/plain")
    assert call(kube, "POST", LAYOUTS, layout())[0] == 404
    wait_established(kube, "cpupoollayouts.cpupools.io")
    assert call(kube, "POST", LAYOUTS, layout())[0] == 201


def test_a_crd_whose_kind_is_taken_in_its_group_is_not_accepted_nor_served(kube):
    other = layout_crd()
    other["metadata"]["name"] = "pools.cpupools.io"
    other["spec"]["names"] = {"kind": "CpuPoolLayout", "plural": "pools", "singular": "pool"}
    kube.add_crd(other)
    status, crd, _ = call(kube, "POST", CRDS, layout_crd())
    assert status == 201
    assert conditions(crd) == {"NamesAccepted": ("False", "ListKindConflict"), "Established": ("False", "NotAccepted")}
    assert {c["message"] for c in crd["status"]["conditions"]} == {
        '"CpuPoolLayoutList" is already in use',
        "not all names are accepted",
    }
    time.sleep(0.5)  # longer than the establish delay: a conflict never gets Established
    assert call(kube, "GET", LAYOUTS)[:2] == (404, "404 page not found\n")
    assert call(kube, "DELETE", f"{CRDS}/pools.cpupools.io")[0] == 200
    wait_established(kube, "cpupoollayouts.cpupools.io")  # the naming controller accepts the freed names


def test_a_non_structural_schema_is_refused(kube):
    crd = layout_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["extra"] = {
        "description": "no type"
    }
    status, body, _ = call(kube, "POST", CRDS, crd)
    assert status == 422
    assert "properties[spec].properties[extra].type: Required value: must not be empty" in body["message"]
    assert kube.crds == {}


def test_no_op_writes_bump_neither_resource_version_nor_generation(kube):
    node_rv = kube.nodes["node-1"]["metadata"]["resourceVersion"]
    same = {"metadata": {"labels": {"kubernetes.io/hostname": "node-1"}}}
    assert call(kube, "PATCH", "/api/v1/nodes/node-1", same, MERGE)[1]["metadata"]["resourceVersion"] == node_rv
    crd = kube.add_crd(layout_crd())
    status, put, _ = call(kube, "PUT", f"{CRDS}/{crd['metadata']['name']}", crd)
    assert status == 200 and put["metadata"]["resourceVersion"] == crd["metadata"]["resourceVersion"]
    assert put["metadata"]["generation"] == 1
    created = call(kube, "POST", LAYOUTS, layout())[1]
    status, again, _ = call(kube, "PUT", f"{LAYOUTS}/node-1", created)
    assert status == 200 and again["metadata"] == created["metadata"]
    relabelled = call(kube, "PATCH", f"{LAYOUTS}/node-1", {"metadata": {"labels": {"a": "b"}}}, MERGE)[1]
    assert relabelled["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert relabelled["metadata"]["generation"] == 1  # metadata is not spec
    changed = call(kube, "PATCH", f"{LAYOUTS}/node-1", {"spec": {"mode": "adopt"}}, MERGE)[1]
    assert changed["metadata"]["generation"] == 2


def test_strategic_merge_replaces_the_taint_list(kube):
    taints = [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]
    call(kube, "PATCH", "/api/v1/nodes/node-1", {"spec": {"taints": taints}}, STRATEGIC)
    status, node, _ = call(kube, "PATCH", "/api/v1/nodes/node-1", {"spec": {"taints": [taints[1]]}}, STRATEGIC)
    assert status == 200 and node["spec"]["taints"] == [taints[1]]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"metadata": {"labels": {"tier": "gold!"}}}, 'metadata.labels: Invalid value: "gold!"'),
        ({"metadata": {"labels": {"bad key": "x"}}}, 'metadata.labels: Invalid value: "bad key"'),
        ({"spec": {"taints": [{"key": "bad key", "effect": "NoSchedule"}]}}, "spec.taints[0].key: Invalid value"),
        ({"spec": {"taints": [{"key": "a", "value": "b c", "effect": "NoSchedule"}]}}, "spec.taints[0].value: Invalid"),
        ({"spec": {"taints": [{"key": "a", "effect": "NoRun"}]}}, 'spec.taints[0].effect: Unsupported value: "NoRun"'),
        ({"status": {"capacity": {"example.com/cores": "1.5"}}}, "must be an integer"),
        ({"status": {"capacity": {"example.com/cores": "500m"}}}, "must be an integer"),
    ],
)
def test_node_validation(kube, patch, message):
    path = "/api/v1/nodes/node-1" + ("/status" if "status" in patch else "")
    status, body, _ = call(kube, "PATCH", path, patch, MERGE)
    assert status == 422 and message in body["message"], body


def test_capacity_is_canonical_and_copied_into_a_missing_allocatable(kube):
    kube.add_node("bare", with_capacity=False)
    status, node, _ = call(
        kube, "PATCH", "/api/v1/nodes/bare/status", {"status": {"capacity": {"x.io/c": "6.0"}}}, MERGE
    )
    assert status == 200
    assert node["status"]["capacity"] == {"x.io/c": "6"} and node["status"]["allocatable"] == {"x.io/c": "6"}


def test_a_new_node_gets_the_not_ready_taint(kube):
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-3"}}
    status, node, _ = call(kube, "POST", "/api/v1/nodes", body)
    assert status == 201 and [t["key"] for t in node["spec"]["taints"]] == ["node.kubernetes.io/not-ready"]
    assert [t["key"] for t in kube.add_node("node-4", ready=False)["spec"]["taints"]] == [
        "node.kubernetes.io/not-ready"
    ]
    assert "taints" not in kube.nodes["node-1"]["spec"]  # registered and Ready: the node controller removed it


def test_custom_objects_are_pruned_and_coerced_like_a_real_server(kube):
    kube.add_crd(layout_crd())
    body = layout(counts={"exclusive": 6.0}, mode=None, bogus=1)
    status, obj, headers = call(kube, "POST", LAYOUTS, body)
    assert status == 201
    assert obj["spec"]["counts"] == {"exclusive": 6} and "mode" not in obj["spec"] and "bogus" not in obj["spec"]
    assert headers.get_all("Warning") == ['299 - "unknown field \\"spec.bogus\\""']
    status, body_text, _ = call(kube, "POST", LAYOUTS + "?fieldValidation=Strict", layout("n2", bogus=1))
    assert status == 400 and 'unknown field "spec.bogus"' in body_text["message"]
    status, body_text, _ = call(kube, "POST", LAYOUTS, layout("n3", counts={"exclusive": 6.5}))
    assert status == 422 and "must be of type integer" in body_text["message"]


def test_dry_run_stores_nothing(kube):
    kube.add_crd(layout_crd())
    rv = kube.nodes["node-1"]["metadata"]["resourceVersion"]
    assert call(kube, "POST", LAYOUTS + "?dryRun=All", layout())[0] == 201
    assert call(kube, "GET", f"{LAYOUTS}/node-1")[0] == 404
    patch = {"metadata": {"labels": {"tier": "gold"}}}
    status, node, _ = call(kube, "PATCH", "/api/v1/nodes/node-1?dryRun=All", patch, MERGE)
    assert status == 200 and node["metadata"]["labels"]["tier"] == "gold"
    assert "tier" not in kube.nodes["node-1"]["metadata"]["labels"]
    assert kube.nodes["node-1"]["metadata"]["resourceVersion"] == rv


def test_a_create_carrying_a_resource_version_is_refused(kube):
    kube.add_crd(layout_crd())
    body = layout()
    body["metadata"]["resourceVersion"] = "5"
    status, answer, _ = call(kube, "POST", LAYOUTS, body)
    assert status == 400 and answer["message"] == "resourceVersion should not be set on objects to be created"
    assert kube.objects == {}


def evict(kube, namespace, name):
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    return call(kube, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)


def test_a_budget_counts_healthy_pods_and_names_itself_when_it_refuses(kube):
    kube.add_pod("shop", "db-0", "node-1", labels={"app": "db"})
    kube.add_pod("shop", "db-1", "node-2", labels={"app": "db"}, ready=False)  # Running, not Ready
    kube.add_pdb("shop", "db-budget", {"app": "db"}, min_available=1)
    status, body, _ = evict(kube, "shop", "db-0")
    assert status == 429 and body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget db-budget needs 1 healthy pods and has 1 currently",
        }
    ]
    assert evict(kube, "shop", "db-1")[0] == 201  # an unhealthy pod may go while the budget holds
    kube.add_pod("shop", "db-2", "node-2", labels={"app": "db"})
    assert evict(kube, "shop", "db-0")[0] == 201  # now two healthy, one may go


def test_a_pending_pod_is_evicted_whatever_its_budget_says(kube):
    kube.add_pod("shop", "db-0", "node-1", labels={"app": "db"}, phase="Pending", ready=False)
    kube.add_pdb("shop", "db-budget", {"app": "db"}, min_available=1)
    assert evict(kube, "shop", "db-0")[0] == 201


def test_field_selectors_on_the_phase(kube):
    kube.add_pod("a", "run", "node-1")
    kube.add_pod("a", "wait", "node-1", phase="Pending", ready=False)
    kube.add_pod("a", "done", "node-1", phase="Succeeded", ready=False)

    def names(selector):
        status, body, _ = call(kube, "GET", f"/api/v1/pods?fieldSelector={selector}")
        assert status == 200, body
        return [p["metadata"]["name"] for p in body["items"]]

    assert names("status.phase=Pending") == ["wait"]
    assert names("spec.nodeName=node-1,status.phase!=Succeeded,status.phase!=Failed") == ["run", "wait"]
    assert names("status.phase==Running") == ["run"]
    assert call(kube, "GET", "/api/v1/pods?fieldSelector=spec.image=x")[0] == 400


def test_node_credentials_reach_only_their_own_node(kube):
    own = "/api/v1/nodes/node-1"
    assert call(kube, "GET", own, token=NODE_TOKEN)[0] == 200
    capacity = {"status": {"capacity": {"x.io/c": "2"}}}
    assert call(kube, "PATCH", own + "/status", capacity, MERGE, token=NODE_TOKEN)[0] == 200
    status, body, _ = call(kube, "GET", "/api/v1/nodes/node-2", token=NODE_TOKEN)
    assert status == 403 and 'User "system:node:node-1" cannot get resource "nodes"' in body["message"]
    status, body, _ = call(kube, "PATCH", "/api/v1/nodes/node-2/status", capacity, MERGE, token=NODE_TOKEN)
    assert status == 403 and 'node "node-1" is not allowed to modify node "node-2"' in body["message"]
    assert "x.io/c" not in kube.nodes["node-2"]["status"]["capacity"]
    taint = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    assert call(kube, "PATCH", own, taint, MERGE, token=NODE_TOKEN)[0] == 403
    status, body, _ = call(kube, "GET", CRDS, token=NODE_TOKEN)
    assert status == 403 and 'cannot list resource "customresourcedefinitions"' in body["message"]
    assert call(kube, "GET", own, token="wrong")[0] == 401
