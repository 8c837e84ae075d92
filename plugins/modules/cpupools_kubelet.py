#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_kubelet
short_description: Write the kubelet's CPU manager drop-in derived from the CPU pool plan
description:
  - With O(runtime=kubelet), derives C(cpuManagerPolicy static), its policy
    options, C(reservedSystemCPUs) (the infra pool) and the Topology Manager
    policy and scope from the plan and the topology facts, and writes them as
    a KubeletConfiguration drop-in in the kubelet's C(--config-dir).
  - With O(runtime=cmk) and O(dropin=true), writes the drop-in that keeps the
    pools' CPUs from the kubelet (C(reservedSystemCPUs) or C(systemReserved)).
  - The kubelet takes a new CPU manager policy or reserved set only with an
    empty C(cpu_manager_state). O(action=configure) therefore writes such a
    change only where the kubelet has no state file yet; otherwise it leaves
    the drop-in as it is and returns RV(restart_required) for the rolling
    restart, which stops the kubelet, runs O(action=apply), starts it and
    runs O(action=verify).
  - Refuses, with one line naming the host and the variable, combinations the
    kubelet cannot run with (see docs/kubelet.md).
version_added: "0.1.0"
options:
  action:
    description:
      - C(configure) (the kernel stage), C(apply) (the kubelet is stopped -
        write the drop-in and remove the state file) or C(verify) (the kubelet
        was started - wait for its new state file and check it).
    type: str
    choices: [configure, apply, verify]
    default: configure
  state:
    description: C(absent) removes the drop-in (refused while the kubelet still runs with the policy cpupools set).
    type: str
    choices: [present, absent]
    default: present
  runtime:
    description:
      - How exclusive CPUs reach workloads on the node (C(cpupools_runtime)).
      - C(kubelet) writes the static CPU manager drop-in, C(cmk) the reservation drop-in when O(dropin=true).
      - The other runtimes (C(cpu-pooler), C(nri-topology-aware), C(nri-balloons)) have no drop-in;
        one cpupools wrote earlier is removed like with O(state=absent).
    type: str
    choices: [cmk, kubelet, cpu-pooler, nri-topology-aware, nri-balloons]
    default: cmk
  plan:
    description: The plan of M(cpupools.cpupools.cpupools_plan) (the variable C(cpupools_plan)).
    type: dict
  topology:
    description:
      - The topology facts of M(cpupools.cpupools.cpupools_facts) (C(ansible_facts.cpupools)).
      - Needed with O(runtime=kubelet).
    type: dict
  root:
    description: Root directory the kubelet's files are read and written under.
    type: path
    default: /
  config_dir:
    description: The kubelet's C(--config-dir).
    type: path
    default: /etc/kubernetes/kubelet.conf.d
  file_name:
    description: Name of the drop-in in O(config_dir); the kubelet reads C(*.conf) in lexical order.
    type: str
    default: 50-cpupools.conf
  state_file:
    description: The kubelet's CPU manager state file.
    type: path
    default: /var/lib/kubelet/cpu_manager_state
  dropin:
    description: With O(runtime=cmk), whether the reservation drop-in is written.
    type: bool
    default: false
  reservation:
    description: With O(runtime=cmk), C(reservedSystemCPUs) or C(systemReserved).
    type: str
    choices: [reservedSystemCPUs, systemReserved]
    default: reservedSystemCPUs
  policy_options:
    description: C(auto) (derived from the topology) or a list of static-policy options.
    type: raw
    default: auto
  topology_policy:
    description: The Topology Manager policy.
    type: str
    choices: [none, best-effort, restricted, single-numa-node]
    default: best-effort
  topology_scope:
    description: The Topology Manager scope.
    type: str
    choices: [container, pod]
    default: container
  isolcpus_flags:
    description:
      - The C(isolcpus) flags of the kernel stage (the C(domain) flag on CPUs the kubelet manages is refused).
      - C(auto) is C([managed_irq]) for the kubelet runtime.
    type: raw
    default: auto
  kubelet_version:
    description:
      - The kubelet's version (C(1.34)), for the policy options it has; C(auto) takes the one the plan play
        asked of the node's kubelet (C(plan.kubelet.version)).
    type: str
    default: auto
  content:
    description:
      - With O(action=apply), the drop-in's text (RV(content) of O(action=configure)); null removes it.
    type: str
  config:
    description:
      - With O(action=verify), the drop-in's fields (RV(config) of O(action=configure)) the kubelet's
        new state is checked against.
    type: dict
  timeout:
    description: With O(action=verify), seconds to wait for the kubelet's new state file.
    type: int
    default: 120
  service:
    description:
      - With O(action=verify) and O(root=/), the kubelet's systemd unit. When systemd has restarted it 3 times
        since its start (a kubelet that refuses its configuration exits at each start), the verification fails
        at once with the kubelet's own last error from the unit's journal instead of waiting out O(timeout).
    type: str
    default: kubelet
  header:
    description: Comment lines put first in the drop-in.
    type: str
    default: "# Ansible managed by cpupools: edits here are overwritten (docs/kubelet.md)."
  host:
    description: Name of the host, used in error messages.
    type: str
