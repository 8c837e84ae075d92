#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_converged
short_description: Plan a node and say which cpupools stages have work to do, in one execution
description:
  - Does in one module execution what the plan play needs from a node - reads the
    topology (as M(cpupools.cpupools.cpupools_facts)), checks every C(cpupools_*) variable and
    computes the plan (as M(cpupools.cpupools.cpupools_plan) with O(inputs)) - and then, with
    O(compare), derives every artefact the kernel and agent stages write
    (kernel arguments and boot loader state, the optional drop-ins, the pool
    state, the C(cmk) build, the agent's settings, the reconcile units) with
    the stages' own functions and compares each with the node.
  - Returns the stages that are not converged, with a reason for each
    difference, and the rendered files, which the stages write as they are.
  - Never changes anything; check mode is the same run.
  - Refuses what the kernel and agent stages would refuse (a foreign GRUB
    drop-in, a command line that is too long, live tasks that a resize cannot
    fit, a corrupt state), with the stages' messages, before any stage runs.
  - Its action adds a host with work to the inventory groups the plays select on, as
    M(ansible.builtin.group_by) would - C(cpupools_todo_<stage>) for every stage of RV(todo),
    C(cpupools_todo_k8s) when RV(k8s_skip) is empty, C(cpupools_k8s_skipped_disabled) when it is
    C(disabled) - through one group named after the combination (C(cpupools_set_...)); the first
    host of the play's batch also joins C(cpupools_plan_ran). A converged host without a cluster
    joins no group. The filter C(cpupools.cpupools.stage_hosts) gives each play its hosts.
  - See docs/performance.md.
version_added: "0.2.0"
options:
  inputs:
    description:
      - Every C(cpupools_*) variable of the host, by full name (see
        module_utils/cpupools/planning/inputs.py for the spec of each).
      - The module needs them; its action (on the controller) fills them in
        with every C(cpupools_*) variable of the host when the task omits them.
    type: dict
    required: true
  host:
    description:
      - Name of the host, used in messages.
      - Its action gives it the host's C(inventory_hostname) when the task leaves it out.
    type: str
  compare:
    description:
      - Compare the node with the stages' artefacts. C(false) only plans (as
        for a report without the stages).
      - Left out, the host's C(cpupools_plan_check_stages) (O(inputs); true unless set).
    type: bool
  build:
    description:
      - The output of C(scripts/build_agent.py --check) on the controller (one
        C(<sha256>  <path>  <verdict>) line per file). Without it, or when the
        build failed (O(build_rc)), the agent stage is not converged.
      - Left out, its action reads it from the host's variable C(cpupools_plan_agent_build),
        the result the plan tasks register for that build (C(stdout)), when there is one.
    type: str
  build_rc:
    description:
      - Exit status of that build; not 0 means no build to compare with.
      - Left out, its action reads C(rc) of C(cpupools_plan_agent_build), when there is one.
    type: int
    default: 0
  slim:
    description:
      - On a host with nothing to do (RV(todo) empty), leave out RV(ansible_facts) (RV(topology_digest)
        names the topology), RV(plan) and RV(exports) (RV(plan_digest) names them), RV(files), RV(inputs)
        and C(invocation), which only a stage that runs reads (docs/performance.md, "The converged
        result"). C(-v) and C(--diff) keep the whole result.
      - The module itself leaves out RV(files) and names by digest what O(stored) says the controller
        holds; its action does the rest, and gives the module O(slim) only where it slims the result
        (not with C(-v) or C(--diff), nor for a host that an earlier plan play of the same run left in
        a stage's group).
      - Only for a play whose stage plays leave the converged hosts out, as site.yml's do
        (C(playbooks/plan.yml) sets the variable C(__cpupools_plan_slim), which its action reads when the
        task leaves O(slim) out; false without it); a playbook that runs a stage on every host (C(reboot.yml),
        C(uninstall.yml), a playbook of your own that applies the roles in turn) needs the whole result.
    type: bool
    default: false
  stored:
    description:
      - The digests of this host's topology (C(topology)) and of its plan and exports (C(plan)) that the
        controller holds, as its last result named or stored them (C(<work_dir>/build/hosts/)). With O(slim), on
        a host with nothing to do, the module returns RV(topology_digest) in place of RV(ansible_facts) and
        RV(plan_digest) in place of RV(plan) and RV(exports) where its own digest of them is the same (the
        compact JSON of C(core/digest.py)), so that what the controller would only store again does not
        travel. Anything else is returned whole, and the action stores it.
      - Its action fills it in; a task has no reason to give it.
    type: dict
attributes:
  check_mode:
    support: full
    description: Only reads the node; runs the same in check mode, which is what makes the fast path a check.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff; the stages that run show theirs.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
# Every argument from the host's variables (roles/cpupools_plan/tasks/plan.yml)
- name: Plan the CPU pools and check the node
  cpupools.cpupools.cpupools_converged: {}
  register: cpupools_plan_result

- name: Only plan, whatever cpupools_plan_check_stages says
  cpupools.cpupools.cpupools_converged:
    compare: false
  register: cpupools_plan_result
"""

RETURN = r"""
plan:
  description:
    - The pool layout, as M(cpupools.cpupools.cpupools_plan) returns it.
    - The filter C(cpupools.cpupools.planned) reads it here or where RV(plan_digest) names it; so do the
      C(cpupools) role's defaults (C(cpupools_plan)).
  returned: success, unless the result is slim (O(slim)) and names it by RV(plan_digest)
  type: dict
inputs:
  description: Every public cpupools variable, normalised (without the C(cpupools_) prefix).
  returned: success, unless the result is slim (O(slim))
  type: dict
stages:
  description: Stage name to the reasons it is not converged ([] when converged); only the stages with a check.
  returned: when compare is true and the state is present
  type: dict
  sample: {"kernel": [], "agent": ["pool state: differs from the plan"]}
converged:
  description: The stages with nothing to do (what the playbooks skip).
  returned: success
  type: list
  elements: str
todo:
  description: The stages with a check that have something to do (all of them when the fast path is off).
  returned: success
  type: list
  elements: str
files:
  description:
    - Name to C(stage), C(path) (on the node, without the root), C(content) and C(mode)
      of every file the stages render.
  returned: when compare is true and the state is present, unless the result is slim (O(slim))
  type: dict
exports:
  description:
    - The facts the kernel and agent stages export for the report, as they would set them.
    - Each is null when the node was not compared (O(compare) false, or the state absent).
    - The C(cpupools) role's defaults read each from here or from where RV(plan_digest) names them
      (filter C(cpupools.cpupools.planned)), so the plan play sets no fact per host.
  returned: success, unless the result is slim (O(slim)) and names them by RV(plan_digest)
  type: dict
kubelet_line:
  description:
    - Added by the module's action on a host whose C(cpupools_runtime) is C(kubelet) and whose kernel
      stage has work, before any stage writes, how many CPUs pods can use and the reserved set; the
      plan play prints these lines once for the play.
  returned: on such hosts
  type: str
  sample: "host epyc-1: kubelet 1.36: pods can use 368 of 384 CPUs; reservedSystemCPUs 0,24,... (...)"
k8s_skip_reason:
  description:
    - Why the k8s stage does nothing on this host (C(cpupools_k8s_enabled) false, or
      no kubeconfig and not in-cluster); empty when it runs. The plan play groups
      such hosts out of the k8s play; their C(cpupools_k8s_status) is read from RV(exports).
  returned: success
  type: str
k8s_skip:
  description:
    - The key of RV(k8s_skip_reason), C(disabled) or C(unconfigured); empty when the k8s stage runs. The
      module's action puts a host whose key is not C(unconfigured) in C(cpupools_k8s_skipped_<key>), so
      that the plan play's message reads one host's result per reason (the C(unconfigured) hosts are those
      in no k8s group, so that the common case, a fleet without a cluster, makes no group).
  returned: success
  type: str
agent_leftovers:
  description:
    - On a host whose C(cpupools_runtime) is not C(cmk), the paths of cmk's launcher, zipapp, pool state and
      reconcile units that are on the node, which the agent stage removes; empty on a C(cmk) host. The agent
      stage skips its removal tasks when the list is empty (a node that never ran cmk).
  returned: when the stages are compared, unless the result is slim (O(slim))
  type: list
  elements: str
  sample: ["/opt/bin/cmk", "/etc/cmk"]
state_warnings:
  description:
    - What the check of the pool state warned about (printed by this module, with the host's name). The
      agent stage gives them to M(cpupools.cpupools.cpupools_state) as its C(known_warnings), which does not
      print them again.
  returned: when the stages are compared
  type: list
  elements: str
cmk_v15:
  description:
    - The ConfigMap (C(cmk-config-<node>)) the agent stage reads CMK v1.5's task lists from before it adopts
      the node, when the node shows CMK v1.5 (CMK's C(cmk) at C(cpupools_agent_path), no pool state in
      C(cpupools_conf_dir)); empty otherwise. Without a kubeconfig such a node is refused.
  returned: success
  type: str
ansible_facts:
  description:
    - The topology as C(cpupools), as M(cpupools.cpupools.cpupools_facts) returns it.
    - With O(slim), on a host with nothing to do (RV(todo) empty), the module (where O(stored) names it) or
      its action leaves it out, unless the run has C(-v) or C(--diff); RV(topology_digest) names it
      (docs/performance.md, "The converged result").
  returned: success, unless the result is slim (O(slim))
  type: dict
topology_digest:
  description:
    - Added by the module's action, or by the module where O(stored) names it - the SHA-256 of the
      topology facts as compact JSON (C(core/digest.py)), stored on the
      controller as C(<work_dir>/build/topology/<digest>.json) (identical nodes share one file). The filter
      C(cpupools.cpupools.topology) reads a host's topology from its fact or from there.
    - With O(slim), on a host with nothing to do (RV(todo) empty), without C(-v) or C(--diff), the result
      carries it in place of RV(ansible_facts), and also leaves out RV(files), RV(inputs) and the arguments
      Ansible echoes (C(invocation)) - only a stage that runs reads them, and ansible-playbook's main process
      handles every host's result in one process.
  returned: success, when the topology is stored (check mode stores none, it names one an earlier run stored)
  type: str
plan_digest:
  description:
    - Added to a slim result (O(slim)) by the module's action, or by the module where O(stored) names
      it - the SHA-256 of RV(plan) and RV(exports)
      together as compact JSON, stored on the controller as C(<work_dir>/build/plan/<digest>.json), in their
      place. The filter C(cpupools.cpupools.planned) reads them from either.
  returned: when the result is slim and they are stored (check mode stores none, it names one an earlier run stored)
  type: str
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core import errors
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.digest import encode
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware import topology as topo
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import hugepages, stage_check
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.agent_files import parse_build
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.state_writer import group_id
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning import host_plan, inputs
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning import plan as planner

ARGUMENT_SPEC = {
    "inputs": {"type": "dict", "required": True},
    "host": {"type": "str"},
    "compare": {"type": "bool"},  # None: the host's cpupools_plan_check_stages
    "build": {"type": "str"},
    "build_rc": {"type": "int", "default": 0},
    "slim": {"type": "bool", "default": False},
    "stored": {"type": "dict"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    host = params["host"]
    raw = params["inputs"]
    build = parse_build(params["build"], params["build_rc"])

    def say(text):
        return f"host {host}: {text}" if host else text

    for warning in inputs.unknown_variables(raw):
        module.warn(say(warning))
    # As the cpupools_facts module takes it: an empty value is refused by name, not replaced.
    facts_root = raw["cpupools_facts_root"] if "cpupools_facts_root" in raw else raw.get("cpupools_root", "/")
    facts_root = None if facts_root is None else str(facts_root)
    try:
        facts_dir = topo.check_facts_root(facts_root)
        topology = topo.gather_topology(facts_dir)
        facts = topology.to_facts()
        facts.update(hugepages.read_hugepages(facts_dir))  # as cpupools_facts reports them
    except errors.CpupoolsError as exc:
        module.fail_json(msg=say(f"cpupools_facts_root: {facts_root!r}: {exc}"))
    result = {"ansible_facts": {"cpupools": facts}}
    try:
        checked = inputs.validate_inputs(raw, possible_cpus=max([*topology.cpus, *topology.offline]) + 1)
        values = checked.values
        inputs.check_root(values["root"])
        inputs.check_group(values["task_group"])
        plan = host_plan.plan_host(topology, facts, values, planner.make_request(checked.request()), module.run_command)
        result.update(plan=plan, inputs=values, exports=dict.fromkeys(inputs.EXPORTS))
        result["cmk_v15"] = stage_check.cmk_v15_configmap(values, host or "")
        compare = values["plan_check_stages"] if params["compare"] is None else params["compare"]
        stages = {}
        if compare and values["state"] == "present":
            group = values["task_group"]
            node = stage_check.check_node(
                values,
                plan,
                host or "",
                run_command=module.run_command,
                task_gid=group_id(group),
                build=build,
                which=lambda name: module.get_bin_path(name, opt_dirs=["/usr/sbin", "/sbin"]),
                systemctl=lambda argv: module.run_command(["systemctl", *argv])[0],
                topology=topology,
            )
            stages = node["stages"]
            result.update(
                stages=stages,
                files=node["files"],
                exports=node["exports"],
                state_warnings=node["state_warnings"],
                agent_leftovers=node["agent_leftovers"],
            )
            for warning in node["warnings"]:
                module.warn(say(warning))
    except errors.CpupoolsError as exc:
        module.fail_json(msg=exc.describe(host))
    enabled = compare and values["converged_check"]
    pending = stage_check.todo(stages, enabled, values["state"])
    result.update(todo=pending, converged=[name for name in stage_check.STAGES if name not in pending])
    skip = stage_check.k8s_skip_reason(values)
    result.update(k8s_skip=stage_check.k8s_skip(values), k8s_skip_reason=skip)
    if skip and values["state"] == "present":
        result["exports"]["cpupools_k8s_status"] = stage_check.k8s_skipped_status(skip)
    for warning in plan["warnings"]:
        module.warn(say(warning))
    if params["slim"] and not pending:
        slim(result, params["stored"] or {})
    module.exit_json(changed=False, **result)


def slim(result, stored):
    """A converged host's result without what only a stage that runs reads, and without what ``stored``
    says the controller holds: Ansible walks, encodes and sends every byte of a result (its action slims
    the rest, docs/performance.md)."""
    result.pop("files", None)
    result.pop("agent_leftovers", None)
    if stored.get("topology") and encode(result["ansible_facts"]["cpupools"])[1] == stored["topology"]:
        del result["ansible_facts"]
        result["topology_digest"] = stored["topology"]
    together = {"plan": result["plan"], "exports": result["exports"]}
    if stored.get("plan") and encode(together)[1] == stored["plan"]:
        del result["plan"], result["exports"]
        result["plan_digest"] = stored["plan"]


if __name__ == "__main__":
    main()
