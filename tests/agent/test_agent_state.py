"""Unit tests of the pool state (module_utils/cpupools/node/state.py): layout, validation, lock, resize rule."""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import time

import pytest
from agent_support import PLAN_2X, make_plan, write_plan_state
from cpupools.core.cpulist import format_cpulist
from cpupools.core.errors import LockTimeoutError, ResizeError, StateError, UsageError
from cpupools.hardware.topology import gather_topology
from cpupools.node import state as st
from cpupools.node import state_writer as sw
from cpupools.planning.plan import make_request, plan_pools


@pytest.fixture
def big_plan(corpus_root):
    topo = gather_topology(corpus_root["2s22c-smt2"])
    return plan_pools(topo, make_request({"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"}))


def test_layout_is_cmk_v14(tmp_path, big_plan):
    conf = write_plan_state(tmp_path / "cmk", big_plan)
    pools = conf / "pools"
    assert sorted(os.listdir(pools)) == ["exclusive", "infra", "shared"]
    assert (pools / "exclusive" / "exclusive").read_text() == "1"
    assert (pools / "shared" / "exclusive").read_text() == "0"
    # CMK lists a pool dir as sockets (+ the flag) and reads only "tasks" in a cpulist dir.
    assert sorted(os.listdir(pools / "exclusive")) == ["0", "1", "exclusive"]
    assert sorted(os.listdir(pools / "exclusive" / "0")) == ["1,45", "2,46", "3,47"]
    assert os.listdir(pools / "exclusive" / "0" / "1,45") == ["tasks"]
    assert (pools / "exclusive" / "0" / "1,45" / "tasks").read_bytes() == b""
    assert (conf / "lock").read_bytes() == b""
    # Round trip: what is read back is what the plan asked for.
    assert sw.current_layout(st.read_state(str(conf))) == sw.desired_layout(big_plan)


def test_handout_order_spreads_where_cmk_sorted_strings(tmp_path):
    plan = make_plan({"exclusive": {"0": ["2,46", "10,54"], "1": ["23,67", "30,74"]}})
    plan["handout_order"] = {"exclusive": ["2,46", "23,67", "10,54", "30,74"]}
    conf = write_plan_state(tmp_path / "cmk", plan)
    pool = st.read_state(str(conf))["exclusive"]
    # CMK's order: socket 0 first, "10,54" before "2,46" (strings).
    assert [cl.cpus for cl in pool.cpulists()] == ["10,54", "2,46", "23,67", "30,74"]
    order = st.read_handout_order(str(conf), "exclusive")
    assert [cl.cpus for cl in st.ordered_for_handout(pool, order)] == ["2,46", "23,67", "10,54", "30,74"]
    assert [cl.cpus for cl in st.ordered_for_handout(pool, order, "1")] == ["23,67", "30,74"]
    # A list the order does not name (stale metadata) still comes, after the named ones.
    assert [cl.cpus for cl in st.ordered_for_handout(pool, ["23,67"])] == ["23,67", "10,54", "2,46", "30,74"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: (c / "pools/exclusive/exclusive").write_text("yes"), "expected 1 or 0"),
        (lambda c: (c / "pools/exclusive/exclusive").unlink(), "exclusive is missing"),
        (lambda c: (c / "pools/exclusive/zero").mkdir(), "is not a socket directory"),
        (lambda c: (c / "pools/exclusive/0/0-1").mkdir(), "is not a cpulist directory"),
        (lambda c: (c / "pools/exclusive/0/1,1").mkdir(), "is not a cpulist directory"),
        (lambda c: (c / "pools/exclusive/0/1/tasks").write_text("12,abc"), "expected comma-separated PIDs"),
        (lambda c: (c / "pools/exclusive/0/1/tasks").unlink(), "tasks is missing"),
        (lambda c: os.rename(c / "pools", c / "gone"), "is missing: the pool state is not installed"),
    ],
)
def test_corrupt_state_is_refused_with_the_path(tmp_path, damage, message):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    damage(conf)
    with pytest.raises(StateError, match=message) as info:
        pools = st.read_state(str(conf))
        for pool in pools.values():
            for cl in pool.cpulists():
                cl.tasks  # noqa: B018 - tasks are read lazily
    assert str(conf) in str(info.value)


