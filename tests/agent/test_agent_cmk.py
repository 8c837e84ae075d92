"""The ``cmk`` program as workloads run it: real processes, real files, the built zipapp."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agent_support import PLAN_1X, PLAN_2X, agent_env, can_unshare, children, hold, make_plan, tasks_of, tree_snapshot
from cpupools.node import state as st

#: A plan whose CPUs this 2-CPU machine does not have: used with --no-affinity for hand-out checks.
PLAN_2S = make_plan(
    {
        "exclusive": {"0": ["1,45", "2,46"], "1": ["23,67", "24,68"]},
        "shared": {"0": ["4,48"], "1": ["25,69"]},
        "infra": {"0": ["0,44"], "1": ["22,66"]},
    },
    {"exclusive": ["1,45", "23,67", "2,46", "24,68"]},
)


def default_signals() -> None:
    """Start cmk as from a shell with default signals, whatever the test runner inherited.

    A runner started under ``nohup`` or as a background job of a non-interactive
    shell ignores SIGHUP, SIGINT and SIGQUIT; isolate keeps what its parent
    ignored ignored for the workload (test_signals_the_parent_left_ignored_...),
    so the tests of the default case must not inherit that.
    """
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def run(cmk, *args, env=None, timeout=30, **kw):
    return subprocess.run(
        [cmk, *args],
        env=env or agent_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=default_signals,
        **kw,
    )


def child_env_of(cmk, conf, *opts, **env):
    res = run(cmk, "isolate", f"--conf-dir={conf}", *opts, "--", "env", env=agent_env(**env))
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if line.startswith("CMK_"))


def test_isolate_pins_the_child_and_sets_cmk_env(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    res = run(
        cmk,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=exclusive",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status; env | grep ^CMK_CPUS; cat $0",
        str(conf / "pools/exclusive/0/1/tasks"),
    )
    assert res.returncode == 0, res.stderr
    # plan order hands out "1" first (CMK would take "0": sorted strings)
    assert "Cpus_allowed_list:\t1\n" in res.stdout
    assert "CMK_CPUS_ASSIGNED=1\n" in res.stdout and "CMK_CPUS_ASSIGNED_MASK=2\n" in res.stdout
    assert int(res.stdout.splitlines()[-1]) not in (0, os.getpid())  # the isolate process held it
    assert tasks_of(conf) == {"0": [], "1": []}  # given back


def test_two_cores_and_no_affinity(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    res = run(
        cmk,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=exclusive",
        "--no-affinity",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
        env=agent_env(CMK_NUM_CORES="2"),
    )
    assert res.returncode == 0, res.stderr
    assert (
        res.stdout
        == f"Cpus_allowed_list:\t{Path('/proc/self/status').read_text().split('Cpus_allowed_list:')[1].split()[0]}\n"
    )
    res = run(
        cmk,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=exclusive",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status; echo $CMK_CPUS_ASSIGNED",
        env=agent_env(CMK_NUM_CORES="2"),
    )
    assert res.stdout == "Cpus_allowed_list:\t0-1\n0,1\n"


def test_spread_handout_and_socket_id(cmk, state_dir):
    conf = state_dir(PLAN_2S)
    env = child_env_of(cmk, conf, "--pool=exclusive", "--no-affinity", CMK_NUM_CORES="2")
    assert env["CMK_CPUS_ASSIGNED"] == "1,45,23,67"  # one core per socket: spread really spreads
    assert env["CMK_CPUS_ASSIGNED_MASK"] == format(1 << 1 | 1 << 45 | 1 << 23 | 1 << 67, "X")
    assert env["CMK_CPUS_SHARED"] == "4,48,25,69"
    assert env["CMK_CPUS_INFRA"] == "0,44,22,66"
    env = child_env_of(cmk, conf, "--pool=exclusive", "--no-affinity", "--socket-id=1")
    assert env["CMK_CPUS_ASSIGNED"] == "23,67"
    # shared and infra: the pool's CPUs on all sockets, or on the one asked for; CMK_NUM_CORES does not count
    env = child_env_of(cmk, conf, "--pool=shared", "--no-affinity", CMK_NUM_CORES="junk")
    assert env["CMK_CPUS_ASSIGNED"] == "4,48,25,69"
    assert child_env_of(cmk, conf, "--pool=infra", "--no-affinity", "--socket-id=1")["CMK_CPUS_ASSIGNED"] == "22,66"


def test_cmk_style_command_line(cmk, state_dir):
    """CMK's own form: options after the command, args after ``--``."""
    conf = state_dir(PLAN_1X)
    res = run(
        cmk,
        "isolate",
        "sh",
        f"--conf-dir={conf}",
        "--pool",
        "shared",
        "--namespace=x",
        "--",
        "-c",
        "echo $CMK_CPUS_ASSIGNED; exit 5",
    )
    assert (res.returncode, res.stdout) == (5, "0\n")


