"""The report role and module through real ansible-playbook runs on localhost."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, run_module

pytestmark = pytest.mark.slow

PLAYBOOK = """\
- name: Report on a fixture node
  hosts: all
  gather_facts: false
  tasks:
    - name: Stand in for the facts and plan roles
      ansible.builtin.set_fact:
        cpupools_plan: "{{ plan }}"
        cpupools_kernel_status: "{{ kernel | default(omit) }}"
        cpupools_verify_result: "{{ verify | default(omit) }}"
        ansible_facts:
          cpupools: "{{ facts }}"

    - name: Report
      ansible.builtin.import_role:
        name: cpupools_report
"""


@pytest.fixture
def extra(host_input, tmp_path):
    entry = host_input("2s8c-2numa", {"num_exclusive_cores": 3})
    return {
        "facts": entry["topology"],
        "plan": entry["plan"],
        "kernel": {"reboot_required": True, "pending": ["isolcpus"]},
        "cpupools_report_html": str(tmp_path / "out" / "report.html"),
    }


def test_first_run_writes_second_run_changes_nothing(playbook, extra, tmp_path):
    html = tmp_path / "out" / "report.html"
    first = playbook(PLAYBOOK, extra)
    assert first.rc == 0, first.stdout + first.stderr
    assert first.changed() == 1
    render = first.result("cpupools_report : Render the fleet report")
    assert render["html_path"] == str(html)
    assert render["hosts"] == {"localhost": {"status": "pending", "drift": [], "warnings": [], "verify": None}}
    assert render["json_path"] == str(tmp_path / "out" / "report.json")
    data = (tmp_path / "out" / "report.json").read_text()
    page = html.read_text()
    assert 'id="host-localhost"' in page and page.count('class="core"') == 16
    printed = first.result("cpupools_report : Print the fleet report")["msg"]
    assert printed[0] == (
        "== localhost [pending]: 2 sockets, 16 cores, 32 CPUs online (2 per core); "
        "mode generate (cpupools chose the isolated CPUs); runtime cmk"
    )
    assert "  kernel          reboot required (pending: isolcpus)" in printed
    assert printed[-1] == "fleet: 1 host; 1 pending (localhost); 3 exclusive cores"
    stat = html.stat()

    second = playbook(PLAYBOOK, extra)
    assert second.rc == 0 and second.changed() == 0, second.stdout
    assert html.read_text() == page and html.stat().st_mtime_ns == stat.st_mtime_ns
    assert (tmp_path / "out" / "report.json").read_text() == data


def test_check_mode_predicts_and_writes_nothing(playbook, extra, tmp_path):
    html = tmp_path / "out" / "report.html"
    check = playbook(PLAYBOOK, extra, "--check", "--diff")
    assert check.rc == 0, check.stdout + check.stderr
    assert check.changed() == 1
    assert not html.parent.exists()
    diff = check.result("cpupools_report : Render the fleet report")["diff"]
    diff = diff[0] if isinstance(diff, list) else diff
    assert diff["before"] == "(absent)\n" and diff["after"].endswith(" bytes, sha1 " + diff["after"].split()[-1] + "\n")
    assert diff["after_header"] == str(html)
    # The report is printed in check mode too: that is where an operator reads the plan.
    assert check.result("cpupools_report : Print the fleet report")["msg"][-1].startswith("fleet: 1 host")

    playbook(PLAYBOOK, extra)
    again = playbook(PLAYBOOK, extra, "--check")
    assert again.changed() == 0


def test_no_html_and_no_print(playbook, extra, tmp_path):
    extra = dict(extra, cpupools_report_html="", cpupools_report_print=False)
    run = playbook(PLAYBOOK, extra)
    assert run.rc == 0 and run.changed() == 0, run.stdout
    assert run.result("cpupools_report : Render the fleet report")["html_path"] is None
    assert run.result("cpupools_report : Print the fleet report").get("skipped") is True
    assert not (tmp_path / "out").exists()


def test_malformed_input_fails_with_one_clear_message(playbook, extra, tmp_path):
    extra = dict(extra, plan={"pool_cpus": {}})
    run = playbook(PLAYBOOK, extra)
    assert run.rc != 0
    assert (
        run.messages()
        == "cpupools report: host localhost: cpupools_plan: has no 'pools' dict; is it the output of cpupools_plan?"
    )
    assert "Traceback" not in run.stdout
    assert not (tmp_path / "out").exists()


def test_page_renders_with_the_controllers_python_whatever_the_inventory_names(playbook, extra, tmp_path):
    """The inventory may give localhost a Python without jinja2; the render task uses the controller's."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "jinja2.py").write_text("raise ImportError('jinja2 hidden by the test')\n")
    python = tmp_path / "python-without-jinja2"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={hide} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    probe = subprocess.run([str(python), "-c", "import jinja2"], capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "jinja2 hidden" in probe.stderr  # or this test proves nothing
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: {python}\n"
    )
    run = playbook(PLAYBOOK, extra, inventory=str(inventory))
    assert run.rc == 0, run.stdout + run.stderr
    assert 'id="host-localhost"' in (tmp_path / "out" / "report.html").read_text()


