#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: the cpupools label, taint, extended resources and published layout of a Node."""

DOCUMENTATION = r"""
---
module: cpupools_k8s_node
short_description: Label, taint and advertise a cpupools node in Kubernetes, and publish its layout
description:
  - Runs on the controller (delegate it to localhost) and talks to the Kubernetes API with the
    C(kubernetes) Python library.
  - With O(state=present), ensures the node label C(<label_domain>/cmk-node=true) plus O(labels),
    the taint C(cmk=true:NoSchedule) when O(taint) is true (an existing C(cmk) taint with another
    value or effect is replaced; other taints are left alone), and the extended resources
    O(exclusive_resource) (the number of exclusive cpulists of the plan) and O(eni_resource)
    (the number of exclusive-non-isolcpus cpulists, only when that pool is non-empty) in the
    node's status capacity and allocatable.
  - Installs the C(cpupoollayouts.cpupools.io) CustomResourceDefinition and publishes the node's
    layout (plan and applied state) as a cluster-scoped C(CpuPoolLayout) named after the node.
  - An outdated CRD is updated by a merge patch of only what cpupools owns (its label and spec),
    so labels and annotations of other owners stay. The layout is written only once the CRD is
    C(Established); a CRD whose names another CRD of the group holds (C(NamesAccepted=False))
    fails with the server's condition instead.
  - Reads first and patches only the difference, with JSON patches guarded by a C(test) of the
    resourceVersion it read; a conflicting write by someone else is retried.
  - With O(state=absent), removes exactly what O(state=present) manages and deletes the node's
    C(CpuPoolLayout); the CRD stays, other nodes use it.
options:
  node_name:
    description: The Kubernetes node name (the role passes the inventory hostname by default).
    type: str
    required: true
  state:
    description: Whether the node carries the cpupools label, taint and resources.
    type: str
    choices: [present, absent]
    default: present
  plan:
    description: The cpupools plan of the host (the variable C(cpupools_plan)); required when O(state=present).
    type: dict
  labels:
    description: Extra labels to set on the node (removed again by O(state=absent)).
    type: dict
    default: {}
  label_domain:
    description: Domain of the node label C(<label_domain>/cmk-node).
    type: str
    default: cmk.intel.com
  taint:
    description: Whether the node carries the C(cmk=true:NoSchedule) taint; false removes a C(cmk) taint.
    type: bool
    default: true
  exclusive_resource:
    description: Extended resource counting the exclusive cpulists.
    type: str
    default: cmk.intel.com/exclusive-cores
  eni_resource:
    description: Extended resource counting the exclusive-non-isolcpus cpulists.
    type: str
    default: cmk.intel.com/exclusive-non-isolcpus-cores
  publish:
    description: Whether to install the CRD and publish (or, when absent, delete) the node's layout object.
    type: bool
    default: true
  pending_reboot:
    description: Whether the node's boot configuration waits for a reboot (shown in the layout object).
    type: bool
    default: false
  applied:
    description: Applied state to publish with the layout (kernel, state directory, agent); free-form.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Sends only GET requests and reports what would change.
  diff_mode:
    support: full
    description: Shows the node's labels, taints and our capacity before and after.
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Label, taint and advertise the node
  cpupools.cpupools.cpupools_k8s_node:
    node_name: "{{ inventory_hostname }}"
    plan: "{{ cpupools_plan }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost

- name: Take the node out of cpupools
  cpupools.cpupools.cpupools_k8s_node:
    node_name: worker-3
    state: absent
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
labels:
  description: The node's labels after the run (predicted in check mode).
  returned: always
  type: dict
taints:
  description: The node's taints after the run (predicted in check mode).
  returned: always
  type: list
  elements: dict
capacity:
  description: Our extended resources in the node's capacity after the run.
  returned: always
  type: dict
  sample: {"cmk.intel.com/exclusive-cores": "6"}
resources:
  description: The extended resource counts wanted (null = must not be advertised).
  returned: always
  type: dict
crd:
  description: What happened to the CRD (created, updated, unchanged, skipped).
  returned: always
  type: str
layout:
  description: What happened to the node's CpuPoolLayout (created, updated, unchanged, deleted, skipped).
  returned: always
  type: str
conflicts:
  description: How many conflicting writes by others were retried.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import (
    DEFAULT_ENI_RESOURCE,
    DEFAULT_EXCLUSIVE_RESOURCE,
    DEFAULT_LABEL_DOMAIN,
    check_node_name,
    desired_node,
    layout_object,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s_apply import (
    ensure_crd,
    ensure_layout,
    ensure_node,
    remove_layout,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "plan": {"type": "dict"},
    "labels": {"type": "dict", "default": {}},
    "label_domain": {"type": "str", "default": DEFAULT_LABEL_DOMAIN},
    "taint": {"type": "bool", "default": True},
    "exclusive_resource": {"type": "str", "default": DEFAULT_EXCLUSIVE_RESOURCE},
    "eni_resource": {"type": "str", "default": DEFAULT_ENI_RESOURCE},
    "publish": {"type": "bool", "default": True},
    "pending_reboot": {"type": "bool", "default": False},
    "applied": {"type": "dict", "default": {}},
}


def run(module: AnsibleModule) -> dict:
    p = module.params
    node = check_node_name(p["node_name"])
    wants = desired_node(
        p["plan"],
        p["state"],
        label_domain=p["label_domain"],
        labels=p["labels"],
        taint=p["taint"],
        exclusive_resource=p["exclusive_resource"],
        eni_resource=p["eni_resource"],
    )
    api = connect_api(p, node)
    outcome = ensure_node(api, wants, module.check_mode)
    crd = layout = "skipped"
    if p["publish"] and p["state"] == "present":
        crd = ensure_crd(api, module.check_mode)
        obj = layout_object(node, p["plan"], wants.resources, p["pending_reboot"], p["applied"])
        layout = ensure_layout(api, obj, module.check_mode, crd_exists=not (module.check_mode and crd == "created"))
    elif p["publish"]:
        layout = remove_layout(api, node, module.check_mode)
    changed = outcome["changed"] or crd not in ("unchanged", "skipped") or layout not in ("unchanged", "skipped")
    return {
        "changed": changed,
        "node": node,
        "server": api.server,
        "labels": outcome["after"]["labels"],
        "taints": outcome["after"]["taints"],
        "capacity": outcome["after"]["capacity"],
        "resources": wants.resources,
        "crd": crd,
        "layout": layout,
        "conflicts": outcome["conflicts"],
        "diff": {
            "before": _with_layout(outcome["before"], layout, 0),
            "after": _with_layout(outcome["after"], layout, 1),
        },
    }


# How the layout object looked before and after, per action (for --diff).
_LAYOUT_STATES = {
    "created": ("absent", "current"),
    "updated": ("outdated", "current"),
    "unchanged": ("current", "current"),
    "deleted": ("present", "absent"),
}


def _with_layout(state: dict, action: str, index: int) -> dict:
    if action not in _LAYOUT_STATES:
        return state
    return dict(state, layout=_LAYOUT_STATES[action][index])


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=lambda p: p["node_name"])


if __name__ == "__main__":
    main()
