"""The mark that every node was planned, without which the stage plays run on every node.

The stage plays of site.yml run on the hosts the plan play grouped as having
work (plugins/plugin_utils/stage_groups.py): a host in no group is left out.
That holds only after playbooks/plan.yml, which plans every node and marks
it. A play of one's own that plans some nodes marks nothing, so a stage
play after it runs on every node and refuses the one without a plan, loudly,
instead of leaving it out in silence.
"""

from __future__ import annotations

from helpers import REPO, local_nodes, run_playbook

NODES = ("planned", "unplanned")

OWN_PLAN_THEN_KERNEL = f"""
- name: Plan one node of two, in a play of one's own
  hosts: planned
  gather_facts: false
  tasks:
    - name: Plan
      ansible.builtin.import_role:
        name: cpupools_plan

- name: The kernel stage, as site.yml has it
  ansible.builtin.import_playbook: {REPO}/playbooks/kernel.yml
"""


def test_a_plan_of_some_nodes_leaves_none_out_of_the_stage_plays(tmp_path):
    topology = str(REPO / "inventories" / "local" / "topology")
    hosts = {name: {"cpupools_facts_root": topology, "cpupools_root": str(tmp_path / "roots" / name)} for name in NODES}
    common = {"cpupools_num_exclusive_cores": 2, "cpupools_kernel_args_backend": "grub"}
    inventory = local_nodes(tmp_path / "hosts.yml", hosts, common)
    res = run_playbook(OWN_PLAN_THEN_KERNEL, tmp_path, None, inventory=inventory)
    assert res.rc != 0
    plays = {play["play"]["name"]: play for play in res.data["plays"]}
    ran = {host for task in plays["Write the kernel arguments"]["tasks"] for host in task["hosts"]}
    assert ran == {"planned", "unplanned"}
    assert res.failed("planned") == 0 and res.changed("planned") > 0
    refused = [
        t["hosts"]["unplanned"] for t in plays["Write the kernel arguments"]["tasks"] if "unplanned" in t["hosts"]
    ]
    assert refused[-1]["failed"] and "no plan; run the cpupools_plan role first" in refused[-1]["msg"], refused[-1]


def test_a_value_reading_a_shared_default_means_what_it_meant_in_the_role(tmp_path):
    """playbooks/plan.yml runs the plan role's tasks without the role, so without the shared defaults
    (roles/cpupools). A host's value that reads one of them, which the host does not set, is templated with
    them beneath, as in a play with the role, and not refused as undefined."""
    topology = str(REPO / "inventories" / "local" / "topology")
    root = tmp_path / "roots" / "planned"
    reading = {
        "cpupools_facts_root": topology,
        "cpupools_root": str(root),
        "cpupools_kernel_args_backend": "grub",
        "cpupools_num_shared_cores": "{{ cpupools_num_exclusive_cores // 2 }}",  # the default, 4, halved
    }
    inventory = local_nodes(tmp_path / "hosts.yml", {"planned": reading})
    role_play = f"""
    - name: The role, in a play of one's own
      hosts: planned
      gather_facts: false
      roles: [cpupools_plan]
    - name: The playbook
      ansible.builtin.import_playbook: {REPO}/playbooks/plan.yml
    """
    res = run_playbook(role_play, tmp_path, None, inventory=inventory)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
    plans = [
        task["hosts"]["planned"]
        for task in res.tasks()
        if task["task"]["name"].endswith("Plan the CPU pools") and "planned" in task["hosts"]
    ]
    assert len(plans) == 2
    assert [plan["inputs"]["num_shared_cores"] for plan in plans] == [2, 2]
    assert plans[0]["plan"]["counts"] == plans[1]["plan"]["counts"]
