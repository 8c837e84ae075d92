# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
name: planned
short_description: A host's cpupools plan and stage exports, from its plan result or from where it names them
version_added: "1.0.0"
description:
  - The plan and the stages' exports (the kernel, agent and k8s statuses, the pending kernel arguments)
    the plan play computed for a host, as a dict with the keys C(plan) and C(exports).
  - A host with work to do carries them in its plan result (C(cpupools_plan_result)). A converged host's
    result names them by C(plan_digest), stored in the controller's work directory
    (C(<work dir>/build/plan)), instead of carrying them (docs/performance.md, "The converged result").
    This filter reads either, so no reader needs to know which. The C(cpupools) role's defaults read
    C(cpupools_plan), C(cpupools_kernel_status) and the other exported facts through it.
options:
  _input:
    description: The host's C(cpupools_plan_result).
    type: dict
    required: true
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Show the exclusive CPUs planned for this host
  ansible.builtin.debug:
    msg: "{{ (cpupools_plan_result | cpupools.cpupools.planned).plan.pool_cpus.exclusive }}"
"""

RETURN = r"""
_value:
  description: C(plan) and C(exports); each null when the host has neither (a host whose plan failed).
  type: dict
"""

from ansible_collections.cpupools.cpupools.plugins.plugin_utils.digest_store import planned


class FilterModule:
    def filters(self):
        return {"planned": planned}
