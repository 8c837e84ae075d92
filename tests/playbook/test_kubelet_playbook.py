"""cpupools_runtime: kubelet end to end: site.yml and the rolling restart over sandbox nodes.

Each node is a fixture root with a fake kubelet (tests/fixtures/fake_kubelet.py,
a real process started and stopped through cpupools_kubelet_simulate_command)
that writes its cpu_manager_state from the merged drop-ins, and refuses to
start over a state of another policy, as the real one does. Drains go to the
Kubernetes fake (tests/k8s_fake.py), not the real server of the other
Kubernetes tests: a drain waits for evicted pods to be gone and for their
budgets, and a test server has no kubelet to end a pod and no controller
manager to compute a PodDisruptionBudget. Reboots go to tests/fixtures/fake_boot.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, tree_snapshot
from sysfs import CORPUS, write_tree

sys.path.insert(0, str(REPO / "tests"))
from k8s_fake import FakeKube, write_kubeconfig

pytestmark = pytest.mark.slow
NODES = ("node-1", "node-2")
FAKE_KUBELET = [sys.executable, str(REPO / "tests/fixtures/fake_kubelet.py")]
FAKE_BOOT = [sys.executable, str(REPO / "tests/fixtures/fake_boot.py")]
STATE = "var/lib/kubelet/cpu_manager_state"
DROPIN = "etc/kubernetes/kubelet.conf.d/50-cpupools.conf"
RECORD = "var/lib/cpupools/kubelet-cpu-manager.json"
LOG = "var/log/fake-kubelet.log"
WRITE = "Write the kubelet drop-in, or leave it for the kubelet restart"


@pytest.fixture
def cluster():
    with FakeKube(token="tok") as kube:
        for node in NODES:
            kube.add_node(node)
            kube.add_pod("default", f"web-{node}", node, owner="ReplicaSet")
        yield kube


@pytest.fixture
def nodes(tmp_path):
    """``name -> root``: a 1s8c-smt2 sandbox per node whose fake kubelet runs with policy none."""
    roots = {}
    for node in NODES:
        root = tmp_path / node
        write_tree(str(root), CORPUS["1s8c-smt2"])
        roots[node] = root
        subprocess.run([*FAKE_KUBELET, "start", str(root)], check=True)
    for root in roots.values():
        wait_for_state(root)
    yield roots
    for root in roots.values():
        subprocess.run([*FAKE_KUBELET, "stop", str(root)], check=True)


def wait_for_state(root: Path) -> dict:
    """The fake kubelet's state, once it wrote it (it takes a moment, as a real one does)."""
    from cpupools.node.kubelet import wait_for_state as wait

    text = wait(str(root / STATE), 30, interval=0.05)
    assert text is not None, (root / LOG).read_text()
    return json.loads(text)


PODS_CAN_USE = "Say how many CPUs pods can use on the kubelet nodes this run changes"


def inventory(tmp_path: Path, kube: FakeKube, roots: dict[str, Path], broken: str | None = None) -> str:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, token="tok")
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for node, root in roots.items():
        kubelet = FAKE_KUBELET + (["--broken"] if node == broken else [])
        lines += [
            f"        {node}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_root: {root}",
            f"          cpupools_reboot_simulate_command: {FAKE_BOOT}",
            f"          cpupools_kubelet_simulate_command: {kubelet}",
        ]
    lines += [
        "  vars:",
        "    cpupools_runtime: kubelet",
        "    cpupools_isolcpus_flags: [managed_irq]",
        "    cpupools_kernel_args_backend: grub",
        f"    cpupools_k8s_kubeconfig: {kubeconfig}",
        "    cpupools_k8s_drain_poll_interval: 0.2",
        "    cpupools_num_exclusive_cores: -1",
        "    cpupools_num_shared_cores: 0",
        "    cpupools_kubelet_restart_timeout: 30",
        f"    cpupools_report_html: {tmp_path / 'report.html'}",
    ]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def unschedulable(kube: FakeKube, node: str) -> bool:
    return bool(kube.nodes[node].get("spec", {}).get("unschedulable"))


def log_lines(root: Path) -> list[str]:
    return (root / LOG).read_text().splitlines()


def changed_tasks(res) -> list[str]:
    return [t["task"]["name"] for t in res.tasks() if any(h.get("changed") for h in t["hosts"].values())]


def real_writes(kube: FakeKube) -> list:
    """The cluster's writes, dry runs (which check mode may send) left out."""
    return [r for r in kube.writes() if "dryRun" not in r.query]


