# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
name: work_dir
short_description: The controller directory a cpupools run writes into
version_added: "1.0.0"
description:
  - Resolves the value of C(cpupools_work_dir). C(auto) is the collection's
    own directory when the user running Ansible may write there (a checkout),
    otherwise C($XDG_CACHE_HOME/cpupools) (C(~/.cache/cpupools)), or, where no
    home directory can be written, C(<tmp>/cpupools-<uid>). Any other value is
    returned as it is.
  - The run writes the C(cmk) build under C(<work dir>/build), the HTML report
    by default under C(<work dir>/reports), and the embedded default inventory's
    sandbox under C(<work dir>/sandbox).
  - Creates nothing. The plan play creates the directory, before any stage
    writes, or refuses the run naming C(cpupools_work_dir).
options:
  _input:
    description: The value of C(cpupools_work_dir), C(auto) or an absolute path.
    type: str
    required: true
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Show where this run writes on the controller
  ansible.builtin.debug:
    msg: "{{ cpupools_work_dir | default('auto') | cpupools.cpupools.work_dir }}"
"""

RETURN = r"""
_value:
  description: The directory.
  type: path
"""

from ansible_collections.cpupools.cpupools.plugins.plugin_utils.work_dir import resolve


def work_dir(value):
    return resolve(value)


class FilterModule:
    def filters(self):
        return {"work_dir": work_dir}
