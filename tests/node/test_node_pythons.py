"""The node side on every Python a node may have: the modules through site.yml, and the cmk agent.

Nodes run the modules and the agent on their own Python: RHEL 9's 3.9,
Debian 12's 3.11, Debian 13's 3.13 (docs/collection.md, "Supported Python").
Each of 3.9 to 3.13 found on this machine (python3.X on PATH, pyenv's
installs, /usr/bin) runs site.yml's modules on the embedded default
inventory (ansible_python_interpreter) and the agent built by that run:
isolate, describe, reconcile. A minor not found is skipped, saying so.
scripts/test.sh runs these beside the suite (marker compat_core).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, VENV_BIN, ansible_env

sys.path.insert(0, str(REPO / "tests" / "agent"))
from agent_support import PLAN_1X, agent_env, write_plan_state

INVENTORY = REPO / "inventories" / "local" / "hosts.yml"
MINORS = (9, 10, 11, 12, 13)


def find_python(minor: int) -> str | None:
    """A Python 3.<minor> that runs here, or None."""
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [
        shutil.which(f"python3.{minor}"),
        *sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3")),
        f"/usr/bin/python3.{minor}",
    ]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == f"3.{minor}":
            return candidate
    return None


@pytest.mark.compat_core
@pytest.mark.parametrize("minor", MINORS, ids=[f"python3.{m}" for m in MINORS])
def test_the_modules_and_the_agent_run_on_the_nodes_python(minor, tmp_path):
    python = find_python(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} on this machine")
    root = tmp_path / "sandbox"
    extra = tmp_path / "vars.json"
    extra.write_text(
        json.dumps({"ansible_python_interpreter": python, "cpupools_root": str(root), "cpupools_report_html": ""})
    )
    cmd = [VENV_BIN / "ansible-playbook", "site.yml", "-i", INVENTORY, "-e", f"@{extra}"]
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=REPO,
        env=ansible_env(ANSIBLE_STDOUT_CALLBACK="default"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"python3.{minor}" in python or f"/3.{minor}." in python
    assert (root / "etc" / "cmk" / "cpupools.json").is_file()
    assert list((root / "etc" / "default" / "grub.d").glob("*.cfg")), "no GRUB drop-in was written"

    # The agent that run built, on the same Python, against a state for this machine's CPUs (0 and 1).
    agent = root / "opt" / "bin" / "cmk.pyz"
    conf = write_plan_state(tmp_path / "cmk", PLAN_1X)

    def cmk(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [python, str(agent), *args], env=agent_env(), capture_output=True, text=True, timeout=60, check=False
        )

    status = "grep Cpus_allowed_list /proc/self/status; echo $CMK_CPUS_ASSIGNED"
    isolated = cmk("isolate", f"--conf-dir={conf}", "--pool=exclusive", "--", "sh", "-c", status)
    assert isolated.returncode == 0, isolated.stderr
    assert isolated.stdout.split() == ["Cpus_allowed_list:", "1", "1"], isolated.stdout
    described = cmk("describe", f"--conf-dir={conf}")
    assert described.returncode == 0, described.stderr
    assert "1" in json.loads(described.stdout)["pools"]["exclusive"]["cpuLists"]
    reconciled = cmk("reconcile", f"--conf-dir={conf}")
    assert reconciled.returncode == 0 and json.loads(reconciled.stdout) == {"reclaimedCpuLists": []}, reconciled
