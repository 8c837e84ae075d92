"""verify, the run: everything read, judged and measured for one node, in the result's shape.

The result is the shape of docs/verify.md and of the ``cpupools_verify``
module's RETURN: findings, worst first, each naming its check, severity and
CPUs, and one row per CPU.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from ..core.cpulist import format_cpulist, parse_cpulist, parse_isolcpus
from ..core.errors import CpulistError, VerifyError
from ..core.names import VERIFY_CHECKS
from ..hardware.power import per_cpu as power_per_cpu
from ..hardware.power import read_power
from ..node.state import DEFAULT_CONF_DIR
from ..node.tasks import Facts, kernel_cpus, read_cmk_held, read_node_masks, read_tasks
from .checks import (
    check_interrupt_growth,
    check_irqs,
    check_kthreads,
    check_nohz,
    check_power,
    check_processes,
    check_rcu,
    check_workqueue,
    cpus_text,
    finding,
    holders,
    interrupt_growth,
)
from .gather import (
    DEFAULT_KUBELET_STATE,
    facts_read_root,
    parse_interrupts,
    read_irqs,
    read_kernel,
    read_kubelet_held,
    read_workqueues,
)
from .latency import DEFAULT_LATENCY, LATENCY_KEYS, check_latency, find_tool, latency_cpus, measure_latency

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping


RESULT_VERSION = 1


#: What the result shows of each checked CPU's power settings (hardware/power.py's per_cpu): its cpufreq
#: governor and frequency range, and its deepest enabled idle state (None where the node has no driver).
POWER_KEYS = ("governor", "scaling_min_khz", "scaling_max_khz", "deepest", "disabled")


CHECKS = VERIFY_CHECKS


SEVERITIES = ("fail", "warn", "info")


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


class _Plan(NamedTuple):
    """The plan's CPUs, parsed once: what every step judges the node against."""

    isolated: set[int]
    housekeeping: list[int]
    pools: dict[str, list[int]]
    exclusive: set[int]
    runtime: str


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
    settings, fail_on = _arguments(plan, latency, fail_on)
    facts = Facts(facts_root)
    planned = _read_plan(plan)
    taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))

    kernel = read_kernel(facts)
    before_cpus, before = parse_interrupts(facts.read("proc/interrupts") or "")
    started = time.monotonic()
    sections, findings = _irq_checks(facts, kernel, before, planned)
    tasks = read_tasks(facts, pods=planned.runtime == "kubelet")
    threads, found = _thread_checks(facts, kernel, tasks, planned, expected_args or {})
    sections.update(threads)
    findings += found
    processes, held_cpus, found = _process_checks(facts, root, conf_dir, kubelet_state, tasks, planned)
    sections.update(processes)
    findings += found

    sections["latency"], measured, comparison, found = _latency_checks(
        settings, planned, held_cpus, check_mode, run, which
    )
    findings += found
    if sections["latency"]["cpus"] == {} or check_mode or not settings.get("enabled"):
        (pause or (lambda: time.sleep(1.0)))()
    interrupts, found = _interrupt_checks(facts, before_cpus, before, started, planned.isolated)
    findings += found
    findings += check_power(plan.get("power") or {}, facts_root)
    findings, ok = _judged(findings, fail_on, reboot_pending)

    rows = sorted(planned.isolated | planned.exclusive | set(comparison))
    power = read_power(facts_root, rows)
    per_cpu = _per_cpu(rows, planned, findings, sections, interrupts["grown"], held_cpus, power_per_cpu(power))
    checked = format_cpulist(planned.isolated | set(measured))
    return _result(taken, kernel, checked, ok, reboot_pending, findings, per_cpu, sections, power, interrupts)


