# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_report: collect every host's report input and render the report, on the controller.

Without a ``hosts`` argument it reads, for each host of the play, the
variables the report is built from, in one task run once: the role needs no
``set_fact`` per host (docs/performance.md). With ``hosts`` it takes them as
they are.

It renders in the worker, with the module's own function
(``report.report``) and its argument spec: no module process, and the
inputs of the whole fleet are not serialised to one and back
(docs/performance.md). The report is a file on the controller whatever the
task's delegation.
"""

import os
import socket
import time
from collections.abc import Mapping

from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.report.report import ARGUMENT_SPEC, report
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import digest_store, jinja_plugins
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import EXPORT_DEFAULTS, checked_args

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()

#: Report input key -> the host variable it is read from (docs/report.md, input schema).
PARTS = (
    ("plan", "cpupools_plan"),
    ("kernel", "cpupools_kernel_status"),
    ("state", "cpupools_agent_status"),
    ("k8s", "cpupools_k8s_status"),
    ("verify", "cpupools_verify_result"),  # set by the verify role; absent on a host never verified
)


def host_input(host, variables, stored=None):
    """The report input of one host, from its host variables.

    ``stored`` (a dict kept for the task) reads each stored topology and plan
    once: hosts naming the same digest share it (``digest_store.load``).
    """
    # hostvars templates what it returns; a variable the host lacks is None (shown as "not collected")
    # a converged host's plan result names its topology, it is not a fact (docs/performance.md)
    result = variables.get("cpupools_plan_result")
    entry = {"host": host, "topology": digest_store.topology(result, variables.get("ansible_facts"), stored)}
    # hostvars has no role defaults: where no stage set the exported facts, the plan result has them
    planned = None
    for key, name in PARTS:
        entry[key] = variables.get(name)
        if entry[key] is None and name in EXPORT_DEFAULTS:
            planned = planned or digest_store.planned(result, stored)
            entry[key] = planned["plan"] if name == "cpupools_plan" else (planned["exports"] or {}).get(name)
    plan = entry["plan"]
    # the plan's checked hugepages request (a -e string is checked there too)
    entry["hugepages"] = (plan.get("hugepages") or {}).get("requested") if isinstance(plan, Mapping) else None
    return entry


def run_label(task_vars):
    """Which run this is, for the report store: the AWX/AAP job (``awx_job_id``) or the controller and
    ansible-playbook's process id, and the run's ``--limit``."""
    job = task_vars.get("awx_job_id") or task_vars.get("tower_job_id")
    where = f"awx job {job}" if job else f"{socket.gethostname()} pid {os.getppid()}"
    limit = task_vars.get("ansible_limit")
    return f"{where}, --limit {limit}" if limit else where


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "hosts" not in args:
            hostvars = task_vars["hostvars"]
            stored = {}
            args["hosts"] = [host_input(host, hostvars[host], stored) for host in task_vars["ansible_play_hosts"]]
        if args.get("store"):
            args.setdefault("now", time.time())
            if not args.get("run"):
                args["run"] = run_label(task_vars)
        params, refusal = checked_args(args, ARGUMENT_SPEC, "cpupools report", as_is=("hosts",))
        if refusal:
            result.update(failed=True, msg=refusal)
            return result
        try:
            result.update(report(params, bool(self._task.check_mode)))
        except CpupoolsError as exc:
            result.update(failed=True, changed=False, msg=f"cpupools report: {exc}")
        return result
