"""`cmk reconcile --kubeconfig`: the built node agent re-advertises to the real server as its kubelet."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cpupools.node import state as st
from cpupools.node import state_writer as sw
from helpers import REPO
from k8s_fake import write_kubeconfig

EXCL = "cmk.intel.com/exclusive-cores"
ENI = "cmk.intel.com/exclusive-non-isolcpus-cores"
PLAN = {
    "version": 1,
    "pools": {
        "exclusive": {"0": ["1,9", "2,10", "3,11"]},
        "exclusive-non-isolcpus": {"0": ["6,14"]},
        "shared": {"0": ["4,12"]},
        "infra": {"0": ["0,5,7,8,13,15"]},
    },
    "exclusive_pools": ["exclusive", "exclusive-non-isolcpus"],
    "handout_order": {"exclusive": ["1,9", "2,10", "3,11"], "exclusive-non-isolcpus": ["6,14"]},
}


@pytest.fixture(scope="module")
def cmk(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent") / "cmk"
    subprocess.run([sys.executable, str(REPO / "scripts/build_agent.py"), str(out)], check=True, capture_output=True)
    return str(out)


@pytest.fixture
def conf(tmp_path):
    conf = tmp_path / "cmk"
    layout = sw.desired_layout(PLAN)
    sw.ensure_lock_file(str(conf))
    with st.StateLock(str(conf)):
        sw.write_state(str(conf), layout, {}, {}, sw.desired_meta(PLAN, layout))
    return conf


def reconcile(cmk, conf, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPUPOOLS_", "NODE_NAME"))}
    return subprocess.run(
        [cmk, "reconcile", f"--conf-dir={conf}", *extra], env=env, capture_output=True, text=True, check=False
    )


def test_reconcile_readvertises_with_the_kubelet_certificate(cmk, conf, cluster):
    node = cluster.node
    kubelet_conf = cluster.kubeconfig("kubelet.conf", node=node, inline_ca=True)
    first = reconcile(cmk, conf, f"--kubeconfig={kubelet_conf}", f"--node-name={node}")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().startswith("{") and '"reclaimedCpuLists": []' in first.stdout
    assert f"re-advertised {EXCL}=3, {ENI}=1 on node {node}" in first.stderr
    capacity = cluster.real.node(node)["status"]["capacity"]
    assert capacity[EXCL] == "3" and capacity[ENI] == "1"
    kubelet = f"system:node:{node}"
    assert [e["requestURI"] for e in cluster.writes(kubelet)] == [f"/api/v1/nodes/{node}/status"]
    # Nothing missing: a second pass reads and writes nothing.
    second = reconcile(cmk, conf, f"--kubeconfig={kubelet_conf}", f"--node-name={node}")
    assert second.returncode == 0 and second.stderr == ""
    assert len(cluster.writes(kubelet)) == 1


def test_without_the_kubelet_kubeconfig_it_is_quietly_off(cmk, conf, tmp_path):
    res = reconcile(cmk, conf, f"--kubeconfig={tmp_path / 'missing.conf'}", "--node-name=node-1")
    assert res.returncode == 0 and res.stderr == ""


def test_an_unreachable_api_server_is_one_line_and_reconcile_still_succeeds(cmk, conf, tmp_path):
    bad = write_kubeconfig(tmp_path / "kubelet.conf", "https://127.0.0.1:9", token="x")
    res = reconcile(cmk, conf, f"--kubeconfig={bad}", "--node-name=node-1")
    assert res.returncode == 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "cmk reconcile: re-advertising on node node-1: cannot reach the API server"
    )
    assert "Traceback" not in res.stderr
