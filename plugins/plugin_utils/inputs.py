# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan modules' actions: every ``cpupools_*`` variable of a host, and what only the controller can check.

The modules check them all against the one spec (module_utils/cpupools/planning/inputs.py)
and warn about unknown names; reading them here, in Python, costs less per
host than a Jinja lookup of every variable name in the task's arguments.
"""

import os

from ansible.errors import AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import UnsupportedError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.inputs import EXPORTS, INTERNAL
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import work_dir

PREFIX = "cpupools_"

#: The facts the plan play exports for the later stages -> their default in roles/cpupools/defaults/main.yml,
#: which reads each from the host's plan result when a stage reads it (tests/planning/test_inputs.py holds the
#: two equal). Where a host's value is anything else (a stage set it earlier in the same run, or the inventory
#: does), the plan play sets them as facts again (roles/cpupools/tasks/plan_facts.yml).
EXPORT_DEFAULTS = {
    "cpupools_plan": "{{ (cpupools_plan_result | cpupools.cpupools.planned).plan }}",
    **{name: f"{{{{ (cpupools_plan_result | cpupools.cpupools.planned).exports.{name} }}}}" for name in EXPORTS},
    # set here for a host the k8s stage skips (the k8s play leaves it out); null otherwise
    "cpupools_k8s_status": (
        "{{ (cpupools_plan_result | cpupools.cpupools.planned).exports.cpupools_k8s_status | default(none) }}"
    ),
}


#: The defaults every role shares (roles/cpupools/defaults/main.yml of this collection).
SHARED_DEFAULTS = os.path.join(work_dir.COLLECTION_DIR, "roles", "cpupools", "defaults", "main.yml")


def host_inputs(task_vars, templar, loader=None):
    """Name -> templated value of every variable of the task whose name starts with ``cpupools_``.

    Not the names cpupools sets itself (``INTERNAL``, the exported facts among them): the module ignores
    them, and an exported fact's default reads a plan result this task is about to make.

    playbooks/plan.yml runs the plan role's tasks without the role, so the
    task has none of the shared defaults, and the module gives each input it
    is not given its default. A value of the host that reads one of those
    defaults (``cpupools_num_shared_cores: "{{ cpupools_num_exclusive_cores // 2 }}"``,
    with no ``cpupools_num_exclusive_cores`` of its own) is then undefined;
    with ``loader``, the values are templated again with the shared defaults
    beneath the task's variables, as in a play that has the role.
    """
    names = [name for name in sorted(task_vars) if name.startswith(PREFIX) and name[len(PREFIX) :] not in INTERNAL]
    try:
        return {name: templar.template(task_vars[name]) for name in names}
    except AnsibleUndefinedVariable:
        missing = {} if loader is None else _shared_defaults_missing(loader, task_vars)
        if not missing:
            raise
    layered = templar.copy_with_new_env(available_variables={**missing, **task_vars})
    return {name: layered.template(task_vars[name]) for name in names}


def _shared_defaults_missing(loader, task_vars):
    defaults = loader.load_from_file(SHARED_DEFAULTS) or {}
    return {name: value for name, value in defaults.items() if name not in task_vars}


def exports_hidden(task_vars):
    """The exported facts whose value in ``task_vars`` is not their default: something set it that would hide
    the plan's (a stage earlier in the run, the inventory). Raw values: nothing is templated."""
    return sorted(name for name, text in EXPORT_DEFAULTS.items() if task_vars.get(name, text) != text)


