#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_plan
short_description: Compute the CPU pool layout of a node
description:
  - Pure computation from the topology facts of M(cpupools.cpupools.cpupools_facts) and the pool
    sizes; never changes anything.
  - C(generate) lets the plan decide which cores are isolated; C(adopt)
    reproduces what CMK's C(cmk init) computes from the C(isolcpus) already on
    the kernel command line, for nodes migrated from CMK.
  - Invalid input fails with one message naming the host, the variable and
    the numbers.
  - With O(inputs), which the cpupools_plan role fills with every C(cpupools_*)
    variable of the host, it checks every public variable of every cpupools
    role first, on one line per refusal, bounds cpulists by the host's possible
    CPUs, checks that C(cpupools_root) can be written under and that
    C(cpupools_task_group) exists on the node, and warns about unknown
    C(cpupools_*) names with the closest known one. The planner options below
    are then ignored.
version_added: "0.1.0"
options:
  topology:
    description:
      - The facts from M(cpupools.cpupools.cpupools_facts) (C(ansible_facts.cpupools)).
      - Without it (only with O(inputs)) the module only checks the inputs and
        returns no plan; cpulists are then bounded by 65536 CPUs instead of
        the host's possible CPUs. C(playbooks/uninstall.yml) does that.
    type: dict
  host:
    description: Name of the host, used in error messages.
    type: str
  inputs:
    description:
      - Every C(cpupools_*) variable of the host, by full name (see
        module_utils/cpupools/planning/inputs.py for the spec of each).
      - A task that gives neither O(topology) nor O(inputs) has them filled in
        by the module's action, on the controller, with every C(cpupools_*)
        variable of the host.
      - With O(topology) too, a plan that C(cpupools_runtime) cannot express (docs/runtimes.md)
        is refused, naming the variable to change.
    type: dict
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
    description:
      - C(packed) fills NUMA node after node, socket by socket; C(spread) balances
        across sockets and, within each socket, across its NUMA nodes.
      - On each node the pool takes the cores that touch the fewest L3 cache
        domains (whole domains, a partly used one before a whole one).
      - In adopt mode (O(isolcpus_source=adopt)) the order is CMK's, by socket only.
    type: str
    default: packed
  shared_mode:
    description: As O(exclusive_mode), for the shared pool.
    type: str
    default: packed
  excl_non_isolcpus:
    description:
      - CPU ids (cpulist text or list) of the C(exclusive-non-isolcpus) pool,
        whose cores are handed out whole but not isolated. Whole cores only.
    type: raw
  infra_cores:
    description:
      - Housekeeping cores, kept for the host and Kubernetes on every NUMA node.
        C(auto) keeps one thread per 32 of each NUMA node's threads, in whole
        cores, at least one core; an integer is a number of cores per NUMA node;
        a mapping NUMA node -> cores (or C(auto)) sets single nodes, the others
        C(auto); a cpulist names the cores. The core of CPU 0 comes first.
      - Cores not in any other pool join the infra pool as well (with O(runtime=kubelet)
        they are the kubelet's).
    type: raw
    default: auto
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
    description:
      - Pools whose CPUs are isolated (in C(generate) mode), a list of C(exclusive) and C(shared).
      - C(auto) is both, but C(exclusive) only for the C(nri-topology-aware), C(nri-balloons) and C(kubelet) runtimes.
    type: raw
    default: auto
  runtime:
    description:
      - How exclusive CPUs reach workloads; the plan is read in its terms. With C(kubelet) the
        housekeeping cores are the reserved ones and every other CPU is one pool, C(exclusive).
    type: str
    choices: [cmk, kubelet, cpu-pooler, nri-topology-aware, nri-balloons]
    default: cmk
  exclusive_core_type:
    description: On a hybrid node, C(performance) (exclusive cores are P cores) or C(any).
    type: str
    choices: [performance, any]
    default: performance
  isolate_cpu0:
    description: Let an infra cpulist that leaves out the core of CPU 0 put that core in an isolated pool.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: A pure computation; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Plan the pools
  cpupools.cpupools.cpupools_plan:
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
  returned: success, when topology is given
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
      description: >-
        What the operator should act on (stranded or half-isolated cores in adopt mode, NUMA
        nodes with too few housekeeping CPUs, cores with an offline sibling).
      type: list
      elements: str
    notes:
      description: What the operator should know (the kubelet's view of a hybrid, SMT kept off by nosmt).
      type: list
      elements: str
    runtime:
      description: The runtime the plan was made for.
      type: str
    reserved_cpus:
      description: >-
        The housekeeping cores' CPUs, kept on every NUMA node: what no runtime hands out
        (C(reservedSystemCPUs), C(reservedResources)); in adopt mode the infra pool's.
      type: str
    allocatable_cpus:
      description: Online CPUs minus C(reserved_cpus).
      type: int
    numa:
      description: >-
        NUMA node (string) to its C(cpus), C(reserved), C(housekeeping), C(isolated) CPUs and each
        pool's CPUs there (compressed cpulists).
      type: dict
    core_types:
      description: On a hybrid node C(performance) and C(efficiency) to their CPUs; empty otherwise.
      type: dict
    kubelet:
      description: >-
        Only with O(inputs) and the C(kubelet) runtime: C(version) (the kubelet's, asked of the node for
        C(cpupools_kubelet_version=auto)), C(version_known), and C(config), the drop-in's fields.
      type: dict
    adopted:
      description: In C(adopt) mode the C(isolcpus) CPUs and flags adopted; null otherwise.
      type: dict
    request:
      description: The normalised inputs.
      type: dict
    hugepages:
      description: >-
        Only with O(inputs): the hugepages of C(cpupools_hugepages) checked against the node
        (C(requested), C(boot) the kernel command line reservation, with C(nodes) when it is
        per NUMA node, C(runtime) the sysfs files the cpupools-hugepages unit writes,
        C(planned) node or C(any) to size to pages, C(memory) node to C(asked_kb) and
        C(available_kb), C(notes) and C(warnings) on where per-node gigantic pages go).
        See docs/hugepages.md.
      type: dict
inputs:
  description: Every public cpupools variable, normalised (without the C(cpupools_) prefix); only with O(inputs).
  returned: when inputs is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.names import RUNTIMES
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware.topology import Topology
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.host_plan import plan_host
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.inputs import (
    PLAN_KEYS,
    check_group,
    check_root,
    unknown_variables,
    validate_inputs,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.plan import make_request, plan_pools

ARGUMENT_SPEC = {
    "topology": {"type": "dict"},
    "host": {"type": "str"},
    "num_exclusive_cores": {"type": "raw", "default": 4},
    "num_shared_cores": {"type": "raw", "default": 1},
    "exclusive_mode": {"type": "str", "default": "packed"},
    "shared_mode": {"type": "str", "default": "packed"},
    "excl_non_isolcpus": {"type": "raw"},
    "infra_cores": {"type": "raw", "default": "auto"},
    "isolcpus_source": {"type": "str", "default": "generate"},
    "sst_bf": {"type": "raw", "default": "auto"},
    "isolated_pools": {"type": "raw", "default": "auto"},
    "isolate_cpu0": {"type": "bool", "default": False},
    "runtime": {
        "type": "str",
        "default": "cmk",
        "choices": list(RUNTIMES),
    },
    "exclusive_core_type": {"type": "str", "default": "performance", "choices": ["performance", "any"]},
    "inputs": {"type": "dict"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    result = {}
    warnings = []
    # A misspelt name may be why a value below is refused: warn first.
    for warning in unknown_variables(params["inputs"] or {}):
        module.warn(f"host {params['host']}: {warning}" if params["host"] else warning)
    try:
        topology = None if params["topology"] is None else Topology.from_facts(params["topology"])
        if params["inputs"] is None:
            if topology is None:
                module.fail_json(msg="cpupools_plan: give topology, inputs, or both")
            request = make_request({key: params[key] for key in PLAN_KEYS})
        else:
            possible = None if topology is None else max([*topology.cpus, *topology.offline]) + 1
            checked = validate_inputs(params["inputs"], possible_cpus=possible)
            check_root(checked.values["root"])
            check_group(checked.values["task_group"])
            request = make_request(checked.request())
            result["inputs"] = checked.values
        if topology is not None:
            if "inputs" in result:  # what the runtime and the hugepages refuse, refused here before any stage
                plan = plan_host(topology, params["topology"], result["inputs"], request, module.run_command)
            else:
                plan = plan_pools(topology, request)
            result["plan"] = plan
            warnings += plan["warnings"]
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(params["host"]))
    for warning in warnings:
        module.warn(f"host {params['host']}: {warning}" if params["host"] else warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
