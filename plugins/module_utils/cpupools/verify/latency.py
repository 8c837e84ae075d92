"""verify, measuring: ``oslat`` (rt-tests) on the isolated CPUs, and the latency check.

The one part of verify that acts: oslat runs through a ``run`` callable the
caller gives (the module's ``run_command``; a subprocess in tests), never in
check mode. Its histogram is read back into per-CPU figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpulistError, VerifyError
from .checks import finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


#: The last (overflow) bucket of oslat's histogram counts everything at or above its label.
OSLAT_BUCKETS = 1024


#: The figures of one measured CPU in ``per_cpu`` (``latency.cpus`` adds ``overflows``).
LATENCY_KEYS = ("max_us", "p99_us", "p999_us", "avg_us", "min_us")


DEFAULT_LATENCY = {
    "enabled": False,
    "tool_path": "oslat",
    "duration": 10,
    "cpus": "auto",
    "main_cpu": "auto",
    "max_us": None,
    "p99_us": None,
}


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
        findings.append(finding("latency", "info", [], "latency not measured: no CPU left to measure"))
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
            finding("latency", "fail", measured, f"latency not measured: {tool_name} not found (install rt-tests)")
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
        findings.append(finding("latency", "fail", measured, f"latency not measured: {problem}"))
        return section, findings
    section["cpus"] = {str(cpu): figures[cpu] for cpu in sorted(figures)}
    return section, findings


def find_tool(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/usr/sbin"])
    return shutil.which(name, path=path)


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
                    finding(
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