def test_the_plans_hugepages_reach_the_report(playbook, extra, tmp_path):
    """The report reads the reservations the plan checked (``cpupools_plan.hugepages.requested``).

    The plan role parses ``cpupools_hugepages`` from YAML or from ``-e`` text
    (tests/node/test_hugepages.py); the report never reads the raw variable.
    """
    extra = dict(extra, facts=dict(extra["facts"], hugepages={"0": {"1G": {"total": 4, "free": 4}}}))
    requested = [{"size": "1G", "count": 4, "numa_node": 0}]
    as_planned = playbook(PLAYBOOK, dict(extra, plan=dict(extra["plan"], hugepages={"requested": requested})))
    assert as_planned.rc == 0, as_planned.stdout
    lines = as_planned.result("cpupools_report : Print the fleet report")["msg"]
    assert "  hugepages       NUMA node 0 1G: planned 4, total 4, free 4; ok" in lines
    # The raw variable, even with another count, is not what the report shows.
    more = [{"size": "1G", "count": 6, "numa_node": 0}]
    raw = playbook(
        PLAYBOOK,
        dict(extra, plan=dict(extra["plan"], hugepages={"requested": more})),
        "-e",
        "cpupools_hugepages=1G:2:0",
    )
    assert raw.rc == 0, raw.stdout
    lines = raw.result("cpupools_report : Print the fleet report")["msg"]
    assert "  hugepages       NUMA node 0 1G: planned 6, total 4, free 4; pending reboot" in lines


def test_the_module_run_directly_renders_what_the_action_renders(playbook, host_input, tmp_path):
    """The action renders in the worker; the module (run outside a task) must give the same report and page."""
    entry = host_input("2s8c-2numa", {"num_exclusive_cores": 3})
    entry["host"] = "node-1"
    template = REPO / "roles" / "cpupools_report" / "templates" / "cpupools-report.html.j2"
    task = """\
    - name: Report
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Render
          cpupools.cpupools.cpupools_report:
            hosts: "{{ hosts }}"
            html_path: "{{ html }}"
            template: "{{ template }}"
    """
    by_action = tmp_path / "action" / "report.html"
    run = playbook(task, {"hosts": [entry], "html": str(by_action), "template": str(template)})
    assert run.rc == 0, run.stdout + run.stderr
    action = run.result("Render")
    assert action["changed"] is True and action["html_path"] == str(by_action)

    by_module = tmp_path / "module" / "report.html"
    module = run_module(
        "cpupools_report", {"hosts": [entry], "html_path": str(by_module), "template": str(template)}, tmp_path
    )
    assert module["changed"] is True and module["html_path"] == str(by_module)
    assert module["lines"] == action["lines"] and module["hosts"] == action["hosts"]
    assert by_module.read_bytes() == by_action.read_bytes()
    assert oct(by_module.stat().st_mode & 0o777) == oct(by_action.stat().st_mode & 0o777) == "0o644"

    # Both refuse the same way: a template missing beside the path given.
    refusals = []
    run = playbook(task, {"hosts": [entry], "html": str(by_action), "template": str(tmp_path / "none.j2")})
    refusals.append(run.result("Render")["msg"])
    refusals.append(
        run_module(
            "cpupools_report",
            {"hosts": [entry], "html_path": str(by_module), "template": str(tmp_path / "none.j2")},
            tmp_path,
        )["msg"]
    )
    assert refusals == [f"cpupools report: HTML template none.j2 not found beside {tmp_path / 'none.j2'}"] * 2


def test_a_hosts_verify_result_reaches_the_page_and_the_json(playbook, extra, tmp_path):
    """The action reads the fact the verify role sets (cpupools_verify_result) from hostvars."""
    import json

    from verify_results import noisy

    run = playbook(PLAYBOOK, dict(extra, verify=noisy()))
    assert run.rc == 0, run.stdout + run.stderr
    assert run.result("cpupools_report : Render the fleet report")["hosts"]["localhost"]["verify"] == "fail"
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["hosts"][0]["verify"] == noisy()
    assert "pid 812 (sshd) ran on exclusive CPU 4, not held" in (tmp_path / "out" / "report.html").read_text()