@pytest.mark.parametrize(
    ("script", "status"), [("exit 0", 0), ("exit 7", 7), ("kill -USR1 $$", 128 + 10), ("kill -KILL $$", 137)]
)
def test_exit_status_propagates(cmk, state_dir, script, status):
    conf = state_dir(PLAN_2X)
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", script)
    assert res.returncode == status, res.stderr
    assert tasks_of(conf) == {"0": [], "1": []}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_and_the_list_given_back(cmk, state_dir, tmp_path, sig):
    conf = state_dir(PLAN_2X)
    mark = tmp_path / "got"
    ready = tmp_path / "ready"
    script = f'trap "echo {sig.name} > {mark}; exit 3" {sig.name[3:]}; touch {ready}; while :; do sleep 0.05; done'
    proc = subprocess.Popen(
        [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", script],
        env=agent_env(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_signals,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.02)
        assert tasks_of(conf)["1"] == [proc.pid]
        proc.send_signal(sig)  # to cmk only, not the process group
        assert proc.wait(timeout=20) == 3  # the child's own status after its trap
        assert mark.read_text() == f"{sig.name}\n"
        assert tasks_of(conf) == {"0": [], "1": []}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_concurrent_isolates_never_share_a_list(cmk, state_dir, tmp_path):
    """24 isolate calls race for 2 exclusive lists: winners never overlap, losers fail fast with 75."""
    conf = state_dir(PLAN_2X)
    log = tmp_path / "log"
    script = f'echo "$CMK_CPUS_ASSIGNED start $(date +%s%N)" >> {log}; sleep 0.3; echo "$CMK_CPUS_ASSIGNED end $(date +%s%N)" >> {log}'  # noqa: E501

    def one(_):
        started = time.monotonic()
        res = run(
            cmk,
            "isolate",
            f"--conf-dir={conf}",
            "--pool=exclusive",
            "--no-affinity",
            "--",
            "sh",
            "-c",
            script,
            env=agent_env(CMK_LOCK_TIMEOUT="20"),
        )
        return res.returncode, time.monotonic() - started, res.stderr

    for _round in range(3):
        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(one, range(24)))
        statuses = sorted(r[0] for r in results)
        assert set(statuses) <= {0, 75}, results
        assert statuses.count(0) >= 2
        for status, took, err in results:
            if status == 75:
                assert err.startswith("cmk: not enough free cpu lists in pool exclusive") and err.count("\n") == 1
                assert took < 10  # failed without waiting for a list to free up
    events: dict[str, list[tuple[int, str]]] = {}
    for line in log.read_text().splitlines():
        cpus, what, stamp = line.split()
        events.setdefault(cpus, []).append((int(stamp), what))
    assert set(events) == {"0", "1"}
    for cpus, seq in events.items():
        kinds = [what for _, what in sorted(seq)]
        assert kinds == ["start", "end"] * (len(kinds) // 2), f"two holders of cpulist {cpus} at once"
    assert tasks_of(conf) == {"0": [], "1": []}


def test_sigkill_then_reconcile_frees_the_list(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    proc = subprocess.Popen(
        [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sleep", "60"],
        env=agent_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while tasks_of(conf)["1"] != [proc.pid]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        assert tasks_of(conf)["1"] == [proc.pid]  # SIGKILL: nothing could clean up
        res = run(cmk, "reconcile", f"--conf-dir={conf}")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"reclaimedCpuLists": [{"cpus": "1", "pid": proc.pid, "pool": "exclusive"}]}
        assert res.stdout.startswith('{\n  "reclaimedCpuLists": [\n')  # CMK's indent=2
        assert tasks_of(conf) == {"0": [], "1": []}
        assert os.listdir(conf / "pools/exclusive/0/1") == ["tasks"]  # marker gone too
    finally:
        # the group may be empty: killed before it spawned sleep, isolate left nothing behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_reconcile_keeps_a_running_pid_whose_marker_disagrees(cmk, state_dir):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        real = st.read_proc_stat("/proc", sleeper.pid)[2]
        # "0": our marker of a process long gone whose PID the sleeper now has; "1": no marker.
        # Nothing shows which process the sleeper is: a CMK isolate may have taken either list
        # under that PID (CMK writes no marker), so both are kept while it runs.
        conf = state_dir(PLAN_2X, {"exclusive": {"0": {"0": [sleeper.pid], "1": [sleeper.pid]}}})
        (conf / f"pools/exclusive/0/0/task.{sleeper.pid}.{real - 5}").touch()
        (conf / "pools/exclusive/0/1/task.99999999.5").touch()  # an orphan: its PID is not in tasks
        res = run(cmk, "reconcile", f"--conf-dir={conf}")
        assert (res.returncode, json.loads(res.stdout)["reclaimedCpuLists"], res.stderr) == (0, [], "")
        assert tasks_of(conf) == {"0": [sleeper.pid], "1": [sleeper.pid]}
        assert not (conf / "pools/exclusive/0/1/task.99999999.5").exists()  # the orphan went
        # Now "1" carries our marker with the sleeper's own start time: the sleeper is one of our
        # isolates, which marks every list it takes, so the entry on "0" is an earlier process's.
        (conf / f"pools/exclusive/0/1/task.{sleeper.pid}.{real}").touch()
        res = run(cmk, "reconcile", f"--conf-dir={conf}")
        assert (res.returncode, json.loads(res.stdout)["reclaimedCpuLists"], res.stderr) == (
            0,
            [{"cpus": "0", "pid": sleeper.pid, "pool": "exclusive"}],
            "",
        )
        assert tasks_of(conf) == {"0": [], "1": [sleeper.pid]}
        sleeper.kill()
        sleeper.wait()
        res = run(cmk, "reconcile", f"--conf-dir={conf}")  # dead now: freed
        assert [r["cpus"] for r in json.loads(res.stdout)["reclaimedCpuLists"]] == ["1"]
        assert tasks_of(conf) == {"0": [], "1": []}
        assert os.listdir(conf / "pools/exclusive/0/1") == ["tasks"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_reconcile_writes_metrics_and_keeps_a_running_total(cmk, state_dir, tmp_path):
    conf = state_dir(PLAN_2X, {"exclusive": {"0": {"0": [2**22 + 1]}}})
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for _ in range(2):
        assert run(cmk, "reconcile", f"--conf-dir={conf}", f"--metrics-dir={metrics}").returncode == 0
    text = (metrics / "cpupools.prom").read_text()
    assert 'cpupools_pool_cpulists{pool="exclusive"} 2' in text
    assert 'cpupools_pool_free_cpulists{pool="exclusive"} 2' in text
    assert "cpupools_reclaimed_cpulists_total 1\n" in text
    assert 'cpupools_pool_free_cpus{pool="exclusive"} 2\n' in text
    assert 'cpupools_pool_cpus_info{free="0-1",held="",pool="exclusive"} 1\n' in text


def test_reconcile_metrics_name_the_held_cpus_and_keep_an_unchanged_file(cmk, state_dir, tmp_path):
    conf = state_dir(PLAN_2X, {"exclusive": {"0": {"1": [os.getpid()]}}})  # this test's process holds CPU 1
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    assert run(cmk, "reconcile", f"--conf-dir={conf}", f"--metrics-dir={metrics}").returncode == 0
    prom = metrics / "cpupools.prom"
    text = prom.read_text()
    assert 'cpupools_pool_held_cpus{pool="exclusive"} 1\n' in text
    assert 'cpupools_pool_free_cpus{pool="exclusive"} 1\n' in text
    assert 'cpupools_pool_cpus_info{free="0",held="1",pool="exclusive"} 1\n' in text
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    before = prom.stat().st_mtime_ns
    time.sleep(0.02)
    assert run(cmk, "reconcile", f"--conf-dir={conf}", f"--metrics-dir={metrics}").returncode == 0
    assert prom.stat().st_mtime_ns == before  # nothing changed: not rewritten
    assert sorted(p.name for p in metrics.iterdir()) == ["cpupools.prom"]


def test_cmk_proc_fs_gives_the_host_pid(cmk, state_dir, tmp_path):
    proc = tmp_path / "hostproc"
    (proc / "self").mkdir(parents=True)
    fields = ["S", "1"] + ["0"] * 17 + ["555"] + ["0"] * 30
    (proc / "self" / "stat").write_text("424242 (cmk isolate) " + " ".join(fields) + "\n")
    (proc / "1").mkdir()  # the host's init is visible: no hidepid
    (proc / "1" / "stat").write_text("1 (init) " + " ".join(fields) + "\n")
    conf = state_dir(PLAN_2X)
    tasks = conf / "pools/exclusive/0/1/tasks"
    res = run(
        cmk,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=exclusive",
        "--",
        "cat",
        str(tasks),
        env=agent_env(CMK_PROC_FS=str(proc)),
    )
    assert res.stdout == "424242"
    assert tasks.read_text() == ""


def test_errors_are_one_line_with_distinct_status_and_change_nothing(cmk, state_dir, tmp_path):
    conf = state_dir(PLAN_2X)
    before = {p: p.read_bytes() for p in conf.rglob("*") if p.is_file()}
    cases = [
        (["--pool=nope"], {}, 65, "requested pool nope does not exist"),
        (["--pool=exclusive", "--socket-id=3"], {}, 65, "pool exclusive has no socket 3"),
        (["--pool=exclusive", "--socket-id=x"], {}, 64, "--socket-id='x'"),
        (["--pool=exclusive"], {"CMK_NUM_CORES": "0"}, 64, "CMK_NUM_CORES='0'"),
        (["--pool=exclusive"], {"CMK_NUM_CORES": "3"}, 75, "pool exclusive: 3 requested, 2 free"),
        (["--pool=exclusive"], {"CMK_LOCK_TIMEOUT": "soon"}, 64, "CMK_LOCK_TIMEOUT='soon'"),
        (["--pool=shared"], {}, 65, "no cpu lists in pool shared"),
        (["--pool=exclusive", "--bogus"], {}, 64, "unknown option --bogus"),
        (["--pool=exclusive", f"--conf-dir={tmp_path / 'none'}"], {}, 78, "is missing"),
    ]
    for opts, env, status, message in cases:
        res = run(cmk, "isolate", f"--conf-dir={conf}", *opts, "--", "true", env=agent_env(**env))
        assert res.returncode == status, (opts, res.stderr)
        assert res.stderr.startswith("cmk: ") and message in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert "Traceback" not in res.stderr
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "/no/such/program")
    assert (res.returncode, res.stderr) == (127, "cmk: command not found: /no/such/program\n")
    assert {p: p.read_bytes() for p in conf.rglob("*") if p.is_file()} == before


def test_lock_timeout_and_corrupt_state(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    holder = os.open(conf / "lock", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        res = run(
            cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true", env=agent_env(CMK_LOCK_TIMEOUT="0.5")
        )
        assert res.returncode == 69 and "still held by another process after 0.5 s" in res.stderr
    finally:
        os.close(holder)
    (conf / "pools/exclusive/0/1/tasks").write_text("1,two")
    # A damaged list is never handed out, and reported without its content; the others keep working.
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", "echo $CMK_CPUS_ASSIGNED")
    assert (res.returncode, res.stdout, res.stderr) == (0, "0\n", "")
    for sub in ("reconcile", "describe"):
        res = run(cmk, sub, f"--conf-dir={conf}")
        assert res.returncode == 0, res.stderr
        damaged = f"{conf}/pools/exclusive/0/1/tasks holds something else; expected comma-separated PIDs"
        assert res.stderr == f"cmk {sub}: skipped: {damaged}\n"
        assert "two" not in res.stdout + res.stderr
    assert "1" not in json.loads(res.stdout)["pools"]["exclusive"]["cpuLists"]
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true", env=agent_env(CMK_NUM_CORES="2"))
    assert res.returncode == 75 and res.stderr.endswith("pool exclusive: 2 requested, 1 free of 2\n")


def test_describe_is_cmk_json(cmk, state_dir):
    conf = state_dir(PLAN_1X, {"exclusive": {"0": {"1": [42]}}})
    res = run(cmk, "describe", f"--conf-dir={conf}")
    assert json.loads(res.stdout) == {
        "pools": {
            "exclusive": {"cpuLists": {"1": {"cpus": "1", "tasks": [42]}}, "exclusive": True, "name": "exclusive"},
            "infra": {"cpuLists": {}, "exclusive": False, "name": "infra"},
            "shared": {"cpuLists": {"0": {"cpus": "0", "tasks": []}}, "exclusive": False, "name": "shared"},
        }
    }


def test_node_report_checks_overlaps(cmk, state_dir, make_root):
    root = make_root("2s8c-nosmt")
    conf = state_dir(make_plan({"exclusive": {"0": ["1"]}, "shared": {"0": ["2"]}, "infra": {"0": ["0,3"]}}))
    env = agent_env(CPUPOOLS_SYSFS_ROOT=str(root))
    report = json.loads(run(cmk, "node-report", f"--conf-dir={conf}", env=env).stdout)
    assert report["checks"]["configDirectory"] == {"errors": [], "ok": True}
    assert report["topology"]["sockets"]["1"]["cores"][0] == {"id": 8, "cpus": [{"id": 8, "isolated": False}]}
    assert report["description"]["pools"]["exclusive"]["cpuLists"]["1"]["tasks"] == []
    (conf / "pools/shared/0/1,2").mkdir()
    (conf / "pools/shared/0/1,2/tasks").write_text("")
    report = json.loads(run(cmk, "node-report", f"--conf-dir={conf}", env=env).stdout)
    assert report["checks"]["configDirectory"] == {
        "errors": [
            "CPU list overlap detected in exclusive:1 and shared:1,2 (in both: 1)",
            "CPU list overlap detected in shared:1,2 and shared:2 (in both: 2)",
        ],
        "ok": False,
    }


def test_reconcile_interval_loops_until_stopped(cmk, state_dir):
    conf = state_dir(PLAN_2X, {"exclusive": {"0": {"0": [2**22 + 3]}}})
    proc = subprocess.Popen(
        [cmk, "reconcile", f"--conf-dir={conf}", "--interval=0.1"], env=agent_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        first = "".join(iter(proc.stdout.readline, "}\n")) + "}\n"
        second = "".join(iter(proc.stdout.readline, "}\n")) + "}\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert json.loads(first)["reclaimedCpuLists"] == [{"cpus": "0", "pid": 2**22 + 3, "pool": "exclusive"}]
    assert json.loads(second) == {"reclaimedCpuLists": []}


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM, signal.SIGPIPE])
def test_every_catchable_signal_is_forwarded(cmk, state_dir, tmp_path, sig):
    """Signals whose default would kill isolate and orphan the workload reach the workload instead."""
    test_signals_are_forwarded_and_the_list_given_back(cmk, state_dir, tmp_path, sig)


def _isolate_running(cmk: str, conf: Path, tmp_path: Path, *prefix: str) -> tuple[subprocess.Popen, int, int]:
    """Start ``[*prefix, cmk isolate ... sleep]`` in a session of its own.

    Returns the process, isolate's PID and its workload's, once the workload runs.
    """
    started = tmp_path / "started"
    workload = ["sh", "-c", f"touch {started}; exec sleep 60"]
    argv = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", *workload]
    proc = subprocess.Popen([*prefix, *argv], env=agent_env(), start_new_session=True)
    deadline = time.monotonic() + 20
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    (isolate,) = children(proc.pid) if prefix else (proc.pid,)
    (child,) = children(isolate)
    return proc, isolate, child


def _killed_isolate_takes_its_workload_and_gives_the_list(cmk: str, conf: Path, isolate: int, child: int) -> None:
    """SIGKILL isolate: its workload goes too (not re-parented), and reconcile frees the list under isolate's PID."""
    os.kill(isolate, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while st.read_proc_stat("/proc", child) is not None:
        assert time.monotonic() < deadline, "the workload outlived its isolate"
        time.sleep(0.02)
    res = run(cmk, "reconcile", f"--conf-dir={conf}")
    assert json.loads(res.stdout)["reclaimedCpuLists"] == [{"cpus": "1", "pid": isolate, "pool": "exclusive"}]


def test_sigkill_of_isolate_takes_the_workload_with_it(cmk, state_dir, tmp_path):
    conf = state_dir(PLAN_2X)
    proc, isolate, child = _isolate_running(cmk, conf, tmp_path)
    try:
        _killed_isolate_takes_its_workload_and_gives_the_list(cmk, conf, isolate, child)  # PR_SET_PDEATHSIG
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(not can_unshare("--pid", "--fork"), reason="needs unshare and CAP_SYS_ADMIN (a PID namespace)")
def test_isolate_as_its_namespaces_init_leaves_the_death_signal_to_the_kernel(cmk, state_dir, tmp_path):
    """As a container's entrypoint (PID 1 of its namespace) isolate loads no ``_ctypes`` for ``prctl``.

    Its death kills the namespace, its workload with it, so the death signal
    would add nothing but ~0.4 ms to the workload's start. Checked from the
    mappings of the running isolate, against one that is not PID 1.
    """
    conf = state_dir(PLAN_2X)
    other = hold(cmk, conf)
    try:
        assert "/_ctypes." in Path(f"/proc/{other.pid}/maps").read_text()  # the check sees the library
    finally:
        os.killpg(other.pid, signal.SIGTERM)
        other.wait()
    # /proc stays the host's, so isolate records its host PID.
    proc, isolate, child = _isolate_running(cmk, conf, tmp_path, "unshare", "--pid", "--fork")
    try:
        assert st.parse_nspid(Path(f"/proc/{isolate}/status").read_text())[-1] == 1
        assert "/_ctypes." not in Path(f"/proc/{isolate}/maps").read_text()
        _killed_isolate_takes_its_workload_and_gives_the_list(cmk, conf, isolate, child)  # the namespace's end
        assert proc.wait(timeout=20) != 0  # unshare's status for a killed child (util-linux: 1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_workload_starts_with_default_signals_and_an_empty_mask(cmk, state_dir):
    """What the workload gets is what a direct exec from the same parent gets: an empty mask, and ignored
    only what that parent ignores (never Python's own SIGPIPE and SIGXFSZ, which cmk resets).

    A pytest-xdist worker on Python 3.13 starts with signal 32 (glibc's SIGCANCEL, which Python cannot
    change) ignored, its parent pytest does not: a direct exec from the worker keeps it ignored, and so
    does isolate (a signal the parent left ignored stays ignored). Run alone, nothing is ignored.
    """
    conf = state_dir(PLAN_2X)
    script = "yes | head -n1; grep -E '^Sig(Ign|Blk)' /proc/self/status"
    direct = subprocess.run(
        ["sh", "-c", script], env=agent_env(), capture_output=True, text=True, preexec_fn=default_signals
    )
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", script)
    assert (res.returncode, res.stderr) == (0, "")  # no "Broken pipe" from yes
    assert res.stdout == direct.stdout, (res.stdout, direct.stdout)
    lines = dict(line.split(":\t") for line in res.stdout.splitlines()[1:])
    assert lines["SigBlk"] == "0000000000000000"
    ignored = int(lines["SigIgn"], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} ignored in the workload"
    assert not ignored & ~(1 << 31), f"SigIgn {lines['SigIgn']}: more than the runner's own signal 32"


def _ignored_in_background(tmp_path: Path, name: str, command: str) -> tuple[str, int]:
    """Start ``command`` as ``nohup COMMAND &`` from a non-interactive shell (SIGHUP, SIGINT and SIGQUIT
    ignored); return ``(SigIgn of its workload, PID of the command)`` once the workload has reported."""
    out, pidfile = tmp_path / f"{name}.sigign", tmp_path / f"{name}.pid"
    script = tmp_path / f"{name}.sh"
    script.write_text(f"grep '^SigIgn' /proc/self/status > {out}.t; mv {out}.t {out}; while :; do sleep 0.05; done\n")
    subprocess.run(
        ["sh", "-c", f"nohup {command} sh {script} >/dev/null 2>&1 & echo $! > {pidfile}"],
        env=agent_env(),
        check=True,
        timeout=20,
    )
    deadline = time.monotonic() + 20
    while not out.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return out.read_text().split()[1], int(pidfile.read_text())


def test_signals_the_parent_left_ignored_stay_ignored_and_others_are_forwarded(cmk, state_dir, tmp_path):
    """Under nohup, as a background job: the workload ignores SIGHUP, SIGINT and SIGQUIT as a direct exec would."""
    conf = state_dir(PLAN_2X)
    direct, direct_pid = _ignored_in_background(tmp_path, "direct", "")
    os.kill(direct_pid, signal.SIGKILL)
    isolated, pid = _ignored_in_background(tmp_path, "isolated", f"{cmk} isolate --conf-dir={conf} --pool=exclusive --")
    try:
        assert int(direct, 16) & 0b111 == 0b111  # HUP, INT, QUIT: what nohup and the shell left ignored
        assert isolated == direct
        assert tasks_of(conf)["1"] == [pid]
        os.kill(pid, signal.SIGHUP)  # ignored by isolate as by its workload: both keep running
        time.sleep(0.3)
        assert st.read_proc_stat("/proc", pid)[1] != "Z" and tasks_of(conf)["1"] == [pid]
        os.kill(pid, signal.SIGTERM)  # still forwarded: the workload ends, the list is given back
        deadline = time.monotonic() + 20
        while (stat := st.read_proc_stat("/proc", pid)) is not None and stat[1] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert tasks_of(conf) == {"0": [], "1": []}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-1", "x"])
def test_odd_intervals_are_usage_errors(cmk, state_dir, value):
    conf = state_dir(PLAN_2X)
    for sub in ("reconcile", "node-report"):
        res = run(cmk, sub, f"--conf-dir={conf}", f"--interval={value}")
        assert res.returncode == 64
        assert res.stderr == f"cmk: --interval={value!r} is not a number of seconds from 0 to 86400\n"


@pytest.mark.parametrize("replacement", ["directory", "symlink"])
def test_a_conf_dir_replaced_during_an_isolate_does_not_split_it(cmk, state_dir, tmp_path, replacement):
    """The lists are given back in the tree they were taken from; the tree now at the path is not touched."""
    conf = state_dir(PLAN_2X)
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [
            cmk,
            "isolate",
            f"--conf-dir={conf}",
            "--pool=exclusive",
            "--",
            "sh",
            "-c",
            f"until [ -e {stop} ]; do sleep 0.02; done",
        ],
        env=agent_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while tasks_of(conf)["1"] != [proc.pid]:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        moved = tmp_path / "cmk.moved"
        os.rename(conf, moved)
        copy = tmp_path / "cmk.copy"
        shutil.copytree(moved, copy, symlinks=True)  # holds the PID too, as a restored backup would
        if replacement == "directory":
            os.rename(copy, conf)
            now = tree_snapshot(conf)
        else:
            conf.symlink_to(copy)
            now = tree_snapshot(copy)
        assert tasks_of(conf)["1"] == [proc.pid]
        stop.touch()
        assert proc.wait(timeout=20) == 0
        assert tasks_of(moved) == {"0": [], "1": []}  # given back where it was taken
        assert tree_snapshot(conf if replacement == "directory" else copy) == now  # the new tree untouched
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


HOSTILE = "\x1b[31m" + "A" * 5000  # a terminal escape, then more than any message should carry
LONG_NAME = "/" + "p" * 300  # one name over NAME_MAX
LONG_PATH = "/" + "/".join(["l" * 200] * 30)  # over PATH_MAX


@pytest.mark.parametrize(
    ("args", "env", "status", "names"),
    [
        (["isolate", "--pool=exclusive", "true"], {"CMK_ISOLATE_SHELL": HOSTILE}, 64, "CMK_ISOLATE_SHELL="),
        (["reconcile", f"--interval={HOSTILE}"], {}, 64, "--interval="),
        (["isolate", "--pool=exclusive", "true"], {"CMK_PROC_FS": HOSTILE}, 64, "CMK_PROC_FS="),
        (["reconcile"], {"CMK_PROC_FS": LONG_NAME}, 64, "CMK_PROC_FS="),
        (["reconcile"], {"CMK_PROC_FS": LONG_PATH}, 64, "CMK_PROC_FS="),
        (["describe", f"--conf-dir={LONG_NAME}"], {}, 64, "--conf-dir="),
        (["describe", f"--conf-dir={LONG_PATH}"], {}, 64, "--conf-dir="),
        (["reconcile", f"--metrics-dir={LONG_PATH}"], {}, 64, "--metrics-dir="),
        (["describe"], {"CMK_LOCK_TIMEOUT": HOSTILE}, 64, "CMK_LOCK_TIMEOUT="),
        (["isolate", f"--pool={HOSTILE}", "true"], {}, 65, "requested pool '"),
        (["isolate", f"--socket-id={HOSTILE}", "--pool=exclusive", "true"], {}, 64, "--socket-id="),
        (["isolate", "--pool=exclusive", HOSTILE], {}, 126, "cannot run '"),
        (["describe", f"--{HOSTILE}"], {}, 64, "unknown option '--"),
    ],
)
def test_a_hostile_or_huge_value_is_quoted_shortened(cmk, state_dir, args, env, status, names):
    """Named and quoted shortened in one line; a path the kernel would refuse is the usage exit, not an OS error."""
    conf = state_dir(PLAN_2X)
    sub, rest = args[0], args[1:]
    conf_opt = [] if any(a.startswith("--conf-dir=") for a in rest) else [f"--conf-dir={conf}"]
    res = run(cmk, sub, *conf_opt, *rest, env=agent_env(**env))
    assert res.returncode == status, res.stderr[:300]
    line = res.stderr.removesuffix("\n")
    assert line.startswith(f"cmk: {names}") or f": {names}" in line, line[:300]
    assert len(line) < 160 and line.isprintable(), line[:300]
    assert any(cut in line for cut in ("AAAAAAAAAA...A'", "lllll...l'", "ppppp...p'")), line  # quoted, shortened
    assert tasks_of(conf) == {"0": [], "1": []}


def test_a_huge_cmk_num_cores_is_a_usage_error(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true", env=agent_env(CMK_NUM_CORES="9" * 5000))
    assert res.returncode == 64
    assert res.stderr == (
        "cmk: CMK_NUM_CORES='99999999999999999999... (5000 characters)': "
        "requested numbers of cores must be a positive integer\n"
    )


def test_stray_entries_are_reported_and_ignored(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    (conf / "pools/junk").write_text("")
    (conf / "pools/nopool").mkdir()
    (conf / "pools/exclusive/x").mkdir()
    (conf / "pools/exclusive/0/not-a-list").mkdir()
    (conf / "pools/exclusive/0/7").write_text("")
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", "echo $CMK_CPUS_ASSIGNED")
    assert (res.returncode, res.stdout, res.stderr) == (0, "1\n", "")
    res = run(cmk, "reconcile", f"--conf-dir={conf}")
    assert res.returncode == 0 and json.loads(res.stdout) == {"reclaimedCpuLists": []}
    p = f"{conf}/pools"
    assert res.stderr.splitlines() == [
        f"cmk reconcile: skipped: {p}/exclusive/0/7 is not a directory",
        f"cmk reconcile: skipped: {p}/exclusive/0/not-a-list is not a cpulist directory (expected a name like 2,46)",
        f"cmk reconcile: skipped: {p}/exclusive/x is not a socket directory (name must be a number)",
        f"cmk reconcile: skipped: {p}/junk is not a pool directory",
        f"cmk reconcile: skipped: {p}/nopool/exclusive is missing",
    ]


@pytest.mark.parametrize(
    ("damage", "status", "message"),
    [
        (lambda c: (os.unlink(c / "lock"), os.mkfifo(c / "lock")), 78, "lock is not a regular file"),
        (lambda c: (os.unlink(c / "lock"), os.symlink("/etc/passwd", c / "lock")), 78, "lock is not a regular file"),
        (lambda c: (shutil.rmtree(c / "pools"), (c / "pools").write_text("")), 78, "pools is not a directory"),
        (lambda c: (os.unlink(c / "cpupools.order"), os.mkdir(c / "cpupools.order")), 78, "is not readable text"),
        (lambda c: (os.unlink(c / "cpupools.order"), os.mkfifo(c / "cpupools.order")), 78, "is not readable text"),
    ],
)
def test_damaged_state_gives_a_clear_line_and_its_status(cmk, state_dir, damage, status, message):
    conf = state_dir(PLAN_2X)
    damage(conf)
    res = run(cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true", timeout=20)
    assert res.returncode == status and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_reconcile_removes_what_killed_writers_left(cmk, state_dir):
    conf = state_dir(PLAN_2X)
    leftovers = ["tasks", ".tasks.0123456789ab.tmp", "task.4194301.77"]
    for name in leftovers[1:]:
        (conf / "pools/exclusive/0/1" / name).write_text("")
    assert run(cmk, "reconcile", f"--conf-dir={conf}").returncode == 0
    assert os.listdir(conf / "pools/exclusive/0/1") == ["tasks"]


# NUMA nodes and L3 domains (issue 15) ------------------------------------------


@pytest.fixture
def nps2(make_root, state_dir):
    """``(conf, sysfs root)``: the 2s32c-smt2-nps2 fixture with 8 exclusive cores spread, 20 shared packed.

    Worked out by hand (tests/planning/test_plan_numa.py has the rules): every
    node keeps its first core for housekeeping (0, 16, 32, 48: L3 0, 2, 4, 6);
    CPU i+64 is the sibling of i. Spread gives each node two exclusive cores,
    packed shared 13 of node 0 and 7 of node 1. On node 0 shared goes first
    beside housekeeping (L3 0: 1-7) and then takes 8-13 of L3 1; exclusive
    gets what is left, 14 and 15 (L3 1). On node 1 shared fills L3 2 (17-23),
    exclusive takes the clean L3 3 (24, 25); node 2 gives 40, 41 (L3 5), node
    3 56, 57 (L3 7). The exclusive lists in hand-out order (nodes 0, 2, 1, 3,
    twice): 14, 40, 24, 56, 15, 41, 25, 57.
    """
    from cpupools.hardware.topology import gather_topology
    from cpupools.planning.plan import make_request, plan_pools

    root = make_root("2s32c-smt2-nps2", "sysfs")
    request = {"num_exclusive_cores": 8, "exclusive_mode": "spread", "num_shared_cores": 20}
    plan = plan_pools(gather_topology(str(root)), make_request(request))
    assert plan["handout_order"]["exclusive"] == [
        "14,78",
        "40,104",
        "24,88",
        "56,120",
        "15,79",
        "41,105",
        "25,89",
        "57,121",
    ]
    assert plan["pool_cpus"]["shared"] == "1-13,17-23,65-77,81-87"
    return state_dir(plan), root


def numa_env(cmk, conf, root, *opts, **env):
    return child_env_of(cmk, conf, "--no-affinity", *opts, CPUPOOLS_SYSFS_ROOT=str(root), **env)


def test_several_cores_come_from_one_numa_node_and_one_l3(cmk, nps2):
    conf, root = nps2
    env = numa_env(cmk, conf, root, "--pool=exclusive", CMK_NUM_CORES="2")
    # Hand-out order would give cores 14 and 40, on two sockets; node 0 holds cores 14 and 15, both in L3 1.
    assert env["CMK_CPUS_ASSIGNED"] == "14,78,15,79"
    assert env["CMK_NUMA_NODES_ASSIGNED"] == "0"
    assert env["CMK_L3_DOMAINS_ASSIGNED"] == "1"
    # One core: the first free list in hand-out order, as CMK; its node and L3 are exported too.
    env = numa_env(cmk, conf, root, "--pool=exclusive")
    assert (env["CMK_CPUS_ASSIGNED"], env["CMK_NUMA_NODES_ASSIGNED"], env["CMK_L3_DOMAINS_ASSIGNED"]) == (
        "14,78",
        "0",
        "1",
    )
    assert tasks_of(conf) == {cl: [] for cl in tasks_of(conf)}  # all given back


def test_numa_locality_can_be_turned_off(cmk, nps2):
    conf, root = nps2
    env = numa_env(cmk, conf, root, "--pool=exclusive", CMK_NUM_CORES="2", CMK_NUMA_LOCALITY="0")
    assert env["CMK_CPUS_ASSIGNED"] == "14,78,40,104"
    assert env["CMK_NUMA_NODES_ASSIGNED"] == "0,2"
    assert env["CMK_L3_DOMAINS_ASSIGNED"] == "1,5"
    res = run(
        cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "true", env=agent_env(CMK_NUMA_LOCALITY="maybe")
    )
    assert res.returncode == 64 and "CMK_NUMA_LOCALITY='maybe': expected 1" in res.stderr


def test_more_cores_than_a_node_has_come_from_the_fewest_nodes(cmk, nps2):
    conf, root = nps2
    env = numa_env(cmk, conf, root, "--pool=exclusive", CMK_NUM_CORES="5")
    # Every node has 2 lists, so three nodes; every set of three spans both sockets, and all are as
    # near (the distances tie), so the nodes first in hand-out order: node 0 and node 2 whole, then 1
    # list of node 1: core 24.
    assert env["CMK_CPUS_ASSIGNED"] == "14,78,15,79,24,88,40,104,41,105"
    assert env["CMK_NUMA_NODES_ASSIGNED"] == "0,1,2"
    assert env["CMK_L3_DOMAINS_ASSIGNED"] == "1,3,5"


def test_numa_node_selector(cmk, nps2):
    conf, root = nps2
    env = numa_env(cmk, conf, root, "--pool=exclusive", "--numa-node=3", CMK_NUM_CORES="2")
    assert (env["CMK_CPUS_ASSIGNED"], env["CMK_NUMA_NODES_ASSIGNED"], env["CMK_L3_DOMAINS_ASSIGNED"]) == (
        "56,120,57,121",
        "3",
        "7",
    )
    # with --socket-id: the node must be on that socket
    env = numa_env(cmk, conf, root, "--pool=exclusive", "--socket-id=1", "--numa-node=2")
    assert env["CMK_CPUS_ASSIGNED"] == "40,104"
    # a shared list spans its socket: --numa-node pins to its CPUs on that node (cores 17-23, L3 2)
    env = numa_env(cmk, conf, root, "--pool=shared", "--numa-node=1")
    assert env["CMK_CPUS_ASSIGNED"] == ",".join(str(c) for c in [*range(17, 24), *range(81, 88)])
    assert (env["CMK_NUMA_NODES_ASSIGNED"], env["CMK_L3_DOMAINS_ASSIGNED"]) == ("1", "2")
    assert env["CMK_CPUS_ASSIGNED_MASK"] == format(sum(1 << c for c in [*range(17, 24), *range(81, 88)]), "X")
    # without --numa-node the whole list, on both nodes of socket 0
    env = numa_env(cmk, conf, root, "--pool=shared", "--socket-id=0")
    assert env["CMK_NUMA_NODES_ASSIGNED"] == "0,1" and env["CMK_L3_DOMAINS_ASSIGNED"] == "0,1,2"
    assert tasks_of(conf, "shared") == {cl: [] for cl in tasks_of(conf, "shared")}


@pytest.mark.parametrize(
    ("opts", "cores", "status", "message"),
    [
        (
            ["--socket-id=1", "--numa-node=1"],
            "1",
            65,
            "cmk: pool exclusive has no cpu lists on socket 1 on NUMA node 1 (NUMA nodes: 2, 3)\n",
        ),
        (
            ["--numa-node=2"],
            "3",
            75,
            "cmk: not enough free cpu lists in pool exclusive on NUMA node 2: 3 requested, 2 free of 2\n",
        ),
        (["--numa-node=x"], "1", 64, "cmk: --numa-node='x' is not a NUMA node number (or -1 for any)\n"),
        (["--numa-node=-2"], "1", 64, "cmk: --numa-node='-2' is not a NUMA node number (or -1 for any)\n"),
    ],
)
def test_numa_node_refusals_change_nothing(cmk, nps2, opts, cores, status, message):
    conf, root = nps2
    before = tasks_of(conf)
    res = run(
        cmk,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=exclusive",
        "--no-affinity",
        *opts,
        "true",
        env=agent_env(CPUPOOLS_SYSFS_ROOT=str(root), CMK_NUM_CORES=cores),
    )
    assert (res.returncode, res.stderr) == (status, message)
    assert tasks_of(conf) == before


def test_a_held_node_sends_the_workload_to_the_next_node_that_holds_it(cmk, nps2):
    """Concurrent workloads: while one holds node 0's two lists, a second two-core isolate gets node 2's.

    Node 2 comes first in hand-out order among the nodes left, and its two lists share one L3.
    """
    conf, root = nps2
    env = agent_env(CPUPOOLS_SYSFS_ROOT=str(root), CMK_NUM_CORES="2")
    base = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--"]
    holder = subprocess.Popen(
        [*base, "sh", "-c", "echo $CMK_CPUS_ASSIGNED; read x"],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == "14,78,15,79\n"  # waits until the first one holds its lists
        second = numa_env(cmk, conf, root, "--pool=exclusive", CMK_NUM_CORES="2")
        assert (second["CMK_CPUS_ASSIGNED"], second["CMK_NUMA_NODES_ASSIGNED"]) == ("40,104,41,105", "2")
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
