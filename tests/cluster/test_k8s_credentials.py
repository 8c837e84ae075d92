"""Credentials as a real cluster holds them: Node,RBAC authorization and the NodeRestriction admission plugin.

- the node agent re-advertises with its kubelet's client certificate
  (``CN=system:node:<name>, O=system:nodes``), and the server refuses it
  anything of another node;
- the ClusterRole docs/kubernetes.md gives the controller is enough for a
  run of the ``cpupools_k8s`` role (node, layout and its CRD, the pod
  injection policy), a drain and an uninstall: the audit log shows no 403.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys

import pytest
import yaml
from cpupools.cluster.k8s_advertise import readvertise
from helpers import REPO
from k8s_real import CONTROLLER_USER, describe

EXCL = "cmk.intel.com/exclusive-cores"
ENI = "cmk.intel.com/exclusive-non-isolcpus-cores"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def status_writes(cluster, user):
    return [(e["verb"], e["requestURI"]) for e in cluster.writes(user)]


def test_the_agent_readvertises_with_its_kubelets_certificate_and_nothing_of_another_node(cluster):
    node, other = cluster.node, cluster.add_node()
    kubelet_conf = cluster.kubeconfig("kubelet.conf", node=node, inline_ca=True)
    report = readvertise(str(kubelet_conf), node, {EXCL: 6, ENI: 0})
    assert report["enabled"] and report["changed"] and "error" not in report, report
    assert report["before"] == {} and report["after"] == {EXCL: "6"}
    stored = cluster.real.node(node)
    assert stored["status"]["capacity"][EXCL] == "6" and stored["status"]["allocatable"][EXCL] == "6"
    assert ENI not in stored["status"]["capacity"]
    assert status_writes(cluster, f"system:node:{node}") == [("patch", f"/api/v1/nodes/{node}/status")]
    again = readvertise(str(kubelet_conf), node, {EXCL: 6})
    assert again["changed"] is False and len(cluster.writes(f"system:node:{node}")) == 1
    # The Node authorizer: this kubelet may not even read the other node (403, not 404) ...
    refused = readvertise(str(kubelet_conf), other, {EXCL: 6})
    assert f"node '{other}' on API server {cluster.url}" in refused["error"] and "403" in refused["error"]
    assert (
        f"the credentials of the kubelet of node '{node}', which may read and patch only its own Node"
        in refused["error"]
    )
    assert "see docs/kubernetes.md" not in refused["error"]  # not the controller's RBAC list: it would mislead
    # ... nor patch it (NodeRestriction), whatever it read
    patch = [{"op": "add", "path": "/status/capacity/cmk.intel.com~1exclusive-cores", "value": "6"}]
    resp = cluster.real.request(
        "PATCH", f"/api/v1/nodes/{other}/status", patch, content_type="application/json-patch+json", node=node
    )
    assert resp.status == 403, resp.body
    assert EXCL not in cluster.real.node(other)["status"]["capacity"]
    assert [e for e in cluster.writes(f"system:node:{node}") if e["responseStatus"]["code"] < 300] == (
        cluster.writes(f"system:node:{node}")[:1]
    )


def test_a_zeroed_count_is_repaired_and_separate_cert_files_work(cluster):
    conf = cluster.kubeconfig("kubelet.conf", node=cluster.node, separate_key=True)
    zeroed = {"status": {"capacity": {EXCL: "0"}}}  # what a kubelet restart does to resources it does not manage
    cluster.real.ok(
        "PATCH", f"/api/v1/nodes/{cluster.node}/status", zeroed, content_type="application/merge-patch+json"
    )
    report = readvertise(str(conf), cluster.node, {EXCL: 4})
    assert report["changed"] and cluster.real.node(cluster.node)["status"]["capacity"][EXCL] == "4", report


def test_a_server_we_do_not_trust_is_an_error_not_a_traceback(cluster, pki):
    conf = cluster.kubeconfig("kubelet.conf", node=cluster.node, ca=pki["ca"])  # another CA than the server's
    report = readvertise(str(conf), cluster.node, {EXCL: 6})
    assert report["changed"] is False and f"cannot reach the API server {cluster.url}" in report["error"]
    assert cluster.writes(f"system:node:{cluster.node}") == []


def test_inline_client_cert_data(cluster):
    import base64

    creds = cluster.real.node_credentials(cluster.node)
    conf = cluster.kubeconfig("inline.conf", node=cluster.node)
    text = conf.read_text().replace(
        f"    client-certificate: {creds.pem}\n    client-key: {creds.pem}\n",
        f"    client-certificate-data: {base64.b64encode(creds.cert.read_bytes()).decode()}\n"
        f"    client-key-data: {base64.b64encode(creds.key.read_bytes()).decode()}\n",
    )
    conf.write_text(text)
    assert "client-certificate-data" in text
    assert readvertise(str(conf), cluster.node, {EXCL: 2})["changed"] is True


def test_off_without_a_kubeconfig(tmp_path):
    report = readvertise(str(tmp_path / "kubelet.conf"), "node-1", {EXCL: 6})
    assert report["enabled"] is False and "re-advertising is off" in report["reason"]


def test_the_advertiser_imports_no_third_party_module():
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'plugins' / 'module_utils')!r}); "
        "import cpupools.cluster.k8s_advertise; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'yaml', 'urllib3', 'ansible')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# The controller's RBAC, as docs/kubernetes.md gives it -------------------------------------------


def documented_cluster_role() -> dict:
    """The ClusterRole of docs/kubernetes.md's "Required RBAC" section, as the operator would apply it."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    section = text[text.index("## Required RBAC") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    role = yaml.safe_load(block)
    assert role["kind"] == "ClusterRole" and role["rules"], role
    return role


