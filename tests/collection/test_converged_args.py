"""The arguments the plan task leaves out, read by cpupools_converged's action from the host's variables.

roles/cpupools_plan/tasks/plan.yml gives the module no argument (a templated
one is compiled again in every host's worker: docs/performance.md, "Filters
loaded once"). The playbooks' side, the build compared and the slim result,
is tests/playbook/test_converged.py; these are the variables' own cases.
"""

from __future__ import annotations

import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.action.cpupools_converged import implicit_args


class Templar:
    """Templates nothing: the values here are no templates, and a string "true" is the caller's to read."""

    @staticmethod
    def template(value):
        return value


def test_a_build_that_ran_gives_its_output_and_status():
    build = {"changed": False, "rc": 0, "stdout": "abc  /w/build/agent/cmk.pyz  unchanged"}
    found = implicit_args({"inventory_hostname": "n1", "cpupools_plan_agent_build": build}, Templar)
    assert found == {"host": "n1", "build": build["stdout"], "build_rc": 0, "slim": False}
    failed = implicit_args({"inventory_hostname": "n1", "cpupools_plan_agent_build": {"rc": 2, "stdout": ""}}, Templar)
    assert failed["build_rc"] == 2 and failed["build"] == ""


def test_no_build_a_skipped_one_or_a_value_that_is_no_result_gives_none():
    for value in ({"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}, "text", None):
        found = implicit_args({"inventory_hostname": "n1", "cpupools_plan_agent_build": value}, Templar)
        assert found == {"host": "n1", "build_rc": 0, "slim": False}, value
    assert implicit_args({"inventory_hostname": "n1"}, Templar) == {"host": "n1", "build_rc": 0, "slim": False}


def test_slim_only_where_the_plan_playbook_says_so():
    for value, slim in ((True, True), ("yes", True), (False, False), ("no", False)):
        assert implicit_args({"__cpupools_plan_slim": value}, Templar)["slim"] is slim, value
