"""``cpupools_agent_build``: the plan play's build of ``cmk`` to compare with the nodes.

Its action runs ``scripts/build_agent.py --check`` from the worker, without a
module process: it must give what the script gives, and what the module gives
when run directly (tests/helpers.py ``run_module``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, run_module

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "build_agent.py"

BUILD = """\
- name: Build in memory
  hosts: all
  gather_facts: false
  tasks:
    - name: Build
      cpupools.cpupools.cpupools_agent_build:
        script: "{{ script }}"
        output: "{{ output }}"
        shebang: "{{ shebang | default(omit) }}"
        pythons: "{{ pythons | default(omit) }}"
      register: build
"""


@pytest.mark.parametrize(
    ("shebang", "pythons"), [(None, None), ("/usr/bin/env -S python3 -IS", None), (None, ["/usr/bin/python3"])]
)
def test_agent_build_gives_the_scripts_lines_and_writes_nothing(playbook, tmp_path, shebang, pythons):
    output = tmp_path / "build" / "cmk"
    options = ([f"--shebang={shebang}"] if shebang else []) + [f"--python={python}" for python in pythons or []]
    script = subprocess.run(
        [sys.executable, str(SCRIPT), *options, "--check", str(output)], capture_output=True, text=True, check=True
    )
    assert script.stdout.count("would be written") == 2  # nothing built there yet: the lines say so
    extra = {"script": str(SCRIPT), "output": str(output)} | ({"shebang": shebang} if shebang else {})
    extra |= {"pythons": pythons} if pythons else {}
    for mode in ([], ["--check"]):
        run = playbook(BUILD, extra, *mode)
        assert run.rc == 0, run.stdout + run.stderr
        result = run.result("Build")
        # The same bytes as a fresh interpreter builds: the digests are equal, line for line.
        assert result["stdout"] == script.stdout and result["rc"] == 0 and result["changed"] is False
        assert result["stdout_lines"] == script.stdout.splitlines()
        assert not output.parent.exists()
    direct = run_module("cpupools_agent_build", extra, tmp_path)
    assert direct["stdout"] == script.stdout and direct["rc"] == 0 and not direct.get("failed")


def test_agent_build_failures_say_why(playbook, tmp_path):
    output = str(tmp_path / "build" / "cmk")
    bad = playbook(BUILD, {"script": str(SCRIPT), "output": output, "shebang": "python3"})
    assert bad.rc != 0
    result = bad.result("Build")
    assert result["rc"] == 2 and result["failed"] is True
    assert (
        result["msg"]
        == "cpupools agent build: build_agent.py: --shebang='python3' must be an absolute interpreter path"
    )

    missing = playbook(BUILD, {"script": str(tmp_path / "nowhere.py"), "output": output})
    result = missing.result("Build")
    assert result["failed"] is True and result["rc"] == 2
    assert result["msg"].startswith("cpupools agent build: ") and "nowhere.py" in result["msg"]

    no_python = playbook(BUILD, {"script": str(SCRIPT), "output": output, "pythons": ["/nonexistent/python3"]})
    result = no_python.result("Build")
    assert result["failed"] is True and result["rc"] == 2 and not (tmp_path / "build").exists()
    assert result["msg"] == (
        "cpupools agent build: build_agent.py: --python='/nonexistent/python3': No such file or directory"
    )

    misspelt = BUILD.replace('shebang: "{{ shebang | default(omit) }}"', "shebangs: /usr/bin/python3")
    unknown = playbook(misspelt, {"script": str(SCRIPT), "output": output})
    assert unknown.result("Build")["msg"] == (
        "cpupools agent build: unsupported parameters: shebangs. Supported parameters include: output, pythons, script,"
        " shebang."
    )
