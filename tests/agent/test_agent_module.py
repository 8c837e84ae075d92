"""The cpupools_state module through real ansible-playbook runs, with live tasks held by real cmk processes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_support import PLAN_1X, PLAN_2X, agent_env, hold, make_plan, tasks_of, tree_snapshot, workload

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
        update_affinity: "{{ update_affinity | default(true) }}"
        host: node-1
      register: out
"""


def state_run(playbook, root, plan=None, *args, **extra):
    vars_ = {"root": str(root), "plan": plan or {}, **extra}
    res = playbook(PLAY, vars_, *args)
    return res, res.result("Write the pool state") if res.data else None


def child_affinity(proc) -> str:
    child = workload(proc)
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
    checked, check_out = state_run(playbook, root, PLAN_1X, "--check")  # the plan play's early refusal
    assert checked.rc != 0 and tree_snapshot(root) == snap
    res, out = state_run(playbook, root, PLAN_1X)
    assert res.rc != 0 and out["failed"] and check_out["msg"] == out["msg"]
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


# A node CMK v1.4 set up, with its workloads still running (issue 12) ---------------

#: One socket of 8 SMT2 cores (core i = CPUs i, i+8), as CMK v1.4 ``init`` lays it out
#: for 3 exclusive and 2 shared cores: shared and infra lists named core by core.
CMK_LAYOUT = {
    "exclusive": {"1,9": "", "2,10": "", "3,11": ""},
    "shared": {"4,12,5,13": ""},
    "infra": {"0,8,6,14,7,15": ""},
}
#: What adopt plans for that node: the same CPU sets, written the way cpupools writes them.
ADOPT_PLAN = make_plan(
    {
        "exclusive": {"0": ["1,9", "2,10", "3,11"]},
        "shared": {"0": ["4,5,12,13"]},
        "infra": {"0": ["0,6,7,8,14,15"]},
    }
)

#: A CMK v1.4 isolate's life after its workload started: wait (here: for stdin to
#: close), then, under the lock, take its PID out of the list it was given, by the
#: path it was given (truncate + write + fsync, as CMK wrote), and exit 0. A list
#: renamed under it makes it fail as CMK did: FileNotFoundError, exit 1.
CMK_HOLDER = """
import fcntl, os, sys
conf, tasks = sys.argv[1], sys.argv[2]
sys.stdin.read()
with open(os.path.join(conf, "lock")) as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(tasks) as handle:
        pids = [p for p in handle.read().split(",") if p and int(p) != os.getpid()]
    with open(tasks, "w") as handle:
        handle.write(",".join(pids))
        handle.flush()
        os.fsync(handle.fileno())
"""


def write_cmk_v14_state(conf: Path) -> None:
    """The directory ``cmk init --conf-dir`` of CMK v1.4 leaves: no cpupools.json, no markers."""
    conf.mkdir(parents=True)
    (conf / "lock").write_text("")
    for pool, lists in CMK_LAYOUT.items():
        (conf / "pools" / pool / "0").mkdir(parents=True)
        (conf / "pools" / pool / "exclusive").write_text("1" if pool == "exclusive" else "0")
        for name, tasks in lists.items():
            (conf / "pools" / pool / "0" / name).mkdir()
            (conf / "pools" / pool / "0" / name / "tasks").write_text(tasks)


