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

Every result names the host's topology by ``topology_digest``: stored on
the controller by digest (plugin_utils/digest_store.py), where the report
and the stages read it when the host has no fact. With ``slim`` (set by
playbooks/plan.yml, whose stage plays leave the converged hosts out), on a
host with nothing to do (every stage with a check converged) it slims the
result that goes back to ansible-playbook's main process, which handles
every host's result in one process (docs/performance.md, "The converged
result"): no fact ``ansible_facts.cpupools`` (Ansible copies a host's facts
on every lookup of its variables, about a dozen per host and run, and
walks every object of a result once more for the callbacks), only its
digest; the plan and the stages' exports named by ``plan_digest``, stored
the same way (the ``cpupools`` role's defaults and the report read them
through ``digest_store.planned``); and no ``files``, ``inputs`` and
``invocation``, which only a stage that runs reads. A run with ``-v`` or
``--diff`` gets the whole result, and so does a host whose topology could
not be stored (check mode writes nothing on the controller: it names only
what an earlier run stored).

The later plays read the plan and the exports through those defaults, so
the plan play sets no fact per host. Where one of those names has another
value on the host (a stage set it earlier in the same run, or the
inventory does), the default would be hidden: the host joins
``cpupools_plan_refresh`` and the plan play sets them as facts there
(roles/cpupools/tasks/plan_facts.yml), as it did for every host.
"""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import digest_store
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import (
    exports_hidden,
    host_inputs,
    run_plan_module,
)


def groups(result, refresh=False):
    """``add_group`` and ``parent_groups`` for the module's result; ``refresh``: the exported facts are hidden.

    Besides the stages: ``cpupools_k8s_skipped_<key>`` holds the hosts the k8s
    stage skips for one reason (``k8s_skip``: the plan play's message reads one
    host's result per reason), ``cpupools_kubelet_lines`` the hosts with a
    ``kubelet_line`` (the plan play prints them, reading no other host's
    variables), ``cpupools_plan_refresh`` those whose exported facts another
    value would hide (roles/cpupools/tasks/plan_facts.yml).
    """
    converged = list(result.get("converged") or [])
    skipped = bool(result.get("k8s_skip_reason"))
    key = result.get("k8s_skip") or "unknown"
    name = "cpupools_converged_set_" + ("_".join(converged) or "none") + (f"_k8s_skipped_{key}" if skipped else "")
    parents = ["cpupools_planned"] + [f"cpupools_converged_{stage}" for stage in converged]
    if skipped:
        parents += ["cpupools_k8s_skipped", f"cpupools_k8s_skipped_{key}"]
    if result.get("kubelet_line"):
        name += "_kubelet_line"
        parents.append("cpupools_kubelet_lines")
    if refresh:
        name += "_refresh"
        parents.append("cpupools_plan_refresh")
    return {"add_group": name, "parent_groups": parents}


#: What only a stage that runs reads (and Ansible's echo of the arguments): left out of a converged host's result.
STAGE_ONLY = ("files", "inputs", "invocation", "agent_leftovers")


def name_topology(result, check_mode):
    """Store the host's topology by digest and name it in the result (``topology_digest``), where it can."""
    facts = (result.get("ansible_facts") or {}).get("cpupools")
    if result.get("failed") or facts is None or not result.get("work_dir"):
        return
    text, digest = digest_store.encode(facts)
    if digest_store.store(result["work_dir"], text, digest, write=not check_mode):
        result["topology_digest"] = digest


def slim(result, verbose, check_mode=False):
    """The result of a host with nothing to do, as later plays and the report read it (the others unchanged).

    The fact ``ansible_facts.cpupools`` goes (``topology_digest`` names it),
    and so do the keys of ``STAGE_ONLY``; ``plan`` and ``exports`` go where
    they can be stored (``plan_digest`` names them). ``verbose`` (``-v``,
    ``--diff``) keeps it whole, as does a topology that could not be stored.
    """
    if verbose or result.get("failed") or result.get("todo") != [] or "topology_digest" not in result:
        return result
    result.pop("ansible_facts", None)
    for key in STAGE_ONLY:
        result.pop(key, None)
    text, digest = digest_store.encode({"plan": result.get("plan"), "exports": result.get("exports")})
    if digest_store.store(result["work_dir"], text, digest, write=not check_mode, kind="plan"):
        result.pop("plan", None)
        result.pop("exports", None)
        result["plan_digest"] = digest
    return result


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "inputs" not in args:
            args["inputs"] = host_inputs(task_vars, self._templar)
        result.update(run_plan_module(self, "cpupools.cpupools.cpupools_converged", args, task_vars, prepare=True))
        if not result.get("failed"):
            grouping = groups(result, refresh=bool(exports_hidden(task_vars)))
            if hasattr(ActionBase, "add_group"):
                # 2.21+: the strategy ignores the keys; the inventory is changed through the worker's RPC
                self.add_group(grouping["add_group"], parent_group_names=grouping["parent_groups"])
            else:
                result.update(grouping)
        name_topology(result, bool(self._task.check_mode))
        # a play that runs the stages on every host (reboot.yml, uninstall.yml, a user's own) keeps it whole
        whole = not boolean(args.get("slim", False)) or Display().verbosity > 0 or bool(self._task.diff)
        return slim(result, whole, bool(self._task.check_mode))