def snapshots(roots: dict[str, Path]) -> dict:
    return {node: tree_snapshot(root) for node, root in roots.items()}


def test_kubelet_runtime_end_to_end_with_the_reboot(playbook, tmp_path, cluster, nodes):
    inv = inventory(tmp_path, cluster, nodes)
    before = snapshots(nodes)

    # Check mode predicts the pending restart and the kernel arguments, and writes nothing.
    check = playbook(REPO / "site.yml", None, "--check", "--diff", inventory=inv)
    assert check.rc == 0, check.messages() + check.stderr[-2000:]
    assert check.result(WRITE, "node-1")["restart_required"] is True
    assert snapshots(nodes) == before

    site = playbook(REPO / "site.yml", None, inventory=inv)
    assert site.rc == 0, site.messages() + site.stderr[-2000:]
    # Before anything was written, the plan play said what pods can use on each node (16 CPUs, one
    # NUMA node: one housekeeping core, CPUs 0 and 8); no kubelet on this machine: 1.33 is assumed.
    said = site.result(PODS_CAN_USE, "node-1")["msg"]
    assert said == [
        f"host {node}: kubelet 1.33: pods can use 14 of 16 CPUs; reservedSystemCPUs 0,8 (the housekeeping CPUs "
        "of 1 NUMA node(s))"
        for node in NODES
    ]
    for node, root in nodes.items():
        result = site.result(WRITE, node)
        assert result["restart_required"] is True
        assert result["restart_reason"] == "the kubelet runs with policy 'none' not set by cpupools"
        # Not written under the running kubelet: a restart for any other reason must not crash-loop it.
        assert not (root / DROPIN).exists()
        assert json.loads((root / STATE).read_text())["policyName"] == "none"
        # No cmk pieces on a kubelet node: no agent, no pool state, no label, taint or extended resource.
        assert not (root / "opt/bin/cmk").exists() and not (root / "etc/cmk").exists()
        # The plan found none there, so the agent stage did not look for them to remove.
        assert site.result("Remove the pool state directory", node).get("skipped") is True
        node_obj = cluster.nodes[node]
        assert "cmk.intel.com/cmk-node" not in node_obj["metadata"]["labels"]
        assert "cmk.intel.com/exclusive-cores" not in node_obj["status"]["capacity"]
        assert not [t for t in node_obj["spec"].get("taints", []) if t["key"] == "cmk"]
    written = snapshots(nodes)
    again = playbook(REPO / "site.yml", None, inventory=inv)
    assert again.rc == 0
    assert [again.changed(node) for node in NODES] == [0, 0]
    assert again.result(PODS_CAN_USE, "node-1")["msg"] == said  # still pending the restart: said again
    assert snapshots(nodes) == written

    # Check mode of the rollout: it predicts the drain, the kubelet's stop and start, the reboot and
    # the uncordon, and neither touches a node nor writes to the cluster.
    writes = len(real_writes(cluster))
    check = playbook(REPO / "playbooks/reboot.yml", None, "--check", "--diff", inventory=inv)
    assert check.rc == 0, check.messages() + check.stderr[-2000:]
    assert snapshots(nodes) == written
    assert len(real_writes(cluster)) == writes
    assert [log_lines(root) for root in nodes.values()] == [["started", "running: policy none reserved -"]] * 2

    # The rolling reboot applies the kernel arguments and the kubelet change together.
    roll = playbook(REPO / "playbooks/reboot.yml", None, inventory=inv)
    assert roll.rc == 0, roll.messages() + roll.stderr[-2000:]
    # The sandbox's stand-ins are commands, which check mode skips (on a real node
    # ansible.builtin.reboot and systemd report the reboot and the stop they would make).
    stand_ins = {
        "cpupools_reboot : Boot the sandbox node with its boot configuration (stand-in for a reboot)",
        "cpupools_kubelet : Stop the sandbox node's kubelet (stand-in for systemctl stop)",
        "cpupools_kubelet : Start the sandbox node's kubelet (stand-in for systemctl start)",
    }
    assert sorted(set(changed_tasks(roll)) - stand_ins) == sorted(set(changed_tasks(check)))
    for node, root in nodes.items():
        state = json.loads((root / STATE).read_text())
        # strict-cpu-reservation: the reserved CPUs 0,8 are out of the shared pool, as the real kubelet keeps them.
        assert (state["policyName"], state["defaultCpuSet"]) == ("static", "1-7,9-15")
        dropin = (root / DROPIN).read_text()
        assert 'reservedSystemCPUs: "0,8"' in dropin and 'cpuManagerPolicy: "static"' in dropin
        assert '  full-pcpus-only: "true"\n  strict-cpu-reservation: "true"\n' in dropin
        assert json.loads((root / RECORD).read_text())["applied"]["reservedSystemCPUs"] == "0,8"
        assert "isolcpus=managed_irq,1-7,9-15" in (root / "proc/cmdline").read_text()
        # Stopped once (before the reboot), started once after it: no second restart.
        assert log_lines(root)[2:] == ["stopped", "started", "running: policy static reserved 0,8"]
        assert not unschedulable(cluster, node)
        assert ("default", f"web-{node}") not in cluster.pods
    cordons = [r for r in cluster.writes() if r.method == "PATCH" and "unschedulable" in str(r.body)]
    assert len(cordons) == 2 * len(NODES)
    assert not [
        t
        for t in roll.tasks()
        if "Drain, restart the kubelet" in t["task"]["name"] and any(not h.get("skipped") for h in t["hosts"].values())
    ]

    # Nothing is pending any more: neither stage nor the rollout changes anything on the nodes (the
    # report on the controller now shows the applied kernel and kubelet, so it is rewritten once).
    settled = snapshots(nodes)
    for pb in (REPO / "site.yml", REPO / "playbooks/reboot.yml"):
        res = playbook(pb, None, inventory=inv)
        assert res.rc == 0, res.messages()
        assert [name for name in changed_tasks(res) if "fleet report" not in name] == []
        if pb.name == "site.yml":  # converged: nothing to say
            assert res.result(PODS_CAN_USE, "node-1").get("skipped") is True
    assert snapshots(nodes) == settled

    # A change of a kubelet knob alone (no reboot pending): drained and restarted on its own.
    knob = {"cpupools_kubelet_topology_policy": "single-numa-node"}
    site = playbook(REPO / "site.yml", knob, inventory=inv)
    assert site.result(WRITE, "node-1")["restart_reason"] == "changed: topologyManagerPolicy"
    settled, writes = snapshots(nodes), len(real_writes(cluster))
    check = playbook(REPO / "playbooks/reboot.yml", knob, "--check", inventory=inv)
    assert check.rc == 0, check.messages() + check.stderr[-2000:]
    assert (snapshots(nodes), len(real_writes(cluster))) == (settled, writes)
    roll = playbook(REPO / "playbooks/reboot.yml", knob, inventory=inv)
    assert roll.rc == 0, roll.stdout[-3000:]
    assert sorted(set(changed_tasks(roll)) - stand_ins) == sorted(set(changed_tasks(check)))
    for node, root in nodes.items():
        assert 'topologyManagerPolicy: "single-numa-node"' in (root / DROPIN).read_text()
        assert log_lines(root)[-3:] == ["stopped", "started", "running: policy static reserved 0,8"]
        assert not unschedulable(cluster, node)
    assert not [
        t
        for t in roll.tasks()
        if "stand-in for a reboot" in t["task"]["name"] and any(not h.get("skipped") for h in t["hosts"].values())
    ]
    assert len([r for r in cluster.writes() if r.method == "PATCH" and "unschedulable" in str(r.body)]) == 8

    # Uninstalling while the kubelet runs with cpupools' policy is refused before anything is removed.
    settled = snapshots(nodes)
    res = playbook(REPO / "playbooks/uninstall.yml", knob, inventory=inv)
    assert res.rc != 0
    assert (
        "host node-1: cpupools_runtime: the kubelet still runs with the CPU manager settings cpupools set "
        "(cpuManagerPolicy static set by cpupools is to be removed); set cpupools_runtime: cmk and run "
        "playbooks/reboot.yml" in res.messages()
    )
    assert snapshots(nodes) == settled