def test_lock_times_out_without_threads(tmp_path):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    holder = os.open(conf / "lock", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeoutError, match=r"after 0\.3 s"), st.StateLock(str(conf), 0.3):
            pass
        assert time.monotonic() - started >= 0.3
    finally:
        os.close(holder)
    with st.StateLock(str(conf), 0.3):  # free again
        pass


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "inf-ish"])
def test_lock_timeout_env_is_validated(raw):
    from cpupools.agent.options import lock_timeout

    with pytest.raises(UsageError, match="CMK_LOCK_TIMEOUT"):
        lock_timeout({"CMK_LOCK_TIMEOUT": raw})
    assert lock_timeout({}) == 30.0
    assert lock_timeout({"CMK_LOCK_TIMEOUT": "2.5"}) == 2.5


def test_proc_stat_with_hostile_command_name():
    text = "4242 (a) b (c d) R 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 987654 0 0"
    assert st.parse_proc_stat(text) == (4242, "R", 987654)
    me = st.read_proc_stat("/proc", os.getpid())
    assert me is not None and me[0] == os.getpid()
    assert st.read_proc_stat("/proc", 2**22 + 7) is None


def test_start_markers_catch_pid_reuse(tmp_path):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    me = st.read_proc_stat("/proc", os.getpid())
    cl = st.read_state(str(conf))["exclusive"].cpulists()[0]
    st.write_tasks(cl, [os.getpid()], {os.getpid(): me[2]})
    assert sorted(os.listdir(cl.path)) == [f"task.{os.getpid()}.{me[2]}", "tasks"]
    fresh = st.read_state(str(conf))["exclusive"].cpulists()[0]
    assert fresh.tasks == [os.getpid()] and fresh.starts == {os.getpid(): me[2]}
    assert st.task_alive("/proc", os.getpid(), me[2])
    # Same PID, another start time: the recorded process is gone, but a running PID may hold the
    # list for an agent that writes no marker (CMK v1.4); only a PID that does not run is dead.
    assert st.task_alive("/proc", os.getpid(), me[2] + 1)
    assert not st.task_alive("/proc", 2**22 + 7, me[2])
    assert st.task_alive("/proc", os.getpid(), None)  # no marker: CMK's existence check
    st.write_tasks(fresh, [], {})
    assert os.listdir(cl.path) == ["tasks"] and (conf / "pools/exclusive/0/0/tasks").read_text() == ""


def test_stray_marker_without_its_pid_is_ignored(tmp_path):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    (conf / "pools/exclusive/0/1/task.77.12345").touch()  # a crash between marker and tasks
    cl = st.read_state(str(conf))["exclusive"].cpulists()[1]
    assert cl.tasks == [] and cl.starts == {77: 12345}
    st.write_tasks(cl, [], {})  # the next write of the list cleans it
    assert os.listdir(cl.path) == ["tasks"]


def test_desired_layout_rejects_bad_plans():
    with pytest.raises(StateError, match=r"not a cpulist in CMK form") as info:
        sw.desired_layout(make_plan({"exclusive": {"0": ["0-3"]}}))
    assert info.value.field == "plan"
    with pytest.raises(StateError, match="CPU 1 is in exclusive:1 and shared:1,2"):
        sw.desired_layout(make_plan({"exclusive": {"0": ["1"]}, "shared": {"0": ["1,2"]}}))
    with pytest.raises(StateError, match="plan is malformed"):
        sw.desired_layout({"pools": ["exclusive"]})


def test_diff_layout_names_added_and_removed():
    old = sw.desired_layout(PLAN_2X)
    new = sw.desired_layout(make_plan({"exclusive": {"0": ["1"]}, "shared": {"0": ["0"]}}))
    diff = sw.diff_layout(old, new)
    assert diff == {"added": ["shared/0/0"], "removed": ["exclusive/0/0"], "flags": []}


# The resize rule ------------------------------------------------------------

OLD = {
    "exclusive": {"0": {"1,45": [100], "2,46": [], "3,47": [300]}, "1": {"23,67": [400]}},
    "shared": {"0": {"4,48": [500, 501]}, "1": {"25,69": [600]}},
}


def _desired(excl0, excl1, shared0, shared1):
    plan = make_plan({"exclusive": {"0": excl0, "1": excl1}, "shared": {"0": shared0, "1": shared1}})
    return sw.desired_layout(plan), plan["handout_order"]


