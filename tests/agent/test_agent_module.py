"""The cpupools_state module through real ansible-playbook runs, with live tasks held by real cmk processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from agent_support import PLAN_1X, PLAN_2X, agent_env, make_plan, tasks_of, tree_snapshot

pytestmark = pytest.mark.slow

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write the pool state
      cpupools_state:
        root: "{{ root }}"
        plan: "{{ plan }}"
        state: "{{ state | default('present') }}"
        force: "{{ force | default(false) }}"
        task_group: "{{ task_group | default(omit) }}"
        host: node-1
      register: out
"""


def state_run(playbook, root, plan=None, *args, **extra):
    vars_ = {"root": str(root), "plan": plan or {}, **extra}
    res = playbook(PLAY, vars_, *args)
    return res, res.result("Write the pool state") if res.data else None


def hold(cmk, conf, pool="exclusive"):
    """Start ``cmk isolate ... sleep 120`` and wait until it holds its list."""
    proc = subprocess.Popen(
        [cmk, "isolate", f"--conf-dir={conf}", f"--pool={pool}", "--", "sleep", "120"],
        env=agent_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    # Wait for what the tests assert on: the PID recorded, and the workload started.
    while not any(proc.pid in pids for pids in tasks_of(conf, pool).values()) or not children.read_text().split():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def child_affinity(proc) -> str:
    child = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
    for line in Path(f"/proc/{child}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError("no Cpus_allowed_list")


@pytest.fixture
def holders():
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_first_run_changes_second_does_not_check_mode_touches_nothing(playbook, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    res, out = state_run(playbook, root, PLAN_2X, "--check", "--diff")
    assert res.rc == 0 and out["changed"] is True
    assert "pools/exclusive/0/1/tasks: " in out["diff"]["after"]
    assert list(root.iterdir()) == []  # check mode wrote nothing
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc == 0 and out["changed"] is True
    conf = root / "etc/cmk"
    assert (conf / "pools/exclusive/exclusive").read_text() == "1"
    snap = tree_snapshot(root)
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc == 0 and res.changed() == 0 and out["changed"] is False
    assert tree_snapshot(root) == snap  # same content, same mtimes
    res, out = state_run(playbook, root, PLAN_1X, "--check")
    assert out["changed"] is True and tree_snapshot(root) == snap


def test_resize_keeps_a_live_holder_on_its_list(playbook, tmp_path, cmk, holders):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    conf = root / "etc/cmk"
    holders.append(hold(cmk, conf))  # takes "1", first in hand-out order
    res, out = state_run(playbook, root, PLAN_1X)  # "0" leaves exclusive, "1" stays
    assert res.rc == 0 and out["changed"] is True and out["moves"] == []
    assert tasks_of(conf) == {"1": [holders[0].pid]}
    assert tasks_of(conf, "shared") == {"0": []}
    assert child_affinity(holders[0]) == "1"
    # and the holder still gives its list back through the new state
    os.kill(holders[0].pid, signal.SIGTERM)
    assert holders[0].wait(timeout=20) == 128 + signal.SIGTERM
    assert tasks_of(conf) == {"1": []}


def test_resize_moves_a_holder_and_repins_it(playbook, tmp_path, cmk, holders):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_1X)
    conf = root / "etc/cmk"
    holders.append(hold(cmk, conf))
    assert child_affinity(holders[0]) == "1"
    swapped = make_plan({"exclusive": {"0": ["0"]}, "shared": {"0": ["1"]}, "infra": {"0": []}})
    res, out = state_run(playbook, root, swapped)
    assert res.rc == 0, res.messages()
    assert out["moves"] == [{"pid": holders[0].pid, "pool": "exclusive", "from": "1", "to": "0", "socket": "0"}]
    assert tasks_of(conf) == {"0": [holders[0].pid]}
    assert child_affinity(holders[0]) == "0"  # the workload itself was re-pinned


def test_resize_that_cannot_fit_is_refused_before_any_change(playbook, tmp_path, cmk, holders):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    conf = root / "etc/cmk"
    holders.extend([hold(cmk, conf), hold(cmk, conf)])
    snap = tree_snapshot(root)
    res, out = state_run(playbook, root, PLAN_1X)
    assert res.rc != 0 and out["failed"]
    pid = holders[1].pid  # the holder of "0", which PLAN_1X drops
    assert out["msg"] == (
        f"host node-1: cpupools_plan: refusing to change the pool state: pool exclusive: live task(s) PID {pid} "
        "hold 1 cpulist(s) that the new plan drops, but only 0 of its 1 cpulist(s) are free "
        "(the others are kept by live tasks)"
    )
    assert tree_snapshot(root) == snap


def test_absent_refuses_while_tasks_are_live_unless_forced(playbook, tmp_path, cmk, holders):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    conf = root / "etc/cmk"
    holders.append(hold(cmk, conf))
    snap = tree_snapshot(root)
    res, out = state_run(playbook, root, None, state="absent")
    assert res.rc != 0
    assert f"refusing to remove the pool state while tasks are live: PID {holders[0].pid} on exclusive:1" in out["msg"]
    assert tree_snapshot(root) == snap
    res, out = state_run(playbook, root, None, "--check", state="absent", force=True)
    assert out["changed"] is True and tree_snapshot(root) == snap
    res, out = state_run(playbook, root, None, state="absent", force=True)
    assert res.rc == 0 and out["changed"] is True
    assert not conf.exists()
    res, out = state_run(playbook, root, None, state="absent")
    assert res.rc == 0 and out["changed"] is False


def test_corrupt_state_is_refused_naming_the_path(playbook, tmp_path):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    (root / "etc/cmk/pools/exclusive/0/1/tasks").write_text("x")
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc != 0 and "state is corrupt" in out["msg"] and "0/1/tasks holds something else" in out["msg"]
    assert out["msg"].startswith("host node-1: cpupools_state: ")


def test_task_group_lets_its_members_take_lists_and_nothing_more(playbook, tmp_path_factory, cmk):
    """Workloads run as other users: members of the task group may isolate; others get status 77."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cpupools-perm-"))
    try:
        base.chmod(0o755)
        root = base / "root"
        res, out = state_run(playbook, root, PLAN_2X, task_group="4711")
        assert res.rc == 0, res.messages()
        conf = root / "etc/cmk"
        leaf = (conf / "pools/exclusive/0/1").stat()
        assert (oct(leaf.st_mode & 0o7777), leaf.st_gid) == ("0o2775", 4711)
        assert oct((conf / "pools/exclusive/0").stat().st_mode & 0o7777) == "0o755"
        assert (oct((conf / "lock").stat().st_mode & 0o7777), (conf / "lock").stat().st_gid) == ("0o640", 4711)
        prog = base / "bin"
        shutil.copytree(Path(cmk).parent, prog)
        prog.chmod(0o755)
        as_member = dict(user=65534, group=65534, extra_groups=[4711])
        res = subprocess.run(
            [
                str(prog / "cmk"),
                "isolate",
                f"--conf-dir={conf}",
                "--pool=exclusive",
                "--",
                "sh",
                "-c",
                f"cat {conf}/pools/exclusive/0/1/tasks",
            ],
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=30,
            **as_member,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.isdigit() and tasks_of(conf) == {"0": [], "1": []}
        # a non-member cannot take a list, and nothing changed
        res = subprocess.run(
            [str(prog / "cmk"), "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "true"],
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=30,
            user=65534,
            group=65534,
        )
        assert res.returncode == 77 and "permission denied" in res.stderr
        assert tasks_of(conf) == {"0": [], "1": []}
        # members cannot touch the layout
        res = subprocess.run(["mkdir", str(conf / "pools/exclusive/0/7")], capture_output=True, **as_member)
        assert res.returncode != 0
        # the module still sees its state as converged after workloads rewrote task files
        res, out = state_run(playbook, root, PLAN_2X, task_group="4711")
        assert out["changed"] is False
    finally:
        shutil.rmtree(base, ignore_errors=True)