def test_rollout_stops_at_the_first_kubelet_that_fails_verification(playbook, tmp_path, cluster, nodes):
    inv = inventory(tmp_path, cluster, nodes, broken="node-1")
    # The kernel arguments are already booted: only the kubelet must restart.
    for root in nodes.values():
        cmdline = root / "proc/cmdline"
        cmdline.write_text(
            cmdline.read_text().strip() + " isolcpus=managed_irq,1-7,9-15 nohz_full=1-7,9-15"
            " rcu_nocbs=1-7,9-15 irqaffinity=0,8\n"
        )
        (root / "sys/devices/system/cpu/isolated").write_text("1-7,9-15\n")
        (root / "sys/devices/system/cpu/nohz_full").write_text("1-7,9-15\n")
    assert playbook(REPO / "site.yml", None, inventory=inv).rc == 0
    res = playbook(REPO / "playbooks/reboot.yml", None, inventory=inv)
    assert res.rc != 0
    assert (
        "host node-1: cpupools_runtime: the kubelet restarted without the planned CPU manager settings: "
        "policyName is 'none', wanted 'static'. The node stays cordoned and the rollout stops here."
    ) in res.messages()
    assert unschedulable(cluster, "node-1")
    # node-2 was never drained nor restarted.
    assert not unschedulable(cluster, "node-2")
    assert log_lines(nodes["node-2"]) == ["started", "running: policy none reserved -"]
    assert not any(r.path.endswith("/node-2") and r.method == "PATCH" for r in cluster.writes())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["-e", "cpupools_isolcpus_flags=managed_irq,domain"],
            "host node-1: cpupools_isolcpus_flags: isolcpus with the domain flag would take CPUs 1-7,9-15 out of "
            "the scheduler's load balancing",
        ),
        (
            ["-e", "cpupools_num_exclusive_cores=9"],
            "host node-1: cpupools_num_exclusive_cores: 9 exclusive cores requested, the kubelet can hand out 7 "
            "cores after 1 infra core per NUMA node (auto)",
        ),
        (
            ["-e", "cpupools_excl_non_isolcpus=7,15", "-e", "cpupools_num_exclusive_cores=3"],
            "host node-1: cpupools_excl_non_isolcpus: CPUs 7,15 are an exclusive-non-isolcpus pool",
        ),
        (
            ["-e", "cpupools_kubelet_policy_options=full-pcpus-only,align-by-cache"],
            "host node-1: cpupools_kubelet_policy_options: 'align-by-cache' is not auto or one of",
        ),
        (
            ["-e", "cpupools_kubelet_policy_options=full-pcpus-only,distribute-cpus-across-cores"],
            "host node-1: cpupools_kubelet_policy_options: full-pcpus-only and distribute-cpus-across-cores cannot "
            "be used together",
        ),
        (["-e", "cpupools_kubelet_topology_scope=node"], "host node-1: cpupools_kubelet_topology_scope: 'node'"),
    ],
)
def test_what_cannot_work_is_refused_before_anything_is_written(playbook, tmp_path, cluster, nodes, extra, message):
    inv = inventory(tmp_path, cluster, nodes)
    before = snapshots(nodes)
    res = playbook(REPO / "site.yml", None, *extra, inventory=inv)
    assert res.rc != 0
    assert message in res.messages(), res.messages()
    assert snapshots(nodes) == before
    assert not cluster.writes()


