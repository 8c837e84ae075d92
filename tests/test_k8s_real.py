"""tests/k8s_real.py's servers end with the pytest process that started them, however it ends.

A real pytest run (an xdist worker, as CI runs them) starts etcd and
kube-apiserver through ``RealKube.start`` and is then killed with SIGKILL:
nothing of it runs any more, no ``finally``, no fixture teardown. Its
servers must be gone within seconds all the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

INNER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from k8s_real import RealKube, assets_dir


def test_hold(tmp_path):
    bin_dir, why = assets_dir()
    assert bin_dir is not None, why
    kube = RealKube.start(bin_dir, tmp_path / "kube")
    pids = [proc.pid for _, proc in kube.processes]
    out = {out!r}
    with open(out + ".tmp", "w") as handle:
        handle.write(" ".join(map(str, [os.getpid(), *pids])))
    os.rename(out + ".tmp", out)
    time.sleep(600)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killing_the_worker_ends_its_api_server_and_etcd(tmp_path):
    from k8s_real import assets_dir

    bin_dir, why = assets_dir()
    if bin_dir is None:
        if os.environ.get("CPUPOOLS_REQUIRE_REAL_K8S") == "1":
            pytest.fail(f"CPUPOOLS_REQUIRE_REAL_K8S=1 but {why}", pytrace=False)
        pytest.skip(why)
    pids_file = tmp_path / "pids"
    inner = tmp_path / "inner" / "test_inner.py"
    inner.parent.mkdir()
    inner.write_text(textwrap.dedent(INNER.format(tests=str(REPO / "tests"), out=str(pids_file))))
    # The inner session's options are its own (not the PYTEST_ADDOPTS scripts/test.sh gives this one), and
    # so is its base directory: pytest's default would delete older runs' trees as it ends.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "1",
            "--basetemp",
            str(tmp_path / "tmp"),
            str(inner),
        ],
        cwd=inner.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not pids_file.exists():
            assert run.poll() is None, run.stdout.read().decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the inner run did not start its servers"
            time.sleep(0.1)
        worker, *servers = map(int, pids_file.read_text().split())
        assert worker != run.pid and len(servers) == 2 and all(map(running, servers))
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(map(running, servers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in servers if running(pid)] == [], "etcd or kube-apiserver outlived its worker"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        for pid in servers:  # whatever the outcome, nothing of this test keeps running
            if running(pid):
                os.kill(pid, signal.SIGKILL)
