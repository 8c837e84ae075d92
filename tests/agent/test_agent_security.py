"""The agent attacked by the node's own users: a task-group member and an outsider, real accounts.

Each test creates the accounts with ``useradd`` (removed afterwards), writes
the state with the task group, and runs the attacker's steps as that user and
root's ``cmk`` commands as root. What must hold: root never writes, chmods,
creates or reads a file outside the state directory on an attacker's behalf,
no message quotes a file's content, nothing blocks root, and outsiders cannot
lock or write anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from agent_support import PLAN_2X, agent_env, tasks_of, tree_snapshot
from cpupools.core.errors import StateError
from cpupools.node import state as st
from cpupools.node import state_writer as sw

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"), reason="needs root and useradd")

SECRET = "root-only-secret-7f3a\n"
#: The accounts cannot run the venv's python (under root's home); the node's python3 runs cmk too.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


@pytest.fixture
def accounts():
    """``{"group": gid, "member": uid, "outsider": uid}``: a task group, one member, one outsider."""
    tag = os.urandom(3).hex()
    group, member, outsider = f"cpt{tag}", f"cpm{tag}", f"cpo{tag}"
    made = []
    try:
        subprocess.run(["groupadd", group], check=True)
        made.append(("groupdel", group))
        subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", "-G", group, member], check=True)
        made.append(("userdel", member))
        subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", outsider], check=True)
        made.append(("userdel", outsider))
        import grp
        import pwd

        yield {
            "group": grp.getgrnam(group).gr_gid,
            "member": pwd.getpwnam(member).pw_uid,
            "member_gid": pwd.getpwnam(member).pw_gid,
            "outsider": pwd.getpwnam(outsider).pw_uid,
            "outsider_gid": pwd.getpwnam(outsider).pw_gid,
        }
    finally:
        for cmd, name in reversed(made):
            subprocess.run([cmd, name], check=False, capture_output=True)


@pytest.fixture
def world(cmk, accounts):
    """A 0755 base directory (pytest's own is root-only) holding the agent, the state, and a victim area."""
    base = Path(tempfile.mkdtemp(prefix="cpupools-sec-"))
    try:
        base.chmod(0o755)
        prog = base / "bin"
        shutil.copytree(Path(cmk).parent, prog)
        prog.chmod(0o755)
        conf = base / "cmk"
        layout = sw.desired_layout(PLAN_2X)
        sw.ensure_lock_file(str(conf), accounts["group"])
        with st.StateLock(str(conf)):
            sw.write_state(str(conf), layout, {}, {}, sw.desired_meta(PLAN_2X, layout), accounts["group"])
        victim = base / "victim"  # root's files outside the state directory
        victim.mkdir(mode=0o700)
        (victim / "shadow").write_text(SECRET)
        (victim / "shadow").chmod(0o600)
        yield {"base": base, "cmk": str(prog / "cmk"), "conf": conf, "victim": victim, **accounts}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_user(world, who: str, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    ids = {"user": world[who], "group": world[f"{who}_gid"]}
    if who == "member":
        ids["extra_groups"] = [world["group"]]
    return subprocess.run(argv, env=env or agent_env(), capture_output=True, text=True, timeout=30, **ids)


def as_root(world, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [world["cmk"], args[0], f"--conf-dir={world['conf']}", *args[1:]],
        env=env or agent_env(CMK_LOCK_TIMEOUT="5"),
        capture_output=True,
        text=True,
        timeout=30,
    )


def attack(world, who: str, script: str) -> None:
    """Run a Python snippet as ``who`` with ``L`` = a cpulist directory, ``C`` = the conf dir, ``V`` = the victim."""
    prelude = f"import os\nL = {str(world['conf'] / 'pools/exclusive/0/1')!r}\nC = {str(world['conf'])!r}\n"
    prelude += f"V = {str(world['victim'])!r}\n"
    res = as_user(world, who, [SYSTEM_PYTHON, "-I", "-c", prelude + script])
    assert res.returncode == 0, res.stderr


def victim_intact(world) -> None:
    shadow = world["victim"] / "shadow"
    assert shadow.read_text() == SECRET
    assert shadow.stat().st_mode & 0o7777 == 0o600 and shadow.stat().st_uid == 0
    assert sorted(p.name for p in world["victim"].iterdir()) == ["shadow"]


def test_outsider_can_neither_lock_nor_write(world):
    conf = world["conf"]
    before = tree_snapshot(conf)
    res = as_user(world, "outsider", [SYSTEM_PYTHON, "-I", "-c", f"open({str(conf / 'lock')!r})"])
    assert res.returncode != 0 and "PermissionError" in res.stderr  # cannot even open it to flock
    res = as_user(world, "outsider", [world["cmk"], "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true"])
    assert (res.returncode, res.stderr) == (77, f"cmk: cannot open state lock {conf}/lock: permission denied\n")
    for path in (conf / "pools/exclusive/0/1/x", conf / "pools/exclusive/0/1/tasks"):
        res = as_user(world, "outsider", ["sh", "-c", f"echo 1 > {path}"])
        assert res.returncode != 0
    assert tree_snapshot(conf) == before
    # a member can take a list and give it back
    res = as_user(world, "member", [world["cmk"], "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true"])
    assert res.returncode == 0, res.stderr
    assert tasks_of(conf) == {"0": [], "1": []}
    lock = (conf / "lock").stat()
    assert (lock.st_mode & 0o7777, lock.st_gid) == (0o640, world["group"])


def test_planted_symlinks_and_a_swapped_tasks_file_give_root_nothing(world):
    """The attack of the issue: symlinks for every old temporary name, ``tasks`` swapped for the member's 0666 file."""
    victim = world["victim"]
    attack(
        world,
        "member",
        "for pid in range(1, 32768):\n"
        "    os.symlink(V + '/shadow', f'{L}/.tasks.{pid}.tmp')\n"
        "os.symlink(V + '/created-by-root', f'{L}/task.4242.555')\n"
        "os.unlink(L + '/tasks')\n"
        "fd = os.open(L + '/tasks', os.O_WRONLY | os.O_CREAT, 0o666)\n"
        "os.write(fd, b'4194303')\n"
        "os.fchmod(fd, 0o666)\n",
    )
    res = as_root(world, "reconcile")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["reclaimedCpuLists"] == [{"cpus": "1", "pid": 4194303, "pool": "exclusive"}]
    tasks = (world["conf"] / "pools/exclusive/0/1/tasks").stat()
    assert (tasks.st_uid, tasks.st_gid, tasks.st_mode & 0o7777) == (0, world["group"], 0o664)  # from the directory
    # reconcile removed every temporary name, the planted symlinks included (unlink never follows)
    assert sorted(os.listdir(world["conf"] / "pools/exclusive/0/1")) == ["tasks"]
    victim_intact(world)
    # isolate creating a marker where a symlink was planted: recorded PID and start from a procfs of our own
    attack(world, "member", "os.symlink(V + '/created-by-root', f'{L}/task.424242.555')\n")
    proc = fake_proc(world["base"] / "proc", 424242, 555)
    res = subprocess.run(
        [world["cmk"], "isolate", f"--conf-dir={world['conf']}", "--pool=exclusive", "--", "ls", "-l", list_dir(world)],
        env=agent_env(CMK_PROC_FS=str(proc)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert "task.424242.555 ->" not in res.stdout and "task.424242.555" in res.stdout  # a real file replaced the link
    victim_intact(world)
    assert not (victim / "created-by-root").exists()


def list_dir(world) -> str:
    """The cpulist directory the attacks work in."""
    return str(world["conf"] / "pools/exclusive/0/1")


def fake_proc(path: Path, pid: int, start: int) -> Path:
    fields = ["S", "1"] + ["0"] * 17 + [str(start)] + ["0"] * 30
    (path / "self").mkdir(parents=True)
    (path / "self" / "stat").write_text(f"{pid} (cmk) " + " ".join(fields) + "\n")
    (path / "1").mkdir()
    (path / "1" / "stat").write_text("1 (init) " + " ".join(fields) + "\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("sub", ["reconcile", "describe", "isolate"])
def test_tasks_linked_to_a_root_only_file_is_neither_read_nor_quoted(world, sub):
    attack(world, "member", "os.unlink(L + '/tasks')\nos.symlink(V + '/shadow', L + '/tasks')\n")
    args = ["isolate", "--pool=exclusive", "--", "true"] if sub == "isolate" else [sub]
    res = as_root(world, *args)
    assert res.returncode == 0, res.stderr  # the damaged list is skipped, the rest works
    assert "secret" not in res.stdout + res.stderr
    if sub != "isolate":
        assert res.stderr == f"cmk {sub}: skipped: {list_dir(world)}/tasks is not a regular file\n"
    victim_intact(world)


def test_a_fifo_as_tasks_blocks_nobody(world):
    attack(world, "member", "os.unlink(L + '/tasks')\nos.mkfifo(L + '/tasks', 0o666)\n")
    for args in (["reconcile"], ["describe"], ["isolate", "--pool=exclusive", "--", "true"]):
        started = time.monotonic()
        res = as_root(world, *args)
        assert res.returncode == 0, res.stderr
        assert time.monotonic() - started < 10
    # the other list still works; the FIFO's list is never handed out
    res = as_root(world, "isolate", "--pool=exclusive", "--", "sh", "-c", "echo $CMK_CPUS_ASSIGNED")
    assert res.stdout == "0\n"


def test_a_member_planting_a_hard_link_gets_it_refused(world):
    """A member's hard link to a file it owns stands for any file a lax fs.protected_hardlinks would let it link."""
    attack(
        world,
        "member",
        "os.unlink(L + '/tasks')\n"
        "fd = os.open(L + '/tasks', os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b'1'); os.close(fd)\n"
        "os.link(L + '/tasks', L + '/task.1.1')\n",
    )
    res = as_root(world, "describe")
    assert (
        res.returncode == 0
        and res.stderr == f"cmk describe: skipped: {list_dir(world)}/tasks has 2 hard links (expected 1)\n"
    )


def test_hidepid_procfs_refuses_to_record_or_reclaim(world):
    """With ``hidepid=2`` a member sees no other user's process: its isolate must not free their lists."""
    proc = world["base"] / "hidden-proc"
    proc.mkdir()
    mounted = subprocess.run(["mount", "-t", "proc", "-o", "hidepid=2", "proc", str(proc)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a procfs here: {mounted.stderr.strip()}")
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        start = st.read_proc_stat("/proc", sleeper.pid)[2]
        tasks = world["conf"] / "pools/exclusive/0"
        for cpus in ("0", "1"):  # every list held by root's live sleeper: a member's reclaim would free them
            (tasks / cpus / "tasks").write_text(str(sleeper.pid))
            (tasks / cpus / f"task.{sleeper.pid}.{start}").touch()
        before = tree_snapshot(world["conf"])
        res = as_user(
            world,
            "member",
            [world["cmk"], "isolate", f"--conf-dir={world['conf']}", "--pool=exclusive", "true"],
            env=agent_env(CMK_PROC_FS=str(proc)),
        )
        assert res.returncode == 64
        assert "hides other users' processes (PID 1 is not visible: hidepid?)" in res.stderr
        assert tree_snapshot(world["conf"]) == before
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["umount", str(proc)], check=False)


def test_own_pid_namespace_refuses_to_record_or_reclaim(world):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        start = st.read_proc_stat("/proc", sleeper.pid)[2]
        lists = world["conf"] / "pools/exclusive/0"
        for cpus in ("0", "1"):
            (lists / cpus / "tasks").write_text(str(sleeper.pid))
            (lists / cpus / f"task.{sleeper.pid}.{start}").touch()
        before = tree_snapshot(world["conf"])
        res = subprocess.run(
            [
                *("unshare", "--pid", "--fork", "--mount-proc", world["cmk"], "isolate"),
                f"--conf-dir={world['conf']}",
                "--pool=exclusive",
                "true",
            ],
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if "unshare failed" in res.stderr:
            pytest.skip(res.stderr)
        assert res.returncode == 64, res.stderr
        assert "shows only the PID namespace cmk runs in (its PID there is 1), not the host's" in res.stderr
        assert tree_snapshot(world["conf"]) == before
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_module_repairs_a_world_readable_lock_and_says_so(world):
    """States installed before the lock model have a 0644 lock: the next module run fixes it, then changes nothing."""
    conf, lock = world["conf"], world["conf"] / "lock"
    os.chown(lock, 0, 0)
    lock.chmod(0o644)
    check = sw.apply_state(str(conf), PLAN_2X, task_gid=world["group"], check_mode=True)
    assert check["changed"] is True and lock.stat().st_mode & 0o7777 == 0o644  # predicted, not done
    assert sw.apply_state(str(conf), PLAN_2X, task_gid=world["group"])["changed"] is True
    assert (lock.stat().st_mode & 0o7777, lock.stat().st_gid) == (0o640, world["group"])
    assert sw.apply_state(str(conf), PLAN_2X, task_gid=world["group"])["changed"] is False
    res = as_user(world, "outsider", [world["cmk"], "describe", f"--conf-dir={conf}"])
    assert res.returncode == 77


@pytest.fixture
def sticky(world):
    """A sticky world-writable directory (``/tmp``-like) in the world, and a root-only target outside the state.

    ``target`` holds what a conf dir holds (a lock, a state with a dead holder's PID), so that anything root
    would do there through a planted path (re-mode the lock, create ``pools/``, free the list) shows.
    """
    shared = world["base"] / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = world["victim"] / "cmk"
    layout = sw.desired_layout(PLAN_2X)
    sw.ensure_lock_file(str(target))
    with st.StateLock(str(target)):
        sw.write_state(
            str(target), layout, {"exclusive": {"0": {"1": [4194303]}}}, {}, sw.desired_meta(PLAN_2X, layout)
        )
    return {"shared": shared, "target": target}


def planted(world, sticky, how: str) -> Path:
    """The member plants ``shared/cmk``: a symlink to the target, a directory, a file, or a symlinked parent."""
    shared, target = sticky["shared"], sticky["target"]
    script = {
        "symlink": f"os.symlink({str(target)!r}, {str(shared / 'cmk')!r})",
        "own-directory": f"os.mkdir({str(shared / 'cmk')!r}, 0o777)",
        "file": f"open({str(shared / 'cmk')!r}, 'w').close()",
        "symlinked-parent": f"os.symlink({str(target.parent)!r}, {str(shared / 'up')!r})",
    }[how]
    attack(world, "member", script + "\n")
    return shared / ("up/cmk" if how == "symlinked-parent" else "cmk")


REFUSAL = {
    "symlink": "{conf}: {conf} is a symlink",
    "own-directory": "{conf}: {conf} is owned by uid {member}, not root",
    "file": "{conf}: {conf} is not a directory",
    "symlinked-parent": "{conf}: {shared}/up is a symlink in {shared}, which others can write",
}


@pytest.mark.parametrize("how", sorted(REFUSAL))
def test_a_conf_dir_planted_in_a_sticky_directory_is_refused_before_any_write(world, sticky, how):
    """A task-group member plants the conf dir (or a parent of it) in /tmp; root's module and agent refuse it."""
    conf = planted(world, sticky, how)
    target = sticky["target"]
    before = tree_snapshot(world["base"])
    message = REFUSAL[how].format(conf=conf, member=world["member"], shared=sticky["shared"])
    for check_mode in (True, False):
        with pytest.raises(StateError) as exc:
            sw.apply_state(str(conf), PLAN_2X, task_gid=world["group"], check_mode=check_mode)
        assert f"refusing the state directory {message}" in str(exc.value) and exc.value.field == "conf_dir"
    for sub, extra in (("reconcile", []), ("describe", []), ("isolate", ["--pool=exclusive", "true"])):
        res = subprocess.run(
            [world["cmk"], sub, f"--conf-dir={conf}", *extra],
            env=agent_env(CMK_LOCK_TIMEOUT="5"),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (res.returncode, res.stderr) == (78, f"cmk: refusing the state directory {message}\n"), sub
    assert tree_snapshot(world["base"]) == before  # the lock not re-moded, no pools/ made, the dead PID not freed
    assert (target / "lock").stat().st_mode & 0o7777 == 0o600 and tasks_of(target)["1"] == [4194303]
    victim_intact_but(world, "cmk")


def victim_intact_but(world, *also: str) -> None:
    shadow = world["victim"] / "shadow"
    assert shadow.read_text() == SECRET and shadow.stat().st_mode & 0o7777 == 0o600
    assert sorted(p.name for p in world["victim"].iterdir()) == sorted(["shadow", *also])


def test_a_conf_dir_of_root_in_a_sticky_directory_is_used(world, sticky):
    """The same place, made by root: a sticky directory keeps the member from replacing it, so it is fine."""
    conf = sticky["shared"] / "cmk"
    result = sw.apply_state(str(conf), PLAN_2X, task_gid=world["group"])
    assert result["changed"] is True and (conf / "pools").is_dir()
    res = as_user(world, "member", [world["cmk"], "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true"])
    assert res.returncode == 0, res.stderr
