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

On the node, ``housekeep`` does the whole pass from the configuration the
agent stage writes (``render_config``: the isolated and housekeeping CPUs,
the pool state of a cmk node, the task names never to move): ``cmk
housekeep`` runs it, at boot and on a timer (docs/agent.md). It also takes
the isolated CPUs out of the unbound workqueues' mask
(``/sys/devices/virtual/workqueue/cpumask``) and out of each workqueue's own
(``WQ_SYSFS``) mask, which kernels before 6.10 do not do for ``isolcpus``.
A cmk workload and every process it started are left alone: with
``--no-affinity`` it is allowed everywhere on purpose.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core.cpulist import format_cpulist, format_sysfs_cpumask, parse_cpulist, parse_cpumask
from ..core.errors import CpulistError, StateError
from .power import parse_power_lines, power_pass, render_power_lines
from .tasks import Facts, kernel_cpus, read_cmk_held, read_node_masks, read_tasks

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
    keep: Iterable[str | re.Pattern] = (),
) -> list[Move]:
    """The threads of ``tasks`` (``tasks.read_tasks``, with ``pods=True``) to move, in the order read.

    ``isolated``: the CPUs to keep free (the plan's isolated CPUs);
    ``housekeeping``: where the moved threads go; ``online``: the node's
    online CPUs (a task allowed on all of them is one nobody pinned);
    ``node_masks``: each NUMA node's CPUs; ``held``: the thread group ids of
    the workloads (cmk's tasks), never moved; ``keep``: regular expressions
    of task names (``comm``, whole) never moved.
    """
    isolated, housekeeping, online = frozenset(isolated), frozenset(housekeeping), frozenset(online)
    kept = [re.compile(pattern) for pattern in keep]
    if not housekeeping:
        raise ValueError("no housekeeping CPUs to move tasks to")
    nodes = [frozenset(mask) for mask in node_masks]
    held = frozenset(held)
    moves = []
    for task in tasks:
        allowed = frozenset(task.get("allowed") or ())
        if not allowed & isolated or any(pattern.fullmatch(task["comm"]) for pattern in kept):
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


# The pass on the node ---------------------------------------------------------------

#: Where the agent stage writes the housekeeper's configuration (``render_config``).
CONFIG_PATH = "/etc/cpupools/housekeep.conf"
WORKQUEUE_DIR = "sys/devices/virtual/workqueue"
#: First line of the configuration (the stages' header, node/stage_check.py: edits are overwritten).
CONFIG_HEADER = "# Managed by cpupools (Ansible). Local edits are overwritten by the next run.\n"


def render_config(
    isolated: str, housekeeping: str, conf_dir: str | None, keep: Iterable[str] = (), power: Mapping | None = None
) -> str:
    """The housekeeper's configuration, ``key=value`` lines: the plan's ``isolated`` and ``housekeeping``
    CPUs (cpulists), the pool state directory of a cmk node (``conf_dir``: its workloads are never moved;
    absent on other runtimes), one ``keep`` line per task name never moved (a regular expression), and
    the planned power settings (``power.plan_power``'s): one ``power`` line per group of CPUs, one
    ``uncore`` line per uncore domain (node/power.py applies them)."""
    lines = [
        CONFIG_HEADER.rstrip("\n"),
        "# cmk housekeep (docs/agent.md): kernel threads and host tasks nobody pinned are moved",
        "# off the isolated CPUs to the housekeeping CPUs.",
        f"isolated={isolated}",
        f"housekeeping={housekeeping}",
    ]
    if conf_dir:
        lines.append(f"conf_dir={conf_dir}")
    lines += [f"keep={pattern}" for pattern in keep]
    power_lines = render_power_lines(power or {})
    if power_lines:
        lines.append("# Power per pool (docs/power.md): set at boot before the kubelet, kept by every pass.")
        lines += power_lines
    return "\n".join(lines) + "\n"


