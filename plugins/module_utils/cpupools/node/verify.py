"""Is the node quiet? What runs on, and interrupts, its isolated CPUs, read from the running kernel.

Every check only reads ``/proc`` and ``/sys`` under a facts root (a fixture
tree in tests) and the pool state cpupools wrote under a root; the one thing
that acts is the latency measurement (``oslat`` from rt-tests), run through a
``run`` callable the caller gives (the module's ``run_command``; a subprocess
in tests) and never in check mode. The result is the shape of
docs/verify.md and of the ``cpupools_verify`` module's RETURN: findings,
worst first, each naming its check, severity and CPUs, and one row per CPU.

What each check reads and what fails it is in docs/verify.md; the kernel
facts it relies on:

* ``/proc/irq/N/effective_affinity_list`` is where the IRQ is delivered
  (absent on kernels and chips without it: ``smp_affinity_list`` stands in);
  the kernel keeps a *managed* IRQ (a multi-queue device's per-CPU vector,
  ``IRQD_AFFINITY_MANAGED`` in the ``dstate`` block of
  ``/sys/kernel/debug/irq/irqs/N``) on the CPUs it was spread over, isolated
  or not; with ``isolcpus=managed_irq`` only while no housekeeping CPU is in
  its mask.
* field 9 of ``/proc/PID/stat`` is the task's flags (``PF_KTHREAD``,
  ``PF_NO_SETAFFINITY``), field 39 the CPU it last ran on.
* ``/sys/devices/virtual/workqueue/cpumask`` is a hex mask, 32-bit groups
  separated by commas, highest first.

Standard library only (it may run inside the node agent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from ..core.cpulist import format_cpulist, parse_cpulist, parse_cpumask, parse_isolcpus
from ..core.errors import CpulistError, VerifyError
from ..core.names import VERIFY_CHECKS
from ..hardware.power import per_cpu as power_per_cpu
from ..hardware.power import read_power
from ..hardware.topology import parse_kernel_cmdline
from .housekeep import is_kernel_thread, per_cpu_bound
from .state import DEFAULT_CONF_DIR
from .tasks import Facts, kernel_cpus, read_cmk_held, read_node_masks, read_tasks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

RESULT_VERSION = 1
#: What the result shows of each checked CPU's power settings (hardware/power.py's per_cpu): its cpufreq
#: governor and frequency range, and its deepest enabled idle state (None where the node has no driver).
POWER_KEYS = ("governor", "scaling_min_khz", "scaling_max_khz", "deepest", "disabled")
CHECKS = VERIFY_CHECKS
SEVERITIES = ("fail", "warn", "info")

#: The name kernel/irq/debugfs.c prints in the ``dstate`` block of a managed IRQ.
MANAGED_FLAG = "IRQD_AFFINITY_MANAGED"
#: RCU's callback-offload kthreads: rcuop/N (preemptible RCU), rcuos/N (sched), rcuob/N (bh, old
#: kernels), rcuog/N (the grace-period kthread of the group led by CPU N).
RCU_THREAD = re.compile(r"^rcuo([a-z])/(\d+)$")
#: A per-queue vector's action name: a queue index at its end (``nvme0q3``, ``virtio1-req.0``,
#: ``eth0-TxRx-5``, ``mlx5_comp7``, ``i40e-eth0-TxRx-3``), what managed spreading applies to.
QUEUE_NAME = re.compile(r"(?:q|queue|-|\.|_comp|comp|rx|tx|txrx|req\.?|input\.|output\.)\d+$", re.IGNORECASE)
#: The last (overflow) bucket of oslat's histogram counts everything at or above its label.
OSLAT_BUCKETS = 1024
#: The figures of one measured CPU in ``per_cpu`` (``latency.cpus`` adds ``overflows``).
LATENCY_KEYS = ("max_us", "p99_us", "p999_us", "avg_us", "min_us")
DEFAULT_KUBELET_STATE = "/var/lib/kubelet/cpu_manager_state"
DEFAULT_LATENCY = {
    "enabled": False,
    "tool_path": "oslat",
    "duration": 10,
    "cpus": "auto",
    "main_cpu": "auto",
    "max_us": None,
    "p99_us": None,
}


# Reading under the facts root ----------------------------------------------------


# Parsers (text in, data out) ------------------------------------------------------


def parse_interrupts(text: str) -> tuple[list[int], dict[str, dict]]:
    """``/proc/interrupts``: the CPUs of its columns and one row per source.

    A row is ``{"counts": {cpu: n}, "name": str, "device": bool}``: numbered
    rows are device IRQs (name: the action names after the chip and hwirq
    columns), the others the architecture's per-CPU rows (``LOC``, ``RES``,
    ``CAL``, ``TLB``, ...; name: their description). Columns are the online
    CPUs only, in the header's order; a row with fewer numbers (``ERR``) has
    counts for the first CPUs.
    """
    lines = text.splitlines()
    if not lines:
        return [], {}
    cpus = [int(word[3:]) for word in lines[0].split() if word.startswith("CPU") and word[3:].isdigit()]
    rows: dict[str, dict] = {}
    for line in lines[1:]:
        key, colon, rest = line.partition(":")
        key = key.strip()
        if not colon or not key:
            continue
        words = rest.split()
        counts: dict[int, int] = {}
        index = 0
        while index < len(words) and index < len(cpus) and words[index].isdigit():
            counts[cpus[index]] = int(words[index])
            index += 1
        tail = words[index:]
        device = key.isdigit()
        rows[key] = {"counts": counts, "name": _action_names(tail) if device else " ".join(tail), "device": device}
    return cpus, rows


_HWIRQ = re.compile(r"^(?:\d+|None)-\S+$")


def _action_names(words: list[str]) -> str:
    """The action names of a device IRQ row: what follows ``<hwirq>-<flow>`` (x86:
    ``IO-APIC 5-edge ACPI:Ged``) or ``Level``/``Edge`` (arm64: ``GICv3 27 Level arch_timer``)."""
    for index, word in enumerate(words):
        if _HWIRQ.match(word) or word in ("Level", "Edge"):
            return " ".join(words[index + 1 :])
    return ""


def parse_debugfs_irq(text: str) -> bool:
    """Whether a ``/sys/kernel/debug/irq/irqs/N`` dump names ``IRQD_AFFINITY_MANAGED`` (its ``dstate`` block
    lists one set flag per line, indented)."""
    return any(line.strip() == MANAGED_FLAG for line in text.splitlines())


# Gathering --------------------------------------------------------------------------


def read_irqs(facts: Facts, actions: Mapping[str, str] | None = None) -> list[dict]:
    """Every ``/proc/irq/N`` with a handler: effective CPUs, affinity, action names, managed or not.

    ``managed`` is read from debugfs when it is readable (``managed_how`` "debugfs"),
    else inferred (``managed_how`` says so) or ``None`` when nothing suggests it.
    """
    actions = actions or {}
    default = facts.read("proc/irq/default_smp_affinity")
    default_cpus = parse_cpumask(default) if default else None
    debugfs = facts.path("sys/kernel/debug/irq/irqs")
    debugfs_ok = os.access(debugfs, os.R_OK | os.X_OK) and os.path.isdir(debugfs)
    out = []
    for name in facts.listdir("proc/irq"):
        if not name.isdigit():
            continue
        base = f"proc/irq/{name}"
        affinity_text = facts.read(f"{base}/smp_affinity_list")
        if affinity_text is None:
            continue  # freed while we read
        effective_text = facts.read(f"{base}/effective_affinity_list")
        try:
            affinity = kernel_cpus(affinity_text)
            effective = kernel_cpus(effective_text) if effective_text is not None else affinity
        except CpulistError:
            continue
        label = actions.get(name) or ", ".join(
            entry for entry in facts.listdir(base) if os.path.isdir(facts.path(f"{base}/{entry}"))
        )
        if actions and name not in actions and not label:
            continue  # no handler: /proc/interrupts leaves it out, and it never fires
        managed: bool | None = None
        how: str | None = None
        dump = facts.read(f"sys/kernel/debug/irq/irqs/{name}") if debugfs_ok else None
        if dump is not None:
            managed, how = parse_debugfs_irq(dump), "debugfs"
        elif label and default_cpus is not None and affinity != default_cpus and QUEUE_NAME.search(label):
            # Without debugfs: a per-queue vector whose affinity is not the default
            # (irqaffinity=) set, and that no driver hint put there (virtio-net and
            # many NICs hint one CPU per queue without the kernel managing it), was
            # spread by the kernel: managed, as far as can be told.
            hint = facts.read(f"{base}/affinity_hint")
            try:
                hinted = bool(hint and parse_cpumask(hint))
            except CpulistError:
                hinted = True
            if not hinted:
                managed, how = True, "per-queue vector (inferred)"
        out.append(
            {
                "irq": name,
                "name": label,
                "effective": effective,
                "affinity": affinity,
                "effective_from": "effective_affinity_list" if effective_text is not None else "smp_affinity_list",
                "managed": managed,
                "managed_how": how,
            }
        )
    out.sort(key=lambda item: int(item["irq"]))
    return out


def read_workqueues(facts: Facts) -> dict:
    """The unbound workqueue mask and each WQ_SYSFS workqueue's own mask (``None``: no file)."""
    base = "sys/devices/virtual/workqueue"
    text = facts.read(f"{base}/cpumask")
    own = {}
    for name in facts.listdir(base):
        mask = facts.read(f"{base}/{name}/cpumask")
        if mask is not None:
            own[name] = parse_cpumask(mask, f"{base}/{name}/cpumask")
    return {"cpumask": None if text is None else parse_cpumask(text, f"{base}/cpumask"), "workqueues": own}


