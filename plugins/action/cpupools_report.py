# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_report: collect every host's report input on the controller, then run the module.

Without a ``hosts`` argument it reads, for each host of the play, the
variables the report is built from, in one task run once: the role needs no
``set_fact`` per host (docs/performance.md). With ``hosts`` it passes them on
as they are.
"""

from collections.abc import Mapping

from ansible.plugins.action import ActionBase

#: Report input key -> the host variable it is read from (docs/report.md, input schema).
PARTS = (
    ("plan", "cpupools_plan"),
    ("kernel", "cpupools_kernel_status"),
    ("state", "cpupools_agent_status"),
    ("k8s", "cpupools_k8s_status"),
)


def host_input(host, variables):
    """The report input of one host, from its host variables."""
    # hostvars templates what it returns; a variable the host lacks is None (shown as "not collected")
    facts = variables.get("ansible_facts") or {}
    entry = {"host": host, "topology": facts.get("cpupools")}
    for key, name in PARTS:
        entry[key] = variables.get(name)
    plan = entry["plan"]
    # the plan's checked hugepages request (a -e string is checked there too)
    entry["hugepages"] = (plan.get("hugepages") or {}).get("requested") if isinstance(plan, Mapping) else None
    return entry


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "hosts" not in args:
            hostvars = task_vars["hostvars"]
            args["hosts"] = [host_input(host, hostvars[host]) for host in task_vars["ansible_play_hosts"]]
        result.update(
            self._execute_module(module_name="cpupools.cpupools.cpupools_report", module_args=args, task_vars=task_vars)
        )
        return result
