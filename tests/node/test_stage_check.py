"""The pieces of the converged check that need no playbook: build digests, file comparisons, stage lists.

The check as a whole is tested against the stages themselves in
tests/playbook/test_converged.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from cpupools.node import agent_files, stage_check
from cpupools.planning.inputs import validate_inputs
from helpers import REPO

OUTPUTS = {
    "isolated_cpus": "1-3,5-7",
    "housekeeping_cpus": "0,4",
    "cpu_affinity": "0 4",
    "irqbalance_banned_cpulist": "1-3,5-7",
    "kubelet_reserved_system_cpus": "1-3,5-7",
    "kubelet_system_reserved_cpu": "6",
}


def values(**raw):
    return validate_inputs({f"cpupools_{k}": v for k, v in raw.items()}).values


def test_parse_build_reads_the_digests_build_agent_prints(tmp_path):
    out = tmp_path / "cmk"
    argv = [sys.executable, str(REPO / "scripts" / "build_agent.py"), "--check", str(out)]
    fresh = subprocess.run(argv, capture_output=True, text=True, check=True)
    parsed = agent_files.parse_build(fresh.stdout)
    assert "would be written" in fresh.stdout and not out.exists()  # nothing built at out yet: the same digests
    subprocess.run([*argv[:2], str(out)], capture_output=True, check=True)
    again = agent_files.parse_build(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert again == parsed and set(parsed) == {"pyz_sha256", "launcher_sha256"}
    assert again["pyz_sha256"] == hashlib.sha256((tmp_path / "cmk.pyz").read_bytes()).hexdigest()
    assert again["launcher_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def test_a_failed_or_missing_build_gives_nothing_to_compare_with():
    assert agent_files.parse_build(None) is None
    assert agent_files.parse_build("", 0) is None
    assert agent_files.parse_build("abc  /x/cmk.pyz  unchanged\nabd  /x/cmk  unchanged", rc=2) is None
    assert agent_files.parse_build("build_agent.py: --shebang='x' must be an absolute interpreter path") is None


def test_no_build_means_the_agent_stage_runs(tmp_path):
    v = values(root=str(tmp_path))
    files = stage_check.desired_files(v, OUTPUTS, "n1", 4026531836)
    reasons = stage_check.agent_reasons(v, {"changed": False}, files, None, None)
    assert reasons[0] == "cmk: no build of the agent was given to compare with"


def test_file_difference_names_what_differs(tmp_path):
    wanted = stage_check.NodeFile("agent", "/etc/cmk/cpupools.agent", "x=1\n", 0o644)
    assert stage_check.file_difference(str(tmp_path), wanted) == "/etc/cmk/cpupools.agent is missing"
    path = tmp_path / "etc/cmk/cpupools.agent"
    path.parent.mkdir(parents=True)
    path.write_text("x=2\n")
    assert (
        stage_check.file_difference(str(tmp_path), wanted)
        == "/etc/cmk/cpupools.agent differs from the rendered content"
    )
    path.write_text("x=1\n")
    os.chmod(path, 0o600)
    assert stage_check.file_difference(str(tmp_path), wanted) == "/etc/cmk/cpupools.agent has mode 0600, not 0644"
    os.chmod(path, 0o644)
    assert stage_check.file_difference(str(tmp_path), wanted) is None


def test_rendered_files_follow_the_inputs_and_are_deterministic():
    v = values(kubelet_reservation="systemReserved", reconcile_interval="90", metrics_dir="/var/lib/ne")
    files = stage_check.desired_files(v, OUTPUTS, "node-7", 1)
    assert files == stage_check.desired_files(v, OUTPUTS, "node-7", 1)
    assert "OnUnitActiveSec=90s\n" in files["timer"].content
    assert "--metrics-dir=/var/lib/ne --kubeconfig=/etc/kubernetes/kubelet.conf --node-name=node-7\n" in (
        files["service"].content
    )
    assert files["settings"].path == "/etc/cmk/cpupools.agent"
    assert "\nnode_pid_ns=1\n" in files["settings"].content and files["settings"].content.endswith("isolate_shell=0\n")
    assert "kubelet" not in files  # the kubelet drop-in is the kubelet module's (kubelet_reasons below)
    default = stage_check.desired_files(values(), OUTPUTS, "node-7", 1)
    assert all(f.content.startswith(stage_check.HEADER) for f in default.values())


def test_the_cpuaffinity_drop_in_is_wanted_where_the_kernel_leaves_host_processes_on_isolated_cpus(tmp_path):
    """auto: the kubelet runtime's isolcpus=managed_irq confines nothing (the real guest's kubelet,
    containerd and systemd ran on every CPU until the drop-in); CMK's domain flag confines init, which
    lasts only where the cgroup hierarchy is v1: on v2 the kubelet's enabling of the cpuset controller
    gave systemd-udevd every CPU on the real guest, and an exclusive one to run on."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    (v2 / "sys/fs/cgroup").mkdir(parents=True)
    (v2 / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    v1.mkdir()
    on_v1 = {"root": str(v1), "facts_root": str(v1)}
    assert stage_check.desired_files(values(runtime="kubelet", **on_v1), OUTPUTS, "n", 1)["cpuaffinity"].wanted is True
    assert stage_check.desired_files(values(**on_v1), OUTPUTS, "n", 1)["cpuaffinity"].wanted is False
    assert stage_check.wants_cpuaffinity(values(isolcpus_flags=["managed_irq"], **on_v1)) is True
    assert stage_check.wants_cpuaffinity(values(runtime="kubelet", systemd_cpuaffinity="false", **on_v1)) is False
    assert stage_check.wants_cpuaffinity(values(systemd_cpuaffinity=True, **on_v1)) is True
    files = stage_check.desired_files(values(**on_v1), OUTPUTS, "n", 1)
    assert files["cpuaffinity"].to_result()["wanted"] is False and files["irqbalance"].to_result()["wanted"] is False
    # cgroup v2, read where the facts are read (the node's /, or the facts tree of a sandbox node).
    assert stage_check.wants_cpuaffinity(values(root=str(v1), facts_root=str(v2))) is True
    assert stage_check.wants_cpuaffinity(values(root=str(v2))) is True
    assert stage_check.wants_cpuaffinity(values(root=str(v2), systemd_cpuaffinity="false")) is False


def test_a_node_of_another_runtime_converges_once_nothing_of_the_agent_is_left(tmp_path):
    """A kubelet node's agent stage ran on every site.yml (about a minute on the emulated guest) only to
    find nothing to remove: now it is left out when nothing of the agent is there."""
    v = values(runtime="kubelet", root=str(tmp_path))
    assert stage_check.agent_leftovers(v, str(tmp_path)) == []
    (tmp_path / "opt/bin").mkdir(parents=True)
    (tmp_path / "opt/bin/cmk").write_text("#!/bin/sh\n")
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/cpupools-reconcile.timer").symlink_to("/nowhere")  # dangling: still there
    assert stage_check.agent_leftovers(v, str(tmp_path)) == [
        "agent: cpupools_runtime is kubelet: the agent stage removes /opt/bin/cmk",
        "agent: cpupools_runtime is kubelet: the agent stage removes /etc/systemd/system/cpupools-reconcile.timer",
    ]
    # The paths alone are the converged module's agent_leftovers: the agent stage removes only when there are any.
    assert stage_check.leftover_paths(v, str(tmp_path)) == [
        "/opt/bin/cmk",
        "/etc/systemd/system/cpupools-reconcile.timer",
    ]


def test_agent_node_name_follows_the_roles_default_chain():
    assert stage_check.agent_node_name(values(), "h") == "h"
    assert stage_check.agent_node_name(values(k8s_node_name="k"), "h") == "k"
    assert stage_check.agent_node_name(values(k8s_node_name="k", agent_node_name="a"), "h") == "a"


def test_todo_runs_every_stage_when_the_fast_path_is_off_or_the_state_is_absent():
    stages = {"kernel": [], "agent": ["pool state: differs from the plan"]}
    assert stage_check.todo(stages, True, "present") == ["agent"]
    assert stage_check.todo({"kernel": [], "agent": []}, True, "present") == []
    assert stage_check.todo(stages, False, "present") == list(stage_check.STAGES)
    assert stage_check.todo({}, True, "absent") == list(stage_check.STAGES)
    # A stage the check does not know is never reported converged.
    assert stage_check.todo(stages, True, "present", known=("kernel", "agent", "hugepages")) == ["agent", "hugepages"]


PLAN = {"pool_cpus": {"exclusive": "2-3", "shared": "4", "infra": "0-1,5-7"}, "isolated_cpus": "2-4"}


def test_kubelet_drop_in_is_compared_through_the_kubelet_modules_own_logic(tmp_path):
    """Off: nothing to do. On: missing, then written by the stage's own function, then converged."""
    from cpupools.node import kubelet
    from cpupools.node.bootloader import Host

    def host(check):
        return Host(str(tmp_path), lambda *a, **k: (0, "", ""), check_mode=check)

    assert stage_check.kubelet_reasons(values(), PLAN, None, host(True)) == []
    on = values(kubelet_dropin=True)
    reasons = stage_check.kubelet_reasons(on, PLAN, None, host(True))
    assert reasons and all(r.startswith("kubelet: ") for r in reasons), reasons
    assert list(tmp_path.iterdir()) == []  # the check wrote nothing
    node = kubelet.Node(host(False), stage_check.kubelet_path(on), on["kubelet_state_file"])
    settings = {**on, "state": "present", "plan": PLAN, "dropin": True, "reservation": on["kubelet_reservation"]}
    kubelet.configure(node, kubelet.desired_config(settings, None), "cmk", kubelet.HEADER)  # what the stage does
    assert stage_check.kubelet_reasons(on, PLAN, None, host(True)) == []
    off_again = stage_check.kubelet_reasons(values(), PLAN, None, host(True))
    assert off_again and "kubelet" in off_again[0]  # the stage would remove it


def test_hugepages_through_the_unit_always_run_the_kernel_stage(tmp_path):
    root = str(tmp_path)
    assert stage_check.hugepages_reasons({"hugepages": {"runtime": []}}, root) == []
    planned = {"hugepages": {"runtime": [{"size": "2M", "count": 8, "numa_node": 0}]}}
    assert stage_check.hugepages_reasons(planned, root) == [
        "hugepages: the cpupools-hugepages unit is not compared by the fast path"
    ]
    conf = tmp_path / "etc/cpupools-hugepages.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("x\n")
    assert stage_check.hugepages_reasons({}, root) == [
        "hugepages: /etc/cpupools-hugepages.conf is present and no page is planned through the unit"
    ]