def read_kernel(facts: Facts) -> dict:
    """Release, command line and what sysfs says is isolated and tickless (``None``: no such file)."""
    cmdline = (facts.read("proc/cmdline") or "").strip()
    isolated = facts.read("sys/devices/system/cpu/isolated")
    nohz = facts.read("sys/devices/system/cpu/nohz_full")
    try:
        args = parse_kernel_cmdline(cmdline, isolated or "", nohz or "")
    except CpulistError as exc:
        raise VerifyError(f"the running kernel's command line cannot be read: {exc}") from None
    return {
        "release": (facts.read("proc/sys/kernel/osrelease") or "").strip(),
        "cmdline": cmdline,
        "args": args,
        "isolated": None if isolated is None else list(args.isolated_active),
        "nohz_full": None if nohz is None else list(args.nohz_full_active),
    }


def read_kubelet_held(text: str | None) -> list[dict]:
    """The kubelet's ``cpu_manager_state`` entries: ``[{"holder": "pod/container", "cpus": [...]}]``."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    held = []
    if isinstance(entries, dict):
        for pod, containers in sorted(entries.items()):
            if isinstance(containers, dict):
                for container, cpus in sorted(containers.items()):
                    try:
                        held.append({"holder": f"{pod}/{container}", "cpus": parse_cpulist(str(cpus))})
                    except CpulistError:
                        continue
    return held


# Judging ----------------------------------------------------------------------------


def _finding(check: str, severity: str, cpus: Iterable[int], message: str, **detail: object) -> dict:
    return {"check": check, "severity": severity, "cpus": format_cpulist(cpus), "message": message, "detail": detail}


def _list(cpus: Iterable[int]) -> str:
    return format_cpulist(cpus) or "none"


def check_irqs(irqs: list[dict], isolated: set[int], housekeeping: set[int], managed_irq: bool) -> tuple[list, list]:
    """IRQs effective on an isolated CPU: unmanaged ones fail; managed ones are info
    (warn when ``isolcpus=managed_irq`` should have kept them on a housekeeping CPU of their mask)."""
    listed, findings = [], []
    movable = []
    for irq in irqs:
        on = sorted(set(irq["effective"]) & isolated)
        if not on:
            if set(irq["affinity"]) & isolated and not irq["managed"]:
                movable.append(irq)
            continue
        label = f"IRQ {irq['irq']}" + (f" ({irq['name']})" if irq["name"] else "")
        where = f"effective on isolated CPU {_list(on)} (affinity {_list(irq['affinity'])})"
        detail = {"irq": irq["irq"], "effective": format_cpulist(irq["effective"])}
        if irq["managed"]:
            how = "inferred: no debugfs" if irq["managed_how"] != "debugfs" else "debugfs"
            if managed_irq and set(irq["affinity"]) & housekeeping:
                findings.append(
                    _finding(
                        "irq",
                        "warn",
                        on,
                        f"{label} is {where}; managed ({how}), but its mask holds housekeeping CPUs "
                        "and isolcpus=managed_irq should keep it there",
                        **detail,
                    )
                )
            else:
                findings.append(
                    _finding("irq", "info", on, f"{label} is {where}; managed ({how}): the kernel keeps it", **detail)
                )
        else:
            known = "not managed" if irq["managed"] is False else "not known to be managed"
            findings.append(_finding("irq", "fail", on, f"{label} is {where}; {known}", **detail))
        listed.append(
            {
                "irq": irq["irq"],
                "name": irq["name"],
                "effective": format_cpulist(irq["effective"]),
                "affinity": format_cpulist(irq["affinity"]),
                "managed": irq["managed"],
                "managed_how": irq["managed_how"],
            }
        )
    if movable:
        cpus = sorted({cpu for irq in movable for cpu in irq["affinity"] if cpu in isolated})
        names = ", ".join(f"{irq['irq']} ({irq['name']})" for irq in movable[:8])
        more = f" and {len(movable) - 8} more" if len(movable) > 8 else ""
        findings.append(
            _finding(
                "irq",
                "info",
                cpus,
                f"{len(movable)} IRQ{'s' if len(movable) != 1 else ''} delivered to housekeeping CPUs "
                f"may be moved to isolated CPU {_list(cpus)} (their affinity allows it): {names}{more}",
                irqs=[irq["irq"] for irq in movable],
            )
        )
    return listed, findings


def interrupt_growth(before: Mapping[str, dict], after: Mapping[str, dict], cpus: set[int]) -> dict[int, dict]:
    """Per CPU in ``cpus``: ``{source: increase}`` of every interrupt row whose count grew
    (source ``"IRQ 25 virtio0-input.0"`` for a device, ``"LOC"`` for a per-CPU row)."""
    grown: dict[int, dict] = {}
    for key, row in after.items():
        old = before.get(key, {"counts": {}})["counts"]
        source = f"IRQ {key} {row['name']}".rstrip() if row["device"] else key
        for cpu, count in row["counts"].items():
            if cpu in cpus and count > old.get(cpu, 0):
                grown.setdefault(cpu, {})[source] = count - old.get(cpu, 0)
    return grown


def check_interrupt_growth(grown: Mapping[int, dict], seconds: float) -> list[dict]:
    findings = []
    for cpu in sorted(grown):
        devices = {s: n for s, n in grown[cpu].items() if s.startswith("IRQ ")}
        if devices:
            listing = ", ".join(f"{s} +{n}" for s, n in sorted(devices.items()))
            findings.append(
                _finding(
                    "irq",
                    "warn",
                    [cpu],
                    f"device interrupts fired on isolated CPU {cpu} in {seconds:.1f} s: {listing}",
                    sources=devices,
                )
            )
    return findings


def check_workqueue(wq: dict, isolated: set[int]) -> tuple[dict, list]:
    findings = []
    mask = wq["cpumask"]
    if mask is None:
        section = {"cpumask": None, "isolated_in_mask": "", "ok": True, "workqueues": {}}
        findings.append(_finding("workqueue", "info", [], "no /sys/devices/virtual/workqueue/cpumask: not checked"))
        return section, findings
    inside = sorted(set(mask) & isolated)
    if inside:
        findings.append(
            _finding(
                "workqueue",
                "fail",
                inside,
                f"unbound workqueues may run on isolated CPU {_list(inside)}: workqueue cpumask is {_list(mask)}",
                cpumask=format_cpulist(mask),
            )
        )
    own = {}
    for name, cpus in sorted(wq["workqueues"].items()):
        # The kernel runs a workqueue on its own mask and the global one (the global
        # one alone when they do not meet): only that can reach an isolated CPU.
        effective = sorted(set(cpus) & set(mask)) or mask
        own[name] = format_cpulist(cpus)
        bad = sorted(set(effective) & isolated)
        asked = sorted(set(cpus) & isolated)
        if bad:
            findings.append(
                _finding(
                    "workqueue",
                    "fail",
                    bad,
                    f"workqueue {name} may run on isolated CPU {_list(bad)}: its cpumask is {_list(cpus)}, "
                    f"the unbound mask {_list(mask)}",
                    workqueue=name,
                )
            )
        elif asked:
            findings.append(
                _finding(
                    "workqueue",
                    "info",
                    [],
                    f"workqueue {name} asks for isolated CPU {_list(asked)} (cpumask {_list(cpus)}); "
                    f"the unbound mask {_list(mask)} keeps it off them",
                    workqueue=name,
                )
            )
    ok = not any(f["severity"] == "fail" for f in findings)
    section = {"cpumask": format_cpulist(mask), "isolated_in_mask": format_cpulist(inside), "ok": ok, "workqueues": own}
    return section, findings


def _movable_on(task: dict, isolated: set[int]) -> list[int]:
    return sorted(set(task["allowed"] or ()) & isolated)


def _movable_findings(
    check: str,
    what: str,
    movable: list[dict],
    isolated: set[int],
    domain: set[int],
    node_masks: Iterable[frozenset[int]] = (),
) -> list:
    """Findings for threads that may be moved and are allowed on isolated CPUs.

    One that last ran on an isolated CPU: fail, one finding each; warn when
    its allowed CPUs are exactly a NUMA node's (``node_masks``): the kernel
    itself binds its per-node threads (kswapd, kcompactd) to their node,
    isolated CPUs included, and nothing in the plan can prevent it; the
    finding says how to move it. The others are
    grouped in one finding: info where every isolated CPU they are allowed on is
    out of the scheduler's domains (``isolcpus=domain``: load balancing and
    wake-up placement never move a task there), warn where one is not (only
    ``nohz_full``, or no ``isolcpus``: the scheduler may put them there).
    """
    findings = []
    waiting: dict[str, list[dict]] = {"warn": [], "info": []}
    for task in movable:
        on = _movable_on(task, isolated)
        if task["processor"] in isolated:
            allowed = frozenset(task["allowed"])
            per_node = allowed in set(node_masks)
            message = (
                f"{what} {task['pid']} ({task['comm']}) last ran on isolated CPU {task['processor']} "
                f"(allowed {_list(task['allowed'])})"
            )
            if per_node:
                keep = sorted(allowed - isolated)
                message += (
                    ": the kernel binds it to its NUMA node's CPUs, isolated ones included, and wake-ups keep it "
                    "where it last ran; the housekeeper (cpupools_housekeep, cmk housekeep) moves it at boot and "
                    "every interval" + (f", or by hand: taskset -pc {_list(keep)} {task['pid']}" if keep else "")
                )
            findings.append(
                _finding(check, "warn" if per_node else "fail", [task["processor"]], message, pid=task["pid"])
            )
        else:
            waiting["info" if set(on) <= domain else "warn"].append(task)
    for severity, tasks in waiting.items():
        if not tasks:
            continue
        cpus = sorted({cpu for task in tasks for cpu in _movable_on(task, isolated)})
        names = ", ".join(f"{t['comm']}" for t in tasks[:8]) + (f" and {len(tasks) - 8} more" if len(tasks) > 8 else "")
        count = f"{len(tasks)} {what}{'s' if len(tasks) != 1 else ''}"
        why = (
            "the scheduler keeps them off CPUs isolcpus takes out of its domains"
            if severity == "info"
            else "they are not out of the scheduler's domains, so it may put them there"
        )
        findings.append(
            _finding(
                check,
                severity,
                cpus,
                f"{count} allowed on isolated CPU {_list(cpus)} may be moved there ({names}); {why}",
                pids=[t["pid"] for t in tasks],
            )
        )
    return findings


def _thread_entry(task: dict) -> dict:
    return {
        "pid": task["pid"],
        "comm": task["comm"],
        "allowed": format_cpulist(task["allowed"]),
        "cpu": task["processor"],
    }


def check_kthreads(
    tasks: list[dict], isolated: set[int], domain: set[int], node_masks: Iterable[frozenset[int]] = ()
) -> tuple[list, list]:
    """Kernel threads that may be moved (not per-CPU) and are allowed on isolated CPUs (rcuo* are RCU's)."""
    movable = [
        task
        for task in tasks
        if is_kernel_thread(task)
        and not per_cpu_bound(task)
        and not RCU_THREAD.match(task["comm"])
        and _movable_on(task, isolated)
    ]
    findings = _movable_findings("kthread", "kernel thread", movable, isolated, domain, node_masks)
    return [_thread_entry(t) for t in movable], findings


def check_rcu(
    tasks: list[dict],
    expected: list[int] | None,
    isolated: set[int],
    domain: set[int],
    possible: set[int],
    running_nocbs: set[int],
) -> tuple[dict, list]:
    """The CPUs whose callbacks are offloaded must be the planned ``rcu_nocbs``; every rcuo
    thread must stay off the isolated CPUs (they run the offloaded callbacks on housekeeping).

    Offloaded: the CPUs with an ``rcuop``/``rcuos``/``rcuob`` thread; but since Linux 5.17 the
    kernel starts one on every possible CPU when ``rcu_nocbs=`` or ``nohz_full=`` is given (so
    that offload can be switched at run time), and then the threads cannot tell: the running
    command line's ``rcu_nocbs`` and ``nohz_full`` (which implies it) are read instead, among
    the CPUs that have a thread.
    """
    threads: set[int] = set()
    for task in tasks:
        match = RCU_THREAD.match(task["comm"])
        if match and is_kernel_thread(task) and match.group(1) in ("p", "s", "b"):
            threads.add(int(match.group(2)))
    if not tasks:
        offloaded, source = threads | running_nocbs, "command line, as no task is visible to read the rcuo threads"
    elif possible and threads >= possible and len(threads) > 1:
        offloaded, source = threads & running_nocbs, "command line (an rcuo thread runs on every CPU)"
    else:
        offloaded, source = threads, "rcuo threads"
    movable = [
        task
        for task in tasks
        if RCU_THREAD.match(task["comm"]) and is_kernel_thread(task) and _movable_on(task, isolated)
    ]
    findings = _movable_findings("rcu", "RCU offload thread", movable, isolated, domain)
    if expected is None:
        findings.append(_finding("rcu", "info", [], "rcu_nocbs is not planned: offload not checked"))
    elif set(expected) != offloaded:
        missing = sorted(set(expected) - offloaded)
        extra = sorted(offloaded - set(expected))
        parts = []
        if missing:
            parts.append(f"not offloaded: CPU {_list(missing)}")
        if extra:
            parts.append(f"offloaded without a plan: CPU {_list(extra)}")
        findings.append(
            _finding(
                "rcu",
                "fail",
                missing + extra,
                f"RCU callbacks are offloaded from CPU {_list(offloaded)} (read from the {source}), "
                f"planned rcu_nocbs={_list(expected)}: " + "; ".join(parts),
            )
        )
    section = {
        "expected": None if expected is None else format_cpulist(expected),
        "offloaded": format_cpulist(offloaded),
        "offloaded_from": source,
        "threads": format_cpulist(threads),
        "threads_on_isolated": [_thread_entry(t) for t in movable],
        "ok": not any(f["severity"] == "fail" for f in findings),
    }
    return section, findings


def check_nohz(kernel: dict, expected_nohz: list[int] | None, expected_isolated: list[int] | None) -> tuple[dict, list]:
    """``/sys/devices/system/cpu/nohz_full`` against the planned ``nohz_full``; ``isolated``
    (the domain-isolated CPUs) against the planned ``isolcpus`` when that isolates domains."""
    findings = []
    active = kernel["nohz_full"]
    if expected_nohz is None:
        findings.append(_finding("nohz", "info", [], "nohz_full is not planned: tick not checked"))
    elif active is None:
        findings.append(
            _finding(
                "nohz",
                "fail",
                expected_nohz,
                f"nohz_full={_list(expected_nohz)} is planned but the kernel has no "
                "/sys/devices/system/cpu/nohz_full (built without CONFIG_NO_HZ_FULL)",
            )
        )
    elif set(active) != set(expected_nohz):
        findings.append(
            _finding(
                "nohz",
                "fail",
                sorted(set(active) ^ set(expected_nohz)),
                f"the tick is stopped on CPU {_list(active)} (nohz_full), planned {_list(expected_nohz)}",
            )
        )
    section = {
        "expected": None if expected_nohz is None else format_cpulist(expected_nohz),
        "active": None if active is None else format_cpulist(active),
        "isolated_expected": None if expected_isolated is None else format_cpulist(expected_isolated),
        "isolated_active": None if kernel["isolated"] is None else format_cpulist(kernel["isolated"]),
    }
    if expected_isolated is not None:
        active_iso = kernel["isolated"] or []
        if set(active_iso) != set(expected_isolated):
            findings.append(
                _finding(
                    "nohz",
                    "fail",
                    sorted(set(active_iso) ^ set(expected_isolated)),
                    f"the kernel isolates CPU {_list(active_iso)} (/sys/devices/system/cpu/isolated), "
                    f"planned isolcpus {_list(expected_isolated)}",
                )
            )
    section["ok"] = not any(f["severity"] == "fail" for f in findings)
    return section, findings


def _holders(
    tasks: list[dict], cmk_held: list[dict], kubelet_held: list[dict], runtime: str, exclusive: set[int]
) -> tuple[dict[int, dict[int, str]], dict[int, str]]:
    """Which tasks are held on which CPUs: ``({tid: {cpu: holder}}, {cpu: holder})``."""
    children: dict[int, list[int]] = {}
    for task in tasks:
        if task["pid"] == task["tgid"]:
            children.setdefault(task["ppid"], []).append(task["pid"])
    by_tgid: dict[int, list[dict]] = {}
    for task in tasks:
        by_tgid.setdefault(task["tgid"], []).append(task)
    held_tasks: dict[int, dict[int, str]] = {}
    held_cpus: dict[int, str] = {}
    for entry in cmk_held:
        for pid in entry["pids"]:
            holder = f"cmk pid {pid}"
            for cpu in entry["cpus"]:
                held_cpus.setdefault(cpu, holder)
            todo = [pid]
            seen: set[int] = set()
            while todo:
                current = todo.pop()
                if current in seen:
                    continue
                seen.add(current)
                for task in by_tgid.get(current, []):
                    for cpu in entry["cpus"]:
                        held_tasks.setdefault(task["pid"], {})[cpu] = holder
                todo.extend(children.get(current, []))
    assigned: set[int] = set()
    for entry in kubelet_held:
        holder = f"kubelet {entry['holder']}"
        uid = entry["holder"].split("/", 1)[0]
        cpus = set(entry["cpus"])
        assigned |= cpus
        for cpu in sorted(cpus & exclusive):
            held_cpus.setdefault(cpu, holder)
        for task in tasks:
            # The pod's own tasks, by their cgroup; where no cgroup can be read (a fixture
            # without them), a task allowed exactly the container's CPUs.
            pod = task.get("pod")
            ours = pod == uid if pod is not None else task["allowed"] is not None and set(task["allowed"]) == cpus
            if ours:
                for cpu in cpus:
                    held_tasks.setdefault(task["pid"], {})[cpu] = holder
    if runtime == "kubelet":
        # The CPUs the kubelet has not handed out are its shared pool: every pod's other
        # containers (Burstable, BestEffort, non-integer) run there. Not a process outside the pods.
        shared = exclusive - assigned
        for task in tasks:
            if task.get("pod"):
                for cpu in shared:
                    held_tasks.setdefault(task["pid"], {}).setdefault(cpu, "kubelet shared pool")
    if runtime not in ("cmk", "kubelet"):
        # cpu-pooler and the nri policies keep no record verify reads: a task pinned
        # inside the exclusive CPUs is taken to be the workload they pinned there.
        for task in tasks:
            if task["allowed"] and set(task["allowed"]) <= exclusive and not is_kernel_thread(task):
                for cpu in task["allowed"]:
                    held_tasks.setdefault(task["pid"], {})[cpu] = f"pinned ({runtime})"
                    held_cpus.setdefault(cpu, f"pinned ({runtime})")
    return held_tasks, held_cpus


def check_processes(
    tasks: list[dict],
    exclusive: set[int],
    held_tasks: Mapping[int, Mapping[int, str]],
    cmk_held: list[dict],
    cmk_stale: list[dict],
    runtime: str,
) -> tuple[list, dict, list]:
    """Strays (tasks that last ran on an exclusive CPU and nothing holds there) and what
    the runtime's record says against what runs (stale entries, unrecorded pinned tasks)."""
    strays, findings = [], []
    unrecorded = []
    for task in tasks:
        if task["state"] in ("Z", "X") or is_kernel_thread(task):
            # Kernel threads are judged by the kthread and rcu checks (a per-CPU one belongs there).
            continue
        cpu = task["processor"]
        allowed = set(task["allowed"] or ())
        held_here = held_tasks.get(task["pid"], {})
        pinned = bool(allowed) and allowed <= exclusive
        if pinned and not set(held_here) >= allowed:
            unrecorded.append(
                {
                    "pid": task["pid"],
                    "tgid": task["tgid"],
                    "comm": task["comm"],
                    "allowed": format_cpulist(allowed),
                    "cpu": cpu,
                }
            )
            record = "CMK's state" if runtime == "cmk" else "the kubelet's cpu_manager_state"
            findings.append(
                _finding(
                    "cmk",
                    "fail",
                    sorted(allowed),
                    f"pid {task['pid']} ({task['comm']}) is pinned to exclusive CPU {_list(allowed)} "
                    f"that {record} does not give it: they may be handed to another workload",
                    pid=task["pid"],
                )
            )
            continue
        if cpu in exclusive and cpu not in held_here:
            why = f"ran on exclusive CPU {cpu}, not held"
            item = {
                "pid": task["pid"],
                "comm": task["comm"],
                "cpu": cpu,
                "allowed": format_cpulist(allowed),
                "why": why,
            }
            if task["tgid"] != task["pid"]:
                item["tgid"] = task["tgid"]
            strays.append(item)
            findings.append(
                _finding(
                    "process",
                    "fail",
                    [cpu],
                    f"pid {task['pid']} ({task['comm']}) last ran on exclusive CPU {cpu} and nothing holds it "
                    f"there (allowed {_list(allowed)})",
                    pid=task["pid"],
                )
            )
    for entry in cmk_stale:
        findings.append(
            _finding(
                "cmk",
                "warn",
                entry["cpus"],
                f"CMK's state holds exclusive CPU {_list(entry['cpus'])} for pid "
                f"{', '.join(map(str, entry['pids']))}, which no longer runs (reconcile frees it)",
                pool=entry["pool"],
            )
        )
    running: dict[int, set[int]] = {}
    for task in tasks:
        for cpu_holder in held_tasks.get(task["pid"], {}).values():
            if cpu_holder.startswith("cmk pid "):
                running.setdefault(int(cpu_holder[8:]), set()).add(task["processor"])
    cmk = {
        "held": [
            {
                "pool": e["pool"],
                "cpus": format_cpulist(e["cpus"]),
                "pids": e["pids"],
                "running_on": format_cpulist(set().union(*(running.get(p, set()) for p in e["pids"]))),
            }
            for e in cmk_held
        ],
        "stale": [{"pool": e["pool"], "cpus": format_cpulist(e["cpus"]), "pids": e["pids"]} for e in cmk_stale],
        "unrecorded": unrecorded,
    }
    return strays, cmk, findings


# Latency (oslat) ----------------------------------------------------------------------


def oslat_capabilities(help_text: str) -> dict:
    """What the installed oslat accepts, from its ``--help``: ``--json`` (rt-tests 2.0 and later),
    ``--zero-omit`` and ``--bucket-size``."""
    return {
        "json": "--json" in help_text,
        "zero_omit": "--zero-omit" in help_text,
        "bucket_size": "--bucket-size" in help_text,
    }


def parse_oslat_version(text: str) -> str | None:
    """``oslat V 2.40`` -> ``"2.40"``."""
    match = re.search(r"oslat V\s*(\S+)", text)
    return match.group(1) if match else None


def oslat_argv(
    tool: str, cpus: list[int], main_cpu: int, duration: int, caps: Mapping[str, bool], json_path: str | None
) -> list[str]:
    argv = [tool, "--cpu-list", format_cpulist(cpus), "--cpu-main-thread", str(main_cpu)]
    argv += ["--duration", f"{int(duration)}", "--quiet"]
    if caps.get("bucket_size"):
        argv += ["--bucket-size", str(OSLAT_BUCKETS)]
    if caps.get("zero_omit"):
        argv.append("--zero-omit")
    if caps.get("json") and json_path:
        argv.append(f"--json={json_path}")
    return argv


def percentile(histogram: Mapping[int, int], fraction: float, overflow_key: int | None, maximum: int) -> int:
    """The ``fraction`` quantile (0.99) of an oslat histogram, in µs, rounded up to its bucket.

    A bucket labelled ``k`` holds the loops that took less than ``k`` µs (oslat
    counts ``index = latency // 1 µs`` and prints ``index + 1``); the overflow bucket
    (``overflow_key``) holds everything from its label up, so a quantile that falls
    there is given as the measured maximum, the one bound known.
    """
    total = sum(histogram.values())
    if total == 0:
        return 0
    need = fraction * total
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        if seen >= need:
            return max(key, maximum) if key == overflow_key else key
    return maximum


def _summarise(histogram: Mapping[int, int], low: int, avg: float, high: int, overflow_key: int) -> dict:
    return {
        "min_us": low,
        "avg_us": round(avg, 3),
        "max_us": high,
        "p99_us": percentile(histogram, 0.99, overflow_key, high),
        "p999_us": percentile(histogram, 0.999, overflow_key, high),
        "overflows": histogram.get(overflow_key, 0),
    }


def parse_oslat_json(text: str, buckets: int = OSLAT_BUCKETS) -> dict[int, dict]:
    """Per CPU from oslat's ``--json`` file: min/avg/max and p99/p99.9 in µs."""
    data = json.loads(text)
    out = {}
    for thread in (data.get("thread") or {}).values():
        histogram = {int(k): int(v) for k, v in (thread.get("histogram") or {}).items()}
        cpu = int(thread["cpu"])
        out[cpu] = _summarise(histogram, int(thread["min"]), float(thread["avg"]), int(thread["max"]), buckets)
    return out


def parse_oslat_text(text: str) -> dict[int, dict]:
    """Per CPU from oslat's text output (older rt-tests without ``--json``).

    One column per measured CPU, in the order of the ``Core:`` line; histogram rows
    ``NNN (us): c1 c2``, the last one marked ``(including overflows)``;
    ``...`` where ``--zero-omit`` left out empty rows.
    """
    cpus: list[int] = []
    histograms: list[dict[int, int]] = []
    values: dict[str, list[str]] = {}
    overflow_key = None
    for line in text.splitlines():
        head, colon, rest = line.partition(":")
        head = head.strip()
        if not colon:
            continue
        words = rest.replace("(us)", "").replace("(sec)", "").replace("(Mhz)", "").split()
        if head == "Core":
            cpus = [int(w) for w in words]
            histograms = [{} for cpu in cpus]
        elif head.endswith("(us)") and head[:-4].strip().isdigit():
            key = int(head[:-4])
            if "(including overflows)" in rest:
                overflow_key = key
            for index, count in enumerate(words[: len(cpus)]):
                histograms[index][key] = int(count)
        elif head in ("Minimum", "Average", "Maximum"):
            values[head] = words[: len(cpus)]
    if not cpus or not all(k in values for k in ("Minimum", "Average", "Maximum")):
        raise VerifyError("oslat's output holds no result (no Core:, Minimum, Average and Maximum lines)")
    return {
        cpu: _summarise(
            histograms[i],
            int(values["Minimum"][i]),
            float(values["Average"][i]),
            int(values["Maximum"][i]),
            overflow_key if overflow_key is not None else -1,
        )
        for i, cpu in enumerate(cpus)
    }


def latency_cpus(
    setting: object, exclusive: list[int], held: set[int], housekeeping: list[int], main: object
) -> tuple[list[int], list[int], int | None, list[int]]:
    """``(measured, comparison housekeeping CPUs, main CPU, held CPUs left out)``.

    ``auto``: every exclusive CPU no workload holds, and the last housekeeping CPU
    for comparison when another housekeeping CPU is left for oslat's main thread.
    A given cpulist is measured as given, less the held CPUs. The main thread
    (``auto``) goes on the first housekeeping CPU not measured.
    """
    if setting in (None, "", "auto"):
        wanted = list(exclusive)
        comparison = [housekeeping[-1]] if len(housekeeping) > 1 else []
        wanted += comparison
    else:
        try:
            wanted = parse_cpulist(setting, "latency.cpus")
        except CpulistError as exc:
            raise VerifyError(str(exc)) from None
        comparison = [cpu for cpu in wanted if cpu in housekeeping]
    left_out = sorted(set(wanted) & held)
    measured = sorted(set(wanted) - held)
    if main in (None, "", "auto"):
        free = [cpu for cpu in housekeeping if cpu not in measured]
        main_cpu = free[0] if free else (housekeeping[0] if housekeeping else None)
    else:
        try:
            main_cpu = int(main)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise VerifyError(f"latency.main_cpu {main!r} is not a CPU number or auto") from None
    return measured, [c for c in comparison if c in measured], main_cpu, left_out


def measure_latency(
    settings: Mapping[str, object],
    measured: list[int],
    main_cpu: int | None,
    check_mode: bool,
    run: Callable[[list[str]], tuple[int, str, str]] | None,
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[dict, list]:
    """Run oslat on ``measured`` (unless check mode) and read its figures."""
    duration = int(settings.get("duration") or 10)  # type: ignore[call-overload]
    tool_name = str(settings.get("tool_path") or "oslat")
    section: dict = {
        "tool": "oslat",
        "version": None,
        "argv": [],
        "duration_s": duration,
        "cpus": {},
        "thresholds": {"max_us": settings.get("max_us"), "p99_us": settings.get("p99_us")},
        "ok": True,
        "skipped": None,
    }
    findings: list[dict] = []
    if not settings.get("enabled"):
        section["skipped"] = "not enabled"
        return section, findings
    if not measured:
        section["skipped"] = "no CPU left to measure"
        findings.append(_finding("latency", "info", [], "latency not measured: no CPU left to measure"))
        return section, findings
    if main_cpu is None:
        section["skipped"] = "no housekeeping CPU for oslat's main thread"
        return section, findings
    tool = which(tool_name)
    if check_mode:
        caps = {"json": True, "zero_omit": True, "bucket_size": True}
        argv = oslat_argv(tool or tool_name, measured, main_cpu, duration, caps, "<result.json>")
        section["argv"] = argv
        section["skipped"] = "check mode: would run " + " ".join(argv)
        return section, findings
    if tool is None or run is None:
        section["ok"] = False
        section["skipped"] = f"{tool_name} not found (Debian package rt-tests)"
        findings.append(
            _finding("latency", "fail", measured, f"latency not measured: {tool_name} not found (install rt-tests)")
        )
        return section, findings
    rc, out, err = run([tool, "--help"])
    caps = oslat_capabilities(out + err)
    out_v, err_v = run([tool, "--version"])[1:]
    section["version"] = parse_oslat_version(out_v + err_v) or parse_oslat_version(out + err)
    workdir = tempfile.mkdtemp(prefix="cpupools-oslat-")
    json_path = os.path.join(workdir, "oslat.json")
    try:
        argv = oslat_argv(tool, measured, main_cpu, duration, caps, json_path)
        section["argv"] = [a if a != f"--json={json_path}" else "--json=<result.json>" for a in argv]
        rc, out, err = run(argv)
        figures: dict[int, dict] | None = None
        problem = None
        if rc != 0:
            problem = f"oslat exited {rc}: {(err or out).strip()[-300:]}"
        else:
            try:
                if caps["json"] and os.path.exists(json_path):
                    with open(json_path, encoding="utf-8") as handle:
                        figures = parse_oslat_json(handle.read(), OSLAT_BUCKETS if caps["bucket_size"] else 32)
                else:
                    figures = parse_oslat_text(out)
            except (ValueError, KeyError, VerifyError) as exc:
                problem = f"oslat's output could not be read: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if figures is None:
        section["ok"] = False
        findings.append(_finding("latency", "fail", measured, f"latency not measured: {problem}"))
        return section, findings
    section["cpus"] = {str(cpu): figures[cpu] for cpu in sorted(figures)}
    return section, findings


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/usr/sbin"])
    return shutil.which(name, path=path)


def check_power(planned: Mapping, facts_root: str) -> list[dict]:
    """Each planned CPU's power settings as the node shows them (``cpupools_power``, hardware/power.py):
    a governor or scaling range other than planned, a C-state planned off that a CPU may enter, or one
    planned on that it may not, fails; the housekeeper sets them at boot and on every pass."""
    entries = planned.get("cpus") or []
    if not entries:
        return []
    cpus = sorted({cpu for entry in entries for cpu in parse_cpulist(entry["cpus"])})
    now = power_per_cpu(read_power(facts_root, cpus))
    wrong: dict[str, list[int]] = {}
    for entry in entries:
        names = entry.get("cstate_names") or {}
        for cpu in parse_cpulist(entry["cpus"]):
            found = now.get(cpu) or {}
            said = []
            if "governor" in entry and found.get("governor") != entry["governor"]:
                said.append(f"governor {found.get('governor')} (planned {entry['governor']})")
            for key, shown in (("min_khz", "scaling_min_khz"), ("max_khz", "scaling_max_khz")):
                if key in entry and found.get(shown) != entry[key]:
                    said.append(f"{key} {found.get(shown)} (planned {entry[key]})")
            disabled = set(found.get("disabled") or ())
            may = [
                names.get(str(i), f"state{i}")
                for i in entry.get("cstates_off") or ()
                if names.get(str(i)) not in disabled
            ]
            may_not = [
                names.get(str(i), f"state{i}") for i in entry.get("cstates_on") or () if names.get(str(i)) in disabled
            ]
            if may:
                said.append(f"may enter {', '.join(may)} (planned off: deeper than the {entry['pool']} pool's limit)")
            if may_not:
                said.append(f"may not enter {', '.join(may_not)} (planned on)")
            for text in said:
                wrong.setdefault(text, []).append(cpu)
    return [
        _finding(
            "power",
            "fail",
            members,
            f"CPU {_list(members)}: {text}; the housekeeper sets what the plan says at boot and on every pass "
            "(cpupools_housekeep; something else changed it since, or its last pass was refused: "
            "journalctl -u cpupools-housekeep)",
        )
        for text, members in sorted(wrong.items(), key=lambda item: (item[1], item[0]))
    ]


def check_latency(section: dict, judged: set[int]) -> list[dict]:
    """Threshold findings: a judged (isolated, measured) CPU over ``max_us`` or ``p99_us`` fails."""
    findings = []
    limits = section["thresholds"]
    for cpu_text, figures in section["cpus"].items():
        cpu = int(cpu_text)
        if cpu not in judged:
            continue
        for key, label in (("max_us", "max"), ("p99_us", "99th percentile")):
            limit = limits.get(key)
            if limit is not None and figures[key] > int(limit):
                findings.append(
                    _finding(
                        "latency",
                        "fail",
                        [cpu],
                        f"CPU {cpu}: oslat {label} latency {figures[key]} µs is over the threshold {limit} µs",
                        measured=figures[key],
                        threshold=limit,
                    )
                )
    if findings:
        section["ok"] = False
    return findings


# The whole verification -------------------------------------------------------------


def _plan_cpus(plan: Mapping, key: str) -> list[int]:
    try:
        return parse_cpulist(plan.get(key) or "", f"plan {key}")
    except CpulistError as exc:
        raise VerifyError(str(exc)) from None


def _expected(expected_args: Mapping[str, object], key: str) -> list[int] | None:
    value = expected_args.get(key)
    if value is None:
        return None
    try:
        if key == "isolcpus":
            flags, cpus = parse_isolcpus(str(value))
            return cpus if (not flags or "domain" in flags) else None
        return parse_cpulist(str(value), key)
    except CpulistError as exc:
        raise VerifyError(f"expected_args: {exc}") from None


def _role(cpu: int, plan_pools: Mapping[str, list[int]], housekeeping: set[int]) -> str:
    if cpu in housekeeping:
        return "housekeeping"
    for pool, cpus in plan_pools.items():
        if cpu in cpus:
            return pool
    return "isolated"


def verify(
    facts_root: str = "/",
    root: str = "/",
    conf_dir: str = DEFAULT_CONF_DIR,
    plan: Mapping | None = None,
    expected_args: Mapping[str, object] | None = None,
    latency: Mapping[str, object] | None = None,
    fail_on: Iterable[str] = CHECKS,
    kubelet_state: str = DEFAULT_KUBELET_STATE,
    check_mode: bool = False,
    run: Callable[[list[str]], tuple[int, str, str]] | None = None,
    pause: Callable[[], None] | None = None,
    now: float | None = None,
    which: Callable[[str], str | None] | None = None,
    reboot_pending: bool = False,
) -> dict:
    """Every check; the result of the contract (JSON-serialisable).

    ``reboot_pending``: the kernel stage found planned arguments the running
    kernel was not booted with; the kernel's checks then read the old kernel,
    and the result says so (a finding, the summary, ``reboot_pending``).

    ``run(argv) -> (rc, stdout, stderr)`` runs oslat, found by ``which(name)``
    (``shutil.which`` with ``/usr/bin`` and ``/usr/sbin`` added to ``PATH``);
    ``pause()`` is what happens between the two samples of ``/proc/interrupts``
    when no latency run separates them (one second's sleep).
    """
    if not isinstance(plan, dict) or "isolated_cpus" not in plan:
        raise VerifyError("plan must be the host's cpupools_plan (it has no isolated_cpus)")
    expected_args = expected_args or {}
    settings = dict(DEFAULT_LATENCY)
    settings.update({k: v for k, v in (latency or {}).items() if v is not None or k in ("max_us", "p99_us")})
    fail_on = set(fail_on)
    unknown = sorted(fail_on - set(CHECKS))
    if unknown:
        raise VerifyError(f"fail_on: unknown check {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    facts = Facts(facts_root)
    isolated = set(_plan_cpus(plan, "isolated_cpus"))
    housekeeping = _plan_cpus(plan, "housekeeping_cpus")
    pools = {}
    for pool, cpus in (plan.get("pool_cpus") or {}).items():
        try:
            pools[pool] = parse_cpulist(cpus, f"plan pool_cpus {pool}")
        except CpulistError as exc:
            raise VerifyError(str(exc)) from None
    exclusive = {cpu for pool in plan.get("exclusive_pools") or () for cpu in pools.get(pool, [])}
    runtime = str(plan.get("runtime") or "cmk")
    taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))

    kernel = read_kernel(facts)
    before_cpus, before = parse_interrupts(facts.read("proc/interrupts") or "")
    started = time.monotonic()
    findings: list[dict] = []

    irqs_all = read_irqs(facts, {k: r["name"] for k, r in before.items() if r["device"]})
    managed_irq = "managed_irq" in kernel["args"].isolcpus_flags
    irqs, found = check_irqs(irqs_all, isolated, set(housekeeping), managed_irq)
    findings += found

    workqueue, found = check_workqueue(read_workqueues(facts), isolated)
    findings += found

    tasks = read_tasks(facts, pods=runtime == "kubelet")
    if not tasks:
        findings.append(
            _finding(
                "process",
                "info",
                [],
                f"no task is visible under {facts.path('proc')}: the process, kernel thread and RCU thread "
                "checks read nothing (a facts root without /proc: a sandbox, a fixture)",
            )
        )
    domain = set(kernel["isolated"] or ())
    kthreads, found = check_kthreads(tasks, isolated, domain, read_node_masks(facts))
    findings += found
    args = kernel["args"]
    possible = set(kernel_cpus(facts.read("sys/devices/system/cpu/possible")))
    running_nocbs = set(args.rcu_nocbs or ()) | set(args.nohz_full or ())
    expected_nocbs = _expected(expected_args, "rcu_nocbs")
    if expected_nocbs is not None:  # nohz_full implies rcu_nocbs (the kernel offloads both)
        expected_nocbs = sorted(set(expected_nocbs) | set(_expected(expected_args, "nohz_full") or ()))
    rcu, found = check_rcu(tasks, expected_nocbs, isolated, domain, possible, running_nocbs)
    findings += found
    nohz, found = check_nohz(kernel, _expected(expected_args, "nohz_full"), _expected(expected_args, "isolcpus"))
    findings += found

    conf = os.path.join(root, conf_dir.lstrip("/"))
    proc_fs = facts.path("proc")
    cmk_held, cmk_stale, problem = ([], [], None) if runtime == "kubelet" else read_cmk_held(conf, proc_fs)
    if problem and runtime == "cmk" and exclusive:
        findings.append(_finding("cmk", "warn", [], f"CMK's state could not be read: {problem}"))
    kubelet_held = []
    if runtime == "kubelet":
        kubelet_held = read_kubelet_held(facts_read_root(root, kubelet_state))
    held_tasks, held_cpus = _holders(tasks, cmk_held, kubelet_held, runtime, exclusive)
    processes, cmk, found = check_processes(tasks, exclusive, held_tasks, cmk_held, cmk_stale, runtime)
    findings += found
    if problem:
        cmk["problem"] = problem

    measured, comparison, main_cpu, left_out = latency_cpus(
        settings.get("cpus"), sorted(exclusive & isolated), set(held_cpus), housekeeping, settings.get("main_cpu")
    )
    if settings.get("enabled") and left_out:
        findings.append(
            _finding(
                "latency",
                "info",
                left_out,
                f"CPU {_list(left_out)} not measured: held by a workload (a measurement would disturb it)",
            )
        )
    latency_section, found = measure_latency(settings, measured, main_cpu, check_mode, run, which or _which)
    findings += found
    findings += check_latency(latency_section, isolated)
    latency_section["left_out"] = format_cpulist(left_out)

    if latency_section["cpus"] == {} or check_mode or not settings.get("enabled"):
        (pause or (lambda: time.sleep(1.0)))()
    seconds = time.monotonic() - started
    after = parse_interrupts(facts.read("proc/interrupts") or "")[1]
    grown = interrupt_growth(before, after, isolated)
    findings += check_interrupt_growth(grown, seconds)

    findings += check_power(plan.get("power") or {}, facts_root)

    if reboot_pending:
        findings = [_pending(f) for f in findings]
        findings.append(
            _finding(
                "nohz",
                "warn",
                [],
                "a reboot is pending: the running kernel was booted before cpupools wrote the planned kernel "
                "arguments, so these checks read the old kernel (playbooks/reboot.yml reboots and verifies)",
            )
        )
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: (rank[f["severity"]], CHECKS.index(f["check"]), f["cpus"], f["message"]))
    ok = not any(f["severity"] == "fail" and f["check"] in fail_on for f in findings)

    rows = sorted(isolated | exclusive | set(comparison))
    power = read_power(facts_root, rows)
    power_of = power_per_cpu(power)
    per_cpu = {}
    for cpu in rows:
        named = [f for f in findings if cpu in set(parse_cpulist(f["cpus"]))]
        seen = [f"IRQ {i['irq']} {i['name']}".rstrip() for i in irqs if cpu in parse_cpulist(i["effective"])]
        seen += [f"pid {p['pid']} ({p['comm']})" for p in processes if p["cpu"] == cpu]
        seen += [f"pid {p['pid']} ({p['comm']})" for p in cmk["unrecorded"] if p["cpu"] == cpu]
        seen += [
            f"kernel thread {k['pid']} ({k['comm']})" for k in kthreads + rcu["threads_on_isolated"] if k["cpu"] == cpu
        ]
        seen += [f"{s} +{n}" for s, n in sorted(grown.get(cpu, {}).items())]
        figures = latency_section["cpus"].get(str(cpu))
        per_cpu[str(cpu)] = {
            "role": _role(cpu, pools, set(housekeeping)),
            "isolated": cpu in isolated,
            "quiet": not any(f["severity"] in ("fail", "warn") for f in named),
            "held_by": held_cpus.get(cpu),
            "found": seen,
            "latency": None if figures is None else {k: figures[k] for k in LATENCY_KEYS},
            "power": {k: power_of[cpu][k] for k in POWER_KEYS} if cpu in power_of else None,
        }
    result = {
        "version": RESULT_VERSION,
        "taken": taken,
        "kernel": {
            "release": kernel["release"],
            "cmdline": kernel["cmdline"],
            "isolated": None if kernel["isolated"] is None else format_cpulist(kernel["isolated"]),
            "nohz_full": None if kernel["nohz_full"] is None else format_cpulist(kernel["nohz_full"]),
        },
        "cpus_checked": format_cpulist(isolated | set(measured)),
        "ok": ok,
        "reboot_pending": bool(reboot_pending),
        "summary": ("reboot pending; " if reboot_pending else "") + summarise(per_cpu, findings, irqs, latency_section),
        "findings": findings,
        "per_cpu": per_cpu,
        "irqs": irqs,
        "workqueue": workqueue,
        "kthreads": kthreads,
        "rcu": rcu,
        "nohz": nohz,
        "processes": processes,
        "cmk": cmk,
        "latency": latency_section,
        "power": {
            "cpufreq": power["cpufreq"]["driver"],
            "mode": power["cpufreq"]["mode"],
            "turbo": power["cpufreq"]["turbo"],
            "cpuidle": power["cpuidle"]["driver"],
            "uncore": power["uncore"]["driver"],
        },
        "interrupts": {
            "seconds": round(seconds, 3),
            "grown": {str(cpu): grown[cpu] for cpu in sorted(grown)},
            "columns": format_cpulist(before_cpus),
        },
    }
    return result