def cmk_holder(conf: Path, pool: str, name: str) -> subprocess.Popen:
    """A running CMK v1.4 holder of ``pool/0/name``, its PID appended to ``tasks`` as CMK does."""
    tasks = conf / "pools" / pool / "0" / name / "tasks"
    proc = subprocess.Popen(
        [sys.executable, "-c", CMK_HOLDER, str(conf), str(tasks)], stdin=subprocess.PIPE, start_new_session=True
    )
    with open(conf / "lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = tasks.read_text()
        tasks.write_text(f"{old},{proc.pid}" if old else str(proc.pid))
    return proc


def pools_tree(conf: Path) -> dict:
    """Every file and directory under pools/ with content, mtime and mode."""
    return tree_snapshot(conf / "pools")


def test_adopting_a_live_cmk_node_renames_nothing(playbook, tmp_path, cmk, holders):
    root = tmp_path / "root"
    conf = root / "etc/cmk"
    write_cmk_v14_state(conf)
    for pool, name in (("infra", "0,8,6,14,7,15"), ("shared", "4,12,5,13"), ("exclusive", "2,10")):
        holders.append(cmk_holder(conf, pool, name))
    infra_holder, shared_holder, excl_holder = holders
    before = pools_tree(conf)
    # This machine has 2 CPUs: the holders cannot run on 0-15, so nothing is re-pinned here.
    res, out = state_run(playbook, root, ADOPT_PLAN, "--diff", update_affinity=False)
    assert res.rc == 0, res.messages()
    assert out["changed"] is True  # cpupools.json and cpupools.order are new
    assert out["moves"] == [] and out["live_tasks"] == sorted(p.pid for p in holders)
    assert pools_tree(conf) == before  # no directory renamed, moved or rewritten
    assert (conf / "cpupools.order").read_text() == "exclusive 1,9 2,10 3,11\n"
    res, out = state_run(playbook, root, ADOPT_PLAN, update_affinity=False)
    assert res.rc == 0 and out["changed"] is False and pools_tree(conf) == before

    # cmk reconcile and isolate work on CMK's names and leave the holders' lists alone.
    reconciled = subprocess.run(
        [cmk, "reconcile", f"--conf-dir={conf}"], env=agent_env(), capture_output=True, text=True, timeout=30
    )
    assert reconciled.returncode == 0 and json.loads(reconciled.stdout) == {"reclaimedCpuLists": []}
    isolated = subprocess.run(
        [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "env"],
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert isolated.returncode == 0, isolated.stderr
    env = dict(line.split("=", 1) for line in isolated.stdout.splitlines() if line.startswith("CMK_"))
    assert env["CMK_CPUS_ASSIGNED"] == "1,9"  # the first free list, not the held 2,10
    assert env["CMK_CPUS_INFRA"] == "0,8,6,14,7,15" and env["CMK_CPUS_SHARED"] == "4,12,5,13"
    # isolate gave its list back: same entries, same contents (only 1,9/tasks was rewritten)
    assert {k: v[0] for k, v in pools_tree(conf).items()} == {k: v[0] for k, v in before.items()}
    assert sorted(os.listdir(conf / "pools/infra/0")) == ["0,8,6,14,7,15"]

    # The holders end as CMK's isolate does: through the paths they were given.
    for proc in holders:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    for pool, name in (("infra", "0,8,6,14,7,15"), ("shared", "4,12,5,13"), ("exclusive", "2,10")):
        assert (conf / "pools" / pool / "0" / name / "tasks").read_text() == ""
    assert infra_holder.returncode == shared_holder.returncode == excl_holder.returncode == 0


# Damaged state (issue 11) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda c: (shutil.rmtree(c / "pools"), (c / "pools").write_text("")),
            "pools is not a directory; repair it, or set force",
        ),
        (
            lambda c: ((c / "cpupools.order").unlink(), (c / "cpupools.order").mkdir()),
            "cpupools.order is not a regular file; repair it, or set force",
        ),
        (
            lambda c: ((c / "lock").unlink(), os.mkfifo(c / "lock")),
            "lock is not a regular file; repair it, or set force",
        ),
    ],
    ids=["pools-is-a-file", "order-is-a-directory", "lock-is-a-fifo"],
)
def test_damaged_state_is_one_line_then_force_repairs_it(playbook, tmp_path, damage, message):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    conf = root / "etc/cmk"
    damage(conf)
    snap = tree_snapshot(root)
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc != 0
    assert out["msg"].startswith(f"host node-1: cpupools_state: state is corrupt: {conf}/") and message in out["msg"]
    assert "\n" not in out["msg"] and "Traceback" not in res.stdout
    assert tree_snapshot(root) == snap
    res, out = state_run(playbook, root, PLAN_2X, force=True)
    assert res.rc == 0 and out["changed"] is True, res.messages()
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc == 0 and out["changed"] is False
    assert tasks_of(conf) == {"0": [], "1": []}


def test_stray_entries_are_warned_about_and_ignored(playbook, tmp_path):
    root = tmp_path / "root"
    state_run(playbook, root, PLAN_2X)
    conf = root / "etc/cmk"
    (conf / "pools/README").write_text("notes")
    (conf / "pools/exclusive/0/scratch").mkdir()
    res, out = state_run(playbook, root, PLAN_2X)
    assert res.rc == 0 and out["changed"] is False
    assert sorted(out["warnings"]) == [
        f"{conf}: {conf}/pools/README is not a pool directory; ignored",
        f"{conf}: {conf}/pools/exclusive/0/scratch is not a cpulist directory (expected a name like 2,46); ignored",
    ]


