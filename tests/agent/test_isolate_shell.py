"""CMK v1.4's shell form of ``cmk isolate``: a per-node default and a per-workload switch."""

from __future__ import annotations

import subprocess

import pytest
from agent_support import PLAN_2X, agent_env, tasks_of, tree_snapshot
from helpers import plan_play_files

#: A v1.4-era pod spec: the variable is expanded by the shell CMK v1.4 ran the command through.
V14_ARGS = ("echo", "--", "--cpus", "$CMK_CPUS_ASSIGNED")


def isolate(cmk, conf, *command, **env):
    argv = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", *command]
    return subprocess.run(argv, env=agent_env(**env), capture_output=True, text=True, timeout=30, check=False)


def test_argv_is_the_default(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    res = isolate(cmk, conf, *V14_ARGS)
    assert (res.returncode, res.stdout) == (0, "--cpus $CMK_CPUS_ASSIGNED\n")
    res = isolate(cmk, conf, "echo a; echo b")
    assert res.returncode == 127 and res.stderr == "cmk: command not found: echo a; echo b\n"
    assert tasks_of(conf) == {"0": [], "1": []}


def test_workload_switch_runs_the_command_through_the_shell(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    res = isolate(cmk, conf, *V14_ARGS, CMK_ISOLATE_SHELL="1")
    assert (res.returncode, res.stdout) == (0, "--cpus 1\n")  # the plan hands out "1" first
    res = isolate(cmk, conf, "echo a; echo b", CMK_ISOLATE_SHELL="true")
    assert (res.returncode, res.stdout) == (0, "a\nb\n")
    # Unlike CMK v1.4 (always 0), the status stays the command's, the shell's here.
    res = isolate(cmk, conf, "exit 3", CMK_ISOLATE_SHELL="1")
    assert res.returncode == 3
    assert tasks_of(conf) == {"0": [], "1": []}


def test_node_default_from_the_settings_file_and_the_workload_overrides_it(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    (conf / "cpupools.agent").write_text("# Ansible managed\nisolate_shell=1\n")
    assert isolate(cmk, conf, *V14_ARGS).stdout == "--cpus 1\n"
    assert isolate(cmk, conf, *V14_ARGS, CMK_ISOLATE_SHELL="0").stdout == "--cpus $CMK_CPUS_ASSIGNED\n"
    (conf / "cpupools.agent").write_text("isolate_shell=0\n")
    assert isolate(cmk, conf, *V14_ARGS).stdout == "--cpus $CMK_CPUS_ASSIGNED\n"
    assert isolate(cmk, conf, *V14_ARGS, CMK_ISOLATE_SHELL="yes").stdout == "--cpus 1\n"


@pytest.mark.parametrize(
    ("settings", "env", "message"),
    [
        (None, {"CMK_ISOLATE_SHELL": "maybe"}, "cmk: CMK_ISOLATE_SHELL='maybe': expected 1"),
        ("isolate_shell=on\n", {}, "/cpupools.agent: isolate_shell='on': expected 1"),
    ],
)
def test_a_bad_switch_is_one_line_and_takes_nothing(cmk, state_dir, settings, env, message):
    conf = state_dir(PLAN_2X)
    if settings:
        (conf / "cpupools.agent").write_text(settings)
    snap = tree_snapshot(conf)
    res = isolate(cmk, conf, "true", **env)
    assert res.returncode == 64 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert tree_snapshot(conf) == snap


PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: cpupools_agent
"""


@pytest.mark.slow
def test_role_writes_the_node_default(playbook, tmp_path):
    root = tmp_path / "root"
    base = {"cpupools_root": str(root), "cpupools_plan": PLAN_2X}

    def with_files(**variables):  # what the plan play hands the stage for these variables
        variables = {**base, **variables}
        return {**variables, "cpupools_plan_result": plan_play_files(variables)}

    extra = with_files(cpupools_agent_isolate_shell=True)
    res = playbook(PLAY, extra, "--check")
    assert res.rc == 0, res.stdout[-2000:]
    assert not root.exists() or list(root.iterdir()) == []
    assert playbook(PLAY, extra).rc == 0
    settings = root / "etc/cmk/cpupools.agent"
    assert settings.read_text().startswith("#") and settings.read_text().endswith("\nisolate_shell=1\n")
    snap = tree_snapshot(root)
    res = playbook(PLAY, extra)
    assert res.rc == 0 and res.changed() == 0 and tree_snapshot(root) == snap
    res = isolate(str(root / "opt/bin/cmk"), root / "etc/cmk", *V14_ARGS)
    assert (res.returncode, res.stdout) == (0, "--cpus 1\n")
    snap = tree_snapshot(root)  # isolate rewrote a tasks file
    res = playbook(PLAY, with_files(cpupools_agent_isolate_shell=False), "--check", "--diff")
    assert res.rc == 0 and res.changed() == 1 and tree_snapshot(root) == snap
    assert playbook(PLAY, with_files(cpupools_agent_isolate_shell=False)).changed() == 1
    assert settings.read_text().endswith("\nisolate_shell=0\n")
    assert playbook(PLAY, with_files(cpupools_agent_isolate_shell=True, cpupools_state="absent")).rc == 0
    assert not (root / "etc/cmk").exists()