def test_switching_a_cmk_node_to_the_kubelet_removes_the_agent_and_waits_for_its_workloads(playbook, tmp_path):
    sandbox = tmp_path / "sandbox"
    local = str(REPO / "inventories/local/hosts.yml")
    extra = {"cpupools_root": str(sandbox), "cpupools_report_html": str(tmp_path / "report.html")}
    kubelet = {**extra, "cpupools_runtime": "kubelet", "cpupools_isolcpus_flags": ["managed_irq"]}
    assert playbook(REPO / "site.yml", extra, inventory=local).rc == 0
    conf = sandbox / "etc/cmk"
    cmk = str(sandbox / "opt/bin/cmk")
    # The holder outlives any run of the playbook, however loaded the machine (killed below).
    argv = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "sleep", "3600"]
    holder = subprocess.Popen(argv, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while str(holder.pid) not in "".join(p.read_text() for p in (conf / "pools/exclusive").rglob("tasks")):
            assert time.monotonic() < deadline, "cmk isolate never recorded its PID"
            time.sleep(0.05)
        before = tree_snapshot(sandbox)
        refused = playbook(REPO / "site.yml", kubelet, inventory=local)
        assert refused.rc != 0
        assert (
            "host localhost: cpupools_state: refusing to remove the pool state while tasks are live: "
            f"PID {holder.pid}" in refused.messages()
        )
        assert tree_snapshot(sandbox) == before
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    switched = playbook(REPO / "site.yml", kubelet, inventory=local)
    assert switched.rc == 0, switched.messages()
    root = sandbox
    assert not (root / "opt/bin/cmk").exists() and not (root / "etc/cmk").exists()
    # No kubelet has run in the sandbox: the drop-in is written at once, nothing waits for a restart.
    assert switched.result(WRITE)["restart_required"] is False
    assert 'cpuManagerPolicy: "static"' in (root / DROPIN).read_text()
    settled = tree_snapshot(root)
    again = playbook(REPO / "site.yml", kubelet, inventory=local)
    assert again.rc == 0
    assert [name for name in changed_tasks(again) if "fleet report" not in name] == []
    assert tree_snapshot(root) == settled
