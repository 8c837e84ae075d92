"""scripts/pidns_init.py, the PID 1 under which scripts/test.sh runs the PID-reuse test in a namespace of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_support import can_unshare

REPO = Path(__file__).resolve().parents[2]
INIT = str(REPO / "scripts" / "pidns_init.py")
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]

#: Leaves an orphan that has already exited, waits until something reaps it, exits 3.
#: The orphan's new parent is the namespace's PID 1: until PID 1 waits for it, it is a zombie, which
#: still has a /proc entry (a holder the agent would judge alive).
ORPHAN = """
import os, sys, time
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    orphan = os.fork()
    if orphan == 0:
        os._exit(0)
    os.write(w, str(orphan).encode())
    os._exit(0)
os.waitpid(middle, 0)
orphan = int(os.read(r, 32))
deadline = time.monotonic() + float(sys.argv[1])
while os.path.exists(f"/proc/{orphan}"):
    if time.monotonic() > deadline:
        print("still there:", open(f"/proc/{orphan}/stat").read())
        sys.exit(1)
    time.sleep(0.01)
print(f"reaped {orphan}; my parent is {os.getppid()}")
sys.exit(3)
"""


pytestmark = pytest.mark.skipif(
    not can_unshare(*UNSHARE[1:]), reason="needs unshare and CAP_SYS_ADMIN (a PID namespace)"
)


def test_reaps_every_orphan_and_exits_with_the_commands_status():
    res = subprocess.run(
        [*UNSHARE, sys.executable, INIT, sys.executable, "-c", ORPHAN, "30"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.endswith("my parent is 1\n"), res.stdout  # the command runs under the init, in the namespace
    # Without it the command is PID 1 itself, does not wait for the orphan, and the orphan stays a zombie.
    res = subprocess.run([*UNSHARE, sys.executable, "-c", ORPHAN, "2"], capture_output=True, text=True, check=False)
    assert res.returncode == 1 and ") Z " in res.stdout, res.stdout + res.stderr


def test_forwards_sigterm_and_reports_the_signal(tmp_path):
    ready = tmp_path / "ready"
    sleeper = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    proc = subprocess.Popen([*UNSHARE, sys.executable, INIT, sys.executable, "-c", sleeper])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the command did not start"
            time.sleep(0.01)
        # unshare's one child is the init (PID 1 in the namespace); a signal from outside reaches it
        # only through its handler.
        init = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(init, signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_command_that_cannot_run_is_127():
    res = subprocess.run(
        [*UNSHARE, sys.executable, INIT, "/nonexistent/cmd"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 127
    assert res.stderr == "pidns_init.py: cannot run /nonexistent/cmd: No such file or directory\n"
