#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: cordon, drain (Eviction API) and uncordon a Kubernetes node around a reboot."""

DOCUMENTATION = r"""
---
module: cpupools_k8s_drain
short_description: Cordon, drain or uncordon a Kubernetes node for a cpupools reboot
description:
  - Runs on the controller (delegate it to localhost) and talks to the Kubernetes API with the
    C(kubernetes) Python library.
  - O(state=drained) cordons the node, evicts its pods through the Eviction API (PodDisruptionBudgets
    are respected, a refused eviction is retried until O(timeout), then the failure names each blocked
    pod with its budget and counts), skips DaemonSet-owned and mirror pods, and waits until the evicted
    pods are gone.
  - O(state=cordoned) only marks the node unschedulable; O(state=uncordoned) makes it schedulable again.
  - Each state is idempotent, a drained node with nothing left to evict reports no change.
options:
  node_name:
    description: The Kubernetes node name.
    type: str
    required: true
  state:
    description: What the node should be.
    type: str
    choices: [drained, cordoned, uncordoned]
    default: drained
  timeout:
    description: Seconds a drain may take (evictions refused by a PodDisruptionBudget, pods terminating).
    type: int
    default: 300
  poll_interval:
    description: Seconds between eviction retries and between checks that pods are gone.
    type: float
    default: 2.0
  delete_unmanaged:
    description: Evict pods that no controller recreates (they are deleted for good); refused when false.
    type: bool
    default: false
  ready_timeout:
    description:
      - With O(state=uncordoned), seconds to wait for the node's V(Ready) condition before uncordoning it
        (0 does not wait). A node that is not Ready by then stays cordoned and the module fails.
    type: int
    default: 0
  ready_since:
    description:
      - With O(ready_timeout), the V(Ready) heartbeat must be newer than this one (RV(ready_heartbeat) of the
        drain), so that only what the node's kubelet posted after its restart counts.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Sends only GET requests and reports what would be cordoned and evicted.
  diff_mode:
    support: none
    description: Reports the cordon and the evictions in its result, not as a diff.
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Drain the node before rebooting it
  cpupools.cpupools.cpupools_k8s_drain:
    node_name: "{{ inventory_hostname }}"
    kubeconfig: ~/.kube/config
    timeout: 600
  delegate_to: localhost

- name: Let workloads back on the node
  cpupools.cpupools.cpupools_k8s_drain:
    node_name: "{{ inventory_hostname }}"
    state: uncordoned
    kubeconfig: ~/.kube/config
  delegate_to: localhost
"""

RETURN = r"""
node:
  description: The node name.
  returned: always
  type: str
server:
  description: The API server URL.
  returned: always
  type: str
cordoned:
  description: Whether this run changed the node's schedulability.
  returned: always
  type: bool
evicted:
  description: Pods evicted (would be, in check mode), as namespace and name.
  returned: when state is drained
  type: list
  elements: dict
skipped_daemonset:
  description: DaemonSet pods left on the node.
  returned: when state is drained
  type: list
  elements: dict
skipped_mirror:
  description: Mirror (static) pods left on the node.
  returned: when state is drained
  type: list
  elements: dict
blocked_retries:
  description: Rounds in which a PodDisruptionBudget refused an eviction.
  returned: when state is drained
  type: int
ready_heartbeat:
  description:
    - The V(lastHeartbeatTime) of the node's V(Ready) condition once the node is drained (empty in check mode or
      when the kubelet has posted none); give it as O(ready_since) to the uncordon after the node's reboot.
  returned: when state is drained
  type: str
ready:
  description: The node's V(Ready) condition the uncordon waited for (null when it did not wait).
  returned: when state is uncordoned or cordoned
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import check_node_name
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s_apply import (
    drain,
    set_unschedulable,
    wait_ready,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["drained", "cordoned", "uncordoned"], "default": "drained"},
    "timeout": {"type": "int", "default": 300},
    "poll_interval": {"type": "float", "default": 2.0},
    "delete_unmanaged": {"type": "bool", "default": False},
    "ready_timeout": {"type": "int", "default": 0},
    "ready_since": {"type": "str", "default": ""},
}


def run(module: AnsibleModule) -> dict:
    p = module.params
    node = check_node_name(p["node_name"])
    api = connect_api(p, node)
    if p["state"] == "drained":
        report = drain(
            api,
            module.check_mode,
            timeout=p["timeout"],
            poll=p["poll_interval"],
            delete_unmanaged=p["delete_unmanaged"],
        )
        return dict(report, node=node, server=api.server)
    ready = None
    if p["state"] == "uncordoned" and p["ready_timeout"] > 0 and not module.check_mode:
        ready = wait_ready(api, p["ready_since"], p["ready_timeout"], p["poll_interval"])
    changed = set_unschedulable(api, p["state"] == "cordoned", module.check_mode)
    return {"changed": changed, "cordoned": changed, "node": node, "server": api.server, "ready": ready}


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=lambda p: p["node_name"])


if __name__ == "__main__":
    main()
