# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_plan: a task that gives neither ``topology`` nor ``inputs`` checks the host's variables.

Such a task would otherwise be refused ("give topology, inputs, or both"):
the action fills ``inputs`` with every cpupools_* variable of the host, which
is how the cpupools_plan role checks them (tasks/inputs.yml). A task with
either runs the module with its arguments as they are.
"""

from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import jinja_plugins
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import host_inputs, run_plan_module

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "inputs" not in args and "topology" not in args:
            args["inputs"] = host_inputs(task_vars, self._templar, self._loader)
        result.update(run_plan_module(self, "cpupools.cpupools.cpupools_plan", args, task_vars))
        return result