attributes:
  check_mode:
    support: full
    description: Reads the drop-in and the state file and reports the actions a real run takes; writes nothing.
  diff_mode:
    support: full
    description: Shows the drop-in's text before and after.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Write the kubelet drop-in (or leave it pending for the rolling restart)
  cpupools.cpupools.cpupools_kubelet:
    runtime: kubelet
    plan: "{{ cpupools_plan }}"
    topology: "{{ ansible_facts.cpupools }}"
    isolcpus_flags: [managed_irq]
  register: kubelet
"""

RETURN = r"""
config:
  description: The KubeletConfiguration fields of the drop-in ({} when there is none).
  returned: always
  type: dict
content:
  description: The drop-in's text (null when there is none).
  returned: always
  type: str
path:
  description: The drop-in's path (under O(root)).
  returned: always
  type: str
state_file:
  description: The kubelet's state file (under O(root)).
  returned: always
  type: str
restart_required:
  description: With O(action=configure), the change waits for the drain and kubelet restart of playbooks/reboot.yml.
  returned: always
  type: bool
restart_reason:
  description: Why the restart is needed, one line ("" when it is not).
  returned: always
  type: str
kubelet_policy:
  description: The policy in the kubelet's state file (null when there is none).
  returned: always
  type: str
actions:
  description: What was changed (in check mode, what would be).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.names import RUNTIMES
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware.topology import Topology
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import kubelet
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.bootloader import Host

ARGUMENT_SPEC = {
    "action": {"type": "str", "choices": ["configure", "apply", "verify"], "default": "configure"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "runtime": {"type": "str", "choices": list(RUNTIMES), "default": "cmk"},
    "plan": {"type": "dict"},
    "topology": {"type": "dict"},
    "root": {"type": "path", "default": "/"},
    "config_dir": {"type": "path", "default": "/etc/kubernetes/kubelet.conf.d"},
    "file_name": {"type": "str", "default": kubelet.DROPIN_FILE},
    "state_file": {"type": "path", "default": kubelet.STATE_FILE},
    "dropin": {"type": "bool", "default": False},
    "reservation": {"type": "str", "choices": list(kubelet.RESERVATIONS), "default": "reservedSystemCPUs"},
    "policy_options": {"type": "raw", "default": "auto"},
    "topology_policy": {"type": "str", "choices": list(kubelet.TOPOLOGY_POLICIES), "default": "best-effort"},
    "topology_scope": {"type": "str", "choices": list(kubelet.TOPOLOGY_SCOPES), "default": "container"},
    "isolcpus_flags": {"type": "raw", "default": "auto"},
    "kubelet_version": {"type": "str", "default": "auto"},
    "content": {"type": "str"},
    "config": {"type": "dict"},
    "timeout": {"type": "int", "default": 120},
    "service": {"type": "str", "default": "kubelet"},
    "header": {"type": "str", "default": kubelet.HEADER},
    "host": {"type": "str"},
}


def run(module: AnsibleModule) -> dict:
    p = module.params
    host = Host(p["root"], module.run_command, check_mode=module.check_mode, wrapper=[])
    node = kubelet.Node(host, f"{p['config_dir'].rstrip('/')}/{p['file_name']}", p["state_file"])
    topology = None if p["topology"] is None else Topology.from_facts(p["topology"])
    if p["action"] == "apply":
        return kubelet.apply_stopped(node, p["content"])
    if p["action"] == "verify":
        online = set(topology.online) if topology is not None else set()
        # A kubelet that refuses its configuration exits and is restarted by systemd: say so with its
        # own words rather than wait out the timeout (a sandbox root's kubelet is no systemd unit).
        failed = _unit_failure(module, p["service"]) if p["root"] == "/" and p["service"] else None
        return kubelet.verify_started(node, p["config"], online, p["timeout"], failed=failed)
    settings = {
        **p,
        "kubelet_policy_options": kubelet.to_policy_options(p["policy_options"], "kubelet_policy_options"),
        "kubelet_topology_policy": p["topology_policy"],
        "kubelet_topology_scope": p["topology_scope"],
    }
    config = kubelet.desired_config(settings, topology)
    result = kubelet.configure(node, config, p["runtime"], p["header"])
    if p["state"] == "absent" and result["restart_required"]:
        raise kubelet.KubeletError(
            f"the kubelet still runs with the CPU manager settings cpupools set ({result['restart_reason']}); "
            "set cpupools_runtime: cmk and run playbooks/reboot.yml (it drains the node and restarts the "
            "kubelet) before uninstalling",
            "runtime",
        )
    return result


def _unit_failure(module, service):
    """A probe for ``kubelet.verify_started``: why the kubelet's unit keeps exiting, or None."""
    env = {"LC_ALL": "C", "SYSTEMD_PAGER": ""}
    return lambda: kubelet.unit_failure(lambda argv: module.run_command(argv, environ_update=env), service)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(module.params["host"]))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
