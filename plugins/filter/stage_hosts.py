# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
name: stage_hosts
short_description: The host pattern of a cpupools stage play, from the groups the plan play made
version_added: "1.0.0"
description:
  - The plan play puts each host with work in C(cpupools_todo_<stage>) (C(kernel), C(agent), and C(k8s)
    where that stage runs), and the first host of its batch in C(cpupools_plan_ran); a converged host joins
    no group (docs/performance.md, "Groups of the hosts with work").
  - Returns C(cpupools_nodes) when the plan play of C(playbooks/plan.yml), which plans every node, has not
    run in this playbook (a stage play run on its own, C(--skip-tags plan), a play of one's own that plans
    some nodes), C(cpupools_nodes:&cpupools_todo_<stage>) when some host has work for the stage, and
    otherwise a pattern of known groups that matches no host (the play is skipped, "no hosts matched").
  - With the stage C(plan) (the report's own planning play), C(cpupools_nodes) when the plan play has not
    run, and otherwise no host.
options:
  _input:
    description: The run's C(groups).
    type: dict
    required: true
  stage:
    description: C(kernel), C(agent), C(k8s) or C(plan).
    type: str
    required: true
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Write the kernel arguments where the plan found work for that stage
  hosts: "{{ groups | cpupools.cpupools.stage_hosts('kernel') }}"
  gather_facts: false
  roles:
    - cpupools.cpupools.cpupools_kernel
"""

RETURN = r"""
_value:
  description: A host pattern.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.stage_groups import play_hosts


def stage_hosts(groups, stage):
    try:
        return play_hosts(groups, stage)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"stage_hosts": stage_hosts}
