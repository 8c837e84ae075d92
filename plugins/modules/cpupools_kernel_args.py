#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: write the kernel arguments derived from the CPU pool plan."""

DOCUMENTATION = r"""
---
module: cpupools_kernel_args
short_description: Write the kernel arguments derived from the cpupools plan into the boot loader
description:
  - Derives C(isolcpus), C(nohz_full), C(rcu_nocbs) and C(irqaffinity) from the plan of the
    C(cpupools_plan) role, and C(default_hugepagesz), C(hugepagesz), C(hugepages) from the plan's
    boot hugepage reservation, and writes them into the boot loader configuration, changing only
    those arguments. Every other kernel argument is left exactly as it is.
  - C(grub) writes a drop-in C(/etc/default/grub.d/<name>.cfg) that appends to
    C(GRUB_CMDLINE_LINUX); C(grubby) runs C(grubby --update-kernel=ALL) with only the
    differences; C(kernel-install) edits C(/etc/kernel/cmdline) in place.
  - Compares the result with the running kernel (C(/proc/cmdline),
    C(/sys/devices/system/cpu/isolated) and C(nohz_full)) and reports which arguments wait for a reboot.
    It never reboots.
  - Reads back what the boot loader will actually boot (the generated C(grub.cfg), the BLS entries of the
    kernel); when it disagrees with the configuration (an update that failed once), regenerates it and
    reports the difference in RV(boot_config).
  - Every command goes through one seam (O(command_wrapper)) and is listed in RV(commands).
options:
  state:
    description: >-
      C(present) writes the arguments; C(absent) removes exactly those cpupools wrote and restores the
      values it replaced.
    type: str
    choices: [present, absent]
    default: present
  plan:
    description: The plan (variable C(cpupools_plan)). Required when O(state=present).
    type: dict
  backend:
    description: Boot loader backend; C(auto) detects it under O(root) (grubby, then GRUB, then kernel-install).
    type: str
    choices: [auto, grub, grubby, kernel-install]
    default: auto
  root:
    description:
      - Root directory of the host; the boot loader files are read and written under it (tests use a fixture tree).
    type: path
    default: /
  facts_root:
    description:
      - Root directory under which what the running kernel reports is read (C(/proc/cmdline),
        C(/sys/devices/system/cpu/isolated), C(nohz_full), C(/proc/sys/kernel/osrelease), and
        C(/proc/config.gz) where O(root) has no C(/boot/config-<release>) of the running kernel); the role
        passes C(cpupools_facts_root), the root the topology facts come from. Default O(root).
    type: path
  report_files:
    description:
      - Paths (as on the node, under O(root)) to report back in RV(files_present) when they exist. The role
        lists its optional drop-ins, so that switched-off ones are removed only when they are there, without
        one more module run per file.
    type: list
    elements: path
    default: []
  host:
    description: Name of the host in error messages (the role passes the inventory name); default the node's hostname.
    type: str
  name:
    description: Name of the GRUB drop-in, C(/etc/default/grub.d/<name>.cfg). Sort it after other drop-ins.
    type: str
    default: 99-cpupools
  isolcpus_flags:
    description:
      - Flags written in front of the isolcpus cpulist, a list of C(nohz), C(domain), C(managed_irq).
      - C(auto) takes the plan's runtime's flags, C([managed_irq, domain]), or C([managed_irq]) for the
        C(kubelet) runtime (its isolated CPUs also run the pods it has not handed CPUs to).
    type: raw
    default: auto
  keep_adopted:
    description: >-
      In adopt mode, keep the running kernel's isolcpus (with its flags) and other owned arguments, so a
      migrated CMK node needs no reboot.
    type: bool
    default: true
  nohz_full:
    description: Write C(nohz_full=) with the exclusive pool's CPUs.
    type: bool
    default: true
  rcu_nocbs:
    description: Write C(rcu_nocbs=) with the exclusive pool's CPUs.
    type: bool
    default: true
  irqaffinity:
    description: Write C(irqaffinity=) with the housekeeping CPUs.
    type: bool
    default: true
  command_line_size:
    description: The kernel's COMMAND_LINE_SIZE in bytes, terminating NUL included (2048 on x86).
    type: int
    default: 2048
  update:
    description:
      - When to regenerate the boot configuration (C(update-grub) or C(grub-mkconfig -o), C(kernel-install add)).
      - C(auto) when this run changed a file or the generated configuration (C(grub.cfg), the BLS entries)
        disagrees with it; C(never) leaves it to the caller (the role's handler) and reports RV(update_needed);
        C(always) runs it in any case; C(only) runs it and changes no file (the handler's call, after the task
        that wrote the file). grubby changes the entries directly.
      - After a regeneration the generated configuration is read back; a disagreement is an error.
    type: str
    choices: [auto, never, always, only]
    default: auto
  command_wrapper:
    description:
      - Argv prefix every command is run through (the seam tests observe). Defaults to the
        whitespace-split environment variable C(CPUPOOLS_COMMAND_WRAPPER).
    type: list
    elements: str
  kernel_release:
    description: >-
      Release of the kernel the arguments are for; default the running one (or
      C(<facts_root>/proc/sys/kernel/osrelease)). Its C(/boot/config-<release>) is what
      C(nohz_full=) and C(rcu_nocbs=) are checked against; only the running kernel's
      C(/proc/config.gz) stands in for a missing one.
    type: str
  record:
    description: File (under O(root)) that remembers the values cpupools replaced, for O(state=absent).
    type: path
    default: /var/lib/cpupools/kernel-args.json
  known_warnings:
    description:
      - Warnings already shown for this host (the plan play's M(cpupools.cpupools.cpupools_converged) gives
        the same ones, in C(cpupools_kernel_status.warnings)); they are returned in RV(exports) but not
        emitted again, so each warning is printed once per run.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: >-
      Reads everything (and runs C(grubby --info)), writes nothing, runs no other command, and reports
      exactly the actions a real run takes (RV(actions)).
  diff_mode:
    support: full
    description: Shows the old and new kernel command line, and the old and new file.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Write the kernel arguments of the plan
  cpupools.cpupools.cpupools_kernel_args:
    plan: "{{ cpupools_plan }}"
    isolcpus_flags: [managed_irq, domain]
  register: kargs

- name: Remove them again
  cpupools.cpupools.cpupools_kernel_args:
    state: absent
"""