#: The checks whose findings read the kernel's boot arguments: a pending reboot explains them.
BOOT_CHECKS = ("irq", "workqueue", "kthread", "rcu", "nohz")


def _pending(finding: dict) -> dict:
    """A finding of a check the boot arguments decide, saying that the kernel it read predates them."""
    if finding["check"] not in BOOT_CHECKS or finding["severity"] == "info":
        return finding
    return {**finding, "message": finding["message"] + " (reboot pending: the running kernel predates the plan)"}


def facts_read_root(root: str, path: str) -> str | None:
    """A file cpupools or the kubelet wrote, under ``root``."""
    return Facts(root).read(path)


def summarise(per_cpu: Mapping[str, dict], findings: list[dict], irqs: list[dict], latency: Mapping) -> str:
    isolated = [row for row in per_cpu.values() if row["isolated"]]
    quiet = sum(1 for row in isolated if row["quiet"])
    parts = [f"{quiet} of {len(isolated)} isolated CPUs quiet"]
    fails = sum(1 for f in findings if f["severity"] == "fail")
    warns = sum(1 for f in findings if f["severity"] == "warn")
    if fails:
        parts.append(f"{fails} failing finding{'s' if fails != 1 else ''}")
    if warns:
        parts.append(f"{warns} warning{'s' if warns != 1 else ''}")
    managed = sum(1 for irq in irqs if irq["managed"])
    if managed:
        parts.append(f"{managed} IRQ{'s' if managed != 1 else ''} kept on isolated CPUs by the kernel (managed)")
    if latency["cpus"]:
        worst = max(latency["cpus"].items(), key=lambda item: item[1]["max_us"])
        parts.append(f"max latency {worst[1]['max_us']} µs (CPU {worst[0]})")
    return "; ".join(parts)
