#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: remove CMK's cluster pieces from nodes cpupools has adopted."""

DOCUMENTATION = r"""
---
module: cpupools_cmk_retire
short_description: Remove what Intel's CMK left in the cluster, in a safe order, once cpupools runs the nodes
description:
  - Runs on the controller (delegate it to localhost, once for the nodes of the run) and talks to the
    Kubernetes API with the C(kubernetes) Python library.
  - Looks up by name what CMK's C(cluster-init), manifests and webhook created, and removes it in this
    order - for each of O(nodes), CMK's agents (C(cmk-init-install-discover-pod-<node>),
    C(cmk-reconfigure-pod-<node>), DaemonSet C(cmk-reconcile-nodereport-ds-<node>)), then its data
    (ConfigMaps C(cmk-config-<node>), C(cmk-reconfigure-<node>), the node's C(cmk-nodereports) and
    C(cmk-reconcilereports) objects); then, only when no node outside O(nodes) still runs CMK, the
    C(-all) DaemonSets and cluster-init pods, the webhook (MutatingWebhookConfiguration
    C(cmk-webhook-config) first, then its Deployment, Service, Secret and ConfigMap), the report CRDs,
    CMK's ClusterRoleBindings and ClusterRoles, and the C(cmk-serviceaccount) ServiceAccount.
  - Keeps CMK v1.5's C(cmk-config-<node>) while it names a task that O(checked) does not show dead.
  - Keeps the webhook while running pods carry its mutation (annotation
    C(cmk.intel.com/resources-injected)) and the service account while running pods use it, and says why.
  - Never touches the node label, taint or extended resources, which cpupools manages under the same names.
  - With nothing of CMK present it changes nothing. Check mode sends only reads and reports what it would remove.
options:
  nodes:
    description: The Kubernetes node names whose CMK pieces go (the nodes cpupools has adopted in this run).
    type: list
    elements: str
    required: true
  namespaces:
    description: Namespaces CMK was installed into (its C(--namespace), and the namespace of its service account).
    type: list
    elements: str
    default: [default, intel-cmk, cmk-namespace]
  checked:
    description:
      - Node name to what its M(cpupools.cpupools.cpupools_state) run found of the PIDs CMK v1.5's ConfigMap
        C(cmk-config-<node>) names (its return value C(cmk_v15), with C(live) and C(dead)).
      - That ConfigMap is kept while it names a PID not found dead there (a running v1.5 workload, or a PID
        not checked), with the reason.
    type: dict
    default: {}
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
attributes:
  check_mode:
    support: full
    description: Sends only GET requests and reports what would be removed.
  diff_mode:
    support: full
    description: Shows the CMK objects present before and after.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Retire CMK from the nodes of this run
  cpupools.cpupools.cpupools_cmk_retire:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'cpupools_k8s_node_name') | list }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
found:
  description: The CMK objects found, as C(Kind namespace/name) or C(Kind name), in removal order.
  returned: always
  type: list
  elements: str
removed:
  description: The objects removed (in check mode, those that would be).
  returned: always
  type: list
  elements: str
kept:
  description: Objects found and kept, each with C(object) and C(reason).
  returned: always
  type: list
  elements: dict
other_cmk_nodes:
  description: Nodes outside O(nodes) that CMK still runs on; the cluster-wide pieces stay while there are any.
  returned: always
  type: list
  elements: str
server:
  description: The API server URL.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.cmk_retire import RBAC_HINT, retire
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import check_node_name
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.cmk15 import CMK_NAMESPACES
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "nodes": {"type": "list", "elements": "str", "required": True},
    "namespaces": {"type": "list", "elements": "str", "default": list(CMK_NAMESPACES)},
    "checked": {"type": "dict", "default": {}},
}


def _where(params: dict) -> str:
    return ",".join(params["nodes"])


def run(module: AnsibleModule) -> dict:
    p = module.params
    nodes = sorted({check_node_name(n) for n in p["nodes"]})
    api = connect_api(p, _where(p), RBAC_HINT)
    import yaml  # the kubernetes library's dependency

    result = retire(api, nodes, list(p["namespaces"]), module.check_mode, checked=p["checked"], load=yaml.safe_load)
    present = sorted(result["found"])
    gone = set(result["removed"])
    result["diff"] = {
        "before": "".join(f"{o}\n" for o in present),
        "after": "".join(f"{o}\n" for o in present if o not in gone),
    }
    return dict(result, server=api.server)


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=_where)


if __name__ == "__main__":
    main()