def test_resize_keeps_holders_whose_list_stays_exclusive():
    desired, order = _desired(["1,45", "3,47"], ["23,67", "24,68"], ["4,48"], ["25,69"])
    new, moves = sw.resize_tasks(OLD, {100, 300, 400, 500, 501, 600}, desired, order)
    assert new["exclusive"]["0"] == {"1,45": [100], "3,47": [300]}
    assert new["exclusive"]["1"] == {"23,67": [400], "24,68": []}
    assert new["shared"] == {"0": {"4,48": [500, 501]}, "1": {"25,69": [600]}}
    assert moves == []


def test_resize_moves_a_displaced_holder_to_a_free_list_same_socket_first():
    desired, order = _desired(["1,45", "5,49"], ["23,67", "24,68"], ["4,48", "3,47"], ["25,69"])
    desired["shared"]["sockets"]["0"] = ["3,4,47,48"]
    new, moves = sw.resize_tasks(OLD, {100, 300, 400, 500, 501, 600}, desired, order)
    assert new["exclusive"]["0"] == {"1,45": [100], "5,49": [300]}
    assert moves[0] == {"pid": 300, "pool": "exclusive", "from": "3,47", "to": "5,49", "socket": "0"}
    # shared tasks follow their socket's (grown) list
    assert new["shared"]["0"] == {"3,4,47,48": [500, 501]}
    changes = sw.affinity_changes(OLD, new, {100, 300, 400, 500, 501, 600})
    assert changes == {300: [5, 49], 500: [3, 4, 47, 48], 501: [3, 4, 47, 48]}


def test_resize_refuses_when_live_holders_do_not_fit():
    desired, order = _desired(["1,45"], ["23,67"], ["2,3,46,47"], ["25,69"])
    with pytest.raises(ResizeError) as info:
        sw.resize_tasks(OLD, {100, 300, 400, 500, 501, 600}, desired, order)
    msg = str(info.value)
    assert "PID 300" in msg and "1 cpulist(s) that the new plan drops" in msg and "only 0 of its 2" in msg


def test_resize_drops_dead_holders_of_removed_lists_only():
    desired, order = _desired(["1,45"], ["23,67"], ["4,48"], ["25,69"])
    new, moves = sw.resize_tasks(OLD, {400}, desired, order)  # 100, 300, 5xx, 600 are dead
    assert new["exclusive"]["0"] == {"1,45": [100]}  # kept list: left for reconcile
    assert moves == []


def test_resize_refuses_a_pool_that_disappears_under_live_tasks():
    desired, order = _desired(["1,45", "2,46", "3,47"], ["23,67"], [], [])
    with pytest.raises(ResizeError, match=r"PID 500, 501, 600 hold 2 cpulist\(s\) but the new plan has no cpulist"):
        sw.resize_tasks(OLD, {500, 501, 600}, desired, order)


# Names of big lists (issue 10) ---------------------------------------------------

#: Every other core of a 2 x 128 SMT2 socket 0: too fragmented even for ranges.
FRAGMENTED = [c for core in range(0, 128, 2) for c in (core, core + 256)]


def test_list_names_take_the_first_form_that_fits():
    assert st.list_dir_name([2, 46]) == "2,46"  # CMK's form, as every exclusive list
    contiguous = [*range(64), *range(512, 576)]
    assert st.list_dir_name(contiguous) == "0-63,512-575"  # the comma form is 474 bytes
    name = st.list_dir_name(FRAGMENTED)
    assert name.startswith("cpus-128-") and len(name) == len("cpus-128-") + 16
    assert st.list_dir_name(list(reversed(FRAGMENTED))) == name  # stable: a function of the set
    for cpus in ([2, 46], contiguous, FRAGMENTED, list(range(1024))):
        assert len(st.list_dir_name(cpus)) <= st.NAME_MAX


