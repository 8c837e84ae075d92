"""Node metrics for node_exporter's textfile collector: the one place that renders and writes them.

Two writers, one file each, in the directory node_exporter's
``--collector.textfile.directory`` reads:

* ``cpupools.prom``: ``cmk reconcile`` after each pass (``render_reconcile``):
  pool sizes, free cpulists, held and free exclusive CPUs, reclaimed tasks;
* ``cpupools_verify.prom``: the verify role from the ``cpupools_verify``
  result (``render_verify``): whether the node passed, what was found, which
  CPUs are quiet, the jitter measured per CPU.

The text exposition format (version 0.0.4): ``# HELP`` and ``# TYPE`` before
each family, label values escaped (``\\``, ``"``, newline), base units
(seconds, microseconds only where the name says so), ``_total`` only on
counters. The output is deterministic (sorted labels and series), so an
unchanged node gives a byte-identical file, which ``write_textfile`` then
leaves alone. Standard library only: it runs inside the node agent.
"""

from __future__ import annotations

import calendar
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpupoolsError
from ..core.names import VERIFY_CHECKS
from . import state as st

RECONCILE_FILE = "cpupools.prom"
VERIFY_FILE = "cpupools_verify.prom"
#: The reconcile counter carried from one pass's file to the next.
RECLAIMED = "cpupools_reclaimed_cpulists_total"
#: The checks of ``cpupools_verify`` (docs/verify.md); each gets a findings series, 0 when clean.
SEVERITIES = ("fail", "warn", "info")
#: Pools whose cpulists are handed out whole, one process each: their held and free CPUs are metrics.
EXCLUSIVE_POOLS = ("exclusive", "exclusive-non-isolcpus")


class PoolUsage(NamedTuple):
    """One pool after a reconcile pass (indexable as CMK's ``(cpulists, free)`` pair)."""

    cpulists: int
    free: int  # cpulists with no task
    held_cpus: tuple[int, ...] = ()  # CPUs of cpulists a task holds
    free_cpus: tuple[int, ...] = ()  # CPUs of cpulists with no task (a damaged list is neither)


def escape_label(value: object) -> str:
    """A label value of the text format: ``\\`` -> ``\\\\``, ``"`` -> ``\\"``, newline -> ``\\n``."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: ``\\`` and newline escaped (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float | int | bool) -> str:
    """A sample value: integers without a point, floats as Python's shortest repr, ``NaN``/``+Inf``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    return str(int(value))


class Family:
    """One metric family: HELP, TYPE and its samples, in the order added."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[dict[str, str], float | int | bool]] = []

    def add(self, value: float | int | bool, **labels: object) -> None:
        self.samples.append(({k: str(v) for k, v in labels.items()}, value))

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        for labels, value in self.samples:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in sorted(labels.items()))
            out.append(f"{self.name}{{{inner}}} {number(value)}" if inner else f"{self.name} {number(value)}")
        return out


def render(families: Iterable[Family]) -> str:
    """The exposition text of ``families`` (a family without samples is left out)."""
    lines: list[str] = []
    for family in families:
        if family.samples:
            lines += family.lines()
    return "\n".join(lines) + "\n" if lines else ""


# reconcile ----------------------------------------------------------------------


def previous_counter(text: str, name: str = RECLAIMED) -> int:
    """The value of the unlabelled counter ``name`` in an earlier file's ``text``; 0 when absent or unreadable."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            try:
                return int(float(line.split()[1]))
            except (IndexError, ValueError):
                return 0
    return 0


