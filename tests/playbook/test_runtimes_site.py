"""Each runtime through the whole job against the real API server: site.yml, a second run, uninstall.yml.

Two fixture-root nodes, one real kube-apiserver (tests/k8s_real.py). For the
default runtime (cmk) and for CPU-Pooler and the two NRI policies, a second
run of site.yml changes nothing and sends no write request (the server's
audit log). For the runtimes other than cmk the node gets its kernel
arguments and the runtime its configuration and label; the cmk agent, its
state and the cmk label are not installed; uninstall removes what the
runtime's stage added.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cpupools.planning.runtimes import NRI_GROUP_LABEL, POOLER_CONFIGMAP, POOLER_LABEL
from helpers import REPO
from k8s_real import PRODUCT_USER, describe
from runtime_rules import NRI_KINDS, nri_crd, nri_errors
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

CMK_LABEL = "cmk.intel.com/cmk-node"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@pytest.fixture
def kube(real_kube, tmp_path):
    """``(real, nodes, namespace)``: two fresh Nodes and a namespace for the runtimes' configuration."""
    nodes = [real_kube.unique("site") for _ in range(2)]
    for node in nodes:
        real_kube.add_node(node)
    ns = real_kube.namespace(real_kube.unique("site"))
    yield real_kube, nodes, ns
    for node in nodes:
        real_kube.delete_node(node)
    for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
        real_kube.request("DELETE", f"{ADMISSION}/{plural}/cpupools-cmk-inject")


def inventory(tmp_path: Path, real, nodes: list[str], ns: str, runtime: str) -> tuple[str, dict[str, Path]]:
    kubeconfig = real.kubeconfig(tmp_path / "kubeconfig", token=real.product_token)
    roots = {}
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for node in nodes:
        root = tmp_path / node
        write_tree(str(root), CORPUS["2s8c-2numa"])
        roots[node] = root
        lines += [
            f"        {node}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_root: {root}",
        ]
    lines += [
        "  vars:",
        f"    cpupools_runtime: {runtime}",
        f"    cpupools_runtime_namespace: {ns}",
        "    cpupools_kernel_args_backend: grub",
        "    cpupools_isolated_pools: [exclusive]",
        f"    cpupools_k8s_kubeconfig: {kubeconfig}",
        f"    cpupools_report_html: {tmp_path / 'report.html'}",
    ]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path), roots


def converge_twice(playbook, real, inv, nodes):
    """Run site.yml twice; the second run changes nothing and writes nothing to the cluster."""
    site = playbook(REPO / "site.yml", None, inventory=inv)
    assert site.rc == 0, site.messages() + site.stderr[-2000:]
    mark = real.audit_mark()
    again = playbook(REPO / "site.yml", None, inventory=inv)
    assert again.rc == 0, again.messages()
    assert {node: again.changed(node) for node in nodes} == dict.fromkeys(nodes, 0), again.stdout[-3000:]
    writes = [describe(e) for e in real.audit_writes(mark, PRODUCT_USER)]
    assert writes == [], writes


def test_site_converges_the_cmk_runtime_and_a_second_run_writes_nothing(playbook, tmp_path, kube):
    real, nodes, ns = kube
    inv, _ = inventory(tmp_path, real, nodes, ns, "cmk")
    converge_twice(playbook, real, inv, nodes)
    for node in nodes:
        stored = real.node(node)
        assert stored["metadata"]["labels"][CMK_LABEL] == "true"
        assert stored["status"]["capacity"]["cmk.intel.com/exclusive-cores"].isdigit()
        assert real.get(f"/apis/cpupools.io/v1/cpupoollayouts/{node}") is not None
    assert real.get(f"{ADMISSION}/mutatingadmissionpolicies/cpupools-cmk-inject") is not None


@pytest.mark.parametrize("runtime", ["cpu-pooler", "nri-topology-aware", "nri-balloons"])
def test_site_configures_the_runtime_then_changes_nothing_and_uninstall_removes_it(playbook, tmp_path, kube, runtime):
    real, nodes, ns = kube
    crds = [nri_crd(kind) for kind in NRI_KINDS]
    for crd in crds:
        real.ensure_crd(crd)
    try:
        inv, roots = inventory(tmp_path, real, nodes, ns, runtime)
        converge_twice(playbook, real, inv, nodes)
        for node, root in roots.items():
            stored = real.node(node)
            labels = stored["metadata"]["labels"]
            assert CMK_LABEL not in labels, labels  # no cmk pieces on a node of another runtime
            assert "cmk.intel.com/exclusive-cores" not in stored.get("status", {}).get("capacity", {})
            assert not (root / "opt/bin/cmk").exists() and not (root / "etc/cmk").exists()
            assert "isolcpus=" in (root / "etc/default/grub.d/99-cpupools.cfg").read_text()
            label = POOLER_LABEL if runtime == "cpu-pooler" else NRI_GROUP_LABEL
            assert labels.get(label, "").startswith("cpupools-"), labels
        if runtime == "cpu-pooler":
            files = real.get(f"/api/v1/namespaces/{ns}/configmaps/{POOLER_CONFIGMAP}")["data"]
            assert len(files) == 1  # both nodes have the same plan: one group
        else:
            kind = "BalloonsPolicy" if runtime == "nri-balloons" else "TopologyAwarePolicy"
            objects = real.get(f"/apis/config.nri/v1alpha1/namespaces/{ns}/{NRI_KINDS[kind][0]}")["items"]
            assert len(objects) == 1 and nri_errors(objects[0]) == []

        gone = playbook(REPO / "playbooks" / "uninstall.yml", None, inventory=inv)
        assert gone.rc == 0, gone.messages() + gone.stderr[-2000:]
        for node, root in roots.items():
            labels = real.node(node)["metadata"]["labels"]
            assert POOLER_LABEL not in labels and NRI_GROUP_LABEL not in labels
            assert not (root / "etc/default/grub.d/99-cpupools.cfg").exists()
        assert real.get(f"/api/v1/namespaces/{ns}/configmaps/{POOLER_CONFIGMAP}") is None
        for kind in NRI_KINDS:
            assert real.get(f"/apis/config.nri/v1alpha1/namespaces/{ns}/{NRI_KINDS[kind][0]}")["items"] == []
    finally:
        for crd in crds:
            real.delete_crd(crd["metadata"]["name"])