def _arguments(plan: Mapping | None, latency: Mapping[str, object] | None, fail_on: Iterable[str]) -> tuple[dict, set]:
    """What is checked before anything is read: the plan's shape, latency's settings over the defaults, ``fail_on``."""
    if not isinstance(plan, dict) or "isolated_cpus" not in plan:
        raise VerifyError("plan must be the host's cpupools_plan (it has no isolated_cpus)")
    settings = dict(DEFAULT_LATENCY)
    settings.update({k: v for k, v in (latency or {}).items() if v is not None or k in ("max_us", "p99_us")})
    checks = set(fail_on)
    unknown = sorted(checks - set(CHECKS))
    if unknown:
        raise VerifyError(f"fail_on: unknown check {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return settings, checks


def _read_plan(plan: Mapping) -> _Plan:
    """The plan's cpulists as CPU numbers; one that does not parse is a VerifyError."""
    isolated = set(_plan_cpus(plan, "isolated_cpus"))
    housekeeping = _plan_cpus(plan, "housekeeping_cpus")
    pools = {}
    for pool, cpus in (plan.get("pool_cpus") or {}).items():
        try:
            pools[pool] = parse_cpulist(cpus, f"plan pool_cpus {pool}")
        except CpulistError as exc:
            raise VerifyError(str(exc)) from None
    exclusive = {cpu for pool in plan.get("exclusive_pools") or () for cpu in pools.get(pool, [])}
    return _Plan(isolated, housekeeping, pools, exclusive, str(plan.get("runtime") or "cmk"))


def _irq_checks(facts: Facts, kernel: dict, before: Mapping[str, dict], planned: _Plan) -> tuple[dict, list[dict]]:
    """IRQs and unbound workqueues on isolated CPUs (``before``, the first interrupts sample, names the IRQs)."""
    irqs_all = read_irqs(facts, {k: r["name"] for k, r in before.items() if r["device"]})
    managed_irq = "managed_irq" in kernel["args"].isolcpus_flags
    irqs, findings = check_irqs(irqs_all, planned.isolated, set(planned.housekeeping), managed_irq)
    workqueue, found = check_workqueue(read_workqueues(facts), planned.isolated)
    return {"irqs": irqs, "workqueue": workqueue}, findings + found


def _thread_checks(
    facts: Facts, kernel: dict, tasks: list[dict], planned: _Plan, expected_args: Mapping[str, object]
) -> tuple[dict, list[dict]]:
    """Kernel threads, RCU's offloading and nohz_full: the running kernel against the plan and its arguments."""
    findings = []
    if not tasks:
        findings.append(
            finding(
                "process",
                "info",
                [],
                f"no task is visible under {facts.path('proc')}: the process, kernel thread and RCU thread "
                "checks read nothing (a facts root without /proc: a sandbox, a fixture)",
            )
        )
    domain = set(kernel["isolated"] or ())
    kthreads, found = check_kthreads(tasks, planned.isolated, domain, read_node_masks(facts))
    findings += found
    args = kernel["args"]
    possible = set(kernel_cpus(facts.read("sys/devices/system/cpu/possible")))
    running_nocbs = set(args.rcu_nocbs or ()) | set(args.nohz_full or ())
    expected_nocbs = _expected(expected_args, "rcu_nocbs")
    if expected_nocbs is not None:  # nohz_full implies rcu_nocbs (the kernel offloads both)
        expected_nocbs = sorted(set(expected_nocbs) | set(_expected(expected_args, "nohz_full") or ()))
    rcu, found = check_rcu(tasks, expected_nocbs, planned.isolated, domain, possible, running_nocbs)
    findings += found
    nohz, found = check_nohz(kernel, _expected(expected_args, "nohz_full"), _expected(expected_args, "isolcpus"))
    return {"kthreads": kthreads, "rcu": rcu, "nohz": nohz}, findings + found


def _process_checks(
    facts: Facts, root: str, conf_dir: str, kubelet_state: str, tasks: list[dict], planned: _Plan
) -> tuple[dict, dict, list[dict]]:
    """Tasks on exclusive CPUs against what the runtime (CMK or the kubelet) says holds them.

    Returns the ``processes`` and ``cmk`` sections, ``{cpu: holder}`` and the findings.
    """
    runtime, exclusive = planned.runtime, planned.exclusive
    findings = []
    conf = os.path.join(root, conf_dir.lstrip("/"))
    cmk_held, cmk_stale, problem = ([], [], None) if runtime == "kubelet" else read_cmk_held(conf, facts.path("proc"))
    if problem and runtime == "cmk" and exclusive:
        findings.append(finding("cmk", "warn", [], f"CMK's state could not be read: {problem}"))
    kubelet_held = []
    if runtime == "kubelet":
        kubelet_held = read_kubelet_held(facts_read_root(root, kubelet_state))
    held_tasks, held_cpus = holders(tasks, cmk_held, kubelet_held, runtime, exclusive)
    processes, cmk, found = check_processes(tasks, exclusive, held_tasks, cmk_held, cmk_stale, runtime)
    findings += found
    if problem:
        cmk["problem"] = problem
    return {"processes": processes, "cmk": cmk}, held_cpus, findings


def _latency_checks(
    settings: Mapping[str, object],
    planned: _Plan,
    held_cpus: Mapping[int, str],
    check_mode: bool,
    run: Callable[[list[str]], tuple[int, str, str]] | None,
    which: Callable[[str], str | None] | None,
) -> tuple[dict, list[int], list[int], list[dict]]:
    """oslat on the CPUs no workload holds, judged; those it leaves out are said so.

    Returns the ``latency`` section, the measured CPUs, the housekeeping CPUs among them and the findings.
    """
    exclusive = sorted(planned.exclusive & planned.isolated)
    measured, comparison, main_cpu, left_out = latency_cpus(
        settings.get("cpus"), exclusive, set(held_cpus), planned.housekeeping, settings.get("main_cpu")
    )
    findings = []
    if settings.get("enabled") and left_out:
        findings.append(
            finding(
                "latency",
                "info",
                left_out,
                f"CPU {cpus_text(left_out)} not measured: held by a workload (a measurement would disturb it)",
            )
        )
    section, found = measure_latency(settings, measured, main_cpu, check_mode, run, which or find_tool)
    findings += found
    findings += check_latency(section, planned.isolated)
    section["left_out"] = format_cpulist(left_out)
    return section, measured, comparison, findings


def _interrupt_checks(
    facts: Facts, before_cpus: list[int], before: Mapping[str, dict], started: float, isolated: set[int]
) -> tuple[dict, list[dict]]:
    """The second ``/proc/interrupts`` sample against the first: the ``interrupts`` section and its findings."""
    seconds = time.monotonic() - started
    after = parse_interrupts(facts.read("proc/interrupts") or "")[1]
    grown = interrupt_growth(before, after, isolated)
    section = {
        "seconds": round(seconds, 3),
        "grown": {str(cpu): grown[cpu] for cpu in sorted(grown)},
        "columns": format_cpulist(before_cpus),
    }
    return section, check_interrupt_growth(grown, seconds)


def _judged(findings: list[dict], fail_on: set[str], reboot_pending: bool) -> tuple[list[dict], bool]:
    """The findings worst first, a pending reboot said in those it explains; ok unless one fails a ``fail_on`` check."""
    if reboot_pending:
        findings = [_pending(f) for f in findings]
        findings.append(
            finding(
                "nohz",
                "warn",
                [],
                "a reboot is pending: the running kernel was booted before cpupools wrote the planned kernel "
                "arguments, so these checks read the old kernel (playbooks/reboot.yml reboots and verifies)",
            )
        )
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: (rank[f["severity"]], CHECKS.index(f["check"]), f["cpus"], f["message"]))
    return findings, not any(f["severity"] == "fail" and f["check"] in fail_on for f in findings)


