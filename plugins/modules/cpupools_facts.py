#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_facts
short_description: Gather the CPU topology facts cpupools plans from
description:
  - Reads C(<root>/sys/devices/system/cpu), C(<root>/sys/devices/system/node)
    and C(<root>/proc/cmdline) and returns the CPU topology under
    C(ansible_facts.cpupools).
  - Every online CPU with its socket (physical_package_id), die, NUMA node,
    sysfs core_id, logical core index and hyperthread siblings (read from
    C(thread_siblings_list), or C(core_cpus_list) on kernels that only have
    that; never guessed from CPU numbering); offline CPUs; sockets and NUMA
    nodes with their CPUs; the running kernel's C(isolcpus) (CPUs and flags),
    C(nohz_full), C(rcu_nocbs), C(irqaffinity), C(/sys/devices/system/cpu/isolated);
    SST-BF high-priority CPUs where C(cpufreq/base_frequency) exists.
  - Hugepages per NUMA node and size (C(nr_hugepages), C(free_hugepages) under
    C(<root>/sys/devices/system/node/node*/hugepages) and
    C(<root>/sys/kernel/mm/hugepages)) and each NUMA node's MemTotal.
  - Below the socket, each CPU's last-level (L3) cache domain, from the
    C(cache/index*) directory whose C(level) is 3 (its C(shared_cpu_list),
    and its C(id), or the lowest CPU sharing it where the kernel has no
    C(id)); and the NUMA distance table from C(node/node*/distance).
  - Never changes anything.
version_added: "0.1.0"
options:
  root:
    description:
      - Directory the sysfs and procfs paths are read under. Tests and the
        embedded default inventory point it at a fixture tree.
    type: path
    default: /
  host:
    description: Name of the host, used in error messages.
    type: str
  variable:
    description: The inventory variable O(root) comes from, named in error messages.
    type: str
    default: cpupools_facts_root
  power:
    description:
      - Also read what the node offers for power and frequency, returned as
        RV(ansible_facts.cpupools.power) - the cpufreq driver, its mode and each CPU's policy, the
        cpuidle driver and each CPU's idle states, the uncore frequency domains. Off by default,
        it reads a few files per CPU and idle state (about 16 per CPU on a server).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
  facts:
    support: full
    description: Returns the topology as the fact C(ansible_facts.cpupools).
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Gather CPU topology facts
  cpupools.cpupools.cpupools_facts:

- name: Gather facts from a fixture tree
  cpupools.cpupools.cpupools_facts:
    root: /tmp/fixtures/2s22c-smt2
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    cpupools:
      description: The CPU topology.
      type: dict
      contains:
        cpus:
          description: >-
            One entry per online CPU, ascending: C(id), C(socket), C(die),
            C(numa_node), C(core_id) (sysfs), C(core) (logical index, as
            C(lscpu -p) numbers cores), C(siblings) (cpulist),
            C(base_frequency_khz) (null when not reported), C(l3) (L3 cache
            domain id, null where sysfs shows no level-3 cache).
          type: list
          elements: dict
        online:
          description: Online CPUs, compressed cpulist.
          type: str
          sample: 0-87
        offline:
          description: Offline CPUs, compressed cpulist.
          type: str
          sample: ""
        sockets:
          description: Socket id (string) to C(cpus), C(cores) (one cpulist per core) and C(numa_nodes).
          type: dict
        socket_order:
          description: Socket ids ordered by their lowest CPU id.
          type: list
          elements: int
        numa_nodes:
          description: NUMA node id (string) to its online CPUs.
          type: dict
        numa_distances:
          description: >-
            NUMA node id (string) to its row of the distance table (one
            number per node, ascending node id; 10 is local). Empty without
            C(node/node*/distance).
          type: dict
          sample: {"0": [10, 32], "1": [32, 10]}
        l3_domains:
          description: >-
            L3 cache domain id (string) to its online CPUs (compressed
            cpulist). Empty where sysfs shows no level-3 cache.
          type: dict
          sample: {"0": "0-7,64-71", "1": "8-15,72-79"}
        cores:
          description: Number of physical cores online.
          type: int
        threads_per_core:
          description: Most hyperthreads seen on one core.
          type: int
        kernel:
          description: >-
            The running kernel's C(cmdline), C(isolcpus) (C(set), C(cpus),
            C(flags)), C(nohz_full), C(rcu_nocbs), C(irqaffinity) (null when
            absent from the command line), C(isolated) and C(nohz_full_active)
            (what sysfs reports).
          type: dict
        sst_bf:
          description: >-
            C(available), C(high_priority_cpus) (CPUs whose base frequency is
            above the lowest) and C(base_frequencies_khz).
          type: dict
        hugepages:
          description: >-
            NUMA node id (string) to page size (C(2M), C(1G)) to C(total) and
            C(free) pages. A kernel without NUMA reports one node C("0").
          type: dict
          sample: {"0": {"2M": {"total": 512, "free": 500}, "1G": {"total": 8, "free": 8}}}
        memory:
          description: NUMA node id (string) to its MemTotal in kB.
          type: dict
          sample: {"0": 65843100, "1": 66058764}
        hugepage_sizes:
          description: The page sizes the kernel offers, ascending (empty without hugetlbfs).
          type: list
          elements: str
          sample: ["2M", "1G"]
        hugepages_global:
          description: Page size to C(total) and C(free) pages over all NUMA nodes.
          type: dict
        power:
          description:
            - With O(power) only. C(cpufreq) (C(driver), C(mode) (intel_pstate or amd_pstate status),
              C(turbo), C(policies)), C(cpuidle) (C(driver), C(governor), C(groups)) and C(uncore)
              (C(driver), C(domains)). A policy or idle group holds the CPUs with the same settings
              (C(cpus), a cpulist); a policy its C(governor), C(governors), C(min_khz), C(max_khz),
              C(scaling_min_khz), C(scaling_max_khz), C(epp), C(epps); an idle group its
              C(states) (C(index), C(name), C(latency_us), C(residency_us)) and the C(disabled)
              ones. An uncore domain its C(name), C(package), C(die), C(min_khz), C(max_khz),
              C(initial_min_khz), C(initial_max_khz). A driver the node lacks is null.
          type: dict
          returned: when O(power) is true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware.power import read_power
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware.topology import (
    check_facts_root,
    gather_topology,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.hugepages import read_hugepages

ARGUMENT_SPEC = {
    "root": {"type": "path", "default": "/"},
    "host": {"type": "str"},
    "variable": {"type": "str", "default": "cpupools_facts_root"},
    "power": {"type": "bool", "default": False},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    root = module.params["root"]
    try:
        topology = gather_topology(check_facts_root(root))
    except CpupoolsError as exc:
        where = [f"host {module.params['host']}"] if module.params["host"] else []
        module.fail_json(msg=": ".join([*where, module.params["variable"], f"{root!r}: {exc}"]))
    facts = topology.to_facts()
    facts.update(read_hugepages(root))
    if module.params["power"]:
        try:
            facts["power"] = read_power(root, topology.online)
        except CpupoolsError as exc:
            module.fail_json(msg=f"{root!r}: power and frequency: {exc}")
    module.exit_json(changed=False, ansible_facts={"cpupools": facts})


if __name__ == "__main__":
    main()