def test_every_reader_reads_the_three_forms(tmp_path):
    contiguous = ",".join(str(c) for c in range(384, 511))
    fragmented = ",".join(map(str, sorted(FRAGMENTED)))
    plan = make_plan({"exclusive": {"0": ["1,257"]}, "shared": {"0": [fragmented]}, "infra": {"0": [contiguous]}})
    conf = write_plan_state(tmp_path / "cmk", plan)
    shared = st.read_state(str(conf))["shared"].cpulists()[0]
    assert shared.name.startswith(st.HASHED_PREFIX) and shared.cpus == fragmented
    assert (conf / "pools/shared/0" / shared.name / "cpus").read_text() == format_cpulist(FRAGMENTED) + "\n"
    infra = st.read_state(str(conf))["infra"].cpulists()[0]
    assert infra.name == "384-510" and infra.cpus == contiguous
    assert sw.current_layout(st.read_state(str(conf))) == sw.desired_layout(plan)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("0-1", "the comma form 0,1 fits: a range name is not this list's name"),
        ("cpus-2-0123456789abcdef", "the digest does not match the cpus file"),
        ("cpus-9-nofile", "no cpus file"),
        ("x", "not a cpulist at all"),
    ],
)
def test_names_in_no_valid_form_are_corrupt_or_stray(tmp_path, name, why):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    bad = conf / "pools/exclusive/0" / name
    bad.mkdir()
    (bad / "tasks").write_text("")
    if name.startswith("cpus-2"):
        (bad / "cpus").write_text("5,7\n")
    with pytest.raises(StateError, match="is not a cpulist directory"):
        st.read_state(str(conf))
    strays: list[str] = []
    pools = st.read_state(str(conf), strays=strays)  # the module's reading: reported, not fatal
    assert strays == [f"{bad} is not a cpulist directory (expected a name like 2,46)"], why
    assert [cl.name for cl in pools["exclusive"].cpulists()] == ["0", "1"]


def test_stray_entries_anywhere_are_reported_and_skipped(tmp_path):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    (conf / "pools/README").write_text("hand-written notes")
    (conf / "pools/backup").mkdir()
    (conf / "pools/exclusive/notes.txt").write_text("")
    strays: list[str] = []
    pools = st.read_state(str(conf), strays=strays)
    assert sorted(pools) == ["exclusive", "shared"]
    assert strays == [
        f"{conf}/pools/README is not a pool directory",
        f"{conf}/pools/backup/exclusive is missing",
        f"{conf}/pools/exclusive/notes.txt is not a socket directory (name must be a number)",
    ]


def test_markers_belong_to_their_list_not_to_the_pid():
    """A stale entry of PID P on one list must not lend its start time to P on another."""
    old = {"exclusive": {"0": {"1": [77], "2": [77]}}}
    starts = {("exclusive", "0", "1"): {77: 111}, ("exclusive", "0", "2"): {77: 222}}
    new = {"exclusive": {"0": {"1": [77], "3": [77]}}}
    moves = [{"pid": 77, "pool": "exclusive", "from": "2", "to": "3", "socket": "0"}]
    assert sw.carry_starts(starts, new, moves) == {
        ("exclusive", "0", "1"): {77: 111},
        ("exclusive", "0", "3"): {77: 222},
    }
    # A live 77 whose marker matches only list "2": on "1" it is a dead entry, moved nowhere.
    desired = sw.desired_layout(make_plan({"exclusive": {"0": ["2", "3"]}}))
    placed, moved = sw.resize_tasks(old, {77}, desired, {}, stale={("exclusive", "0", "1", 77)})
    assert placed == {"exclusive": {"0": {"2": [77], "3": []}}} and moved == []


def test_an_interrupted_swap_is_predicted_in_check_mode_and_finished_by_the_next_run(tmp_path):
    """Killed between the two renames: pools/ missing, .pools.old and the complete .pools.new beside it."""
    import shutil

    conf = write_plan_state(tmp_path / "cmk", PLAN_2X, {"exclusive": {"0": {"1": [os.getpid()]}}})
    os.rename(conf / "pools", conf / st.OLD_TREE)
    shutil.copytree(conf / st.OLD_TREE, conf / st.NEW_TREE)
    before = sorted(p.name for p in conf.iterdir())
    check = sw.apply_state(str(conf), PLAN_2X, check_mode=True, update_affinity=False)
    assert check["changed"] is True and check["live_tasks"] == [os.getpid()]
    assert "was missing after an interrupted write" in check["warnings"][0]
    assert sorted(p.name for p in conf.iterdir()) == before  # check mode renamed nothing
    real = sw.apply_state(str(conf), PLAN_2X, update_affinity=False)
    assert real["changed"] is True and real["tasks"]["exclusive"] == {"0": [], "1": [os.getpid()]}
    assert sorted(p.name for p in conf.iterdir()) == ["cpupools.json", "cpupools.order", "lock", "pools"]
    assert sw.apply_state(str(conf), PLAN_2X, update_affinity=False)["changed"] is False


