#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_verify
short_description: Check that a node's isolated CPUs are quiet, and measure their jitter
description:
  - Reads the running kernel under O(facts_root) and says what runs on, or
    interrupts, each isolated CPU of the plan. Every check only reads; the one
    that acts, the latency measurement with C(oslat) (Debian package
    C(rt-tests)), runs only when O(latency.enabled) is true and never in check mode.
  - "IRQs: every C(/proc/irq/N/effective_affinity_list) (C(smp_affinity_list)
    where the kernel has none); an IRQ effective on an isolated CPU fails unless
    the kernel manages it (C(IRQD_AFFINITY_MANAGED) in
    C(/sys/kernel/debug/irq/irqs/N), or inferred without debugfs), and
    C(/proc/interrupts) is sampled twice to say which interrupts fired on each
    isolated CPU."
  - "Unbound workqueues: C(/sys/devices/virtual/workqueue/cpumask) and each
    workqueue's own C(cpumask) must leave the isolated CPUs out."
  - "Kernel threads that may be moved (not per-CPU) must not be allowed on
    isolated CPUs; RCU's C(rcuo*) threads must exist for exactly the planned
    C(rcu_nocbs) CPUs and stay on housekeeping CPUs;
    C(/sys/devices/system/cpu/nohz_full) and C(isolated) must be the planned ones."
  - "Exclusive CPUs: a task that last ran on one and is not held there (by a
    PID in CMK's state for that CPU list or its descendant, or for the kubelet
    runtime a task pinned to exactly a set C(cpu_manager_state) assigned) fails;
    entries of dead PIDs (stale) and pinned tasks the record does not know
    (unrecorded) are listed."
  - Never changes anything on the node (C(changed) is always false); O(latency)
    leaves out every exclusive CPU a workload holds.
