"""playbooks/migrate-cmk.yml end to end: a CMK v1.4 node with live holders, adopted, then CMK retired."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from cmk_seed import cleanup, seed_cmk, workload
from helpers import REPO, tree_snapshot
from sysfs import Spec
from test_cmk_retire import NS, cluster_pieces, node_pieces

pytestmark = pytest.mark.slow

MIGRATE = REPO / "playbooks" / "migrate-cmk.yml"
STANDIN = REPO / "tests" / "fixtures" / "cmk14_standin.py"
STANDIN15 = REPO / "tests" / "fixtures" / "cmk15_standin.py"
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


# CMK v1.5 ---------------------------------------------------------------------------------------------------
# Against the real server: the stand-in (tests/fixtures/cmk15_standin.py) takes its lists through the
# ConfigMap's Owner lock in CMK's own namespace, as CMK v1.5.2's isolate does.

#: What CMK v1.5's init stored for NODE (isolcpus=1-2, one exclusive and one shared core), as yaml.dump writes it.
V15_LAYOUT = {"exclusive": {0: {"1": []}}, "shared": {0: {"2": []}}, "infra": {0: {"0,3": []}}}


def v15_configmap(cluster) -> str:
    return f"/api/v1/namespaces/{NS}/configmaps/cmk-config-{cluster.node}"


def v15_tasks(cluster) -> dict:
    """``pool/cpulist -> PIDs`` of the v1.5 ConfigMap, as its last unlock wrote them."""
    config = yaml.safe_load(cluster.real.get(v15_configmap(cluster))["data"]["config"])
    return {
        f"{pool}/{cpus}": pids
        for pool, sockets in config.items()
        for lists in sockets.values()
        for cpus, pids in lists.items()
    }


@pytest.fixture
def cmk15_node(tmp_path, make_root, cluster):
    """``(inventory, root, holders, stop)``: a CMK v1.5 node whose workloads hold the exclusive and the infra list.

    Its state is only in the ConfigMap (no /etc/cmk); /opt/bin/cmk is CMK's binary (here: the stand-in); the
    holders are CMK v1.5 isolates, which took their lists through the ConfigMap's Owner lock.
    """
    facts = make_root(NODE, "facts")
    root = tmp_path / "root"
    (root / "opt" / "bin").mkdir(parents=True)
    shutil.copy(STANDIN15, root / "opt" / "bin" / "cmk")
    real = cluster.real
    seed_cmk(real, [cluster.node])
    # CMK's init left the node's ConfigMap (seed_cmk made it): its layout, unlocked.
    obj = real.get(v15_configmap(cluster))
    obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), "Owner": ""}
    obj["data"] = {"config": yaml.dump(V15_LAYOUT)}
    real.ok("PUT", v15_configmap(cluster), obj)
    stop = tmp_path / "stop"
    env = {
        **ENV,
        "CMK15_SERVER": cluster.url,
        "CMK15_TOKEN": real.product_token,
        "CMK15_CA": str(real.pki.ca),
        "CMK15_NAMESPACE": NS,
        "NODE_NAME": cluster.node,
    }
    holders = [
        subprocess.Popen(
            [
                sys.executable,
                str(STANDIN15),
                "isolate",
                f"--pool={pool}",
                "--no-affinity",
                "sh",
                "-c",
                f"while [ ! -e {stop} ]; do sleep 0.05; done",
            ],
            env={**env, "HOSTNAME": f"{pool}-pod"},
        )
        for pool in ("exclusive", "infra")
    ]
    deadline = time.monotonic() + 60
    while (
        sorted(pid for pids in v15_tasks(cluster).values() for pid in pids) != sorted(str(p.pid) for p in holders)
        or real.get(v15_configmap(cluster))["metadata"]["annotations"]["Owner"] != ""
    ):
        assert time.monotonic() < deadline and all(p.poll() is None for p in holders)
        time.sleep(0.05)
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
    try:
        yield str(inventory), root, holders, stop
    finally:
        stop.touch()
        for proc in holders:
            proc.kill()
            proc.wait()
        cleanup(real, [NS, "default"])
        for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
            real.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/cpupools-cmk-inject")


def test_migrate_a_cmk15_node_carries_its_configmap_tasks_and_keeps_it_while_they_run(playbook, cluster, cmk15_node):
    inventory, root, holders, stop = cmk15_node
    node, configmap = cluster.node, f"ConfigMap {NS}/cmk-config-{cluster.node}"
    exclusive, infra = holders
    conf = root / "etc" / "cmk"
    # Without a kubeconfig the lists cannot be read: refused in the plan play, nothing written anywhere.
    before, writes = tree_snapshot(root), len(cluster.writes())  # the holders' own lock and unlock
    res = playbook(MIGRATE, {}, inventory=inventory)
    assert res.rc != 0
    failed = [t["hosts"]["localhost"] for t in res.tasks() if t["hosts"].get("localhost", {}).get("failed")]
    assert len(failed) == 1 and failed[0]["msg"] == (
        "host localhost: cpupools_k8s_kubeconfig: CMK v1.5 runs on this node (/opt/bin/cmk is CMK's cmk, not "
        f"cpupools', and /etc/cmk holds no pool state) and keeps its task lists only in ConfigMap cmk-config-{node}, "
        "which cannot be read without a kubeconfig: set cpupools_k8s_kubeconfig (a path on the controller) or "
        "cpupools_k8s_in_cluster: true; adopting without them would hand out the CPUs of its running workloads again"
    )
    assert tree_snapshot(root) == before and len(cluster.writes()) == writes
    # With it: check mode reads the ConfigMap and changes nothing, on the node or in the cluster.
    kube = {"cpupools_k8s_kubeconfig": str(cluster.kubeconfig())}
    res = playbook(MIGRATE, kube, "--check", inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:]
    assert res.result("Carry CMK v1.5's live tasks into the pool state")["cmk_v15"]["carried"] == sorted(
        p.pid for p in holders
    )
    assert tree_snapshot(root) == before and len(cluster.writes()) == writes
    # For real: the v1.5 workloads keep their lists in the pool state; the ConfigMap stays while they run.
    res = playbook(MIGRATE, kube, inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:]
    # The agent stage read them from cmk-namespace (the inventory names no namespace) before it wrote the
    # state cmk hands CPUs out from, not the retirement after it.
    written = res.result("Write the pool state directory from the plan")["tasks"]
    assert (written["exclusive"]["1"], written["infra"]["0,3"]) == ([exclusive.pid], [infra.pid])
    assert (conf / "pools/exclusive/0/1/tasks").read_text() == str(exclusive.pid)
    assert (conf / "pools/infra/0/0,3/tasks").read_text() == str(infra.pid)
    retired = res.result("Remove CMK's cluster pieces of the adopted nodes")
    kept = {k["object"]: k["reason"] for k in retired["kept"]}
    assert kept[configmap] == (
        f"it names running CMK v1.5 task(s) PID {min(exclusive.pid, infra.pid)}, {max(exclusive.pid, infra.pid)}, "
        "carried into the node's pool state; it goes once they have ended"
    )
    assert f"DaemonSet {NS}/cmk-reconcile-nodereport-ds-{node}" in retired["removed"]
    cmk = str(root / "opt/bin/cmk")
    res = subprocess.run(
        [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "true"],
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 75, res.stderr  # the v1.5 workload's core is not handed out again
    # CMK v1.5.2's isolates end without giving their lists back (its clean-up is broken): the PIDs stay named.
    stop.touch()
    assert [p.wait(timeout=60) for p in holders] == [1, 1]
    assert v15_tasks(cluster)["exclusive/1"] == [str(exclusive.pid)]
    res = playbook(MIGRATE, kube, inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:]
    assert configmap in res.result("Remove CMK's cluster pieces of the adopted nodes")["removed"]
    assert cluster.real.get(v15_configmap(cluster)) is None
    res = subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=ENV, capture_output=True, text=True, check=False)
    assert sorted(r["pid"] for r in json.loads(res.stdout)["reclaimedCpuLists"]) == sorted(p.pid for p in holders)
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


def test_site_on_a_cmk15_node_hands_out_no_cpu_its_workloads_hold(playbook, cluster, cmk15_node, tmp_path):
    """site.yml alone (no retirement in the run), the inventory naming no namespace: CMK's own manifests'
    cmk-namespace is read before cmk is replaced."""
    inventory, root, holders, _ = cmk15_node
    conf = root / "etc" / "cmk"
    kube = {"cpupools_k8s_kubeconfig": str(cluster.kubeconfig()), "cpupools_report_html": str(tmp_path / "r.html")}
    res = playbook(REPO / "site.yml", kube, inventory=inventory)
    assert res.rc == 0, res.stdout[-4000:]
    assert (conf / "pools/exclusive/0/1/tasks").read_text() == str(holders[0].pid)
    assert (conf / "pools/infra/0/0,3/tasks").read_text() == str(holders[1].pid)
    isolate = [str(root / "opt/bin/cmk"), "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "true"]
    res = subprocess.run(isolate, env=ENV, capture_output=True, text=True, check=False)
    assert res.returncode == 75, res.stderr  # the one exclusive core is the v1.5 workload's