def controller_refusal(host, values):
    """What the module (on the node) cannot check: a path on the controller. None, or the refusal.

    ``values`` are the module's normalised inputs (``cpupools_`` stripped). A
    kubeconfig the k8s stage would use must be a file here, or that stage
    would fail after the kernel and agent stages have changed the node.
    Relative paths are left to the k8s stage (they depend on its directory).
    Each of ``cpupools_agent_bytecode_pythons`` must be a program here: the
    agent stage's build runs it.
    """
    where = f"host {host}: " if host else ""
    for python in (values or {}).get("agent_bytecode_pythons") or ():
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            return f"{where}cpupools_agent_bytecode_pythons: {python} is not a program on the controller"
    if not values or not values.get("k8s_enabled") or values.get("k8s_in_cluster"):
        return None
    kubeconfig = values.get("k8s_kubeconfig") or ""
    path = os.path.expanduser(os.path.expandvars(kubeconfig))
    if not kubeconfig or not os.path.isabs(path) or os.path.isfile(path):
        return None
    return f"{where}cpupools_k8s_kubeconfig: kubeconfig {path} does not exist or is not a file on the controller"


def run_plan_module(action, module_name, args, task_vars, prepare=False):
    """Run the plan module ``module_name`` for ``action`` and add the controller's own check of its inputs.

    The result is the module's, or, when ``controller_refusal`` refuses its
    normalised inputs, a one-line failure like the module's own refusals.
    With ``prepare`` (the plan play), the work directory (``cpupools_work_dir``)
    is created here, before any stage writes, or the host is refused.
    """
    result = action._execute_module(module_name=module_name, module_args=args, task_vars=task_vars)
    refusal = None if result.get("failed") else controller_refusal(args.get("host"), result.get("inputs"))
    if prepare and not refusal and not result.get("failed"):
        path, refusal = work_dir.prepare(result["inputs"]["work_dir"], bool(action._task.check_mode))
        if refusal and args.get("host"):
            refusal = f"host {args['host']}: {refusal}"
        result["work_dir"] = path
    if refusal:
        return {"failed": True, "changed": False, "msg": refusal}
    line = kubelet_line(args.get("host"), result)
    if line:
        result["kubelet_line"] = line  # the plan play's role prints them, once for the play
    return result


def kubelet_line(host, result):
    """One line, before any stage writes, on a kubelet node whose kernel stage has work: what pods can use.

    ``None`` for another runtime, a failed or converged host (a converged
    re-run stays quiet), or a plan without the kubelet's numbers.
    """
    plan = result.get("plan") or {}
    kubelet = plan.get("kubelet") or {}
    if result.get("failed") or plan.get("runtime") != "kubelet" or not kubelet.get("config"):
        return None
    if "kernel" in (result.get("converged") or []):
        return None
    total = sum((plan.get("cpu_counts") or {}).values())
    nodes = plan.get("numa") or {}
    reserved = kubelet["config"].get("reservedSystemCPUs", "")
    where = f"host {host}: " if host else ""
    return (
        f"{where}kubelet {kubelet.get('version')}: pods can use {plan.get('allocatable_cpus')} of {total} CPUs; "
        f"reservedSystemCPUs {reserved} (the housekeeping CPUs of {len(nodes)} NUMA node(s))"
    )


def checked_args(args, spec, what, as_is=()):
    """``(parameters, None)`` validated against ``spec``, or ``(None, refusal)`` in the words of a module's own refusal.

    For the actions that do their module's work themselves: the same spec, the
    same coercions (``path``, defaults), and one line naming ``what`` the task is.

    ``as_is`` names options whose spec is a list of dicts with no suboptions:
    where the value is one, it is passed on as it is (that type is all the
    validator would check of it) and not deep-copied, as the validator copies
    every value; the report's fleet input cost that copy about 1.4 ms per host
    (docs/performance.md). Any other value is validated as usual.
    """
    kept = {name: args[name] for name in as_is if _list_of_dicts(args.get(name))}
    checked = ArgumentSpecValidator(spec).validate({**args, **{name: [] for name in kept}})
    if not checked.error_messages:
        return {**checked.validated_parameters, **kept}, None
    errors = checked.errors.errors
    messages = [f"unsupported parameters: {e}" if isinstance(e, UnsupportedError) else str(e) for e in errors]
    return None, f"{what}: {'; '.join(messages)}"


def _list_of_dicts(value):
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)
