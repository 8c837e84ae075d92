# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
name: stages
type: aggregate
short_description: Say how long each stage of a cpupools run took
version_added: "1.0.0"
description:
  - At the end of a run, one line per play that ran a task (each stage of
    C(site.yml) is a play), with its wall time, and the total.
  - Silent when the stdout callback writes JSON (C(ansible.posix.json) and the
    like), so machine-readable output stays parseable.
  - The checkout's C(ansible.cfg) enables it, with the default callback
    hiding skipped hosts (C(display_skipped_hosts = false)). A run of the
    installed collection enables it with
    C(ANSIBLE_CALLBACKS_ENABLED=cpupools.cpupools.stages) or in its own
    C(ansible.cfg).
requirements:
  - enabled in C(callbacks_enabled)
author:
  - The cpupools authors (@cpupools)
"""

import time

from ansible import constants as C
from ansible.plugins.callback import CallbackBase


def format_stages(stages, total):
    """The summary lines: ``name .... 12.3 s`` per stage, then the total (names padded to one width)."""
    rows = [*stages, ("total", total)]
    width = max(len(row[0]) for row in rows) + 2
    return [f"{name} {'.' * (width - len(name))} {seconds:6.1f} s" for name, seconds in rows]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "cpupools.cpupools.stages"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._start = time.monotonic()
        self._play = None  # [name, start, tasks started]
        self._stages = []

    def _end_play(self):
        if self._play and self._play[2]:
            self._stages.append((self._play[0], time.monotonic() - self._play[1]))
        self._play = None

    def v2_playbook_on_play_start(self, play):
        self._end_play()
        self._play = [play.get_name().strip(), time.monotonic(), 0]

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._play:
            self._play[2] += 1

    def v2_playbook_on_handler_task_start(self, task):
        if self._play:
            self._play[2] += 1

    def v2_playbook_on_stats(self, stats):
        self._end_play()
        stdout = str(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK") or "")
        if not self._stages or stdout.endswith(("json", "jsonl")):
            return
        self._display.banner("STAGES")
        for line in format_stages(self._stages, time.monotonic() - self._start):
            self._display.display(line)
