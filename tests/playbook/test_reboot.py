"""playbooks/reboot.yml: a rolling reboot over sandbox nodes and the fake API server.

A real reboot cannot happen in a sandbox; tests/fixtures/fake_boot.py stands in
for it (cpupools_reboot_simulate_command) and "boots" the node's fixture root
with the arguments cpupools wrote into its GRUB drop-in. The drains go to the
fake, not the real server of the other Kubernetes tests: a test server has no
kubelet to end an evicted pod and no controller manager to compute a
PodDisruptionBudget.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import REPO
from sysfs import CORPUS, write_tree

sys.path.insert(0, str(REPO / "tests"))
from k8s_fake import FakeKube, write_kubeconfig

pytestmark = pytest.mark.slow
NODES = ("node-1", "node-2", "node-3")
EXCL = "cmk.intel.com/exclusive-cores"


@pytest.fixture
def cluster():
    with FakeKube(token="tok") as kube:
        for node in NODES:
            kube.add_node(node)
        yield kube


def fleet(
    tmp_path: Path, kube: FakeKube, broken: str | None = None, how: str = "--broken"
) -> tuple[str, dict[str, Path]]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, token="tok")
    roots = {}
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for node in NODES:
        root = tmp_path / node
        write_tree(str(root), CORPUS["1s8c-smt2"])
        roots[node] = root
        boot = [sys.executable, str(REPO / "tests/fixtures/fake_boot.py")] + ([how] if node == broken else [])
        lines += [
            f"        {node}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_root: {root}",
            f"          cpupools_reboot_simulate_command: {boot}",
        ]
    lines += [
        "  vars:",
        "    cpupools_kernel_args_backend: grub",
        f"    cpupools_k8s_kubeconfig: {kubeconfig}",
        "    cpupools_num_exclusive_cores: 3",
        "    cpupools_num_shared_cores: 1",
        "    cpupools_reboot_serial: 1",
    ]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    return str(inventory), roots


def unschedulable(kube: FakeKube, node: str) -> bool:
    return bool(kube.nodes[node].get("spec", {}).get("unschedulable"))


def test_rollout_reboots_verifies_and_readmits_every_node(playbook, tmp_path, cluster):
    inventory, roots = fleet(tmp_path, cluster)
    res = playbook(REPO / "playbooks/reboot.yml", None, inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:] + res.stderr[-2000:]
    for node in NODES:
        cmdline = (roots[node] / "proc/cmdline").read_text()
        assert "isolcpus=managed_irq,domain,1-4,9-12" in cmdline
        assert "nohz_full=1-3,9-11" in cmdline
        assert (roots[node] / "sys/devices/system/cpu/isolated").read_text().strip() == "1-4,9-12"
        assert not unschedulable(cluster, node)
        assert cluster.nodes[node]["status"]["capacity"][EXCL] == "3"
    # Every node was cordoned once and readmitted, one after the other.
    cordons = [r.path for r in cluster.writes() if r.method == "PATCH" and "unschedulable" in str(r.body)]
    assert len(cordons) == 2 * len(NODES)
    # Nothing is pending any more: after site.yml has converged every stage (the plan play of site.yml
    # then returns a converged host's slim result), a second rollout reboots nothing, and its kernel
    # stage, which runs on every host, still gets the whole plan result.
    site = playbook(REPO / "site.yml", None, inventory=inventory)
    assert site.rc == 0, site.stdout[-4000:] + site.stderr[-2000:]
    again = playbook(REPO / "playbooks/reboot.yml", None, inventory=inventory)
    assert again.rc == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert again.changed("node-1") == 0 and again.changed("node-3") == 0
    assert not [t for t in again.tasks() if "stand-in for a reboot" in t["task"]["name"]]


def test_rollout_stops_at_the_first_node_that_fails_verification(playbook, tmp_path, cluster):
    inventory, roots = fleet(tmp_path, cluster, broken="node-2")
    res = playbook(REPO / "playbooks/reboot.yml", None, inventory=inventory)
    assert res.rc != 0
    message = res.messages()
    assert "host node-2: after the reboot the running kernel does not match the plan" in message
    assert "still pending: isolcpus, nohz_full, rcu_nocbs, irqaffinity" in message
    assert "The node stays cordoned and the rollout stops here." in message
    # node-1 went through; node-2 is left cordoned; node-3 was never touched.
    assert "isolcpus=" in (roots["node-1"] / "proc/cmdline").read_text()
    assert not unschedulable(cluster, "node-1")
    assert unschedulable(cluster, "node-2")
    assert "isolcpus=" not in (roots["node-3"] / "proc/cmdline").read_text()
    assert not unschedulable(cluster, "node-3")
    assert not any(r.path.endswith("/node-3") and r.method == "PATCH" for r in cluster.writes())


def test_a_kernel_that_does_not_apply_its_arguments_fails_verification(playbook, tmp_path, cluster):
    inventory, roots = fleet(tmp_path, cluster, broken="node-1", how="--ignored")
    res = playbook(REPO / "playbooks/reboot.yml", None, inventory=inventory)
    assert res.rc != 0
    message = res.messages()
    assert "host node-1: after the reboot the running kernel does not match the plan" in message
    assert "still pending: none; on the command line but not applied: isolcpus, nohz_full" in message
    assert "isolcpus=" in (roots["node-1"] / "proc/cmdline").read_text()
    assert unschedulable(cluster, "node-1")
    assert "isolcpus=" not in (roots["node-2"] / "proc/cmdline").read_text()


def test_a_node_whose_isolated_cpus_are_not_quiet_stays_cordoned(playbook, tmp_path, cluster):
    # node-2 boots with every argument applied, but its kernel leaves the unbound workqueues on every CPU
    # (the mask as the kernel prints it): verify (docs/verify.md) fails it before workloads come back.
    inventory, roots = fleet(tmp_path, cluster)
    mask = roots["node-2"] / "sys/devices/virtual/workqueue/cpumask"
    mask.parent.mkdir(parents=True)
    mask.write_text("ffff\n")
    res = playbook(REPO / "playbooks/reboot.yml", None, inventory=inventory)
    assert res.rc != 0
    message = res.messages()
    assert "host node-2: verify failed:" in message
    assert "unbound workqueues may run on isolated CPU 1-4,9-12" in message, message[-3000:]
    # node-1 was verified and readmitted; node-2 booted right but stays cordoned; node-3 was never touched.
    verified = [
        t
        for t in res.tasks()
        if t["task"]["name"].endswith("cpupools_verify : Verify that the isolated CPUs are quiet")
    ]
    assert {host for t in verified for host in t["hosts"]} == {"node-1", "node-2"}
    assert not unschedulable(cluster, "node-1")
    assert "isolcpus=" in (roots["node-2"] / "proc/cmdline").read_text()
    assert unschedulable(cluster, "node-2")
    assert "isolcpus=" not in (roots["node-3"] / "proc/cmdline").read_text()


def test_sandbox_without_stand_in_is_refused(playbook, tmp_path):
    root = tmp_path / "root"
    write_tree(str(root), CORPUS["1s8c-smt2"])
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "cpupools_nodes:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    res = playbook(
        REPO / "playbooks/reboot.yml",
        {"cpupools_root": str(root), "cpupools_kernel_args_backend": "grub"},
        inventory=str(inventory),
    )
    assert res.rc != 0
    assert f"host localhost: cpupools_root: {root} is a sandbox and cannot be rebooted" in res.messages()
