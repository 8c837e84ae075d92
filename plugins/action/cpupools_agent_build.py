# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_agent_build: ``scripts/build_agent.py --check`` run by the controller's Python.

The action runs the script straight from the task's worker (``sys.executable``
is the controller's own Python, ``ansible_playbook_python``), with the command
line the module would give it: no module process around it (docs/performance.md:
the plan play's one task run once). Not in-process: the zipapp holds
``marshal`` output, whose bytes depend on the state of the process that
compiles (reference counts of interned constants), so only a fresh
interpreter builds the same bytes as the agent role's build.
"""

import os
import subprocess
import sys

from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.modules.cpupools_agent_build import ARGUMENT_SPEC, argv, outcome
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import jinja_plugins, work_dir
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import checked_args

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()

#: The default of ``script``: the collection's own.
SCRIPT = os.path.join(work_dir.COLLECTION_DIR, "scripts", "build_agent.py")


def run_script(args):
    """``(rc, stdout, stderr)`` of ``python3 <script> <options>``; a script that cannot be started is rc 1."""
    try:
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        return 1, "", f"{sys.executable}: {exc.strerror}\n"
    return proc.returncode, proc.stdout, proc.stderr


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("script") is None:
            args["script"] = SCRIPT
        params, refusal = checked_args(args, ARGUMENT_SPEC, "cpupools agent build")
        if refusal:
            result.update(failed=True, msg=refusal)
            return result
        result.update(outcome(*run_script(argv(params))))
        return result
