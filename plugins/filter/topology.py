# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
name: topology
short_description: A host's cpupools topology facts, from its fact or from where its plan result names them
version_added: "1.0.0"
description:
  - The topology of a host as the cpupools_facts module gathered it in the plan play.
  - A host with work to do has it as the fact C(ansible_facts.cpupools). A converged host's plan result
    (C(cpupools_plan_result)) names it by C(topology_digest), stored in the controller's work directory
    (C(<work dir>/build/topology)), instead of carrying it (docs/performance.md, "The converged result").
    This filter reads either, so no reader needs to know which.
options:
  _input:
    description: The host's C(cpupools_plan_result).
    type: dict
    required: true
  facts:
    description: The host's C(ansible_facts).
    type: dict
    default: {}
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Show the online CPUs of this host
  ansible.builtin.debug:
    msg: "{{ (cpupools_plan_result | cpupools.cpupools.topology(ansible_facts)).online }}"
"""

RETURN = r"""
_value:
  description: The topology facts; null when the host has neither the fact nor a stored topology.
  type: dict
"""

from ansible_collections.cpupools.cpupools.plugins.plugin_utils.digest_store import topology


class FilterModule:
    def filters(self):
        return {"topology": topology}