def render_reconcile(usage: Mapping[str, PoolUsage | Sequence[int]], reclaimed_total: int) -> str:
    """``cpupools.prom``: per pool its cpulists and free cpulists; per exclusive pool its held and free CPUs.

    ``usage`` maps a pool to a ``PoolUsage`` (a plain ``(cpulists, free)``
    pair counts no CPUs). ``reclaimed_total`` is the running count of task
    entries reconcile freed.
    """
    pools = {name: PoolUsage(*value) for name, value in usage.items()}
    lists = Family("cpupools_pool_cpulists", "gauge", "Cpulists in the pool.")
    free = Family("cpupools_pool_free_cpulists", "gauge", "Cpulists of the pool with no task.")
    held_cpus = Family(
        "cpupools_pool_held_cpus", "gauge", "CPUs of the exclusive pool in cpulists a task holds (logical CPUs)."
    )
    free_cpus = Family(
        "cpupools_pool_free_cpus", "gauge", "CPUs of the exclusive pool in cpulists no task holds (logical CPUs)."
    )
    info = Family(
        "cpupools_pool_cpus_info",
        "gauge",
        "Always 1; the labels held and free are the exclusive pool's held and free CPUs as cpulists.",
    )
    for name in sorted(pools):
        pool = pools[name]
        lists.add(pool.cpulists, pool=name)
        free.add(pool.free, pool=name)
        if name in EXCLUSIVE_POOLS:
            held_cpus.add(len(pool.held_cpus), pool=name)
            free_cpus.add(len(pool.free_cpus), pool=name)
            info.add(1, pool=name, held=format_cpulist(pool.held_cpus), free=format_cpulist(pool.free_cpus))
    reclaimed = Family(RECLAIMED, "counter", "Task entries freed by reconcile (dead or reused PIDs).")
    reclaimed.add(reclaimed_total)
    return render((lists, free, held_cpus, free_cpus, info, reclaimed))


def write_reconcile(directory: str, usage: Mapping[str, PoolUsage | Sequence[int]], reclaimed: int) -> bool:
    """Write ``<directory>/cpupools.prom`` after a pass that freed ``reclaimed`` entries; True when rewritten.

    The reclaimed counter goes on from the value in the file the last pass left.
    """
    try:
        with open(os.path.join(directory, RECONCILE_FILE), encoding="utf-8") as handle:
            total = previous_counter(handle.read()) + reclaimed
    except (OSError, UnicodeDecodeError):
        total = reclaimed
    return write_textfile(directory, RECONCILE_FILE, render_reconcile(usage, total))


# verify -------------------------------------------------------------------------