def _per_cpu(
    rows: list[int],
    planned: _Plan,
    findings: list[dict],
    sections: Mapping[str, object],
    grown: Mapping[str, dict],
    held_cpus: Mapping[int, str],
    power_of: Mapping[int, dict],
) -> dict[str, dict]:
    """One row per checked CPU: its role, whether no finding troubles it, its holder, what was seen on it."""
    per_cpu = {}
    for cpu in rows:
        named = [f for f in findings if cpu in set(parse_cpulist(f["cpus"]))]
        seen = _seen_on(cpu, sections, grown)
        figures = sections["latency"]["cpus"].get(str(cpu))
        per_cpu[str(cpu)] = {
            "role": _role(cpu, planned.pools, set(planned.housekeeping)),
            "isolated": cpu in planned.isolated,
            "quiet": not any(f["severity"] in ("fail", "warn") for f in named),
            "held_by": held_cpus.get(cpu),
            "found": seen,
            "latency": None if figures is None else {k: figures[k] for k in LATENCY_KEYS},
            "power": {k: power_of[cpu][k] for k in POWER_KEYS} if cpu in power_of else None,
        }
    return per_cpu


def _seen_on(cpu: int, sections: Mapping[str, object], grown: Mapping[str, dict]) -> list[str]:
    """What the checks saw on ``cpu``: IRQs, tasks, kernel threads, then the interrupts that grew there."""
    seen = [f"IRQ {i['irq']} {i['name']}".rstrip() for i in sections["irqs"] if cpu in parse_cpulist(i["effective"])]
    tasks = sections["processes"] + sections["cmk"]["unrecorded"]
    seen += [f"pid {p['pid']} ({p['comm']})" for p in tasks if p["cpu"] == cpu]
    threads = sections["kthreads"] + sections["rcu"]["threads_on_isolated"]
    seen += [f"kernel thread {k['pid']} ({k['comm']})" for k in threads if k["cpu"] == cpu]
    seen += [f"{s} +{n}" for s, n in sorted(grown.get(str(cpu), {}).items())]
    return seen


