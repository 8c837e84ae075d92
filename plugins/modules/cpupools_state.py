#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_state
short_description: Write the node's CPU pool state (CMK v1.4 directory layout) from the plan
description:
  - Writes C(<conf_dir>/pools/<pool>/<socket>/<cpulist>/tasks) and friends, the
    directory C(cmk isolate) takes CPU lists from, so that CMK's own tooling can
    still read it. See docs/agent.md for the layout and the permission model.
  - Keeps the tasks of running workloads. An exclusive holder keeps its cpulist
    when the new plan still has it in the same pool, else moves to a free one,
    and the CPU affinity of the moved workload is updated. Live tasks that do
    not fit the new plan make the module fail before it changes anything,
    naming the PIDs and the numbers.
  - Cpulists are compared as CPU sets; a list whose CPUs stay in the same pool
    and socket keeps its directory name (CMK's core-by-core names included).
    A list whose name in CMK's comma form would pass 255 bytes is named
    C(0-63,512-575), or C(cpus-<count>-<digest>) with a C(cpus) file.
  - Live tasks whose threads may run outside their cpulists' CPUs are re-pinned
    on every run (this finishes a run that was killed after the swap).
  - Entries in the state that are not part of the layout are reported as
    warnings and ignored; a C(pools), lock or metadata file of the wrong type
    fails with one line unless O(force).
  - Idempotent; a run with the same plan changes no file (same mtimes).
  - C(state=absent) removes the state and refuses while tasks are live unless O(force).
version_added: "0.1.0"
options:
  root:
    description: Root directory the state is written under (tests use a sandbox).
    type: path
    default: /
  conf_dir:
    description: The CMK configuration directory, relative to O(root).
    type: path
    default: /etc/cmk
  plan:
    description: The plan (variable C(cpupools_plan)); required when O(state=present).
    type: dict
  state:
    description: C(present) writes the state from O(plan); C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - With C(state=absent), remove the state even while tasks are live.
      - With C(state=present), rewrite a corrupt state (its task lists are lost).
      - Never makes a resize drop live tasks.
    type: bool
    default: false
  task_group:
    description:
      - Group (name or gid) whose members may take and release CPU lists (the
        users that isolated workloads run as). The cpulist directories become
        C(root:<group> 2775) and their files C(0664); everything else stays
        root-owned and read-only for others.
      - Unset, only root may take CPU lists.
    type: str
  proc_fs:
    description: The host's C(/proc), used to tell live tasks from dead ones (not under O(root)).
    type: path
    default: /proc
  lock_timeout:
    description: Seconds to wait for the state lock held by C(cmk) processes.
    type: float
    default: 30
  update_affinity:
    description:
      - Re-pin the process tree of a live task that moved, or whose threads may run
        outside its cpulists' CPUs, to its cpulists' CPUs.
    type: bool
    default: true
  cmk_v15:
    description:
      - The task lists of the node's CMK v1.5 ConfigMap C(cmk-config-<node>), as M(cpupools.cpupools.cpupools_cmk_tasks)
        returns them (C(configmaps), C(tasks)). Their live tasks are carried into the state as the tasks of
        CMK v1.4's directory are - each keeps its cpulist until it exits - and RV(cmk_v15) says which run.
      - On a node that shows CMK v1.5 (a C(cmk) at O(agent_path) that is not cpupools' and no pool state in
        O(conf_dir)) the module refuses to write a state without them.
    type: dict
  agent_path:
    description: Where C(cmk) is installed on the node, relative to O(root) (to recognise CMK v1.5's binary).
    type: path
    default: /opt/bin/cmk
  host:
    description: Name of the host, used in error messages.
    type: str
  known_warnings:
    description:
      - Warnings already shown for this host in this run - the plan play's M(cpupools.cpupools.cpupools_converged)
        checks the same state and gives them as C(state_warnings), an earlier task of the stage gives its
        RV(state_warnings). They are returned in RV(state_warnings) but not emitted again, so each is printed
        once per run.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reads the state directory and reports what would change; writes nothing.
  diff_mode:
    support: full
    description: Shows the state files before and after.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Write the pool state from the plan
  cpupools.cpupools.cpupools_state:
    plan: "{{ cpupools_plan }}"
    host: "{{ inventory_hostname }}"
    task_group: cmk

- name: Remove the pool state, refusing while workloads hold CPU lists
  cpupools.cpupools.cpupools_state:
    state: absent
"""

RETURN = r"""
conf_dir:
  description: The state directory written (O(root) joined with O(conf_dir)).
  returned: always
  type: str
fingerprint:
  description: SHA-256 of the layout and hand-out order (also in C(cpupools.json)).
  returned: when state is present
  type: str
live_tasks:
  description: PIDs of the live tasks found in the state.
  returned: always
  type: list
  elements: int
moves:
  description: Live tasks placed on another cpulist by a resize (C(pid), C(pool), C(from), C(to), C(socket)).
  returned: always
  type: list
  elements: dict
affinity:
  description:
    - PID (string) to the CPUs its process tree was (or in check mode would be)
      re-pinned to, because it moved or because a thread may run outside its cpulists.
  returned: always
  type: dict
tasks:
  description:
    - Pool to cpulist to the PIDs the state holds after the run (every cpulist; [] when free).
    - Cpulists are given in CMK's comma form, ascending, whatever their directory is named.
  returned: when state is present
  type: dict
  sample: {"exclusive": {"1,45": [4242], "2,46": []}, "shared": {"3,4,47,48": []}}
state_warnings:
  description:
    - What this run found wrong in the state and worked around (a stray entry ignored, an interrupted write
      finished), whether emitted now or already in O(known_warnings); emitted prefixed with the conf dir.
  returned: always
  type: list
  elements: str
cmk_v15:
  description:
    - With O(cmk_v15), the PIDs its task lists name that run (C(live)) and do not (C(dead)), those this run
      added to the state (C(carried)), and the ConfigMaps read (C(configmaps)).
  returned: when cmk_v15 is given and state is present
  type: dict
  sample: {"configmaps": ["default/cmk-config-node7"], "live": [48624], "dead": [], "carried": [48624]}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.cmk15 import traces_on_node
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.state import as_given
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.state_writer import apply_state, group_id

ARGUMENT_SPEC = {
    "root": {"type": "path", "default": "/"},
    "conf_dir": {"type": "path", "default": "/etc/cmk"},
    "plan": {"type": "dict"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "force": {"type": "bool", "default": False},
    "task_group": {"type": "str"},
    "proc_fs": {"type": "path", "default": "/proc"},
    "lock_timeout": {"type": "float", "default": 30.0},
    "update_affinity": {"type": "bool", "default": True},
    "cmk_v15": {"type": "dict"},
    "agent_path": {"type": "path", "default": "/opt/bin/cmk"},
    "host": {"type": "str"},
    "known_warnings": {"type": "list", "elements": "str", "default": []},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "present", ("plan",))],
        supports_check_mode=True,
    )
    params = module.params
    conf_dir = os.path.join(params["root"], params["conf_dir"].lstrip("/"))
    try:
        result = apply_state(
            conf_dir,
            params["plan"],
            present=params["state"] == "present",
            force=params["force"],
            task_gid=group_id(params["task_group"]),
            proc_fs=params["proc_fs"],
            lock_timeout=params["lock_timeout"],
            check_mode=module.check_mode,
            update_affinity=params["update_affinity"],
            cmk_v15=params["cmk_v15"],
            cmk15_traces=traces_on_node(params["root"], params["conf_dir"], params["agent_path"])
            if params["state"] == "present"
            else "",
        )
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(params["host"]))
    except OSError as exc:  # the node's file system refused a write (read-only, full, ...)
        prefix = f"host {params['host']}: " if params["host"] else ""
        where = f" ({as_given(str(exc.filename))})" if exc.filename else ""
        module.fail_json(msg=f"{prefix}cpupools_state: cannot write the pool state: {exc.strerror or exc}{where}")
    result["state_warnings"] = result.pop("warnings")
    for warning in result["state_warnings"]:
        if warning not in params["known_warnings"]:
            module.warn(f"{conf_dir}: {warning}")
    before, after = result.pop("before"), result.pop("after")
    if result["changed"]:
        result["diff"] = {"before": before, "after": after, "before_header": conf_dir, "after_header": conf_dir}
    module.exit_json(conf_dir=conf_dir, **result)


if __name__ == "__main__":
    main()
