"""verify, the run: everything read, judged and measured for one node, in the result's shape.

The result is the shape of docs/verify.md and of the ``cpupools_verify``
module's RETURN: findings, worst first, each naming its check, severity and
CPUs, and one row per CPU.
"""

from __future__ import annotations

import os
import time

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
            finding(
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
        findings.append(finding("cmk", "warn", [], f"CMK's state could not be read: {problem}"))
    kubelet_held = []
    if runtime == "kubelet":
        kubelet_held = read_kubelet_held(facts_read_root(root, kubelet_state))
    held_tasks, held_cpus = holders(tasks, cmk_held, kubelet_held, runtime, exclusive)
    processes, cmk, found = check_processes(tasks, exclusive, held_tasks, cmk_held, cmk_stale, runtime)
    findings += found
    if problem:
        cmk["problem"] = problem

    measured, comparison, main_cpu, left_out = latency_cpus(
        settings.get("cpus"), sorted(exclusive & isolated), set(held_cpus), housekeeping, settings.get("main_cpu")
    )
    if settings.get("enabled") and left_out:
        findings.append(
            finding(
                "latency",
                "info",
                left_out,
                f"CPU {cpus_text(left_out)} not measured: held by a workload (a measurement would disturb it)",
            )
        )
    latency_section, found = measure_latency(settings, measured, main_cpu, check_mode, run, which or find_tool)
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