version_added: "1.1.0"
options:
  facts_root:
    description: Directory C(/proc) and C(/sys) are read under (a fixture tree in tests).
    type: path
    default: /
  root:
    description: Directory cpupools wrote its files under (the pool state, the kubelet's state).
    type: path
    default: /
  conf_dir:
    description: CMK's pool state directory, relative to O(root).
    type: path
    default: /etc/cmk
  plan:
    description:
      - The host's C(cpupools_plan). Read are C(isolated_cpus), C(housekeeping_cpus),
        C(pool_cpus), C(exclusive_pools) and C(runtime).
    type: dict
    required: true
  expected_args:
    description:
      - The kernel arguments the kernel stage derived for the plan (C(isolcpus),
        C(nohz_full), C(rcu_nocbs), C(irqaffinity) to their values). An argument
        that is missing is not planned; its check says so and does not fail.
    type: dict
    default: {}
  latency:
    description: The jitter measurement with C(oslat).
    type: dict
    default: {}
    suboptions:
      enabled:
        description: Run C(oslat) (not in check mode, which says what it would run).
        type: bool
        default: false
      tool_path:
        description: The C(oslat) program, a name looked up on C(PATH), C(/usr/bin) and C(/usr/sbin), or a path.
        type: str
        default: oslat
      duration:
        description: Seconds to measure.
        type: int
        default: 10
      cpus:
        description:
          - C(auto) (every exclusive, isolated CPU no workload holds, and the last
            housekeeping CPU for comparison) or a cpulist. Held CPUs are always left out.
        type: raw
        default: auto
      main_cpu:
        description: CPU of C(oslat)'s main thread; C(auto) is the first housekeeping CPU not measured.
        type: raw
        default: auto
      max_us:
        description: A measured isolated CPU whose maximum latency is above this many microseconds fails.
        type: int
      p99_us:
        description: A measured isolated CPU whose 99th percentile latency is above this many microseconds fails.
        type: int
  fail_on:
    description: The checks whose C(fail) findings make RV(ok) false.
    type: list
    elements: str
    choices: [irq, workqueue, kthread, rcu, nohz, process, cmk, latency, power]
    default: [irq, workqueue, kthread, rcu, nohz, process, cmk, latency, power]
  kubelet_state:
    description: The kubelet's CPU manager checkpoint, relative to O(root) (read for the kubelet runtime).
    type: path
    default: /var/lib/kubelet/cpu_manager_state
  host:
    description: Name of the host, used in error messages.
    type: str
  reboot_pending:
    description:
      - The kernel stage found planned arguments the running kernel was not booted with
        (C(cpupools_reboot_required)). The kernel's findings then say so, and a C(warn) finding and the
        summary name the pending reboot.
    type: bool
    default: false
  metrics_dir:
    description:
      - A node_exporter textfile collector directory (under O(root)) to write C(cpupools_verify.prom)
        into, replaced atomically (not in check mode). The directory must exist. Not counted as a change
        (it holds the latest measurement, with its time).
    type: path
attributes:
  check_mode:
    support: full
    description: Every read-only check runs; C(oslat) does not, and the returned C(latency.skipped) shows its command.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Verify the node's isolation
  cpupools.cpupools.cpupools_verify:
    plan: "{{ cpupools_plan }}"
    expected_args: "{{ cpupools_kernel_status.desired_cmdline_args }}"
  register: cpupools_verify_result

- name: Verify and measure 30 s of jitter, failing the node above 20 us
  cpupools.cpupools.cpupools_verify:
    plan: "{{ cpupools_plan }}"
    expected_args: {nohz_full: "4-7", rcu_nocbs: "4-7", isolcpus: "managed_irq,domain,4-7"}
    latency:
      enabled: true
      duration: 30
      max_us: 20
  register: cpupools_verify_result

- name: Stop here when the node is not quiet
  ansible.builtin.assert:
    that: cpupools_verify_result.ok
    fail_msg: "{{ cpupools_verify_result.summary }}"
"""

RETURN = r"""
version:
  description: Version of this result's shape.
  returned: always
  type: int
  sample: 1
taken:
  description: When the node was read, UTC.
  returned: always
  type: str
  sample: "2026-11-26T19:40:00Z"
kernel:
  description: >-
    The running kernel: C(release), C(cmdline), C(isolated) and C(nohz_full)
    as sysfs shows them (null where the file does not exist).
  returned: always
  type: dict
cpus_checked:
  description: The isolated CPUs and the measured CPUs, a cpulist.
  returned: always
  type: str
  sample: "1,4-7"
ok:
  description: False when a finding of severity C(fail) belongs to a check in O(fail_on).
  returned: always
  type: bool
reboot_pending:
  description: The value of O(reboot_pending).
  returned: always
  type: bool
metrics_file:
  description: The textfile written (or, in check mode, that would be), under O(root).
  returned: when O(metrics_dir) is given
  type: str
  sample: /var/lib/node_exporter/textfile/cpupools_verify.prom
summary:
  description: One line for a person.
  returned: always
  type: str
  sample: "4 of 4 isolated CPUs quiet; 1 IRQ kept on isolated CPUs by the kernel (managed)"
findings:
  description: >-
    Every observation, worst first: C(check), C(severity) (C(fail), C(warn),
    C(info)), C(cpus) (the cpulist it concerns), C(message), C(detail).
  returned: always
  type: list
  elements: dict
per_cpu:
  description: >-
    CPU (string) to C(role) (its pool, or C(housekeeping)), C(isolated),
    C(quiet) (no fail or warn finding names it), C(held_by), C(found) (IRQs,
    processes and interrupt counts that grew) and C(latency) (C(max_us),
    C(p99_us), C(p999_us), C(avg_us), C(min_us); null when not measured).
  returned: always
  type: dict
irqs:
  description: >-
    The IRQs effective on an isolated CPU: C(irq), C(name), C(effective),
    C(affinity), C(managed) (null when unknown), C(managed_how).
  returned: always
  type: list
  elements: dict
workqueue:
  description: >-
    C(cpumask) (the unbound mask), C(isolated_in_mask), C(ok), C(workqueues)
    (each WQ_SYSFS workqueue's own mask).
  returned: always
  type: dict
kthreads:
  description: Movable kernel threads allowed on isolated CPUs (C(pid), C(comm), C(allowed)).
  returned: always
  type: list
  elements: dict
rcu:
  description: C(expected) (planned rcu_nocbs, null when not planned), C(offloaded), C(threads_on_isolated), C(ok).
  returned: always
  type: dict
nohz:
  description: >-
    C(expected) and C(active) nohz_full, C(isolated_expected) and
    C(isolated_active) (the domain-isolated CPUs), C(ok).
  returned: always
  type: dict
processes:
  description: >-
    Tasks that last ran on an exclusive CPU that nothing holds there (C(pid),
    C(comm), C(cpu), C(allowed), C(why); C(tgid) for a thread).
  returned: always
  type: list
  elements: dict
cmk:
  description: C(held) (with C(running_on)), C(stale) and C(unrecorded) entries of the runtime's record.
  returned: always
  type: dict
latency:
  description: >-
    C(tool), C(version), C(argv), C(duration_s), C(cpus) (CPU to figures in
    microseconds and C(overflows), the loops in oslat's last bucket),
    C(thresholds), C(ok), C(left_out) (held CPUs not measured) and
    C(skipped) (null, C(not enabled), or C(check mode: would run ...)).
  returned: always
  type: dict
interrupts:
  description: C(seconds) between the two samples of /proc/interrupts and C(grown) (CPU to source to increase).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import metrics
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.verify.run import CHECKS, verify

ARGUMENT_SPEC = {
    "facts_root": {"type": "path", "default": "/"},
    "root": {"type": "path", "default": "/"},
    "conf_dir": {"type": "path", "default": "/etc/cmk"},
    "plan": {"type": "dict", "required": True},
    "expected_args": {"type": "dict", "default": {}},
    "latency": {
        "type": "dict",
        "default": {},
        "options": {
            "enabled": {"type": "bool", "default": False},
            "tool_path": {"type": "str", "default": "oslat"},
            "duration": {"type": "int", "default": 10},
            "cpus": {"type": "raw", "default": "auto"},
            "main_cpu": {"type": "raw", "default": "auto"},
            "max_us": {"type": "int"},
            "p99_us": {"type": "int"},
        },
    },
    "fail_on": {"type": "list", "elements": "str", "choices": list(CHECKS), "default": list(CHECKS)},
    "kubelet_state": {"type": "path", "default": "/var/lib/kubelet/cpu_manager_state"},
    "host": {"type": "str"},
    "reboot_pending": {"type": "bool", "default": False},
    "metrics_dir": {"type": "path"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    def which(name):
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) else None
        return module.get_bin_path(name, opt_dirs=["/usr/bin", "/usr/sbin"])

    try:
        result = verify(
            facts_root=p["facts_root"],
            root=p["root"],
            conf_dir=p["conf_dir"],
            plan=p["plan"],
            expected_args=p["expected_args"],
            latency=p["latency"],
            fail_on=p["fail_on"],
            kubelet_state=p["kubelet_state"],
            check_mode=module.check_mode,
            run=run,
            which=which,
            reboot_pending=p["reboot_pending"],
        )
        if p["metrics_dir"]:
            result["metrics_file"] = write_metrics(p["root"], p["metrics_dir"], result, module.check_mode)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(p["host"], prefix="cpupools_verify: "))
    # A measurement, not a configuration: its textfile holds the latest one (with its time), so it is
    # rewritten on every run and never counted as a change (a re-run of verify.yml changes nothing).
    module.exit_json(changed=False, **result)


def write_metrics(root, directory, result, check_mode):
    """``cpupools_verify.prom`` in the node_exporter textfile directory (under ``root``); its path."""
    where = os.path.join(root, directory.lstrip("/"))
    if not os.path.isdir(where):
        raise CpupoolsError(
            f"the metrics directory {directory} does not exist (node_exporter's --collector.textfile.directory)",
            "metrics_dir",
        )
    if not check_mode:
        metrics.write_textfile(where, metrics.VERIFY_FILE, metrics.render_verify(result))
    return os.path.join(directory, metrics.VERIFY_FILE)


if __name__ == "__main__":
    main()
