"""playbooks/uninstall.yml after site.yml, on the embedded default inventory into a temp sandbox."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
from helpers import REPO, tree_snapshot

pytestmark = pytest.mark.slow
INVENTORY = str(REPO / "inventories" / "local" / "hosts.yml")


def run(playbook, tmp_path, name):
    extra = {"cpupools_root": str(tmp_path / "sandbox"), "cpupools_report_html": str(tmp_path / "report.html")}
    return playbook(REPO / name, extra, inventory=INVENTORY)


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_uninstall_refuses_while_a_workload_holds_cpus_then_removes_everything(playbook, tmp_path):
    sandbox = tmp_path / "sandbox"
    assert run(playbook, tmp_path, "site.yml").rc == 0
    installed = files(sandbox)
    assert "opt/bin/cmk" in installed and "etc/default/grub.d/99-cpupools.cfg" in installed
    conf = sandbox / "etc/cmk"
    holder = subprocess.Popen(
        [
            str(sandbox / "opt/bin/cmk"),
            "isolate",
            f"--conf-dir={conf}",
            "--pool=exclusive",
            "--no-affinity",
            "sleep",
            "60",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while str(holder.pid) not in (conf / "pools/exclusive/0/1,45/tasks").read_text():
            assert time.monotonic() < deadline, "cmk isolate never recorded its PID"
            time.sleep(0.05)
        before = tree_snapshot(sandbox)
        refused = run(playbook, tmp_path, "playbooks/uninstall.yml")
        assert refused.rc != 0
        assert (
            "host localhost: cpupools_state: refusing to remove the pool state while tasks are live: "
            f"PID {holder.pid}" in refused.messages()
        )
        # Refused before anything changed: the kernel arguments and agent are all still there.
        assert tree_snapshot(sandbox) == before
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    removed = run(playbook, tmp_path, "playbooks/uninstall.yml")
    assert removed.rc == 0, removed.messages()
    assert removed.changed() > 0
    assert files(sandbox) == []
    again = run(playbook, tmp_path, "playbooks/uninstall.yml")
    assert again.rc == 0 and again.changed() == 0
