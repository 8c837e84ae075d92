"""The facts and plan modules and the cpupools_plan role, through real ansible-playbook runs."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, ansible_env, tree_snapshot
from sysfs import Spec

pytestmark = pytest.mark.slow

ROLE_PLAY = """
- name: Plan
  hosts: localhost
  gather_facts: false
  vars:
    cpupools_plan_check_stages: false  # fixture roots have no boot loader
  roles:
    - role: cpupools_plan
  tasks:
    - name: Show the plan
      ansible.builtin.debug:
        var: cpupools_plan
"""


def test_facts_module_reads_the_fixture_and_changes_nothing(playbook, corpus_root):
    root = corpus_root["2s8c-offline"]
    before = tree_snapshot(root)
    pb = f"""
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: Gather
          cpupools_facts:
            root: {root}
        - name: Show
          ansible.builtin.debug:
            var: ansible_facts.cpupools
    """
    for args in ((), ("--check",)):
        res = playbook(pb, None, *args)
        assert res.rc == 0, res.stdout + res.stderr
        assert res.changed() == 0
        facts = res.result("Show")["ansible_facts.cpupools"]
        assert facts["offline"] == "5,21,30-31"
        assert facts["sockets"]["1"]["cpus"] == "8-15,24-29"
    assert tree_snapshot(root) == before


def test_role_sets_the_plan_fact(playbook, corpus_root):
    res = playbook(
        ROLE_PLAY,
        {
            "cpupools_root": corpus_root["2s22c-smt2"],
            "cpupools_num_exclusive_cores": 4,
            "cpupools_exclusive_mode": "spread",
            "cpupools_num_shared_cores": 2,
        },
    )
    assert res.rc == 0, res.stdout + res.stderr
    assert res.changed() == 0
    plan = res.result("Show the plan")["cpupools_plan"]
    assert plan["handout_order"]["exclusive"] == ["1,45", "23,67", "2,46", "24,68"]
    assert plan["pools"]["shared"] == {"0": ["3,4,47,48"], "1": []}


def test_role_plans_numa_nodes_and_l3_domains_with_values_from_e(playbook, corpus_root):
    """NPS2 with two 8-core L3s per node: facts carry the domains and distances; spread balances nodes.

    The expected hand-out order is worked out in tests/planning/test_plan_numa.py
    (nodes 0, 2, 1, 3 in turn; on each, the L3 domain without its housekeeping
    core). The sizes come as strings, as ``-e key=value`` gives them.
    """
    pb = (
        ROLE_PLAY
        + """
    - name: Show the topology
      ansible.builtin.debug:
        msg: "{{ {'l3': ansible_facts.cpupools.l3_domains, 'dist': ansible_facts.cpupools.numa_distances} }}"
"""
    )
    res = playbook(
        pb,
        None,
        "-e",
        f"cpupools_root={corpus_root['2s32c-smt2-nps2']}",
        "-e",
        "cpupools_num_exclusive_cores=8 cpupools_exclusive_mode=spread cpupools_num_shared_cores=2",
        "-e",
        "cpupools_shared_mode=spread",
    )
    assert res.rc == 0, res.stdout + res.stderr
    assert res.changed() == 0
    plan = res.result("Show the plan")["cpupools_plan"]
    assert plan["handout_order"]["exclusive"] == [
        "8,72",
        "40,104",
        "24,88",
        "56,120",
        "9,73",
        "41,105",
        "25,89",
        "57,121",
    ]
    assert plan["pools"]["shared"] == {"0": ["1,65"], "1": ["33,97"]}
    assert plan["reserved_cpus"] == "0,16,32,48,64,80,96,112"
    shown = res.result("Show the topology")["msg"]
    assert shown["l3"]["1"] == "8-15,72-79" and len(shown["l3"]) == 8
    assert shown["dist"]["2"] == [32, 32, 10, 12]


def test_adopt_warnings_reach_the_operator(playbook, make_root):
    root = make_root(Spec(sockets=1, cores_per_socket=8, threads=1, cmdline="ro isolcpus=domain,1-6"))
    res = playbook(
        ROLE_PLAY,
        {"cpupools_root": str(root), "cpupools_isolcpus_source": "adopt"},
    )
    assert res.rc == 0, res.stdout + res.stderr
    warnings = res.result("Plan the CPU pools")["warnings"]
    assert any("host localhost: 1 isolated core (6) are in no pool" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"cpupools_num_exclusive_cores": "lots"},
            "host localhost: cpupools_num_exclusive_cores: 'lots' is not an integer",
        ),
        ({"cpupools_num_shared_cores": -3}, "host localhost: cpupools_num_shared_cores: -3 is below -1"),
        (
            {"cpupools_num_exclusive_cores": -1, "cpupools_num_shared_cores": -1},
            "cpupools_num_exclusive_cores: num_exclusive_cores and num_shared_cores are both -1",
        ),
        ({"cpupools_exclusive_mode": "vertical"}, "cpupools_exclusive_mode"),
        (
            {"cpupools_num_exclusive_cores": 20, "cpupools_num_shared_cores": 2},
            "host localhost: cpupools_num_exclusive_cores: 20 exclusive cores + 2 shared cores requested, "
            "12 available after 1 infra core per NUMA node (auto) and 1 core with an offline sibling, never isolated",
        ),
        ({"cpupools_excl_non_isolcpus": "30"}, "host localhost: cpupools_excl_non_isolcpus: CPU(s) 30 are offline"),
        (
            {"cpupools_excl_non_isolcpus": "999"},
            "host localhost: cpupools_excl_non_isolcpus: malformed excl_non_isolcpus '999': item 1 '999': "
            "CPU 999 is beyond the last possible CPU 31",
        ),
        ({"cpupools_excl_non_isolcpus": "6"}, "cpupools_excl_non_isolcpus: 6 splits core 6,22"),
        ({"cpupools_excl_non_isolcpus": "0,16"}, "cpupools_excl_non_isolcpus: CPU(s) 0,16 are infra cores"),
        ({"cpupools_isolcpus_source": "adopt"}, "host localhost: cpupools_isolcpus_source: adopt needs isolcpus="),
    ],
)
def test_bad_input_fails_with_one_clear_message(playbook, corpus_root, extra, message):
    res = playbook(ROLE_PLAY, {"cpupools_root": corpus_root["2s8c-offline"], **extra})
    assert res.rc != 0
    assert message in res.messages(), res.messages()
    assert "Traceback" not in res.stdout + res.stderr


def test_malformed_cmdline_is_refused(playbook, make_root):
    root = make_root(Spec(cmdline="ro isolcpus=managed_irq,3-x"))
    res = playbook(ROLE_PLAY, {"cpupools_root": str(root)})
    assert res.rc != 0
    assert (
        "malformed /proc/cmdline isolcpus= 'managed_irq,3-x': item 1 '3-x': 'x' is not a CPU number" in res.messages()
    )


def test_modules_render_with_ansible_doc():
    import subprocess

    for module in sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py")):
        proc = subprocess.run(
            [str(REPO / ".venv/bin/ansible-doc"), "-t", "module", "--json", module],
            cwd=REPO,
            env=ansible_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{module}: {proc.stderr}"
        doc = json.loads(proc.stdout)[module]["doc"]
        assert doc["attributes"]["check_mode"]["support"] in ("full", "partial"), module
