# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stdout callback of bench/fleet_bench.py: one JSON object at the end, and the main process's own CPU.

It runs in ansible-playbook's main process (callbacks always do), so at the
end of the run ``resource.getrusage(RUSAGE_SELF)`` is the CPU time of that
process alone: the strategy, the results thread, the callbacks, the forking
of workers; not the workers themselves (children). It prints, as one JSON
object: per host the results (tasks, module executions, changed), the
statistics, the main process's user and system CPU seconds, and with
``CPUPOOLS_BENCH_SIZES=1`` the size of each task's result (its JSON) per
task name, which costs the main process CPU of its own (keep it off when
timing). It measures too the part of that CPU which is a wait: when every
fork is busy, ansible-core's ``_queue_task`` loops until a worker ends, with
a 0.1 ms sleep between two looks at every worker and the RPC queue. That
loop's CPU grows with how long a worker takes (the node's module, which on
a real fleet runs on the node), not with the strategy's work per host;
``main_wait`` is the main thread's CPU from the first sleep of each such
wait to the last (the results of workers' RPC calls the loop hands on meanwhile,
``add_group`` of the plan's action, are in it: 1.6 % of the main process's
samples in a 200-host re-run). It also keeps the wall time of each task (from its start to the
next task's or play's) and its number of results (one for a task run once
for the play: the bench's serial part). Only ansible-core is needed (the bench ran ``ansible.posix.json``
before, which only the development set has).
"""

import json
import os
import resource
import sys
import time

import ansible.plugins.strategy as strategy_base
from ansible.executor.process.worker import WorkerProcess
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: bench_json
type: stdout
short_description: Counts, statistics and the main process's CPU of a run, as one JSON object (benchmarks only)
description:
  - Used by bench/fleet_bench.py; not part of the collection.
"""

#: Actions that run on the controller without executing a module.
CONTROLLER_ACTIONS = frozenset(
    {
        "set_fact",
        "assert",
        "debug",
        "group_by",
        "meta",
        "include_tasks",
        "import_tasks",
        "include_role",
        "validate_argument_spec",
        "add_host",
    }
)


class _WaitClock:
    """The strategy module's ``time``: its ``sleep`` marks a wait of ``_queue_task`` for a free worker."""

    def __init__(self, real):
        self._real = real
        self.waiting = False  # inside _queue_task
        self.first = None
        self.last = None
        self.total = 0.0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def sleep(self, seconds):
        if self.waiting and self.first is None:
            self.first = time.thread_time()
        self._real.sleep(seconds)
        if self.waiting:
            self.last = time.thread_time()


def _measure_waits() -> _WaitClock:
    """Wrap ``StrategyBase._queue_task`` once per process: the CPU between its first and last sleep."""
    clock = strategy_base.time
    if isinstance(clock, _WaitClock):
        return clock
    clock = strategy_base.time = _WaitClock(time)
    queue_task = strategy_base.StrategyBase._queue_task

    def measured(self, *args, **kwargs):
        clock.waiting, clock.first, clock.last = True, None, None
        try:
            return queue_task(self, *args, **kwargs)
        finally:
            clock.waiting = False
            if clock.first is not None and clock.last is not None:
                clock.total += clock.last - clock.first

    strategy_base.StrategyBase._queue_task = measured
    return clock


def _measure_workers() -> None:
    """With ``CPUPOOLS_BENCH_WORKERS`` (a file), each worker forked after this appends its own CPU seconds.

    One line per worker, ``<task name>\t<user + system>``, written as it ends:
    the task's worker alone (the action, the templating, the module's payload
    built and its result read), not the module's process, which a real fleet's
    node runs. The workers' CPU and the main process's are what the controller
    pays per host. bench/fleet_bench.py reads the file once ansible-playbook
    has exited (every worker has then ended).
    """
    path = os.environ.get("CPUPOOLS_BENCH_WORKERS")
    if not path or getattr(WorkerProcess.run, "bench_measured", False):
        return
    run = WorkerProcess.run

    def measured(self):
        try:
            return run(self)
        finally:
            times = os.times()
            line = f"{self._task.get_name()}\t{times.user + times.system:.4f}\n".encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)  # one write of a short line to a file opened to append: lines never mix
            finally:
                os.close(fd)

    measured.bench_measured = True
    WorkerProcess.run = measured


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "bench_json"

    def __init__(self):
        super().__init__()
        self._tasks = 0
        self._modules = 0
        self._failures = []
        self._warnings = 0
        self._changed = {}
        self._task_times = {}
        self._task_results = {}
        self._current = None
        self._sizes = {} if os.environ.get("CPUPOOLS_BENCH_SIZES") == "1" else None
        self._waits = _measure_waits()
        _measure_workers()

    def _count(self, result, failed=False):
        self._tasks += 1
        name = result.task.get_name()
        self._task_results[name] = self._task_results.get(name, 0) + 1
        action = str(result.task.action).rpartition(".")[2]
        if action not in CONTROLLER_ACTIONS:
            self._modules += 1
        self._warnings += len(result.result.get("warnings") or ())
        if failed:
            self._failures.append(f"{result.host.name}: {result.task.get_name()}: {result.result.get('msg', '')}")
        if self._sizes is not None:
            size = len(json.dumps(result.result, default=str))
            entry = self._sizes.setdefault(result.task.get_name(), [0, 0])
            entry[0] += 1
            entry[1] += size

    def _task_start(self, task):
        now = time.monotonic()
        if self._current is not None and self._current[0] is not None:
            name, start = self._current
            self._task_times[name] = self._task_times.get(name, 0.0) + now - start
        self._current = (None if task is None or not hasattr(task, "action") else task.get_name(), now)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_start(task)

    def v2_playbook_on_play_start(self, play):
        self._task_start(play)  # a play's start ends its previous play's last task

    def v2_runner_on_ok(self, result):
        self._count(result)
        if result.result.get("changed"):
            name = result.task.get_name()
            self._changed[name] = self._changed.get(name, 0) + 1

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result, failed=not ignore_errors)

    def v2_runner_on_unreachable(self, result):
        self._count(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._tasks += 1
        name = result.task.get_name()
        self._task_results[name] = self._task_results.get(name, 0) + 1

    def v2_playbook_on_stats(self, stats):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._task_start(None)
        hosts = sorted(stats.processed)
        out = {
            "main_cpu": {"user": usage.ru_utime, "system": usage.ru_stime},
            "main_wait": self._waits.total,
            "hosts": len(hosts),
            "tasks": self._tasks,
            "modules": self._modules,
            "changed": sum(stats.summarize(host)["changed"] for host in hosts),
            "changed_tasks": self._changed,
            "warnings": self._warnings,
            "task_seconds": {name: round(seconds, 3) for name, seconds in self._task_times.items()},
            "task_results": self._task_results,
            "failures": self._failures,
            "stats": {host: stats.summarize(host) for host in hosts},
        }
        if self._sizes is not None:
            out["sizes"] = {name: {"results": n, "bytes": b} for name, (n, b) in self._sizes.items()}
        sys.stdout.write("\n" + json.dumps(out) + "\n")
        sys.stdout.flush()
