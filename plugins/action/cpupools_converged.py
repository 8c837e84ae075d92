# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_converged: fill in ``inputs``, run the module, and group the host by its answer.

A host with work joins ``cpupools_todo_<stage>`` for every stage that has
work on it (the k8s stage's where it runs), through one group named after the
combination; a converged host joins no group and makes no call. In
playbooks/plan.yml (``slim``), whose hosts are every node, the first host of
the batch also marks that the plan ran, and the stage plays then run on those
groups (plugin_utils/stage_groups.py). A play of one's own that plans some of
the nodes marks nothing: the stage plays after it run on every node, and a
node it did not plan fails there for want of a plan, as it always did.
No task of its own per host: on
ansible-core 2.21 and later the action adds the groups to the inventory
itself (``ActionBase.add_group``, which ``group_by`` uses there); before
2.21 the strategy adds them from the result's ``add_group`` and
``parent_groups``, as it does for ``group_by``. 2.21 no longer reads those
keys: a host then joined no group.

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
what an earlier run stored). Where it will slim, it first tells the module
which of the host's digests the controller holds (``stored``: what the
host's last result named or stored, ``digest_store.named``; a whole
result's plan is stored as well, so the first converged re-run after a run
that changed the host already finds it), and the module
leaves out what they name when its own digests are the same: the topology,
plan and exports do not travel from the node to be stored again.

The later plays read the plan and the exports through those defaults, so
the plan play sets no fact per host. Where one of those names has another
value on the host (a stage set it earlier in the same run, or the
inventory does), the default would be hidden: the host joins
``cpupools_plan_refresh`` and the plan play sets them as facts there
(roles/cpupools/tasks/plan_facts.yml), as it did for every host.
"""

from collections.abc import Mapping

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import (
    digest_store,
    jinja_plugins,
    stage_groups,
    work_dir,
)
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import (
    exports_hidden,
    host_inputs,
    run_plan_module,
)

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()

#: The result the plan tasks register for the controller's build of cmk (its stdout is ``build``).
BUILD_RESULT = "cpupools_plan_agent_build"
#: Set by playbooks/plan.yml, whose stage plays leave the converged hosts out (``slim``).
SLIM = "__cpupools_plan_slim"

#: What only a stage that runs reads (and Ansible's echo of the arguments): left out of a converged host's result.
STAGE_ONLY = ("files", "inputs", "invocation", "agent_leftovers")


def name_topology(result, check_mode):
    """Store the host's topology by digest and name it in the result (``topology_digest``), where it can
    (where the module named it, it is stored already)."""
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
    if "plan_digest" in result:  # the module named them (its ``stored``)
        return result
    digest = store_plan(result, check_mode)
    if digest:
        result.pop("plan", None)
        result.pop("exports", None)
        result["plan_digest"] = digest
    return result


def store_plan(result, check_mode):
    """Store the host's plan and exports together by digest: the digest, or None where they cannot be stored."""
    text, digest = digest_store.encode({"plan": result.get("plan"), "exports": result.get("exports")})
    if digest_store.store(result["work_dir"], text, digest, write=not check_mode, kind="plan"):
        return digest
    return None


def names_kept(result, check_mode):
    """``{kind: digest}`` of what the controller holds of this result, for the host's record (``remember``).

    A slim result names them; a whole one (a host with work, ``-v``,
    ``--diff``) keeps its plan and exports, which are stored here as well,
    so that the first converged re-run after a run that changed the host
    already finds its module's digests on the controller and its module
    leaves them out (where they differ by then, the module sends them).
    """
    names = {kind: result[f"{kind}_digest"] for kind in digest_store.KINDS if f"{kind}_digest" in result}
    if "plan_digest" not in result and "topology_digest" in result and "plan" in result:
        digest = store_plan(result, check_mode)
        if digest:
            names["plan"] = digest
    return names


def implicit_args(task_vars, templar):
    """The arguments a task may leave out, from the host's variables (the module's documentation).

    roles/cpupools_plan/tasks/plan.yml gives none of them: a task's arguments
    are templated in its worker, and Jinja compiles each template anew in
    every worker, filters and all (docs/performance.md, "Filters loaded
    once"); reading the variables here costs a dictionary lookup each. The
    module gives ``compare`` its default, the host's ``cpupools_plan_check_stages``,
    from the checked ``inputs``.
    """
    build = task_vars.get(BUILD_RESULT)
    build = build if isinstance(build, Mapping) else {}  # a value of the same name that is no task result: none
    implicit = {
        "host": task_vars.get("inventory_hostname"),
        "build_rc": build.get("rc", 0),
        "slim": boolean(templar.template(task_vars.get(SLIM, False)), strict=False),
    }
    if build.get("stdout") is not None:
        implicit["build"] = build["stdout"]
    return implicit


def stored_names(args, task_vars):
    """What the controller still holds of the host's last result (``digest_store.named``):
    the module's ``stored``. {} where the work directory is not a plain value yet (the module checks it)."""
    where = args["inputs"].get("cpupools_work_dir") if isinstance(args["inputs"], Mapping) else None
    if where is not None and not isinstance(where, str):
        return {}
    return digest_store.named(work_dir.resolve(where), task_vars.get("inventory_hostname"))


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "inputs" not in args:
            args["inputs"] = host_inputs(task_vars, self._templar, self._loader)
        args = {**implicit_args(task_vars, self._templar), **args}
        # slim: the stage plays after this play take their hosts from its groups (playbooks/plan.yml)
        planned = boolean(args["slim"])
        # a play that runs the stages on every host (reboot.yml, uninstall.yml, a user's own) keeps it whole
        whole = not planned or Display().verbosity > 0 or bool(self._task.diff)
        known = {}
        staged = {stage_groups.todo_group(stage) for stage in stage_groups.CHECKED}
        if not whole and not staged.intersection(task_vars.get("group_names") or []):
            # the module leaves out what the controller holds; a host an earlier plan play of the same
            # playbook left in a stage's group may be kept whole below, so the module sends everything
            known = stored_names(args, task_vars)
            args.setdefault("stored", known)
        else:
            args["slim"] = False
        result.update(run_plan_module(self, "cpupools.cpupools.cpupools_converged", args, task_vars, prepare=True))
        if not result.get("failed"):
            batch = task_vars.get("ansible_play_batch") or []
            first = planned and bool(batch) and batch[0] == task_vars.get("inventory_hostname")
            grouping = stage_groups.groups(result, refresh=bool(exports_hidden(task_vars)), first=first)
            # None on a converged host: no call (on 2.21 an RPC, then a reconcile of the whole inventory)
            if grouping and hasattr(ActionBase, "add_group"):
                # 2.21+: the strategy ignores the keys; the inventory is changed through the worker's RPC
                self.add_group(grouping[0], parent_group_names=grouping[1])
            elif grouping:
                result.update(add_group=grouping[0], parent_groups=grouping[1])
        name_topology(result, bool(self._task.check_mode))
        # so does a host an earlier plan play of the same playbook left in a stage's group
        whole = whole or bool(stage_groups.listed_without_work(result, task_vars.get("group_names") or []))
        result = slim(result, whole, bool(self._task.check_mode))
        if not result.get("failed") and "topology_digest" in result:  # the next run's module leaves out what is stored
            names = names_kept(result, bool(self._task.check_mode))
            digest_store.remember(
                result["work_dir"], task_vars.get("inventory_hostname"), names, known, not self._task.check_mode
            )
        return result