def _result(
    taken: str,
    kernel: dict,
    checked: str,
    ok: bool,
    reboot_pending: bool,
    findings: list[dict],
    per_cpu: dict[str, dict],
    sections: Mapping[str, object],
    power: Mapping[str, dict],
    interrupts: dict,
) -> dict:
    """The result in the contract's order (docs/verify.md): the verdict, the findings, the table, each section."""
    summary = summarise(per_cpu, findings, sections["irqs"], sections["latency"])
    return {
        "version": RESULT_VERSION,
        "taken": taken,
        "kernel": {
            "release": kernel["release"],
            "cmdline": kernel["cmdline"],
            "isolated": None if kernel["isolated"] is None else format_cpulist(kernel["isolated"]),
            "nohz_full": None if kernel["nohz_full"] is None else format_cpulist(kernel["nohz_full"]),
        },
        "cpus_checked": checked,
        "ok": ok,
        "reboot_pending": bool(reboot_pending),
        "summary": ("reboot pending; " if reboot_pending else "") + summary,
        "findings": findings,
        "per_cpu": per_cpu,
        "irqs": sections["irqs"],
        "workqueue": sections["workqueue"],
        "kthreads": sections["kthreads"],
        "rcu": sections["rcu"],
        "nohz": sections["nohz"],
        "processes": sections["processes"],
        "cmk": sections["cmk"],
        "latency": sections["latency"],
        "power": {
            "cpufreq": power["cpufreq"]["driver"],
            "mode": power["cpufreq"]["mode"],
            "turbo": power["cpufreq"]["turbo"],
            "cpuidle": power["cpuidle"]["driver"],
            "uncore": power["uncore"]["driver"],
        },
        "interrupts": interrupts,
    }


#: The checks whose findings read the kernel's boot arguments: a pending reboot explains them.
BOOT_CHECKS = ("irq", "workqueue", "kthread", "rcu", "nohz")


def _pending(finding: dict) -> dict:
    """A finding of a check the boot arguments decide, saying that the kernel it read predates them."""
    if finding["check"] not in BOOT_CHECKS or finding["severity"] == "info":
        return finding
    return {**finding, "message": finding["message"] + " (reboot pending: the running kernel predates the plan)"}


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
