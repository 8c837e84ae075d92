"""cpupools_verify through real ansible-playbook on a /proc and /sys fixture tree: a finding, check mode, bad input.

One playbook run, three tasks: the module's result is what the role asserts on
(``ok``), check mode says what oslat would run and runs nothing, and a plan
without its keys is refused with the host named.
"""

from __future__ import annotations

import pytest
from helpers import tree_snapshot
from procfs import EXPECTED, PLAN, Task, quiet_kernel, write_cmk_state, write_kernel

pytestmark = pytest.mark.slow

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Verify
      cpupools_verify:
        facts_root: "{{ node }}"
        root: "{{ node }}"
        plan: "{{ plan }}"
        expected_args: "{{ expected }}"
      register: verified

    - name: Verify in check mode with latency
      cpupools_verify:
        facts_root: "{{ node }}"
        root: "{{ node }}"
        plan: "{{ plan }}"
        expected_args: "{{ expected }}"
        latency:
          enabled: true
          duration: 5
          tool_path: /nonexistent/oslat
          max_us: 20
      check_mode: true
      register: checked

    - name: Verify with a plan without isolated_cpus
      cpupools_verify:
        facts_root: "{{ node }}"
        plan: {runtime: cmk}
        host: node-1
      register: refused
      failed_when: false
"""


def test_module_in_a_playbook(tmp_path, playbook):
    kernel = quiet_kernel()
    kernel.tasks.append(Task(812, "sshd", [0, 1, 2, 3, 4, 5], 4, ppid=1))
    node = write_kernel(tmp_path / "node", kernel)
    write_cmk_state(node, {"3": "100", "4": "", "5": ""})
    before = tree_snapshot(node)
    result = playbook(PLAYBOOK, {"node": str(node), "plan": PLAN, "expected": EXPECTED})
    assert result.rc == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert result.changed() == 0

    verified = result.result("Verify")
    assert verified["ok"] is False and verified["changed"] is False
    (stray,) = [f for f in verified["findings"] if f["check"] == "process"]
    assert stray["severity"] == "fail" and stray["cpus"] == "4" and "pid 812 (sshd)" in stray["message"]
    assert verified["per_cpu"]["3"]["held_by"] == "cmk pid 100"
    assert verified["latency"]["skipped"] == "not enabled"

    checked = result.result("Verify in check mode with latency")
    assert checked["latency"]["skipped"].startswith("check mode: would run /nonexistent/oslat --cpu-list 1,4-5 ")
    assert checked["latency"]["cpus"] == {} and checked["ok"] is False  # the stray still fails it

    refused = result.result("Verify with a plan without isolated_cpus")
    assert "ok" not in refused  # the module failed before reading anything
    assert refused["msg"] == "host node-1: plan must be the host's cpupools_plan (it has no isolated_cpus)"
    assert tree_snapshot(node) == before  # read only
