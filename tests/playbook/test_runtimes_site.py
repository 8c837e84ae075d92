"""Each runtime through the whole job: site.yml, a second run, uninstall.yml (issue 16).

Two fixture-root nodes, one Kubernetes fake. For CPU-Pooler and the two NRI
policies the node gets its kernel arguments and the runtime its
configuration and label; the cmk agent, its state and the cmk label are not
installed; a second run changes nothing; uninstall removes what the runtime's
stage added.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cpupools.runtimes import NRI_GROUP_LABEL, POOLER_CONFIGMAP, POOLER_LABEL
from helpers import REPO
from runtime_rules import nri_crd, nri_errors
from sysfs import CORPUS, write_tree

sys.path.insert(0, str(REPO / "tests"))
from k8s_fake import FakeKube, write_kubeconfig

pytestmark = pytest.mark.slow

NODES = ("node-1", "node-2")
CMK_LABEL = "cmk.intel.com/cmk-node"


def inventory(tmp_path: Path, kube: FakeKube, runtime: str) -> tuple[str, dict[str, Path]]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, token="tok")
    roots = {}
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for node in NODES:
        root = tmp_path / node
        write_tree(str(root), CORPUS["2s8c-2numa"])
        roots[node] = root
        lines += [
            f"        {node}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_root: {root}",
            f"          cpupools_k8s_node_name: {node}",
        ]
    lines += [
        "  vars:",
        f"    cpupools_runtime: {runtime}",
        "    cpupools_kernel_args_backend: grub",
        "    cpupools_isolated_pools: [exclusive]",
        f"    cpupools_k8s_kubeconfig: {kubeconfig}",
        f"    cpupools_report_html: {tmp_path / 'report.html'}",
    ]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path), roots


@pytest.mark.parametrize("runtime", ["cpu-pooler", "nri-topology-aware", "nri-balloons"])
def test_site_configures_the_runtime_then_changes_nothing_and_uninstall_removes_it(playbook, tmp_path, runtime):
    with FakeKube(token="tok") as kube:
        for node in NODES:
            kube.add_node(node)
        for kind in ("BalloonsPolicy", "TopologyAwarePolicy"):
            crd = nri_crd(kind)
            kube.add_crd_raw(crd["metadata"]["name"], crd)
        inv, roots = inventory(tmp_path, kube, runtime)

        site = playbook(REPO / "site.yml", None, inventory=inv)
        assert site.rc == 0, site.messages() + site.stderr[-2000:]
        for node, root in roots.items():
            labels = kube.nodes[node]["metadata"]["labels"]
            assert CMK_LABEL not in labels, labels  # no cmk pieces on a node of another runtime
            assert "cmk.intel.com/exclusive-cores" not in kube.nodes[node].get("status", {}).get("capacity", {})
            assert not (root / "opt/bin/cmk").exists() and not (root / "etc/cmk").exists()
            assert "isolcpus=" in (root / "etc/default/grub.d/99-cpupools.cfg").read_text()
            label = POOLER_LABEL if runtime == "cpu-pooler" else NRI_GROUP_LABEL
            assert labels.get(label, "").startswith("cpupools-"), labels
        if runtime == "cpu-pooler":
            files = kube.resources[("v1", "configmaps", "kube-system", POOLER_CONFIGMAP)]["data"]
            assert len(files) == 1  # both nodes have the same plan: one group
        else:
            objects = [v for k, v in kube.resources.items() if k[0] == "config.nri/v1alpha1"]
            assert len(objects) == 1 and nri_errors(objects[0]) == []

        again = playbook(REPO / "site.yml", None, inventory=inv)
        assert again.rc == 0, again.messages()
        assert {node: again.changed(node) for node in NODES} == dict.fromkeys(NODES, 0), again.stdout[-3000:]

        gone = playbook(REPO / "playbooks" / "uninstall.yml", None, inventory=inv)
        assert gone.rc == 0, gone.messages() + gone.stderr[-2000:]
        for node, root in roots.items():
            labels = kube.nodes[node]["metadata"]["labels"]
            assert POOLER_LABEL not in labels and NRI_GROUP_LABEL not in labels
            assert not (root / "etc/default/grub.d/99-cpupools.cfg").exists()
        assert not [k for k in kube.resources if k[0] == "config.nri/v1alpha1" or k[3:] == (POOLER_CONFIGMAP,)]
