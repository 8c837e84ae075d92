# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_inventory: check every inventory host's ``cpupools_*`` values on the controller.

One task, run once, before any slice writes: it reads each host's variables
from the inventory (``hostvars``, which hold every host of the inventory
whatever the run's ``--limit``; an AWX/AAP job slice gets an inventory of
its own hosts only, so there playbooks/check.yml runs first, unsliced), runs the
one input check (module_utils/cpupools/planning/inputs.py) on each, and refuses the
run naming every bad host. No node is contacted and no module process runs.
A value that cannot be templated on the controller (it needs a fact of the
node) is left to the plan play, which checks it on the node as before.
"""

import time

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.inputs import (
    check_inventory,
    inventory_refusal,
)
from ansible_collections.cpupools.cpupools.plugins.modules.cpupools_inventory import ARGUMENT_SPEC
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import jinja_plugins
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import PREFIX, checked_args, controller_refusal

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()


def host_values(hostvars, host, deferred):
    """``(host, {name: value})``: the host's ``cpupools_*`` variables, templated in its own context.

    A name whose value cannot be templated here is appended to ``deferred``.
    """
    variables = hostvars[host]
    values = {}
    for name in variables:
        if not name.startswith(PREFIX):
            continue
        try:
            values[name] = variables[name]
        except AnsibleError:
            deferred.append(f"{host}: {name}")
    return host, values


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        params, refusal = checked_args(dict(self._task.args), ARGUMENT_SPEC, "cpupools inventory")
        if refusal:
            result.update(failed=True, msg=refusal)
            return result
        start = time.monotonic()
        hostvars = task_vars["hostvars"]
        hosts = params["hosts"]
        if hosts is None:
            hosts = list(task_vars.get("groups", {}).get(params["group"], []))
        deferred = []
        count, refusals, warnings = check_inventory(
            (host_values(hostvars, host, deferred) for host in hosts), controller=controller_refusal
        )
        result.update(
            changed=False,
            checked=count,
            deferred=deferred,
            seconds=round(time.monotonic() - start, 3),
        )
        message = inventory_refusal(count, refusals)
        if message:
            # The plan play, which warns about unknown names, will not run: warn here.
            result.update(failed=True, msg=message, refused=len(refusals), warnings=warnings)
        else:
            result["msg"] = f"{count} host(s) checked on the controller"
        return result
