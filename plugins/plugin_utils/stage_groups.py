# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The groups the plan play puts hosts in, and the hosts each later play of site.yml runs on.

The groups name the hosts **with work**: ``cpupools_todo_<stage>`` for each
stage of the host's ``todo`` (``kernel``, ``agent``) and ``cpupools_todo_k8s``
where the k8s stage runs (a kubeconfig or in-cluster, and enabled). A stage
play runs on its group only, so a converged host is in no group and makes no
call to change the inventory: on ansible-core 2.21 each call is an RPC from
the worker to the main process, which then reconciles the whole inventory for
every new member (docs/performance.md, "Groups of the hosts with work").

So that "in no group" means "nothing to do" only where every node was
planned, the plan play of playbooks/plan.yml (its hosts: every node) marks
that it ran: the first host of its batch also joins ``cpupools_plan_ran``.
Without the mark (a stage play run on its own, ``--skip-tags plan``, a play
of one's own that plans some nodes) every play runs on every host of
``cpupools_nodes``, as a run without the fast path would, and a node
without a plan fails there for want of one. A host stays in a group for the
rest of the run (``listed_without_work``). ``play_hosts`` is the one place
that turns the groups into a play's host pattern (the filter
``cpupools.cpupools.stage_hosts``).

The other groups are of hosts that are few on a converged fleet:
``cpupools_k8s_skipped_disabled`` (``cpupools_k8s_enabled`` false; a host the
k8s stage skips for want of a kubeconfig, the common case, is in no group:
it is a planned host in no other k8s group), ``cpupools_kubelet_lines``
and ``cpupools_plan_refresh`` (plugins/action/cpupools_converged.py).
"""

from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import stage_check

#: Every host a cpupools play may run on (playbooks/nodes.yml checks the run has some).
NODES = "cpupools_nodes"
#: The plan play ran in this playbook: the first host of its batch is in it.
PLANNED = "cpupools_plan_ran"
#: A pattern of known groups that matches no host (Ansible warns about an unknown group, and refuses an
#: empty pattern): the play is skipped with "no hosts matched", as a stage play was on a converged fleet.
NO_HOST = f"{PLANNED}:!{PLANNED}"
#: The stages the plan compares (a converged host's result leaves out what only they read).
CHECKED = stage_check.STAGES
#: The plays whose hosts ``play_hosts`` names, besides the planning play of playbooks/report.yml ("plan").
STAGES = (*CHECKED, "k8s")
#: The k8s stage does nothing on the hosts of ``K8S_SKIPPED + key``, for the reason of that key
#: (stage_check.K8S_SKIP_REASONS), except ``K8S_UNGROUPED``: the planned hosts in no other k8s group.
K8S_SKIPPED = "cpupools_k8s_skipped_"
K8S_UNGROUPED = "unconfigured"


def todo_group(stage):
    """The group of the hosts whose ``stage`` has work."""
    return "cpupools_todo_" + stage


def groups(result, refresh=False, first=False):
    """The groups of one host from its plan result: ``(name, parents)``, or None where it joins none.

    The host joins one group named after the combination, a child of each
    group it belongs to, so that one call adds it to all of them.
    ``refresh``: the exported facts are hidden on the host
    (roles/cpupools/tasks/plan_facts.yml); ``first``: the host is the first
    of the play's batch, which marks that the plan ran (``PLANNED``).
    """
    parents = [todo_group(stage) for stage in result.get("todo") or []]
    skip = result.get("k8s_skip")
    if not skip:
        parents.append(todo_group("k8s"))
    elif skip != K8S_UNGROUPED:
        parents.append(K8S_SKIPPED + skip)
    if result.get("kubelet_line"):
        parents.append("cpupools_kubelet_lines")
    if refresh:
        parents.append("cpupools_plan_refresh")
    if first:
        parents.append(PLANNED)
    if not parents:
        return None
    return "cpupools_set_" + "_".join(name[len("cpupools_") :] for name in parents), parents


def listed_without_work(result, group_names):
    """The stages whose group holds the host from an earlier plan play of the same playbook, with no work now.

    Groups last as long as the run and no call takes a host out of one: in a
    playbook that imports site.yml twice, a host with work in the first plan
    is still in that stage's group in the second, converged or not. The stage
    play then runs on it, and finds nothing to change, where the action has
    kept its result whole (``group_names``: the host's groups, from its
    variables). The k8s stage reads no more of a whole result than of a slim one.
    """
    todo = result.get("todo") or []
    return [stage for stage in CHECKED if todo_group(stage) in group_names and stage not in todo]


def play_hosts(groups, stage):
    """The host pattern of the play of ``stage`` (one of ``STAGES``, or "plan"), from the run's ``groups``.

    Before any plan (no ``PLANNED``): every node. After it: the hosts of the
    stage's group, or none; "plan" (the report's own planning play) then has
    none to plan.
    """
    if stage != "plan" and stage not in STAGES:
        raise ValueError(f"stage_hosts: unknown stage {stage!r}; one of {', '.join(('plan', *STAGES))}")
    if PLANNED not in groups:
        return NODES
    name = todo_group(stage)
    if stage != "plan" and name in groups:
        return f"{NODES}:&{name}"
    return NO_HOST
