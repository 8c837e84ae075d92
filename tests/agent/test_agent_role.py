"""The cpupools_agent role through real ansible-playbook runs into a sandbox root."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from agent_support import PLAN_2X, agent_env, tasks_of, tree_snapshot
from helpers import plan_play_files

pytestmark = pytest.mark.slow

PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: cpupools_agent
"""


def role_vars(root, **extra):
    variables = {"cpupools_root": str(root), "cpupools_plan": PLAN_2X, "cpupools_reconcile_interval": 15, **extra}
    return {**variables, "cpupools_plan_result": plan_play_files(variables)}


def test_install_is_idempotent_and_check_mode_is_honest(playbook, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    res = playbook(PLAY, role_vars(root), "--check")
    assert res.rc == 0, res.stdout[-2000:]
    assert res.changed() > 0 and list(root.iterdir()) == []
    res = playbook(PLAY, role_vars(root))
    assert res.rc == 0, res.messages()
    assert res.changed() > 0
    service = (root / "etc/systemd/system/cpupools-reconcile.service").read_text()
    assert (
        service.startswith("#")
        and "ExecStart=/opt/bin/cmk reconcile --conf-dir=/etc/cmk"
        " --kubeconfig=/etc/kubernetes/kubelet.conf --node-name=localhost\n"
        in service
    )
    assert "OnUnitActiveSec=15s" in (root / "etc/systemd/system/cpupools-reconcile.timer").read_text()
    assert os.access(root / "opt/bin/cmk", os.X_OK) and (root / "opt/bin/cmk.pyz").is_file()
    snap = tree_snapshot(root)
    res = playbook(PLAY, role_vars(root))
    assert res.rc == 0 and res.changed() == 0, [
        t["task"]["name"] for t in res.tasks() if t["hosts"]["localhost"].get("changed")
    ]
    assert tree_snapshot(root) == snap
    res = playbook(PLAY, role_vars(root), "--check")
    assert res.changed() == 0 and tree_snapshot(root) == snap
    # the installed program works on the installed state
    out = subprocess.run(
        [str(root / "opt/bin/cmk"), "describe", f"--conf-dir={root}/etc/cmk"],
        env=agent_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert set(json.loads(out.stdout)["pools"]) == {"exclusive", "shared"}


def test_absent_refuses_with_live_tasks_then_removes_everything(playbook, tmp_path):
    root = tmp_path / "root"
    assert playbook(PLAY, role_vars(root)).rc == 0
    conf = root / "etc/cmk"
    holder = subprocess.Popen(  # it outlives any run of the playbook, however loaded the machine (killed below)
        [str(root / "opt/bin/cmk"), "isolate", f"--conf-dir={conf}", "--pool=exclusive", "sleep", "3600"],
        env=agent_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while tasks_of(conf)["1"] != [holder.pid]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        snap = tree_snapshot(root)
        res = playbook(PLAY, role_vars(root, cpupools_state="absent"))
        assert res.rc != 0
        assert (
            f"host localhost: cpupools_state: refusing to remove the pool state while tasks are live: PID {holder.pid}"
            in res.messages()
        )
        assert tree_snapshot(root) == snap
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    res = playbook(PLAY, role_vars(root, cpupools_state="absent"))  # the holder is dead now: nothing live
    assert res.rc == 0, res.messages()
    leftovers = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    assert leftovers == []
    res = playbook(PLAY, role_vars(root, cpupools_state="absent"))
    assert res.rc == 0 and res.changed() == 0


def test_missing_plan_is_one_clear_message(playbook, tmp_path):
    res = playbook(PLAY, {"cpupools_root": str(tmp_path)})
    assert res.rc != 0
    assert "host localhost: cpupools_plan: no plan for this host; run the cpupools_plan role first" in res.messages()
    assert list(tmp_path.glob("etc")) == []


def test_a_plan_without_the_plan_plays_files_is_one_clear_message(playbook, tmp_path):
    root = tmp_path / "root"
    res = playbook(PLAY, {"cpupools_root": str(root), "cpupools_plan": PLAN_2X})
    assert res.rc != 0 and not root.exists()
    assert "host localhost: cpupools_plan_result: the plan play did not render this stage's files" in res.messages()
