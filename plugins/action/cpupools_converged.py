# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_converged: fill in ``inputs``, run the module, and group the host by its answer.

The host joins ``cpupools_converged_<stage>`` for every converged stage,
``cpupools_k8s_skipped`` when the k8s stage has nothing to do on it, and
``cpupools_planned``, through one group named after the combination (the
stage plays exclude those groups; docs/performance.md). No task of its own
per host: on ansible-core 2.21 and later the action adds the groups to the
inventory itself (``ActionBase.add_group``, which ``group_by`` uses there);
before 2.21 the strategy adds them from the result's ``add_group`` and
``parent_groups``, as it does for ``group_by``. 2.21 no longer reads those
keys: a converged host then joined no group and reached the stage plays.

With ``slim`` (set by playbooks/plan.yml, whose stage plays leave converged
hosts out), on a host with nothing to do (every stage with a check converged) it slims
the result that goes back to ansible-playbook's main process, which handles
every host's result in one process (docs/performance.md, "The converged
result"): the topology is returned as ``topology_json``, its facts as one
JSON text, not as the fact ``ansible_facts.cpupools`` (Ansible copies a
host's facts on every lookup of its variables, about a dozen per host and
run, and walks every object of a result once more for the callbacks: one
string is one object), and ``files``, ``inputs`` and ``invocation``, which
only a stage that runs reads, are left out. A run with ``-v`` or ``--diff``
gets the whole result.
"""

import json

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
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


#: What only a stage that runs reads (and Ansible's echo of the arguments): left out of a converged host's result.
STAGE_ONLY = ("files", "inputs", "invocation")


def slim(result, verbose):
    """The result of a host with nothing to do, as later plays and the report read it (the others unchanged).

    The topology moves from ``ansible_facts.cpupools`` to ``topology_json``
    (the same facts, as compact JSON text); the keys of ``STAGE_ONLY`` go.
    ``verbose`` (``-v``, ``--diff``) keeps it whole.
    """
    if verbose or result.get("failed") or result.get("todo") != []:
        return result
    facts = result.pop("ansible_facts", None) or {}
    result["topology_json"] = json.dumps(facts.get("cpupools"), sort_keys=True, separators=(",", ":"))
    for key in STAGE_ONLY:
        result.pop(key, None)
    return result


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "inputs" not in args:
            args["inputs"] = host_inputs(task_vars, self._templar)
        result.update(run_plan_module(self, "cpupools.cpupools.cpupools_converged", args, task_vars, prepare=True))
        if not result.get("failed"):
            grouping = groups(result)
            if hasattr(ActionBase, "add_group"):
                # 2.21+: the strategy ignores the keys; the inventory is changed through the worker's RPC
                self.add_group(grouping["add_group"], parent_group_names=grouping["parent_groups"])
            else:
                result.update(grouping)
        # a play that runs the stages on every host (reboot.yml, uninstall.yml, a user's own) keeps it whole
        whole = not boolean(args.get("slim", False)) or Display().verbosity > 0 or bool(self._task.diff)
        return slim(result, whole)
