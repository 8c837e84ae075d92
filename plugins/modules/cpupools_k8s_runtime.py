#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: publish a node's CPU-Pooler or nri-plugins configuration from its plan, and label the node."""

DOCUMENTATION = r"""
---
module: cpupools_k8s_runtime
short_description: Configure CPU-Pooler or an nri-plugins policy for a node from its cpupools plan
description:
  - Runs on the controller (delegate it to localhost) and talks to the Kubernetes API with the
    C(kubernetes) Python library.
  - With O(runtime=cpu-pooler), renders the plan as a CPU-Pooler pool configuration
    (C(exclusive_cpupools) and C(exclusive_non_isolcpus) from the exclusive pools, one physical core
    id each, C(shared_cpupools) from the shared pool, C(default) from infra), stores it as the key
    C(poolconfig-cpupools-<digest>.yaml) of the ConfigMap C(cpu-pooler-configmap) in O(namespace), and
    labels the node C(cpupools.io/pooler-config=cpupools-<digest>), the label the file's nodeSelector names.
  - With O(runtime=nri-topology-aware) or O(runtime=nri-balloons), renders the plan as a
    C(TopologyAwarePolicy) or C(BalloonsPolicy) (C(config.nri/v1alpha1)) named C(group.cpupools-<digest>)
    in O(namespace), and labels the node C(config.nri/group=cpupools-<digest>).
  - Nodes whose rendered configurations are equal share one group (the digest). A group no node uses
    any more is removed; only names starting with C(cpupools-) are ever changed or removed.
  - With O(runtime=cmk) or O(runtime=kubelet), or O(state=absent), removes this node's cpupools group
    labels and retires the groups no other node uses.
  - Refusals of layouts a runtime cannot express happen earlier, in the plan module.
options:
  node_name:
    description: The Kubernetes node name.
    type: str
    required: true
  runtime:
    description: How exclusive CPUs reach workloads on this node.
    type: str
    choices: [cmk, kubelet, cpu-pooler, nri-topology-aware, nri-balloons]
    default: cmk
  state:
    description: Whether the node uses the runtime's configuration (absent removes ours).
    type: str
    choices: [present, absent]
    default: present
  plan:
    description: The cpupools plan of the host; required when O(state=present) and the runtime has a configuration.
    type: dict
  ht_policy:
    description: CPU-Pooler's C(hyperThreadingPolicy) of the exclusive pools.
    type: str
    choices: [multiThreaded, singleThreaded]
    default: multiThreaded
  namespace:
    description: Namespace of Pooler's ConfigMap and of the nri-plugins configuration objects.
    type: str
    default: kube-system
attributes:
  check_mode:
    support: full
    description: Sends only GET requests and reports what would change.
  diff_mode:
    support: full
    description: Shows the node's group labels and the state of the group configuration before and after.
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Configure CPU-Pooler for the node
  cpupools.cpupools.cpupools_k8s_runtime:
    node_name: "{{ inventory_hostname }}"
    runtime: cpu-pooler
    plan: "{{ cpupools_plan }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost

- name: Take the node out of its runtime group
  cpupools.cpupools.cpupools_k8s_runtime:
    node_name: worker-3
    state: absent
    kubeconfig: ~/.kube/config
  delegate_to: localhost
"""

RETURN = r"""
runtime:
  description: The runtime configured.
  returned: always
  type: str
group:
  description: The node's configuration group (C(cpupools-<digest>)); null when the runtime has none.
  returned: always
  type: str
published:
  description: What happened to the group's configuration (created, updated, unchanged, skipped).
  returned: always
  type: str
retired:
  description: Configurations removed because no node uses them any more.
  returned: always
  type: list
  elements: str
labels:
  description: The group labels cpupools manages on the node after the run (null = removed).
  returned: always
  type: dict
  sample: {"cpupools.io/pooler-config": "cpupools-5ff7839e9777"}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import check_node_name
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.runtimes_apply import ensure_runtime
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import K8sError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.names import RUNTIMES
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.runtimes import CONFIG_RUNTIMES
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "runtime": {
        "type": "str",
        "choices": list(RUNTIMES),
        "default": "cmk",
    },
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "plan": {"type": "dict"},
    "ht_policy": {"type": "str", "choices": ["multiThreaded", "singleThreaded"], "default": "multiThreaded"},
    "namespace": {"type": "str", "default": "kube-system"},
}


def run(module: AnsibleModule) -> dict:
    p = module.params
    node = check_node_name(p["node_name"])
    if p["state"] == "present" and p["runtime"] in CONFIG_RUNTIMES and not p["plan"]:
        raise K8sError("no plan: run the cpupools_plan role first (the variable cpupools_plan is missing)", "plan")
    api = connect_api(p, node)
    return ensure_runtime(api, p["runtime"], p["plan"], p["state"], p["ht_policy"], p["namespace"], module.check_mode)


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=lambda p: p["node_name"])


if __name__ == "__main__":
    main()
