#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_inventory
short_description: Check every inventory host's cpupools values on the controller, before any host is changed
description:
  - Runs once on the controller (C(run_once)) and checks the C(cpupools_*)
    variables of every host of the inventory group O(group), or of O(hosts),
    with the same check the plan play runs on each node
    (C(plugins/module_utils/cpupools/planning/inputs.py)), leaving out only what needs
    the node's topology (a cpulist beyond its CPUs, pools that fit its
    cores, a root or group on the node), which the plan play checks.
  - Its action reads the variables from C(hostvars), which hold every host
    of the inventory whatever the run's C(--limit), so a run limited to one
    shard still checks the whole fleet, and refuses before any shard writes.
    No node is contacted and no module process runs. An AWX/AAP job slice's
    inventory holds only its own hosts; C(playbooks/check.yml) runs this
    check alone, unsliced, first (docs/awx.md).
  - A value that cannot be templated on the controller (it uses a fact of
    the node) is left to the plan play and listed in RV(deferred).
  - This module is what a direct run outside a task executes, over
    O(variables).
version_added: "1.0.0"
options:
  group:
    description: The inventory group whose hosts are checked.
    type: str
    default: cpupools_nodes
  hosts:
    description: The hosts to check instead of the hosts of O(group).
    type: list
    elements: str
  variables:
    description:
      - Host name to its C(cpupools_*) variables (full names). The action
        fills them in from C(hostvars); only a direct module run gives them.
    type: dict
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Changes nothing.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Check every host's cpupools values before any slice writes
  cpupools.cpupools.cpupools_inventory:
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
checked:
  description: How many hosts were checked.
  returned: always
  type: int
refused:
  description: How many hosts have a bad value (the run fails; C(msg) names them).
  returned: failure
  type: int
deferred:
  description: "C(host: variable) for each value left to the plan play (it needs the node's facts)."
  returned: always
  type: list
  elements: str
seconds:
  description: Wall time of the check on the controller.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.inputs import (
    check_inventory,
    inventory_refusal,
)

#: The options of the module; its action checks a task's arguments against the same spec.
ARGUMENT_SPEC = {
    "group": {"type": "str", "default": "cpupools_nodes"},
    "hosts": {"type": "list", "elements": "str"},
    "variables": {"type": "dict"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    start = time.monotonic()
    variables = module.params["variables"] or {}
    hosts = module.params["hosts"] if module.params["hosts"] is not None else sorted(variables)
    count, refusals, warnings = check_inventory((host, variables.get(host) or {}) for host in hosts)
    result = {"changed": False, "checked": count, "deferred": [], "seconds": round(time.monotonic() - start, 3)}
    message = inventory_refusal(count, refusals)
    if message:
        for warning in warnings:
            module.warn(warning)
        module.fail_json(msg=message, refused=len(refusals), **result)
    module.exit_json(msg=f"{count} host(s) checked", **result)


if __name__ == "__main__":
    main()
