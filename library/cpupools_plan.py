#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_plan
short_description: Compute the CPU pool layout of a node
description:
  - Pure computation from the topology facts of M(cpupools_facts) and the pool
    sizes; never changes anything.
  - C(generate) lets the plan decide which cores are isolated; C(adopt)
    reproduces what CMK's C(cmk init) computes from the C(isolcpus) already on
    the kernel command line, for nodes migrated from CMK.
  - Invalid input fails with one message naming the host, the variable and
    the numbers.
version_added: "0.1.0"
options:
  topology:
    description: The facts from M(cpupools_facts) (C(ansible_facts.cpupools)).
    type: dict
    required: true
  host:
    description: Name of the host, used in error messages.
    type: str
  num_exclusive_cores:
    description:
      - Physical cores in the C(exclusive) pool; C(-1) takes all remaining cores.
      - Only one of the two counts may be C(-1).
    type: raw
    default: 4
  num_shared_cores:
    description: Physical cores in the C(shared) pool; C(-1) takes all remaining cores.
    type: raw
    default: 1
  exclusive_mode:
    description: C(packed) fills socket by socket; C(spread) balances across sockets.
    type: str
    default: packed
  shared_mode:
    description: As O(exclusive_mode), for the shared pool.
    type: str
    default: packed
  excl_non_isolcpus:
    description:
      - CPU ids (cpulist text or list) of the C(exclusive-non-isolcpus) pool:
        cores handed out whole but not isolated. Whole cores only.
    type: raw
  infra_cores:
    description:
      - Cores kept for the host and Kubernetes. An integer is a number of cores
        per socket (the first cores of each socket, which always includes the core
        of CPU 0); a cpulist names the cores.
      - Cores not in any other pool join the infra pool as well.
    type: raw
    default: 1
  isolcpus_source:
    description: C(generate) or C(adopt).
    type: str
    default: generate
  sst_bf:
    description:
      - C(auto) prefers SST-BF high-priority cores for the exclusive pool when the
        topology shows them; C(true) requires them; C(false) ignores them.
    type: raw
    default: auto
  isolated_pools:
    description: Pools whose CPUs are isolated (in C(generate) mode).
    type: list
    elements: str
    default: [exclusive, shared]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - cpupools authors
"""

EXAMPLES = r"""
- name: Plan the pools
  cpupools_plan:
    topology: "{{ ansible_facts.cpupools }}"
    host: "{{ inventory_hostname }}"
    num_exclusive_cores: 8
    num_shared_cores: 2
    exclusive_mode: spread
  register: plan
"""

RETURN = r"""
plan:
  description: The pool layout.
  returned: success
  type: dict
  contains:
    version:
      description: Plan format version.
      type: int
    mode:
      description: C(generate) or C(adopt).
      type: str
    pools:
      description: >-
        Pool name to socket id (string) to cpulists in CMK form (ascending,
        comma-joined). Exclusive pools have one cpulist per physical core in
        hand-out order; shared and infra one cpulist per socket.
      type: dict
    handout_order:
      description: Exclusive pools only, every cpulist in the order C(cmk isolate) hands them out.
      type: dict
    exclusive_pools:
      description: Names of the pools whose cpulists are handed out whole.
      type: list
      elements: str
    pool_cpus:
      description: Pool name to its CPUs, compressed cpulist.
      type: dict
    isolated_cpus:
      description: CPUs to isolate (C(isolcpus)), compressed cpulist.
      type: str
    housekeeping_cpus:
      description: Infra CPUs that are not isolated (C(irqaffinity)), compressed cpulist.
      type: str
    stranded_cpus:
      description: CPUs in no pool (only in C(adopt) mode, with a warning).
      type: str
    counts:
      description: Pool name to number of physical cores.
      type: dict
    cpu_counts:
      description: Pool name to number of CPUs.
      type: dict
    sockets:
      description: Socket ids in order.
      type: list
      elements: int
    sst_bf_cores:
      description: CPUs of the SST-BF high-priority cores the plan preferred.
      type: str
    warnings:
      description: What the operator should know (stranded or half-isolated cores in adopt mode).
      type: list
      elements: str
    adopted:
      description: In C(adopt) mode the C(isolcpus) CPUs and flags adopted; null otherwise.
      type: dict
    request:
      description: The normalised inputs.
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.cpupools.errors import CpupoolsError
from ansible.module_utils.cpupools.plan import make_request, plan_pools
from ansible.module_utils.cpupools.topology import Topology

REQUEST_OPTIONS = (
    "num_exclusive_cores",
    "num_shared_cores",
    "exclusive_mode",
    "shared_mode",
    "excl_non_isolcpus",
    "infra_cores",
    "isolcpus_source",
    "sst_bf",
    "isolated_pools",
)

ARGUMENT_SPEC = {
    "topology": {"type": "dict", "required": True},
    "host": {"type": "str"},
    "num_exclusive_cores": {"type": "raw", "default": 4},
    "num_shared_cores": {"type": "raw", "default": 1},
    "exclusive_mode": {"type": "str", "default": "packed"},
    "shared_mode": {"type": "str", "default": "packed"},
    "excl_non_isolcpus": {"type": "raw"},
    "infra_cores": {"type": "raw", "default": 1},
    "isolcpus_source": {"type": "str", "default": "generate"},
    "sst_bf": {"type": "raw", "default": "auto"},
    "isolated_pools": {"type": "list", "elements": "str", "default": ["exclusive", "shared"]},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        request = make_request({key: params[key] for key in REQUEST_OPTIONS})
        plan = plan_pools(Topology.from_facts(params["topology"]), request)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(params["host"]))
    for warning in plan["warnings"]:
        module.warn(f"host {params['host']}: {warning}" if params["host"] else warning)
    module.exit_json(changed=False, plan=plan)


if __name__ == "__main__":
    main()
