# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_converged: fill in ``inputs``, run the module, and group the host by its answer.

The host joins ``cpupools_converged_<stage>`` for every converged stage,
``cpupools_k8s_skipped`` when the k8s stage has nothing to do on it, and
``cpupools_planned``, through one group named after the combination (the
stage plays exclude those groups; docs/performance.md). The strategy adds
the groups as it does for ``group_by``: no task of its own per host.
"""

from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import host_inputs, run_plan_module


def groups(result):
    """``add_group`` and ``parent_groups`` for the module's result."""
    converged = list(result.get("converged") or [])
    skipped = bool(result.get("k8s_skip_reason"))
    name = "cpupools_converged_set_" + ("_".join(converged) or "none") + ("_k8s_skipped" if skipped else "")
    parents = ["cpupools_planned"] + [f"cpupools_converged_{stage}" for stage in converged]
    if skipped:
        parents.append("cpupools_k8s_skipped")
    return {"add_group": name, "parent_groups": parents}


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "inputs" not in args:
            args["inputs"] = host_inputs(task_vars, self._templar)
        result.update(run_plan_module(self, "cpupools.cpupools.cpupools_converged", args, task_vars, prepare=True))
        if not result.get("failed"):
            result.update(groups(result))
        return result
