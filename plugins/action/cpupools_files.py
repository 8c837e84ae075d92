# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of cpupools_files: a file's ``src`` on the controller becomes its ``content_base64``.

The module then writes every file in one run on the node. Where ``copy`` looks
at the node's file first (a ``stat`` module) and sends the bytes only when
they differ, this sends them every time the task runs: for the cmk zipapp
(about 630 kB, 0.84 MB as base64) that is less than the round trips it
saves, and the task runs only when the plan play found the node's agent
stage not converged. A ``src`` named twice (the zipapp, for cmk and for the
housekeeper) is read and encoded once.
"""

import base64

from ansible.plugins.action import ActionBase
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import jinja_plugins

# the strategy imports this action in the main process, before it forks the task's workers
jinja_plugins.load()


def with_contents(files):
    """``files`` with each ``src`` read into ``content_base64``; ``(files, None)`` or ``(None, reason)``."""
    if not isinstance(files, list):
        return files, None  # the module's argument spec says what is wrong
    sent, encoded = [], {}
    for item in files:
        if isinstance(item, dict) and item.get("src") is not None:
            item = dict(item)
            src = str(item.pop("src"))
            if item.get("content") is not None or item.get("content_base64") is not None:
                return None, f"cpupools_files: {item.get('path')}: give one of content, content_base64 and src"
            if src not in encoded:
                try:
                    with open(src, "rb") as handle:
                        encoded[src] = base64.b64encode(handle.read()).decode("ascii")
                except OSError as exc:
                    return None, f"cpupools_files: {item.get('path')}: src {src}: {exc.strerror}"
            item["content_base64"] = encoded[src]
        sent.append(item)
    return sent, None


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        files, refusal = with_contents(args.get("files", []))
        if refusal:
            result.update(failed=True, msg=refusal)
            return result
        if "files" in args:
            args["files"] = files
        result.update(
            self._execute_module(module_name="cpupools.cpupools.cpupools_files", module_args=args, task_vars=task_vars)
        )
        return result