def taken_seconds(taken: object) -> float | None:
    """``2026-11-26T19:40:00Z`` (the verify result's ``taken``) in seconds since the epoch; None when not that."""
    if not isinstance(taken, str):
        return None
    try:
        return float(calendar.timegm(time.strptime(taken, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _cpu_order(per_cpu: Mapping) -> list[str]:
    return sorted(per_cpu, key=lambda c: (0, int(c)) if str(c).isdigit() else (1, str(c)))


def _figure(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def render_verify(result: Mapping) -> str:
    """``cpupools_verify.prom`` from a ``cpupools_verify`` result (the ``cpupools_verify`` module's RETURN, version 1).

    Series: ``cpupools_verify_ok`` (no finding of severity ``fail``, of any check: what was found,
    whatever ``fail_on`` makes of it), ``cpupools_verify_timestamp_seconds``
    (when the result was taken), ``cpupools_reboot_pending`` (the kernel the
    node runs predates the planned arguments), ``cpupools_verify_findings{check,severity}``
    (every check and severity, 0 when none), ``cpupools_cpu_quiet{cpu,role}``
    (1 quiet, 0 something runs on or interrupts it), and per measured CPU
    ``cpupools_cpu_latency_{max,p99,p999}_microseconds{cpu,role}``.
    """
    findings_found = [f for f in result.get("findings") or [] if isinstance(f, Mapping)]
    ok = Family("cpupools_verify_ok", "gauge", "1 when the last verify found no check failing, else 0.")
    ok.add(not any(f.get("severity") == "fail" for f in findings_found))
    stamp = Family(
        "cpupools_verify_timestamp_seconds", "gauge", "When the last verify looked at the node (seconds since epoch)."
    )
    seconds = taken_seconds(result.get("taken"))
    if seconds is not None:
        stamp.add(seconds)
    pending = Family(
        "cpupools_reboot_pending",
        "gauge",
        "1 when the node runs a kernel booted before cpupools wrote its planned arguments (at the last verify).",
    )
    pending.add(bool(result.get("reboot_pending")))
    counts: dict[tuple[str, str], int] = {(c, s): 0 for c in VERIFY_CHECKS for s in SEVERITIES}
    for finding in findings_found:
        key = (str(finding.get("check") or "unknown"), str(finding.get("severity") or "info"))
        counts[key] = counts.get(key, 0) + 1
    findings = Family(
        "cpupools_verify_findings", "gauge", "Findings of the last verify, by check and severity (fail, warn, info)."
    )
    for (check, severity), n in sorted(counts.items()):
        findings.add(n, check=check, severity=severity)
    quiet = Family(
        "cpupools_cpu_quiet",
        "gauge",
        "1 when nothing but its own workload ran on or interrupted the CPU at the last verify, else 0.",
    )
    figures = {
        key: Family(
            f"cpupools_cpu_latency_{key}_microseconds",
            "gauge",
            f"{words} of the CPU's latency measured by oslat at the last verify, in microseconds.",
        )
        for key, words in (("max", "Maximum"), ("p99", "99th percentile"), ("p999", "99.9th percentile"))
    }
    # Power and frequency as verify read them back (cpupools_power, docs/power.md): where a CPU has cpufreq.
    scaling = {
        key: Family(
            f"cpupools_cpu_scaling_{key}_khz",
            "gauge",
            f"The CPU's cpufreq scaling_{key}_freq at the last verify, in kHz.",
        )
        for key in ("min", "max")
    }
    power_info = Family(
        "cpupools_cpu_power_info",
        "gauge",
        "1 per CPU, labelled with its cpufreq governor and the deepest C-state it may enter, at the last verify.",
    )
    per_cpu = result.get("per_cpu") or {}
    for cpu in _cpu_order(per_cpu):
        row = per_cpu[cpu] if isinstance(per_cpu[cpu], Mapping) else {}
        role = str(row.get("role") or "")
        quiet.add(bool(row.get("quiet")), cpu=cpu, role=role)
        latency = row.get("latency") if isinstance(row.get("latency"), Mapping) else {}
        for key, family in figures.items():
            value = _figure(latency.get(f"{key}_us"))
            if value is not None:
                family.add(value, cpu=cpu, role=role)
        power = row.get("power") if isinstance(row.get("power"), Mapping) else {}
        for key, family in scaling.items():
            value = _figure(power.get(f"scaling_{key}_khz"))
            if value is not None:
                family.add(value, cpu=cpu, role=role)
        if power:
            power_info.add(
                1, cpu=cpu, role=role, governor=power.get("governor") or "", deepest_cstate=power.get("deepest") or ""
            )
    return render((ok, stamp, pending, findings, quiet, *figures.values(), *scaling.values(), power_info))


# writing ------------------------------------------------------------------------


def write_textfile(directory: str, name: str, text: str) -> bool:
    """Replace ``<directory>/<name>`` by ``text`` when it differs: a temporary file beside it, mode 0644, renamed.

    node_exporter reads only ``*.prom`` files, so it never sees the
    temporary ``.<name>.<random>.tmp``; it reads the old file or the new one.
    Returns True when the file was written, False when it already held
    ``text`` (its mtime is kept). Raises ``CpupoolsError`` naming the file.
    """
    path = os.path.join(directory, name)
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            if handle.read(len(data) + 1) == data:
                return False
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CpupoolsError(f"cannot read the metrics file {path}: {exc.strerror}") from None
    if not os.path.isdir(directory):  # atomic_write would call it a corrupt state
        raise CpupoolsError(f"cannot write into the metrics directory {directory}: it is not a directory")
    try:  # the state directory's one atomic write: a temporary ".<name>.<random>.tmp", fsync, rename
        st.atomic_write(path, text, 0o644, fsync=True)
    except UnicodeEncodeError:
        raise CpupoolsError(f"cannot write the metrics file {path}: the exposition text is not ASCII") from None
    except (OSError, CpupoolsError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise CpupoolsError(f"cannot write the metrics file {path}: {reason}") from None
    return True


def cpus_of(cpulists: Iterable[str]) -> tuple[int, ...]:
    """The sorted CPUs of several cpulists (CMK's ``1,45`` or ``1-3``)."""
    return tuple(sorted({cpu for text in cpulists for cpu in parse_cpulist(text)}))