def parse_config(text: str, where: str = CONFIG_PATH) -> dict:
    """``render_config``'s text back, checked: ``isolated``, ``housekeeping`` (CPU lists), ``conf_dir``
    (``None`` without), ``keep`` (compiled). A configuration that cannot be used raises ``StateError``."""
    raw: dict[str, str] = {}
    keep = []
    power_lines: list[tuple[str, str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or key not in ("isolated", "housekeeping", "conf_dir", "keep", "power", "uncore"):
            raise StateError(f"{where}:{number}: not a housekeeper configuration line: {line[:80]!r}")
        if key in ("power", "uncore"):
            power_lines.append((key, value, f"{where}:{number}"))
        elif key == "keep":
            try:
                keep.append(re.compile(value))
            except re.error as exc:
                raise StateError(f"{where}:{number}: keep={value}: not a regular expression ({exc})") from None
        else:
            raw[key] = value
    missing = [key for key in ("isolated", "housekeeping") if key not in raw]
    if missing:
        raise StateError(f"{where}: not a housekeeper configuration (no {' or '.join(missing)}=)")
    try:
        isolated = parse_cpulist(raw["isolated"], f"{where}: isolated")
        housekeeping = parse_cpulist(raw["housekeeping"], f"{where}: housekeeping")
    except CpulistError as exc:
        raise StateError(str(exc)) from None
    if not housekeeping:
        raise StateError(f"{where}: no housekeeping CPUs to move tasks to")
    conf_dir = raw.get("conf_dir") or None
    if conf_dir is not None and not conf_dir.startswith("/"):
        raise StateError(f"{where}: conf_dir={conf_dir} is not an absolute path")
    return {
        "isolated": isolated,
        "housekeeping": housekeeping,
        "conf_dir": conf_dir,
        "keep": keep,
        "power": parse_power_lines(power_lines),
    }


_PROCESSOR = re.compile(r"^processor\s*:?\s*(\d+)", re.M)


def cpuinfo_cpus(text: str | None) -> list[int]:
    """The CPUs ``/proc/cpuinfo`` lists (its ``processor`` lines: x86 and arm64 ``processor : N``, s390x
    ``processor N:``); ``[]`` without the file."""
    return sorted({int(number) for number in _PROCESSOR.findall(text or "")})


def workloads(tasks: Iterable[Mapping], held: Iterable[int]) -> set[int]:
    """The thread group ids of the ``held`` processes and of every process they started (by ``ppid``)."""
    parent = {task["tgid"]: task["ppid"] for task in tasks if task["pid"] == task["tgid"]}
    out = set(held)
    for tgid in parent:
        seen, pid = [], tgid
        while pid in parent and pid not in out and pid not in seen and pid > 1:
            seen.append(pid)
            pid = parent[pid]
        if pid in out:
            out.update(seen)
    return out


def plan_workqueues(facts: Facts, isolated: set[int], housekeeping: list[int]) -> list[dict]:
    """The workqueue masks that hold an isolated CPU, each with what to write (the housekeeping CPUs)."""
    wanted = format_sysfs_cpumask(housekeeping)
    out = []
    names = ["", *(f"{name}/" for name in facts.listdir(WORKQUEUE_DIR))]
    for name in names:
        rel = f"{WORKQUEUE_DIR}/{name}cpumask"
        text = facts.read(rel)
        if text is None:
            continue
        try:
            mask = set(parse_cpumask(text, rel))
        except CpulistError:
            continue
        if mask & isolated:
            out.append(
                {"path": "/" + rel, "from": format_cpulist(mask), "to": format_cpulist(housekeeping), "mask": wanted}
            )
    return out


def write_workqueues(facts: Facts, changes: list[dict]) -> None:
    for change in changes:
        try:
            with open(facts.path(change["path"]), "w") as handle:
                handle.write(change["mask"] + "\n")
            change["status"] = "written"
        except OSError as exc:
            change["status"] = "refused"
            change["error"] = errno.errorcode.get(exc.errno or 0, str(exc.errno)) + f": {exc.strerror}"


def housekeep(
    config: Mapping,
    proc: Facts,
    sysfs: Facts,
    proc_fs: str = "/proc",
    check: bool = False,
    setaffinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity,
    power_only: bool = False,
) -> dict:
    """One pass: move what ``plan_moves`` finds, fix the workqueue masks; in ``check`` only say so.

    ``proc`` reads ``proc/`` (the node's, or a PID namespace's), ``sysfs``
    reads ``sys/``; ``config`` is ``parse_config``'s. A cmk node's state that
    cannot be read moves no user-space task (its workloads could not be told
    apart), only kernel threads, and says why.
    """
    isolated, housekeeping = set(config["isolated"]), config["housekeeping"]
    online = kernel_cpus(sysfs.read("sys/devices/system/cpu/online")) or sorted(isolated | set(housekeeping))
    # The CPUs the kernel runs, from /proc/cpuinfo: sysfs may be a fixture tree bind-mounted over the real
    # one (the molecule containers), which the plan was made from.
    running = cpuinfo_cpus(proc.read("proc/cpuinfo")) or online
    foreign = sorted((isolated | set(housekeeping)) - (set(online) & set(running)))
    if foreign:
        # A plan of another machine (facts read from a fixture tree, a test container) or of this one
        # before CPUs went offline: pinning the node's tasks by it would confine them to whatever its
        # CPU numbers happen to mean here. Nothing is moved; the plan's next run rewrites the file.
        why = (
            f"the configuration names CPUs this node does not have online ({format_cpulist(foreign)}; "
            f"online: {format_cpulist(set(online) & set(running))}): nothing moved"
        )
        return {"check": check, "moves": [], "workqueues": [], "power": [], "summary": why, "problem": why}
    try:
        power = power_pass(config.get("power"), sysfs, check)
    except StateError as exc:
        # Its saved values cannot be read: setting anything would lose what to give back. The tasks still move.
        power = {"writes": [], "summary": f"power: nothing set ({exc})", "problem": str(exc)}
    if power_only:
        out = {"check": check, "moves": [], "workqueues": [], "power": power["writes"], "summary": power["summary"]}
        if "problem" in power:
            out["problem"] = f"power settings not set: {power['problem']}"
        return out
    tasks = read_tasks(proc, pods=True)
    held: set[int] = set()
    problem = None
    if config["conf_dir"]:
        holders, _stale, problem = read_cmk_held(config["conf_dir"], proc_fs)
        held = {pid for holder in holders for pid in holder["pids"]}
    if problem:
        tasks = [task for task in tasks if is_kernel_thread(task)]
    moves = plan_moves(
        tasks,
        isolated,
        housekeeping,
        online,
        read_node_masks(sysfs),
        workloads(tasks, held),
        config["keep"],
    )
    queues = plan_workqueues(sysfs, isolated, housekeeping)
    if check:
        results = [{**move.to_result(), "status": "would move"} for move in moves]
        for change in queues:
            change["status"] = "would write"
    else:
        results = apply_moves(moves, setaffinity)
        write_workqueues(sysfs, queues)
    out = {
        "check": check,
        "moves": results,
        "workqueues": queues,
        "power": power["writes"],
        "summary": summary(results),
    }
    planned = config.get("power") or {}
    if power["writes"] or planned.get("cpus") or planned.get("uncore") or "problem" in power:
        out["summary"] += f"; {power['summary']}"
    if problem:
        out["problem"] = f"the pool state cannot be read, so no user-space task was moved: {problem}"
    if "problem" in power:
        out["problem"] = "; ".join(filter(None, [out.get("problem"), f"power settings not set: {power['problem']}"]))
    return out
