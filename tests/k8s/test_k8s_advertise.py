"""The node agent's re-advertiser (stdlib only) against the fake over HTTPS with a kubelet client certificate."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from cpupools.k8s_advertise import readvertise
from k8s_fake import FakeKube, make_pki, write_kubeconfig

EXCL = "cmk.intel.com/exclusive-cores"
ENI = "cmk.intel.com/exclusive-non-isolcpus-cores"


@pytest.fixture
def tls_fake(pki):
    with FakeKube(tls=(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca"]))) as kube:
        kube.add_node("node-1", taints=[{"key": "cmk", "value": "true", "effect": "NoSchedule"}])
        yield kube


@pytest.fixture
def kubelet_conf(tmp_path, tls_fake, pki):
    """Like kubeadm's /etc/kubernetes/kubelet.conf: CA inline, cert+key in one rotated PEM file."""
    ca = base64.b64encode(pki["ca"].read_bytes()).decode()
    return write_kubeconfig(
        tmp_path / "kubelet.conf",
        tls_fake.url,
        cluster={"certificate-authority-data": ca},
        user={"client-certificate": str(pki["client_pem"]), "client-key": str(pki["client_pem"])},
    )


def test_readvertises_after_kubelet_dropped_them_and_then_leaves_them_alone(tls_fake, kubelet_conf):
    report = readvertise(str(kubelet_conf), "node-1", {EXCL: 6, ENI: 0})
    assert report["enabled"] and report["changed"] and "error" not in report, report
    assert report["before"] == {} and report["after"] == {EXCL: "6"}
    node = tls_fake.nodes["node-1"]
    assert node["status"]["capacity"][EXCL] == "6" and ENI not in node["status"]["capacity"]
    assert node["spec"]["taints"] == [{"key": "cmk", "value": "true", "effect": "NoSchedule"}]
    writes = tls_fake.writes()
    assert [(w.method, w.path, w.user) for w in writes] == [
        ("PATCH", "/api/v1/nodes/node-1/status", "system:node:node-1")
    ]
    again = readvertise(str(kubelet_conf), "node-1", {EXCL: 6})
    assert again["changed"] is False and len(tls_fake.writes()) == 1


def test_a_zeroed_count_is_repaired(tls_fake, kubelet_conf):
    tls_fake.nodes["node-1"]["status"]["capacity"][EXCL] = "0"  # kubelet restart zeroes unmanaged resources
    report = readvertise(str(kubelet_conf), "node-1", {EXCL: 4})
    assert report["changed"] and tls_fake.nodes["node-1"]["status"]["capacity"][EXCL] == "4"


def test_inline_client_cert_data_and_separate_files(tmp_path, tls_fake, pki):
    inline = write_kubeconfig(
        tmp_path / "inline.conf",
        tls_fake.url,
        cluster={"certificate-authority": str(pki["ca"])},
        user={
            "client-certificate-data": base64.b64encode(pki["client_cert"].read_bytes()).decode(),
            "client-key-data": base64.b64encode(pki["client_key"].read_bytes()).decode(),
        },
    )
    assert readvertise(str(inline), "node-1", {EXCL: 2})["changed"] is True


def test_off_without_a_kubeconfig(tmp_path):
    report = readvertise(str(tmp_path / "kubelet.conf"), "node-1", {EXCL: 6})
    assert report["enabled"] is False and "re-advertising is off" in report["reason"]


def test_a_server_we_do_not_trust_is_an_error_not_a_traceback(tmp_path, tls_fake, pki):
    other = make_pki(tmp_path / "other")
    conf = write_kubeconfig(
        tmp_path / "kubelet.conf",
        tls_fake.url,
        cluster={"certificate-authority": str(other["ca"])},
        user={"client-certificate": str(pki["client_pem"]), "client-key": str(pki["client_pem"])},
    )
    report = readvertise(str(conf), "node-1", {EXCL: 6})
    assert report["changed"] is False and f"cannot reach the API server {tls_fake.url}" in report["error"]
    assert tls_fake.writes() == []


def test_another_node_name_is_forbidden_to_the_kubelet_credentials(tls_fake, kubelet_conf):
    # The Node authorizer: node-1's kubelet may not even read node-7 (a real server answers 403, not 404).
    tls_fake.add_node("node-7")
    report = readvertise(str(kubelet_conf), "node-7", {EXCL: 6})
    assert "node 'node-7' on API server " + tls_fake.url in report["error"] and "403" in report["error"]
    assert (
        "the credentials of the kubelet of node 'node-1', which may read and patch only its own Node" in report["error"]
    )
    assert "see docs/kubernetes.md" not in report["error"]  # not the controller's RBAC list: it would mislead
    assert tls_fake.writes() == []


def test_the_advertiser_imports_no_third_party_module():
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / 'plugins' / 'module_utils')!r}); "
        "import cpupools.k8s_advertise; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'yaml', 'urllib3', 'ansible')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