def test_temporary_metadata_files_of_a_killed_run_are_removed(tmp_path):
    conf = write_plan_state(tmp_path / "cmk", PLAN_2X)
    sw.apply_state(str(conf), PLAN_2X, update_affinity=False)
    (conf / ".cpupools.json.4242.tmp").write_text("{")  # killed inside atomic_write
    assert sw.apply_state(str(conf), PLAN_2X, check_mode=True)["changed"] is True
    assert (conf / ".cpupools.json.4242.tmp").exists()
    assert sw.apply_state(str(conf), PLAN_2X)["changed"] is True
    assert not (conf / ".cpupools.json.4242.tmp").exists()
    assert sw.apply_state(str(conf), PLAN_2X)["changed"] is False


@pytest.mark.parametrize("meanwhile", ["joined", "swapped", "cleaned"])
def test_reconcile_writes_a_prepared_file_only_over_the_list_it_scanned(tmp_path, monkeypatch, meanwhile):
    """Reconcile prepares a list's new tasks file before the lock; what happens before the lock is honoured.

    joined: a live task joins the shared list between the scan and the lock
    (its isolate held the lock then), so the prepared file would lose it.
    swapped: the module swapped a new tree in, so the prepared file's
    directory is gone. cleaned: another reconcile removed the prepared file as
    a crash leftover. Each time the list is written again under the lock: the
    dead PID goes, the live ones and their markers stay, no temporary is left.
    """
    from cpupools.agent import reconcile

    dead, me = 2**22 + 7, os.getpid()
    my_start = st.read_proc_stat("/proc", me)[2]
    plan = make_plan({"shared": {"0": ["0,1"]}})
    conf = write_plan_state(tmp_path / "conf", plan, {"shared": {"0": {"0,1": [dead]}}}, {dead: 99})
    path = str(conf / "pools/shared/0/0,1")
    real_current = st.PreparedTasks.current

    def current(prep):
        if meanwhile == "joined":
            cl = st.CpuList("shared", "0", "0,1", path)
            st.write_tasks(cl, [dead, me], {me: my_start})
        elif meanwhile == "swapped":
            os.rename(path, path + ".old")
            os.mkdir(path, 0o775)
            for name in os.listdir(path + ".old"):
                if not st.is_temporary(name):
                    shutil.copy(os.path.join(path + ".old", name), os.path.join(path, name))
            shutil.rmtree(path + ".old")
        else:
            os.unlink(os.path.join(path, prep.tmp))
        return real_current(prep)

    monkeypatch.setattr(st.PreparedTasks, "current", current)
    monkeypatch.setattr(st, "proc_view_problem", lambda *a, **k: None)
    reclaimed, _ = reconcile.reconcile_pass(str(conf), "/proc", 5)
    assert [r["pid"] for r in reclaimed] == [dead]
    kept = [me] if meanwhile == "joined" else []
    assert st.parse_tasks((conf / "pools/shared/0/0,1/tasks").read_text()) == kept
    names = sorted(os.listdir(path))
    assert names == sorted(["tasks", *([st.marker_name(me, my_start)] if kept else [])])


def _list_dir(tmp_path, tasks: list[int]):
    """One cpulist directory holding ``tasks``, as the module writes it."""
    path = tmp_path / "0,1"
    path.mkdir(mode=0o775)
    (path / "tasks").write_text(st.format_tasks(tasks))
    return path


@pytest.mark.parametrize("swap", ["exchange", "no renameat2", "file system refuses", "other error"])
def test_a_prepared_file_goes_in_with_one_name_and_the_old_one_is_freed_after(tmp_path, monkeypatch, swap):
    """commit() swaps the prepared file in: the file replaced keeps a temporary name until close().

    Freeing it under the lock was most of a rename's cost on the CI disk. At
    no moment has ``tasks`` two names (every reader refuses that as planted).
    Without ``renameat2`` in the C library, or on a file system that refuses
    the swap (EINVAL), commit renames as before, and does not try again; on
    another error (EXDEV from an overlay, say) it renames this once.
    """
    path = _list_dir(tmp_path, [2**22 + 1, 2**22 + 2])
    old = (path / "tasks").stat()
    if swap == "exchange":
        monkeypatch.setattr(st, "_renameat2", None)  # looked up afresh, whatever an earlier test found
    elif swap == "no renameat2":
        monkeypatch.setattr(st, "_renameat2", False)
    else:
        import errno

        calls = []
        number = errno.EINVAL if swap == "file system refuses" else errno.EXDEV
        refuse = (lambda *args: calls.append(args) or -1, lambda: number)
        monkeypatch.setattr(st, "_renameat2", refuse)
    prep = st.PreparedTasks(str(path), [2**22 + 1, 2**22 + 2], [2**22 + 2])
    tasks, names = prep.current()
    assert tasks == [2**22 + 1, 2**22 + 2] and sorted(names) == sorted([prep.tmp, "tasks"])
    assert prep.commit() is True
    now = (path / "tasks").stat()
    assert now.st_nlink == 1 and now.st_ino != old.st_ino
    assert st.parse_tasks((path / "tasks").read_text()) == [2**22 + 2]
    temporaries = [n for n in os.listdir(path) if st.is_temporary(n)]
    if swap == "exchange":
        assert [(path / n).stat().st_ino for n in temporaries] == [old.st_ino]
    else:
        assert temporaries == []
    if swap == "file system refuses":
        assert len(calls) == 1 and st._renameat2 is False  # not tried again by this process
    elif swap == "other error":
        assert len(calls) == 1 and st._renameat2 is refuse  # tried again next time
    prep.close()
    assert sorted(os.listdir(path)) == ["tasks"]


