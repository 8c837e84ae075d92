#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: read the task lists CMK v1.5 keeps in a node's ConfigMap."""

DOCUMENTATION = r"""
---
module: cpupools_cmk_tasks
short_description: Read the task lists CMK v1.5 keeps in a node's cmk-config-<node> ConfigMap
description:
  - Runs on the controller (delegate it to localhost) and talks to the Kubernetes API with the
    C(kubernetes) Python library. Sends only GET requests.
  - CMK v1.5 keeps its pools and the PIDs holding each cpulist only in the ConfigMap C(cmk-config-<node>)
    of the namespace it was installed into (C(data.config), YAML), not on the node. The
    M(cpupools.cpupools.cpupools_state) module carries what this module returns into the node's pool state
    (option C(cmk_v15)), so that migrating the node hands out no CPU a running v1.5 workload holds.
  - While the ConfigMap's C(Owner) annotation names a holder (a v1.5 isolate or reconcile between reading
    and writing it back), reads again every second, for at most O(wait) seconds.
  - Refuses a ConfigMap whose C(data.config) is not CMK v1.5's format, naming what is wrong.
options:
  node:
    description: The Kubernetes node name (the ConfigMap is C(cmk-config-<node>)).
    type: str
    required: true
  namespaces:
    description: Namespaces CMK was installed into (its C(--namespace)); each is looked in.
    type: list
    elements: str
    default: [default, intel-cmk, cmk-namespace]
  wait:
    description: Seconds to wait for a v1.5 holder's lock (C(Owner)) to be released before reading as it is.
    type: float
    default: 30
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Read CMK v1.5's task lists of this node
  cpupools.cpupools.cpupools_cmk_tasks:
    node: "{{ cpupools_k8s_node_name | default(inventory_hostname) }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost
  register: cmk_v15
"""

RETURN = r"""
configmaps:
  description: The ConfigMaps found, as C(namespace/name) (none on a node CMK v1.5 never ran on).
  returned: always
  type: list
  elements: str
tasks:
  description: Pool to socket to cpulist (CMK's comma form) to the PIDs its task list names.
  returned: always
  type: dict
  sample: {"exclusive": {"0": {"1": [48624], "2": []}}, "infra": {"0": {"0,3": [48630]}}}
pids:
  description: Every PID the task lists name, ascending.
  returned: always
  type: list
  elements: int
server:
  description: The API server URL.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.cmk_retire import RBAC_HINT
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import check_node_name
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.cmk15 import CMK_NAMESPACES, read_tasks
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "node": {"type": "str", "required": True},
    "namespaces": {"type": "list", "elements": "str", "default": list(CMK_NAMESPACES)},
    "wait": {"type": "float", "default": 30.0},
}


def run(module: AnsibleModule) -> dict:
    import yaml  # the kubernetes library's dependency

    p = module.params
    node = check_node_name(p["node"])
    api = connect_api(p, node, RBAC_HINT)
    result = read_tasks(api, node, list(p["namespaces"]), yaml.safe_load, p["wait"])
    for warning in result.pop("warnings"):
        module.warn(f"node {node}: {warning}")
    return dict(result, changed=False, server=api.server)


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=lambda p: p["node"])


if __name__ == "__main__":
    main()
