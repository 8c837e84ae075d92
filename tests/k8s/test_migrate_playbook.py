"""playbooks/migrate-cmk.yml end to end: a CMK v1.4 node with live holders, adopted, then CMK retired."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cmk_seed import cleanup, seed_cmk, workload
from helpers import REPO, tree_snapshot
from sysfs import Spec
from test_cmk_retire import NS, cluster_pieces, node_pieces

pytestmark = pytest.mark.slow

MIGRATE = REPO / "playbooks" / "migrate-cmk.yml"
STANDIN = REPO / "tests" / "fixtures" / "cmk14_standin.py"
ENV = {"PATH": "/usr/bin:/bin", "CMK_PROC_FS": "/proc"}
OPTS = ("--no-affinity",)
#: One socket, 4 cores, no SMT; CMK's operator isolated 1-2 by hand: exclusive 1, shared 2, infra 0,3.
NODE = Spec(sockets=1, cores_per_socket=4, threads=1, cmdline="BOOT_IMAGE=/vmlinuz ro isolcpus=1-2")


def write_cmk14_state(conf):
    """The directory CMK v1.4's init writes (lock, exclusive flags, comma-separated tasks), no markers."""
    layout = {"exclusive": ("1", {"1": []}), "shared": ("0", {"2": []}), "infra": ("0", {"0,3": []})}
    conf.mkdir(parents=True)
    (conf / "lock").write_text("")
    for pool, (flag, lists) in layout.items():
        (conf / "pools" / pool).mkdir(parents=True)
        (conf / "pools" / pool / "exclusive").write_text(flag)
        for cpus in lists:
            (conf / "pools" / pool / "0" / cpus).mkdir(parents=True)
            (conf / "pools" / pool / "0" / cpus / "tasks").write_text("")


@pytest.fixture
def cmk_node(tmp_path, make_root, cluster):
    """``(inventory, conf, holders, stop)``: a node on which CMK v1.4's isolate holds an exclusive and an infra
    list (a workload, and CMK's reconcile pod); both end cleanly once ``stop`` exists."""
    facts = make_root(NODE, "facts")
    root = tmp_path / "root"
    conf = root / "etc" / "cmk"
    write_cmk14_state(conf)
    stop = tmp_path / "stop"
    workload_cmd = f"while [ ! -e {stop} ]; do sleep 0.05; done"
    holders = [
        subprocess.Popen(
            [sys.executable, str(STANDIN), "isolate", f"--conf-dir={conf}", f"--pool={pool}", *OPTS, workload_cmd],
            env=ENV,
        )
        for pool in ("exclusive", "infra")
    ]
    deadline = time.monotonic() + 60
    while (conf / "pools/infra/0/0,3/tasks").read_text() == "" or (
        conf / "pools/exclusive/0/1/tasks"
    ).read_text() == "":
        assert time.monotonic() < deadline and all(p.poll() is None for p in holders)
        time.sleep(0.02)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    cpupools_nodes:\n      hosts:\n        localhost:\n"
        "          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        f"          cpupools_root: {root}\n          cpupools_facts_root: {facts}\n"
        "          cpupools_num_exclusive_cores: 1\n          cpupools_num_shared_cores: 1\n"
        "          cpupools_kernel_args_backend: grub\n"
        f"          cpupools_k8s_node_name: {cluster.node}\n"
    )
    yield str(inventory), conf, holders, stop
    stop.touch()
    for proc in holders:
        proc.kill()
        proc.wait()


def test_migrate_in_check_mode_then_for_real_keeps_holders_and_retires_cmk(playbook, cluster, cmk_node):
    inventory, conf, holders, stop = cmk_node
    real, node = cluster.real, cluster.node
    telco = real.unique("telco")
    try:
        seed_cmk(real, [node])
        workload(real, "dpdk-0", telco, node)
        expected = node_pieces(node) + cluster_pieces()
        state_before = tree_snapshot(conf)
        kube = {"cpupools_k8s_kubeconfig": str(cluster.kubeconfig())}
        res = playbook(MIGRATE, kube, "--check", "--diff", inventory=inventory)
        assert res.rc == 0, res.stdout[-4000:]
        assert res.result("Remove CMK's cluster pieces of the adopted nodes")["removed"] == expected
        assert cluster.writes() == [] and tree_snapshot(conf) == state_before
        res = playbook(MIGRATE, kube, inventory=inventory)
        assert res.rc == 0, res.stdout[-4000:]
        assert res.result("Remove CMK's cluster pieces of the adopted nodes")["removed"] == expected
        # The workloads kept their lists, under CMK's names; CMK's objects are gone; cpupools labelled the node.
        assert (conf / "pools/exclusive/0/1/tasks").read_text() == str(holders[0].pid)
        assert (conf / "pools/infra/0/0,3/tasks").read_text() == str(holders[1].pid)
        assert all(p.poll() is None for p in holders)
        assert real.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/cmk-reconcile-nodereport-ds-{node}") is None
        assert real.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/cmk-exec") is None
        assert real.node(node)["metadata"]["labels"]["cmk.intel.com/cmk-node"] == "true"
        after = tree_snapshot(conf)
        writes = len(cluster.writes())
        res = playbook(MIGRATE, kube, inventory=inventory)
        assert res.rc == 0 and res.changed() == 0, [
            t["task"]["name"] for t in res.tasks() if t["hosts"]["localhost"].get("changed")
        ]
        assert tree_snapshot(conf) == after and len(cluster.writes()) == writes
    finally:
        cleanup(real, [NS, "default", telco])
        for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
            real.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/cpupools-cmk-inject")
    # CMK's holders end as CMK v1.4 ends them: status 0, their PIDs gone, nothing renamed; the lists serve ours.
    stop.touch()
    assert [p.wait(timeout=60) for p in holders] == [0, 0]
    assert (conf / "pools/exclusive/0/1/tasks").read_text() == "" and (
        conf / "pools/infra/0/0,3/tasks"
    ).read_text() == ""
    assert sorted(p.name for p in (conf / "pools").glob("*/0/*")) == ["0,3", "1", "2"]
    cmk = str(conf.parent.parent / "opt/bin/cmk")
    res = subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=ENV, capture_output=True, text=True, check=False)
    assert (res.returncode, json.loads(res.stdout), res.stderr) == (0, {"reclaimedCpuLists": []}, "")
    res = subprocess.run(
        [
            cmk,
            "isolate",
            f"--conf-dir={conf}",
            "--pool=exclusive",
            "--no-affinity",
            "--",
            "sh",
            "-c",
            "echo $CMK_CPUS_ASSIGNED",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (res.returncode, res.stdout) == (0, "1\n"), res.stderr


def test_migrate_without_a_kubeconfig_does_the_node_side_and_says_so(playbook, cmk_node):
    inventory, conf, holders, _ = cmk_node
    res = playbook(MIGRATE, {}, inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:]
    assert "no kubeconfig is configured" in res.result("Say why CMK's cluster pieces are not retired")["msg"]
    # Adopt mode whatever the inventory says: the pools CMK computed from the node's isolcpus.
    plan = res.result("Plan the CPU pools")["plan"]
    assert plan["adopted"] == {"isolcpus": "1-2", "isolcpus_flags": []}
    assert (conf / "cpupools.json").is_file()  # adopted
    assert (conf / "pools/exclusive/0/1/tasks").read_text() == str(holders[0].pid)
