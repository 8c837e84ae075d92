#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_report
short_description: Render the fleet report of CPU pools, pending changes and drift
description:
  - Runs once on the controller (C(delegate_to=localhost), C(run_once)) over
    the facts of every host of the play and renders a text report (returned) and,
    when O(html_path) is given, one self-contained HTML page with a picture of
    each node's sockets, NUMA nodes, L3 domains, cores and hyperthreads
    coloured by pool, and tables of pools, NUMA nodes, L3 domains and
    hugepages (planned against present).
  - Its action renders the report in the controller's own Python, in the
    task's worker, with no module process (the HTML file is written on the
    controller whatever the task's delegation); this module is what a direct
    run outside a task executes, with the same function and options.
  - Pure rendering from its inputs; the output is deterministic, so an
    unchanged fleet rewrites nothing and reports C(changed=false).
  - Every per-host part but C(host) is optional; a missing part is shown as
    C(not collected).
version_added: "0.1.0"
options:
  hosts:
    description:
      - One dict per host, in the order to show them.
      - C(host) (str, required) inventory name; C(topology) the facts of
        M(cpupools.cpupools.cpupools_facts) (C(ansible_facts.cpupools)); C(plan) the plan of
        M(cpupools.cpupools.cpupools_plan) (fact C(cpupools_plan)); C(kernel) the kernel
        argument status (C(reboot_required), C(pending),
        C(desired_cmdline_args)); C(state) the pool state status (C(present),
        C(pools), C(tasks)); C(k8s) the Kubernetes status (C(enabled),
        C(advertised), C(expected), C(skipped_reason)); C(hugepages) the
        planned hugepages (C(cpupools_hugepages), a list of C(size), C(count),
        and C(numa_node)); C(verify) the host's last C(cpupools_verify) result
        (fact C(cpupools_verify_result)).
      - See docs/report.md for the full schema.
      - The module needs them; its action fills them in when the task omits
        them, reading them on the controller from
        the variables of every host of the play (C(ansible_facts.cpupools),
        C(cpupools_plan), C(cpupools_kernel_status), C(cpupools_agent_status),
        C(cpupools_k8s_status), C(cpupools_verify_result)), once for the whole play.
    type: list
    elements: dict
    required: true
  failed_hosts:
    description: Hosts of the play that failed before the report; named in the fleet summary.
    type: list
    elements: str
    default: []
  html_path:
    description:
      - Where to write the HTML report (parent directories are created).
        Empty or unset writes no file.
      - Written atomically, and only when its content changes.
      - A machine-readable JSON is written beside it, the same way, its
        name the page's with C(.html) replaced by C(.json) (C(.json) appended to any
        other name). It holds per host the status, drift, warnings, a plan
        summary and the last verify result (docs/report.md).
      - A host's verify result that says what the one the JSON shows says, but
        for its time, is shown with that earlier time, the time it was first
        found so; a verify that finds the same rewrites neither file.
    type: path
  template:
    description:
      - The Jinja2 template of the HTML page, on the controller; the role
        passes its own C(templates/cpupools-report.html.j2). Files it
        includes (the CSS) are looked up beside it.
      - Required when O(html_path) is set. The page is rendered with
        autoescape on, so every value from the inventory or the facts is
        escaped; rendering needs the C(jinja2) package, which the
        controller's Python has (the role runs this task with
        C(ansible_playbook_python)).
    type: path
  title:
    description: Title of the HTML page.
    type: str
    default: cpupools report
  generated:
    description:
      - Free text shown under the title, for example a date. Unset by default,
        so that an unchanged fleet gives a byte-identical report.
    type: str
  store:
    description:
      - A directory on the controller, the report store (docs/awx.md). Each
        host of O(hosts) is written there, one file per host, atomically,
        with O(now) and O(run), when its data changed (not in check mode);
        a file whose data is the same keeps its time and run and gets O(now)
        as its modification time. The report then covers every host of
        O(inventory_hosts) from the store, and ends with a report data section
        naming the hosts no run reported, since when each host's data is so and
        which run took it, and the files it left out.
      - A host of this run without a verify result keeps the one its
        stored data has (the report shows the last verify of every host); a
        verify result that says the same keeps its time.
      - Unset, the report shows O(hosts) only.
    type: path
  inventory_hosts:
    description:
      - With O(store), the hosts the report covers (the inventory's
        C(cpupools_nodes)); by default the hosts of O(hosts).
    type: list
    elements: str
  run:
    description:
      - With O(store), which run this is, kept with each host's data; the
        action names the AWX/AAP job or the controller and process, and the
        run's C(--limit).
    type: str
    default: ""
  now:
    description: With O(store), the time this run's data is taken, in seconds since the epoch; by default now.
    type: float
  store_max_age:
    description: With O(store), seconds after which a host's data is flagged as too old; 0 flags none.
    type: int
    default: 0
attributes:
  check_mode:
    support: full
    description: Renders the report but writes no file.
    details: >-
      Renders and says whether the HTML file, the JSON beside it or a file of the store would change; writes
      nothing.
  diff_mode:
    support: partial
    description: Shows which HTML file changes, by size and checksum.
    details: >-
      The diff names the HTML file (and the JSON beside it) and its size and SHA-1 before and after,
      not the markup itself, which would bury the rest of a C(--diff) run.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Render the fleet report
  cpupools.cpupools.cpupools_report:
    hosts:
      - host: "{{ inventory_hostname }}"
        topology: "{{ ansible_facts.cpupools }}"
        plan: "{{ cpupools_plan }}"
    html_path: "{{ playbook_dir }}/sandbox/report.html"
    template: "{{ role_path }}/templates/cpupools-report.html.j2"
  delegate_to: localhost
  run_once: true
  register: report

- name: Print it
  ansible.builtin.debug:
    msg: "{{ report.lines }}"
"""

RETURN = r"""
text:
  description: >-
    The text report: per host the pool table, isolation, kernel, resources,
    tasks, drift and warnings; the fleet summary last.
  returned: success
  type: str
lines:
  description: The text report as a list of lines, for C(ansible.builtin.debug).
  returned: success
  type: list
  elements: str
summary:
  description: The one-line fleet summary.
  returned: success
  type: str
hosts:
  description: >-
    Per host, its status (C(ok), C(pending), C(drift) or C(unplanned)), drift
    items, warnings, and its last verify's verdict (C(ok), C(fail), or null
    when never verified).
  returned: success
  type: dict
  sample: {"node-1": {"status": "pending", "drift": [], "warnings": [], "verify": null}}
html_path:
  description: The HTML file written (or that would be written in check mode); null when none.
  returned: success
  type: str
json_path:
  description: The JSON file written beside the HTML file; null when no HTML file is written.
  returned: success
  type: str
store:
  description: >-
    With O(store): its C(path), the report data C(summary) line, and the
    hosts C(reported), C(missing) (no run reported them), C(stale) (too
    old), C(outside) (in the store, not in O(inventory_hosts)), the
    files C(unreadable), and the files C(written) (in check mode: that
    would be; a written file counts as a change).
  returned: when O(store) is set
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.report.report import ARGUMENT_SPEC, report


def main():
    # Reached only when the module is run directly: a task runs its action, which calls report() in the worker.
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = report(module.params, module.check_mode, module.atomic_move)
    except CpupoolsError as exc:
        module.fail_json(msg=f"cpupools report: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