RETURN = r"""
backend:
  description: The backend used.
  type: str
  returned: always
  sample: grub
args:
  description: The owned arguments cpupools has in the boot configuration after this run (key -> value).
  type: dict
  returned: always
  sample: {"isolcpus": "managed_irq,domain,1-5", "nohz_full": "1-3", "rcu_nocbs": "1-3", "irqaffinity": "0,6-7"}
cmdline:
  description: >-
    C(desired) (the owned arguments as text), C(configured) (the boot loader's command line after this
    run, as far as it is known) and C(running) (C(/proc/cmdline)).
  type: dict
  returned: always
reboot_required:
  description: >-
    True when the running kernel lacks an owned argument the boot configuration has (or has one it no
    longer has).
  type: bool
  returned: always
pending:
  description:
    - Exactly the owned arguments that differ between the boot configuration and the running kernel.
    - C(now) says what of the change the running kernel could take without the reboot, or null; only the
      scheduler-domain isolation of C(isolcpus), on a kernel with isolated cpuset partitions
      (C(/sys/fs/cgroup/cpuset.cpus.isolated), Linux 6.7 and later on cgroup v2). cpupools does not apply it
      (docs/kernel-args.md, "Isolated cpuset partitions").
  type: list
  elements: dict
  returned: always
  sample: [{"arg": "isolcpus", "configured": "managed_irq,domain,1-5", "running": null, "now": null}]
not_applied:
  description: >-
    Owned arguments on the running command line that the kernel does not apply, according to
    C(/sys/devices/system/cpu/isolated) and C(nohz_full) (a reboot does not fix these; each is also a warning).
  type: list
  elements: dict
  returned: always
  sample: [{"arg": "isolcpus", "running": "managed_irq,domain,1-5", "active": ""}]
update_needed:
  description: >-
    True when a boot configuration file changed, or the generated configuration disagrees with it, and the
    boot loader update (update-grub, kernel-install add) has not been run by this call (O(update=never)).
  type: bool
  returned: always
boot_config:
  description: >-
    What the boot loader will actually boot, compared with the configuration: C(path) (the generated
    C(grub.cfg) or BLS entry directory; empty when it cannot be read, for example with no update tool) and
    C(differences), one item per boot entry and owned argument that disagree, before any regeneration by
    this call (C(file), C(entry), C(arg), C(boots), C(configured)).
  type: dict
  returned: always
  sample: {"path": "/boot/grub/grub.cfg", "differences": [{"file": "/boot/grub/grub.cfg", "entry": 1,
           "arg": "isolcpus", "boots": null, "configured": "managed_irq,domain,1-5"}]}
actions:
  description: >-
    Every change made, in order (or, in check mode, that a real run makes): files written or removed,
    commands run. C(changed) is true exactly when this list is not empty.
  type: list
  elements: str
  returned: always
  sample: ["write /etc/default/grub.d/99-cpupools.cfg", "regenerate the boot configuration (/usr/sbin/update-grub)"]
commands:
  description: Every command run (or, in check mode, that would change something), as argv lists without the wrapper.
  type: list
  elements: list
  returned: always
notes:
  description: What was left out and why (adopt mode, empty pools, arguments the operator's own files already set).
  type: list
  elements: str
  returned: always
outputs:
  description: >-
    Values for the optional host drop-ins (housekeeping CPUs, CPUAffinity, irqbalance banned cpulist,
    kubelet reservations).
  type: dict
  returned: always
exports:
  description:
    - The facts the cpupools_kernel role sets from this result (C(cpupools_reboot_required),
      C(cpupools_pending_kernel_args), C(cpupools_kernel_cmdline), C(cpupools_housekeeping),
      C(cpupools_kernel_status), whose C(warnings) are this run's warnings but those about what the
      regeneration of the boot configuration puts right), computed by the function the cpupools_converged
      module uses for a host whose kernel stage it skips.
  type: dict
  returned: always
files_present:
  description: Those of O(report_files) that exist.
  type: list
  elements: str
  returned: always
path:
  description: The file this backend writes (drop-in or C(/etc/kernel/cmdline)); empty for grubby.
  type: str
  returned: always
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import bootloader, kargs
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.stage_check import kernel_exports

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "plan": {"type": "dict"},
    "backend": {"type": "str", "choices": ["auto", "grub", "grubby", "kernel-install"], "default": "auto"},
    "root": {"type": "path", "default": "/"},
    "facts_root": {"type": "path"},
    "host": {"type": "str"},
    "name": {"type": "str", "default": "99-cpupools"},
    "isolcpus_flags": {"type": "raw", "default": "auto"},
    "keep_adopted": {"type": "bool", "default": True},
    "nohz_full": {"type": "bool", "default": True},
    "rcu_nocbs": {"type": "bool", "default": True},
    "irqaffinity": {"type": "bool", "default": True},
    "command_line_size": {"type": "int", "default": kargs.COMMAND_LINE_SIZE},
    "update": {"type": "str", "choices": ["auto", "never", "always", "only"], "default": "auto"},
    "command_wrapper": {"type": "list", "elements": "str"},
    "report_files": {"type": "list", "elements": "path", "default": []},
    "kernel_release": {"type": "str"},
    "record": {"type": "path", "default": "/var/lib/cpupools/kernel-args.json"},
    "known_warnings": {"type": "list", "elements": "str", "default": []},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    host = bootloader.Host(
        params["root"],
        module.run_command,
        facts_root=params["facts_root"],
        wrapper=params["command_wrapper"],
        check_mode=module.check_mode,
        which=lambda name: module.get_bin_path(name, opt_dirs=["/usr/sbin", "/sbin"]),
        move=module.atomic_move,
    )
    try:
        result = bootloader.write_boot_config(host, params)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(params["host"] or socket.gethostname()), commands=host.commands)
    warnings, repairs = result.pop("warnings"), result.pop("repairs")
    for warning in warnings:
        if warning not in params["known_warnings"]:
            module.warn(warning)
    result["files_present"] = sorted(f for f in params["report_files"] if os.path.lexists(host.path(f)))
    # The status the report shows is the node's after this stage: what its regeneration puts right is said
    # (above, or by the plan play), not kept.
    result["exports"] = kernel_exports({**result, "warnings": [w for w in warnings if w not in repairs]})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
