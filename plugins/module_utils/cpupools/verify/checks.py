"""verify, judging: each check of docs/verify.md, from what ``gather`` read to findings.

A finding names its check, severity and CPUs. Field 9 of ``/proc/PID/stat`` is
the task's flags (``PF_KTHREAD``, ``PF_NO_SETAFFINITY``), field 39 the CPU it
last ran on (``node.tasks`` reads them).
"""

from __future__ import annotations

import re

from ..core.cpulist import format_cpulist, parse_cpulist
from ..hardware.power import per_cpu as power_per_cpu
from ..hardware.power import read_power
from ..node.housekeep import is_kernel_thread, per_cpu_bound

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


#: RCU's callback-offload kthreads: rcuop/N (preemptible RCU), rcuos/N (sched), rcuob/N (bh, old
#: kernels), rcuog/N (the grace-period kthread of the group led by CPU N).
RCU_THREAD = re.compile(r"^rcuo([a-z])/(\d+)$")


def finding(check: str, severity: str, cpus: Iterable[int], message: str, **detail: object) -> dict:
    return {"check": check, "severity": severity, "cpus": format_cpulist(cpus), "message": message, "detail": detail}


def cpus_text(cpus: Iterable[int]) -> str:
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
        where = f"effective on isolated CPU {cpus_text(on)} (affinity {cpus_text(irq['affinity'])})"
        detail = {"irq": irq["irq"], "effective": format_cpulist(irq["effective"])}
        if irq["managed"]:
            how = "inferred: no debugfs" if irq["managed_how"] != "debugfs" else "debugfs"
            if managed_irq and set(irq["affinity"]) & housekeeping:
                findings.append(
                    finding(
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
                    finding("irq", "info", on, f"{label} is {where}; managed ({how}): the kernel keeps it", **detail)
                )
        else:
            known = "not managed" if irq["managed"] is False else "not known to be managed"
            findings.append(finding("irq", "fail", on, f"{label} is {where}; {known}", **detail))
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
            finding(
                "irq",
                "info",
                cpus,
                f"{len(movable)} IRQ{'s' if len(movable) != 1 else ''} delivered to housekeeping CPUs "
                f"may be moved to isolated CPU {cpus_text(cpus)} (their affinity allows it): {names}{more}",
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
                finding(
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
        findings.append(finding("workqueue", "info", [], "no /sys/devices/virtual/workqueue/cpumask: not checked"))
        return section, findings
    inside = sorted(set(mask) & isolated)
    if inside:
        findings.append(
            finding(
                "workqueue",
                "fail",
                inside,
                f"unbound workqueues may run on isolated CPU {cpus_text(inside)}: "
                f"workqueue cpumask is {cpus_text(mask)}",
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
                finding(
                    "workqueue",
                    "fail",
                    bad,
                    f"workqueue {name} may run on isolated CPU {cpus_text(bad)}: its cpumask is {cpus_text(cpus)}, "
                    f"the unbound mask {cpus_text(mask)}",
                    workqueue=name,
                )
            )
        elif asked:
            findings.append(
                finding(
                    "workqueue",
                    "info",
                    [],
                    f"workqueue {name} asks for isolated CPU {cpus_text(asked)} (cpumask {cpus_text(cpus)}); "
                    f"the unbound mask {cpus_text(mask)} keeps it off them",
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
                f"(allowed {cpus_text(task['allowed'])})"
            )
            if per_node:
                keep = sorted(allowed - isolated)
                message += (
                    ": the kernel binds it to its NUMA node's CPUs, isolated ones included, and wake-ups keep it "
                    "where it last ran; the housekeeper (cpupools_housekeep, cmk housekeep) moves it at boot and "
                    "every interval" + (f", or by hand: taskset -pc {cpus_text(keep)} {task['pid']}" if keep else "")
                )
            findings.append(
                finding(check, "warn" if per_node else "fail", [task["processor"]], message, pid=task["pid"])
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
            finding(
                check,
                severity,
                cpus,
                f"{count} allowed on isolated CPU {cpus_text(cpus)} may be moved there ({names}); {why}",
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
        findings.append(finding("rcu", "info", [], "rcu_nocbs is not planned: offload not checked"))
    elif set(expected) != offloaded:
        missing = sorted(set(expected) - offloaded)
        extra = sorted(offloaded - set(expected))
        parts = []
        if missing:
            parts.append(f"not offloaded: CPU {cpus_text(missing)}")
        if extra:
            parts.append(f"offloaded without a plan: CPU {cpus_text(extra)}")
        findings.append(
            finding(
                "rcu",
                "fail",
                missing + extra,
                f"RCU callbacks are offloaded from CPU {cpus_text(offloaded)} (read from the {source}), "
                f"planned rcu_nocbs={cpus_text(expected)}: " + "; ".join(parts),
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
        findings.append(finding("nohz", "info", [], "nohz_full is not planned: tick not checked"))
    elif active is None:
        findings.append(
            finding(
                "nohz",
                "fail",
                expected_nohz,
                f"nohz_full={cpus_text(expected_nohz)} is planned but the kernel has no "
                "/sys/devices/system/cpu/nohz_full (built without CONFIG_NO_HZ_FULL)",
            )
        )
    elif set(active) != set(expected_nohz):
        findings.append(
            finding(
                "nohz",
                "fail",
                sorted(set(active) ^ set(expected_nohz)),
                f"the tick is stopped on CPU {cpus_text(active)} (nohz_full), planned {cpus_text(expected_nohz)}",
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
                finding(
                    "nohz",
                    "fail",
                    sorted(set(active_iso) ^ set(expected_isolated)),
                    f"the kernel isolates CPU {cpus_text(active_iso)} (/sys/devices/system/cpu/isolated), "
                    f"planned isolcpus {cpus_text(expected_isolated)}",
                )
            )
    section["ok"] = not any(f["severity"] == "fail" for f in findings)
    return section, findings


def holders(
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
                finding(
                    "cmk",
                    "fail",
                    sorted(allowed),
                    f"pid {task['pid']} ({task['comm']}) is pinned to exclusive CPU {cpus_text(allowed)} "
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
                finding(
                    "process",
                    "fail",
                    [cpu],
                    f"pid {task['pid']} ({task['comm']}) last ran on exclusive CPU {cpu} and nothing holds it "
                    f"there (allowed {cpus_text(allowed)})",
                    pid=task["pid"],
                )
            )
    for entry in cmk_stale:
        findings.append(
            finding(
                "cmk",
                "warn",
                entry["cpus"],
                f"CMK's state holds exclusive CPU {cpus_text(entry['cpus'])} for pid "
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
        finding(
            "power",
            "fail",
            members,
            f"CPU {cpus_text(members)}: {text}; the housekeeper sets what the plan says at boot and on every pass "
            "(cpupools_housekeep; something else changed it since, or its last pass was refused: "
            "journalctl -u cpupools-housekeep)",
        )
        for text, members in sorted(wrong.items(), key=lambda item: (item[1], item[0]))
    ]