def test_a_stale_marker_of_a_reused_pid_does_not_free_the_live_list(playbook, tmp_path, cmk, holders):
    """Markers belong to their list: a stale entry of PID P on one list keeps its own start time
    through a layout rewrite, and never replaces the start time of the live P on another list."""
    root = tmp_path / "root"
    first = make_plan({"exclusive": {"0": ["0", "1"]}, "shared": {"0": []}}, {"exclusive": ["0", "1"]})
    state_run(playbook, root, first)
    conf = root / "etc/cmk"
    holders.append(hold(cmk, conf))  # takes "0"
    pid = holders[0].pid
    live_marker = next(p.name for p in (conf / "pools/exclusive/0/0").glob("task.*"))
    start = int(live_marker.rsplit(".", 1)[1])
    # an earlier process with the same PID left its entry on "1" (CMK's reconcile dropped markers)
    (conf / "pools/exclusive/0/1/tasks").write_text(str(pid))
    (conf / "pools/exclusive/0/1" / f"task.{pid}.{start - 5}").touch()
    grown = make_plan({"exclusive": {"0": ["0", "1"]}, "shared": {"0": []}, "infra": {"0": []}})
    res, out = state_run(playbook, root, grown)  # a new pool: the whole tree is rewritten
    assert res.rc == 0 and out["changed"] is True, res.messages()
    assert sorted(p.name for p in (conf / "pools/exclusive/0/0").iterdir()) == [live_marker, "tasks"]
    assert (conf / "pools/exclusive/0/1" / f"task.{pid}.{start - 5}").exists()
    reconciled = subprocess.run(
        [cmk, "reconcile", f"--conf-dir={conf}"], env=agent_env(), capture_output=True, text=True, timeout=30
    )
    assert json.loads(reconciled.stdout) == {"reclaimedCpuLists": [{"cpus": "1", "pid": pid, "pool": "exclusive"}]}
    assert tasks_of(conf) == {"0": [pid], "1": []}


def test_a_task_group_member_works_on_an_interrupted_swap_and_root_finishes_it(playbook, cmk):
    """pools/ missing after a kill between the renames: a member's isolate, which may not
    rename in <conf>, takes and gives back its list in the new tree; the module moves it into place."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cpupools-swap-"))
    try:
        base.chmod(0o755)
        root = base / "root"
        res, out = state_run(playbook, root, PLAN_2X, task_group="4711")
        assert res.rc == 0, res.messages()
        conf = root / "etc/cmk"
        os.rename(conf / "pools", conf / ".pools.new")  # keeps owners and modes: the complete new tree
        shutil.copytree(conf / ".pools.new", conf / ".pools.old")
        prog = base / "bin"
        shutil.copytree(Path(cmk).parent, prog)
        prog.chmod(0o755)
        held = conf / ".pools.new/exclusive/0/1/tasks"
        res = subprocess.run(
            [str(prog / "cmk"), "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "cat", str(held)],
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=30,
            user=65534,
            group=65534,
            extra_groups=[4711],
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.isdigit()  # its own PID, recorded in the new tree
        assert not (conf / "pools").exists() and held.read_text() == ""
        res, out = state_run(playbook, root, PLAN_2X, task_group="4711")
        assert res.rc == 0 and out["changed"] is True
        assert sorted(p.name for p in conf.iterdir()) == ["cpupools.json", "cpupools.order", "lock", "pools"]
        res, out = state_run(playbook, root, PLAN_2X, task_group="4711")
        assert out["changed"] is False
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_task_group_the_node_lacks_is_refused_by_the_variable_s_name_before_anything_is_written(tmp_path):
    from cpupools.core.errors import StateError
    from cpupools.node.state_writer import group_id
    from helpers import run_module

    assert (group_id(""), group_id("4711"), group_id("root")) == (None, 4711, 0)
    with pytest.raises(StateError) as refused:
        group_id("no-such-group")
    assert (
        refused.value.describe("node-1")
        == "host node-1: cpupools_task_group: group 'no-such-group' does not exist on the node"
    )
    res = run_module(
        "cpupools_state",
        {"root": str(tmp_path / "root"), "plan": PLAN_2X, "task_group": "no-such-group", "host": "node-1"},
        tmp_path,
    )
    assert res["failed"] and res["msg"] == refused.value.describe("node-1")
    assert not (tmp_path / "root").exists()