ROLE_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_k8s
"""
DRAIN_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Drain
      ansible.builtin.include_role:
        name: cpupools_k8s
        tasks_from: drain
    - name: Stand in for the node's kubelet after a reboot (its first status, a newer Ready)
      ansible.builtin.uri:
        url: "{{ node_api }}/api/v1/nodes/{{ inventory_hostname }}/status"
        method: PATCH
        client_cert: "{{ node_cert }}"
        client_key: "{{ node_key }}"
        ca_path: "{{ node_ca }}"
        headers: {Content-Type: application/strategic-merge-patch+json}
        body_format: json
        body:
          status:
            conditions:
              - {type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "{{ node_heartbeat }}"}
      delegate_to: localhost
    - name: Uncordon
      ansible.builtin.include_role:
        name: cpupools_k8s
        tasks_from: uncordon
"""


def kubelet_stand_in(real, node: str) -> dict:
    """What DRAIN_PLAY's stand-in for the node's restarted kubelet posts with: its credentials, a later heartbeat."""
    creds = real.node_credentials(node)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)
    return {
        "node_api": real.url,
        "node_cert": str(creds.cert),
        "node_key": str(creds.key),
        "node_ca": str(real.pki.ca),
        "node_heartbeat": later.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@pytest.fixture
def controller(cluster, no_admission):
    """The ``cpupools`` user bound to docs/kubernetes.md's ClusterRole, and a kubeconfig for it."""
    real = cluster.real
    name = real.unique("cpupools")
    real.bind_cluster_role(name, documented_cluster_role(), CONTROLLER_USER)
    real.delete_crd("cpupoollayouts.cpupools.io")  # so the run creates it, as on a new cluster
    yield cluster.kubeconfig("controller.conf", token=real.controller_token)
    real.request("DELETE", f"{RBAC}/clusterrolebindings/{name}")
    real.request("DELETE", f"{RBAC}/clusterroles/{name}")


def test_the_documented_rbac_is_enough_for_a_whole_run_without_one_403(playbook, cluster, controller, make_plan):
    real, node = cluster.real, cluster.node
    # A finished pod on the node, owned by a ReplicaSet: the drain evicts it (a finished pod goes at once).
    ns = real.namespace(real.unique("shop"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job-0",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "job", "uid": "0f0e", "controller": True}
            ],
        },
        "spec": {"nodeName": node, "automountServiceAccountToken": False, "containers": [{"name": "c", "image": "x"}]},
    }
    real.ok("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    status = {"status": {"phase": "Succeeded"}}
    real.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/job-0/status", status, content_type="application/merge-patch+json")
    inventory = cluster.tmp_path / "hosts.ini"
    inventory.write_text(f"{node} ansible_connection=local\n")
    extra = {"cpupools_plan": make_plan(), "cpupools_k8s_kubeconfig": str(controller), "cpupools_k8s_drain_timeout": 30}
    # A converged run and check mode send only reads the first run sent too; these three cover every verb.
    runs = {
        "first": playbook(ROLE_PLAY, extra, inventory=str(inventory)),
        "drain": playbook(DRAIN_PLAY, {**extra, **kubelet_stand_in(real, node)}, inventory=str(inventory)),
        "uninstall": playbook(ROLE_PLAY, dict(extra, cpupools_state="absent"), inventory=str(inventory)),
    }
    for name, res in runs.items():
        assert res.rc == 0, (name, res.messages() or res.stdout[-3000:])
    assert runs["first"].changed(node) == 2
    events = cluster.events(CONTROLLER_USER)
    refused = [describe(e) for e in events if e["responseStatus"]["code"] in (401, 403)]
    assert refused == [], refused
    verbs = {
        (e["verb"], e["objectRef"]["resource"], e["objectRef"].get("subresource")) for e in events if "objectRef" in e
    }
    # The run did use what the role grants: each of these went through.
    assert {
        ("patch", "nodes", None),
        ("patch", "nodes", "status"),
        ("create", "customresourcedefinitions", None),
        ("create", "cpupoollayouts", None),
        ("create", "mutatingadmissionpolicies", None),
        ("list", "nodes", None),
        ("create", "pods", "eviction"),
        ("delete", "cpupoollayouts", None),
        ("delete", "mutatingadmissionpolicies", None),
    } <= verbs, sorted(verbs, key=str)
    assert real.get(f"/api/v1/namespaces/{ns}/pods/job-0") is None
