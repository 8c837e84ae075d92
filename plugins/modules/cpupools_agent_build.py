#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_agent_build
short_description: Build the cmk node agent in memory and say whether the build on the controller is current
description:
  - Runs C(scripts/build_agent.py --check) on the controller, which builds the
    C(cmk) zipapp and its launcher in memory, prints one
    C(<sha256>  <path>  unchanged|would be written) line per file, and writes
    nothing. M(cpupools.cpupools.cpupools_converged) compares those digests
    with the agent on each node.
  - Its action starts the script with the controller's own Python straight
    from the task's worker, once per run (C(run_once)), with no module
    process around it. A fresh interpreter, not the worker itself, because
    only a fresh interpreter compiles the zipapp's bytecode to the same bytes
    as the agent role's build. This module is what a direct run outside a
    task executes; it runs the script with its own Python.
  - The result has the shape of M(ansible.builtin.command)'s (C(rc),
    C(stdout), C(stderr)); a failed build fails the task, whose C(rc) and
    C(stderr) say why.
version_added: "1.0.0"
options:
  script:
    description:
      - The path of C(scripts/build_agent.py) on the controller.
      - Default, the collection's own C(scripts/build_agent.py), which the role C(cpupools_agent) builds with.
      - Required where the module runs without its action.
    type: path
  output:
    description: The path of the built launcher (C(build/agent/cmk)); the zipapp is C(<output>.pyz). Only read.
    type: path
    required: true
  shebang:
    description: The launcher's interpreter line, as C(cpupools_agent_shebang) gives it.
    type: str
    default: /bin/sh
  pythons:
    description:
      - Interpreters on the controller that compile the agent's bytecode too, as
        C(cpupools_agent_bytecode_pythons) gives them (C(--python) of the script).
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
    description: Writes nothing in any mode; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Build the cmk zipapp in memory to compare with the nodes
  cpupools.cpupools.cpupools_agent_build:
    output: "{{ cpupools_work_dir | default('auto') | cpupools.cpupools.work_dir }}/build/agent/cmk"
  run_once: true
  register: build
"""

RETURN = r"""
rc:
  description: >-
    The script's exit status (2 for a bad shebang or a script Python cannot
    open; 1 when no Python could start).
  returned: always
  type: int
stdout:
  description: One C(<sha256>  <path>  unchanged|would be written) line for the zipapp, then one for the launcher.
  returned: always
  type: str
stdout_lines:
  description: RV(stdout) as lines.
  returned: always
  type: list
  elements: str
stderr:
  description: Why the build failed.
  returned: always
  type: str
"""

import sys

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = {
    "script": {"type": "path"},
    "output": {"type": "path", "required": True},
    "shebang": {"type": "str", "default": "/bin/sh"},
    "pythons": {"type": "list", "elements": "path", "default": []},
}


def argv(params):
    """The script's command line for the validated options, without the interpreter (the action runs the same)."""
    pythons = [f"--python={python}" for python in params["pythons"]]
    return [params["script"], f"--shebang={params['shebang']}", *pythons, "--check", params["output"]]


def outcome(rc, out, err):
    """The result of one run of the script (the action returns the same): a failed build fails, saying why."""
    result = {"changed": False, "rc": rc, "stdout": out, "stdout_lines": out.splitlines(), "stderr": err}
    if rc:
        result.update(failed=True, msg=f"cpupools agent build: {err.strip() or f'exit status {rc}'}")
    return result


def main():
    # Reached only when the module is run directly: a task runs its action, which starts the script itself.
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if not module.params["script"]:
        module.fail_json(msg="cpupools agent build: script is required where the module runs without its action")
    result = outcome(*module.run_command([sys.executable, *argv(module.params)]))
    if result.get("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