def test_a_prepared_file_removed_meanwhile_is_not_committed(tmp_path):
    """Another reconcile removed the prepared file (a crash leftover to it): commit says so, tasks is untouched."""
    path = _list_dir(tmp_path, [2**22 + 1])
    prep = st.PreparedTasks(str(path), [2**22 + 1], [])
    (path / prep.tmp).unlink()
    assert prep.commit() is False
    prep.close()
    assert os.listdir(path) == ["tasks"]
    assert st.parse_tasks((path / "tasks").read_text()) == [2**22 + 1]


@pytest.mark.parametrize("closing", ["fast", "slow"])
def test_reconcile_leaves_the_lock_free_between_stretches_and_sleeps_only_the_rest(tmp_path, monkeypatch, closing):
    """Between two stretches the lock stays free for PAUSE_SECONDS at least, so a waiting isolate gets in.

    What reconcile does outside the lock (closing the lists written, preparing
    the next ones) counts toward that pause: when it takes longer than the
    pause, reconcile does not sleep at all; when it is fast, it sleeps the rest.
    """
    from cpupools.agent import reconcile

    dead = 2**22 + 100
    names = [str(c) for c in range(6)]
    conf = write_plan_state(
        tmp_path / "conf",
        make_plan({"exclusive": {"0": names}}),
        {"exclusive": {"0": {n: [dead + i] for i, n in enumerate(names)}}},
        {dead + i: 1000 + i for i in range(len(names))},
    )
    monkeypatch.setattr(reconcile, "BATCH_MIN_LISTS", 1)
    monkeypatch.setattr(reconcile, "BATCH_SECONDS", 0.0)  # one list per stretch: six stretches
    monkeypatch.setattr(st, "proc_view_problem", lambda *a, **k: None)
    holds: list[tuple[float, float]] = []

    class Recorded(st.StateLock):
        """Each hold as (before the first try, after the release): the gaps measured are never longer than the real."""

        def __enter__(self):
            self.tried = time.monotonic()
            return super().__enter__()

        def __exit__(self, *exc):
            super().__exit__(*exc)
            holds.append((self.tried, time.monotonic()))

    monkeypatch.setattr(st, "StateLock", Recorded)
    real_close, real_sleep = st.PreparedTasks.close, time.sleep
    sleeps: list[float] = []

    def close(prep):
        if closing == "slow":  # longer than the pause, without sleeping
            until = time.monotonic() + reconcile.PAUSE_SECONDS * 1.5
            while time.monotonic() < until:
                pass
        real_close(prep)

    monkeypatch.setattr(st.PreparedTasks, "close", close)
    monkeypatch.setattr(time, "sleep", lambda seconds: sleeps.append(seconds) or real_sleep(seconds))
    reclaimed, _ = reconcile.reconcile_pass(str(conf), "/proc", 5)
    assert sorted(r["pid"] for r in reclaimed) == [dead + i for i in range(len(names))]
    assert len(holds) == len(names)
    gaps = [after[0] - before[1] for before, after in itertools.pairwise(holds)]
    assert min(gaps) >= reconcile.PAUSE_SECONDS, gaps
    if closing == "slow":
        assert sleeps == []
    else:  # one sleep per gap, unless the machine kept reconcile off the CPU for the whole pause
        assert 0 < len(sleeps) <= len(names) - 1 and all(0 < s <= reconcile.PAUSE_SECONDS for s in sleeps)
