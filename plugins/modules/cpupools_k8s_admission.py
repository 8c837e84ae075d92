#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: the cluster's MutatingAdmissionPolicy that injects what CMK workloads need."""

DOCUMENTATION = r"""
---
module: cpupools_k8s_admission
short_description: Publish the MutatingAdmissionPolicy that gives CMK workloads their mounts and environment
description:
  - Runs on the controller (delegate it to localhost, once per cluster) and talks to the Kubernetes API
    with the C(kubernetes) Python library.
  - With O(state=present), creates or updates the cluster-scoped C(MutatingAdmissionPolicy) and
    C(MutatingAdmissionPolicyBinding) named C(cpupools-cmk-inject). For pods whose containers request
    or limit O(exclusive_resource) or O(eni_resource), or that carry the label or annotation O(opt_in)
    with value C(true), C(True) or C(1), the API server then adds what CMK's webhook added and the
    README's pod spec writes by hand - the C(cmk) toleration, hostPath volumes for C(/opt/bin),
    C(/etc/cmk) and C(/proc) mounted at C(/opt/bin), C(/etc/cmk) and C(/host/proc),
    C(CMK_PROC_FS=/host/proc) and C(CMK_NUM_CORES) from the container's request (else limit) - each
    only where the pod does not have it already.
  - Detects the server's version (C(/version)) and which version of C(admissionregistration.k8s.io)
    serves the policies (C(v1) from Kubernetes 1.36, C(v1beta1) in 1.34 and 1.35 with the
    C(MutatingAdmissionPolicy) feature gate). On a server without them it changes nothing and warns,
    naming the server version.
  - Reads first and writes only when the objects differ from what cpupools wants (server defaults
    do not count); a replace keeps labels and annotations others added and is guarded by the
    resourceVersion it read. Requests use strict field validation.
  - With O(state=absent), deletes the binding and the policy, unless Nodes other than O(departing)
    still carry O(node_label) (other nodes' workloads still need the injection).
options:
  state:
    description: Whether the policy and its binding exist.
    type: str
    choices: [present, absent]
    default: present
  exclusive_resource:
    description: Extended resource whose request selects a pod and gives C(CMK_NUM_CORES).
    type: str
    default: cmk.intel.com/exclusive-cores
  eni_resource:
    description: Second extended resource that selects a pod (exclusive-non-isolcpus).
    type: str
    default: cmk.intel.com/exclusive-non-isolcpus-cores
  opt_in:
    description: Label or annotation key that opts a pod in without a request (value C(true), C(True) or C(1)).
    type: str
    default: cmk.intel.com/mutate
  failure_policy:
    description:
      - What the API server does when the policy cannot be evaluated for a pod.
      - C(Fail) refuses the pod, C(Ignore) admits it unchanged.
    type: str
    choices: [Fail, Ignore]
    default: Fail
  node_label:
    description:
      - The cpupools node label; O(state=absent) keeps the policy while Nodes not in O(departing) carry it.
      - Empty removes the policy regardless.
    type: str
    default: cmk.intel.com/cmk-node
  departing:
    description: Names of the Nodes this run uninstalls (they do not keep the policy).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Sends only GET requests and reports what would be created, updated or deleted.
  diff_mode:
    support: full
    description: Shows the policy and binding specs before and after.
extends_documentation_fragment:
  - cpupools.cpupools.cpupools_kube
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Publish the pod injection policy
  cpupools.cpupools.cpupools_k8s_admission:
    kubeconfig: /home/ops/.kube/config
  delegate_to: localhost
  run_once: true

- name: Remove it when the last cpupools node is uninstalled
  cpupools.cpupools.cpupools_k8s_admission:
    state: absent
    departing: [worker-1, worker-2]
    kubeconfig: /home/ops/.kube/config
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
server_version:
  description: The API server's gitVersion (C(unknown) when it does not say).
  returned: always
  type: str
  sample: v1.36.1
api_version:
  description: The apiVersion the policy is published with; null when the server serves none.
  returned: always
  type: str
  sample: admissionregistration.k8s.io/v1
policy:
  description: What happened to the policy (created, updated, unchanged, deleted, absent, kept, unsupported).
  returned: always
  type: str
binding:
  description: What happened to the binding (same values as RV(policy)).
  returned: always
  type: str
kept_for:
  description: With O(state=absent), the labelled Nodes that keep the policy in place.
  returned: always
  type: list
  elements: str
server:
  description: The API server URL.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s import (
    DEFAULT_ENI_RESOURCE,
    DEFAULT_EXCLUSIVE_RESOURCE,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s_admission import (
    DEFAULT_OPT_IN,
    FAILURE_POLICIES,
    ensure_admission,
)
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools_kube import connect_api, run_module

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "exclusive_resource": {"type": "str", "default": DEFAULT_EXCLUSIVE_RESOURCE},
    "eni_resource": {"type": "str", "default": DEFAULT_ENI_RESOURCE},
    "opt_in": {"type": "str", "default": DEFAULT_OPT_IN},
    "failure_policy": {"type": "str", "choices": list(FAILURE_POLICIES), "default": "Fail"},
    "node_label": {"type": "str", "default": "cmk.intel.com/cmk-node"},
    "departing": {"type": "list", "elements": "str", "default": []},
}


def run(module: AnsibleModule) -> dict:
    p = module.params
    api = connect_api(p, "")
    result = ensure_admission(
        api,
        p["state"],
        module.check_mode,
        exclusive_resource=p["exclusive_resource"],
        eni_resource=p["eni_resource"],
        opt_in=p["opt_in"],
        failure_policy=p["failure_policy"],
        node_label=p["node_label"],
        departing=p["departing"],
    )
    for warning in result.pop("warnings"):
        module.warn(warning)
    result["server"] = api.server
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, run, where=lambda p: None)


if __name__ == "__main__":
    main()
