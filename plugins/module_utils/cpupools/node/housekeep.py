"""Keep kernel threads and host tasks off the isolated CPUs: which task goes where, and moving it.

``isolcpus`` and ``nohz_full`` keep the scheduler's load balancing off the
isolated CPUs, but not every task: a kernel thread the kernel binds to a
NUMA node (``kswapdN``, ``kcompactdN``) is allowed on the node's CPUs,
isolated ones included, and wake-ups keep it where it last ran; on cgroup
v2, once the kubelet enables the cpuset controller, the kernel gives the
tasks of the root's children every CPU again, and a host daemon such as
``systemd-udevd`` ran on an exclusive CPU on the Debian 13 guest although
systemd's ``CPUAffinity=`` had confined it at boot. ``verify.yml`` finds
both; this module moves them, as tuned's scheduler plugin does for its
``isolated_cores``.

What moves (``plan_moves``), each thread on its own (``sched_setaffinity``
takes a thread id):

- a kernel thread that may move (not ``PF_NO_SETAFFINITY``, allowed on more
  than one CPU, not an interrupt thread, whose affinity follows its IRQ's
  and which the ``irq`` check judges) and is allowed on an isolated CPU:
  to the housekeeping CPUs of its NUMA node where the kernel bound it to a
  node (all housekeeping CPUs when its node has none), to all housekeeping
  CPUs where it is allowed everywhere, and otherwise to what it is allowed
  on minus the isolated CPUs (left alone when nothing is left: it was bound
  there on purpose);
- a user-space task outside the workloads that nobody pinned (allowed on
  every online CPU): to the housekeeping CPUs. Left alone: the tasks of a
  pod (the kubelet places them through cgroups), the workloads cmk holds
  (``held``), and any task whose affinity someone chose (allowed on fewer
  than all CPUs), which ``verify.yml``'s ``process`` check judges instead.

``apply_moves`` moves them and says, per task, what happened: a task that
exited in between is ``gone``; one whose cpuset does not allow the
housekeeping CPUs is ``refused`` (it keeps its CPUs, and the result names
it). Reading and deciding write nothing, so check mode runs the same code
up to ``apply_moves``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core.cpulist import format_cpulist

#: ``/proc/PID/stat`` field 9 flags (include/linux/sched.h).
PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000

#: Interrupt threads (``irq/N-name``, threaded IRQs): the kernel sets their affinity from the IRQ's.
IRQ_THREAD = re.compile(r"^irq/\d+-")

KERNEL_THREAD = "kernel thread"
TASK = "task"


@dataclass(frozen=True)
class Move:
    """One thread to move: from ``allowed`` to ``target`` (sorted CPU numbers)."""

    tid: int
    tgid: int
    comm: str
    kind: str
    allowed: tuple[int, ...]
    target: tuple[int, ...]
    why: str

    def to_result(self) -> dict:
        return {
            "tid": self.tid,
            "tgid": self.tgid,
            "comm": self.comm,
            "kind": self.kind,
            "allowed": format_cpulist(self.allowed),
            "target": format_cpulist(self.target),
            "why": self.why,
        }


def is_kernel_thread(task: Mapping) -> bool:
    return bool(task["flags"] & PF_KTHREAD)


def per_cpu_bound(task: Mapping) -> bool:
    """A thread nothing may move: ``PF_NO_SETAFFINITY``, or allowed on one CPU only."""
    return bool(task["flags"] & PF_NO_SETAFFINITY) or (task.get("allowed") is not None and len(task["allowed"]) == 1)


def plan_moves(
    tasks: Iterable[Mapping],
    isolated: Iterable[int],
    housekeeping: Iterable[int],
    online: Iterable[int],
    node_masks: Iterable[Iterable[int]] = (),
    held: Iterable[int] = (),
) -> list[Move]:
    """The threads of ``tasks`` (``verify.read_tasks``, with ``pods=True``) to move, in the order read.

    ``isolated``: the CPUs to keep free (the plan's isolated CPUs);
    ``housekeeping``: where the moved threads go; ``online``: the node's
    online CPUs (a task allowed on all of them is one nobody pinned);
    ``node_masks``: each NUMA node's CPUs; ``held``: the thread group ids of
    the workloads (cmk's tasks), never moved.
    """
    isolated, housekeeping, online = frozenset(isolated), frozenset(housekeeping), frozenset(online)
    if not housekeeping:
        raise ValueError("no housekeeping CPUs to move tasks to")
    nodes = [frozenset(mask) for mask in node_masks]
    held = frozenset(held)
    moves = []
    for task in tasks:
        allowed = frozenset(task.get("allowed") or ())
        if not allowed & isolated:
            continue
        if is_kernel_thread(task):
            target, why = _kernel_thread_target(task, allowed, isolated, housekeeping, online, nodes)
            kind = KERNEL_THREAD
        else:
            target, why = _task_target(task, allowed, housekeeping, online, held)
            kind = TASK
        if target and target != allowed:
            moves.append(
                Move(
                    task["pid"], task.get("tgid", task["pid"]), task["comm"], kind, tuple(sorted(allowed)), target, why
                )
            )
    return moves


def _kernel_thread_target(
    task: Mapping,
    allowed: frozenset[int],
    isolated: frozenset[int],
    housekeeping: frozenset[int],
    online: frozenset[int],
    nodes: list[frozenset[int]],
) -> tuple[tuple[int, ...], str]:
    if per_cpu_bound(task) or IRQ_THREAD.match(task["comm"]):
        return (), ""
    if allowed in nodes:
        own = allowed & housekeeping
        if own:
            return tuple(sorted(own)), "bound to its NUMA node: to the node's housekeeping CPUs"
        return tuple(sorted(housekeeping)), "bound to a NUMA node without housekeeping CPUs: to all of them"
    if allowed >= online:
        return tuple(sorted(housekeeping)), "allowed everywhere: to the housekeeping CPUs"
    rest = allowed - isolated
    return tuple(sorted(rest)), "bound to some CPUs: to those that are not isolated"


def _task_target(
    task: Mapping, allowed: frozenset[int], housekeeping: frozenset[int], online: frozenset[int], held: frozenset[int]
) -> tuple[tuple[int, ...], str]:
    if task.get("tgid", task["pid"]) in held or task.get("pod") or not allowed >= online:
        return (), ""
    return tuple(sorted(housekeeping)), "a host task nobody pinned: to the housekeeping CPUs"


def apply_moves(
    moves: Iterable[Move], setaffinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity
) -> list[dict]:
    """Move each thread; one result per move: ``moved``, ``gone`` (it exited) or ``refused`` (with why)."""
    results = []
    for move in moves:
        result = {**move.to_result(), "status": "moved"}
        try:
            setaffinity(move.tid, move.target)
        except ProcessLookupError:
            result["status"] = "gone"
        except OSError as exc:
            result["status"] = "refused"
            # EINVAL: the target is outside the thread's cpuset (or it became PF_NO_SETAFFINITY)
            result["error"] = errno.errorcode.get(exc.errno, str(exc.errno)) + f": {exc.strerror}"
        results.append(result)
    return results


def summary(results: list[dict]) -> str:
    """One line: how many threads moved, and what was left."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    if not results:
        return "no kernel thread or host task to move off the isolated CPUs"
    said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    names = ", ".join(sorted({r["comm"] for r in results})[:8])
    return f"{len(results)} thread(s) to move off the isolated CPUs: {said} ({names})"
