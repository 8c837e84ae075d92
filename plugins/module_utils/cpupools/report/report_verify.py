"""What the fleet report shows of a host's last ``cpupools_verify`` result: per CPU, quiet or not, what
was found on it, and the jitter measured; the latency colour scale and the per-node chart.

The result's shape is the ``cpupools_verify`` module's RETURN (version 1); the report reads only
the parts below and leaves the rest to the JSON beside the page. Pure and
deterministic, standard library only, like analysis.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpupoolsError, ReportError

#: The measured max latency (µs) a CPU is coloured by: (upper bound or None, background, text, label).
#: A sequential scale (viridis: light for low, dark for high), ordered in lightness, so it reads
#: in grey and with the common colour-vision deficiencies; every figure is also in the text.
LATENCY_SCALE = (
    (10, "#fde725", "#000000", "under 10 µs"),
    (20, "#5ec962", "#000000", "10-19 µs"),
    (50, "#21918c", "#ffffff", "20-49 µs"),
    (100, "#3b528b", "#ffffff", "50-99 µs"),
    (None, "#440154", "#ffffff", "100 µs or more"),
)
SEVERITY_ORDER = {"fail": 0, "warn": 1, "info": 2}
#: The latency chart: width of the bar area and of the label column, height of one row (px).
CHART_BARS = 420
CHART_LABEL = 150
CHART_ROW = 18


def bucket(max_us: float) -> int:
    """The index in ``LATENCY_SCALE`` of a measured max latency."""
    for i, step in enumerate(LATENCY_SCALE):
        bound = step[0]
        if bound is None or max_us < bound:
            return i
    return len(LATENCY_SCALE) - 1


@dataclass
class CpuRow:
    cpu: int
    role: str
    isolated: bool
    quiet: bool
    held_by: str
    found: list[str]
    named: list[str] = field(default_factory=list)  # checks of the findings that name it ("latency fail")
    max_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    over: bool = False  # over one of the operator's thresholds
    bucket: int | None = None
    power: str = ""  # governor, frequency range and deepest C-state as verify read them ("" without them)

    @property
    def why(self) -> str:
        """What was found on the CPU, or else the checks of the findings that name it."""
        return ", ".join(self.found or self.named) or "a finding names it"

    @property
    def figures(self) -> tuple[str, str, str]:
        """Max, p99 and p99.9 in µs as the page shows them (``-`` when not measured)."""
        return _us(self.max_us), _us(self.p99_us), _us(self.p999_us)

    @property
    def words(self) -> str:
        """The CPU's verify outcome in words (hover text of its cell)."""
        parts = ["quiet" if self.quiet else f"not quiet: {self.why}"]
        if self.max_us is not None:
            parts.append(f"max latency {_us(self.max_us)} µs, p99 {_us(self.p99_us)} µs")
        if self.power:
            parts.append(self.power)
        return "; ".join(parts)


@dataclass
class ChartBar:
    label: str
    y: int
    width: int  # max
    p99_x: int | None
    value: str
    fill: str
    over: bool


@dataclass
class Chart:
    width: int
    height: int
    left: int
    bars: list[ChartBar]
    scale_max: int
    ticks: list[tuple[int, str]]  # (x, label)
    threshold_x: int | None
    threshold: str
    title: str


@dataclass
class VerifyView:
    ok: bool
    taken: str
    summary: str
    release: str
    findings: list[dict[str, str]] = field(default_factory=list)
    rows: list[CpuRow] = field(default_factory=list)
    latency: str = ""  # how it was measured, or why not
    chart: Chart | None = None

    @property
    def verdict(self) -> str:
        return "ok" if self.ok else "fail"

    @property
    def not_quiet(self) -> list[CpuRow]:
        return [r for r in self.rows if not r.quiet]

    def row(self, cpu: int) -> CpuRow | None:
        for r in self.rows:
            if r.cpu == cpu:
                return r
        return None


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _number(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{what}: {value!r} is not a number", "verify_result")
    return float(value)


def _nice(top: float) -> int:
    """The chart's scale: the smallest of 1, 2, 5 x 10^n at or above ``top``."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if step * m >= top:
                return step * m
        step *= 10


#: What a verify result says of when and for how long it looked, not of what it found: ``taken``, and
#: the seconds between its two samples of /proc/interrupts.
RUN_TIMES = (("taken",), ("interrupts", "seconds"))


def _ghz(khz: object) -> str | None:
    return f"{khz / 1e6:.2f}".rstrip("0").rstrip(".") if isinstance(khz, int) and not isinstance(khz, bool) else None


def power_words(power: object) -> str:
    """A CPU's power settings as verify read them back (its ``per_cpu`` row's ``power``), in words."""
    if not isinstance(power, Mapping):
        return ""
    parts = []
    low, high = _ghz(power.get("scaling_min_khz")), _ghz(power.get("scaling_max_khz"))
    if power.get("governor"):
        parts.append(str(power["governor"]))
    if low and high:
        parts.append(f"{high} GHz fixed" if low == high else f"{low}-{high} GHz")
    if power.get("deepest"):
        parts.append(f"deepest C-state {power['deepest']}")
    return ", ".join(parts)


def _found(result: Mapping) -> str:
    """The result as canonical JSON text (as the JSON beside the page writes it), without ``RUN_TIMES``."""
    data = json.loads(json.dumps(result, default=str))
    for path in RUN_TIMES:
        parent = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return json.dumps(data, sort_keys=True)


def keep_taken(result: object, earlier: object) -> object:
    """``earlier`` when it found what ``result`` found (they differ at most in ``RUN_TIMES``), else ``result``.

    What the report shows of a host's verify is the time it was first found so
    (the page says "since"): a re-run that finds the same changes no file of
    the report. When it was last verified is the node's
    ``cpupools_verify_timestamp_seconds`` (docs/verify.md).
    """
    if not isinstance(result, Mapping) or not isinstance(earlier, Mapping):
        return result
    return earlier if _found(result) == _found(earlier) else result


def analyse(result: object) -> VerifyView | None:
    """The report's view of a ``cpupools_verify`` result; None when the host was never verified."""
    if result is None:
        return None
    if not isinstance(result, Mapping):
        raise ReportError(f"expected a dict, got {type(result).__name__}", "verify_result")
    per_cpu = result.get("per_cpu") or {}
    findings = result.get("findings") or []
    if not isinstance(per_cpu, Mapping) or not isinstance(findings, Sequence) or isinstance(findings, str):
        message = "per_cpu must be a dict and findings a list (is it a cpupools_verify result?)"
        raise ReportError(message, "verify_result")
    latency = result.get("latency") if isinstance(result.get("latency"), Mapping) else {}
    thresholds = latency.get("thresholds") if isinstance(latency.get("thresholds"), Mapping) else {}
    max_limit = _number(thresholds.get("max_us"), "latency thresholds max_us")
    p99_limit = _number(thresholds.get("p99_us"), "latency thresholds p99_us")
    kernel = result.get("kernel") if isinstance(result.get("kernel"), Mapping) else {}
    view = VerifyView(
        ok=bool(result.get("ok")),
        taken=str(result.get("taken") or "?"),
        summary=str(result.get("summary") or ""),
        release=str(kernel.get("release") or ""),
    )
    for item in findings:
        if not isinstance(item, Mapping):
            raise ReportError(f"a finding is {type(item).__name__}, not a dict", "verify_result")
        view.findings.append(
            {
                "severity": str(item.get("severity") or "info"),
                "check": str(item.get("check") or "?"),
                "cpus": str(item.get("cpus") or ""),
                "message": str(item.get("message") or ""),
            }
        )
    view.findings.sort(key=lambda f: SEVERITY_ORDER.get(f["severity"], 3))  # stable: the module's order within
    named: dict[int, list[str]] = {}  # CPU -> the checks of the fail/warn findings that name it
    for f in view.findings:
        if f["severity"] in ("fail", "warn"):
            try:
                cpus = parse_cpulist(f["cpus"])
            except CpupoolsError:
                raise ReportError(
                    f"finding {f['message']!r}: cpus {f['cpus']!r} is not a cpulist", "verify_result"
                ) from None
            for cpu in cpus:
                named.setdefault(cpu, []).append(f"{f['check']} {f['severity']}")
    for key in per_cpu:
        if not str(key).isdigit():
            raise ReportError(f"per_cpu: {key!r} is not a CPU number", "verify_result")
    for key in sorted(per_cpu, key=int):
        raw = per_cpu[key]
        if not isinstance(raw, Mapping):
            raise ReportError(f"per_cpu {key}: expected a dict", "verify_result")
        lat = raw.get("latency") if isinstance(raw.get("latency"), Mapping) else {}
        row = CpuRow(
            cpu=int(key),
            role=str(raw.get("role") or ""),
            isolated=bool(raw.get("isolated")),
            quiet=bool(raw.get("quiet")),
            held_by=str(raw.get("held_by") or ""),
            found=[str(f) for f in raw.get("found") or []],
            named=named.get(int(key), []),
            max_us=_number(lat.get("max_us"), f"per_cpu {key} latency max_us"),
            p99_us=_number(lat.get("p99_us"), f"per_cpu {key} latency p99_us"),
            p999_us=_number(lat.get("p999_us"), f"per_cpu {key} latency p999_us"),
            power=power_words(raw.get("power")),
        )
        if row.max_us is not None:
            row.bucket = bucket(row.max_us)
            # thresholds apply to isolated CPUs only (a housekeeping CPU is measured for comparison)
            row.over = row.isolated and (
                (max_limit is not None and row.max_us > max_limit)
                or (p99_limit is not None and row.p99_us is not None and row.p99_us > p99_limit)
            )
        view.rows.append(row)
    view.latency = _latency_words(latency, max_limit, p99_limit, view.rows)
    view.chart = _chart(view.rows, max_limit)
    return view


def _latency_words(latency: Mapping, max_limit: float | None, p99_limit: float | None, rows: list[CpuRow]) -> str:
    if latency.get("skipped"):
        return f"not measured: {latency['skipped']}"
    measured = [r for r in rows if r.max_us is not None]
    if not measured:
        return "not measured"
    tool = " ".join(str(latency.get(k)) for k in ("tool", "version") if latency.get(k)) or "oslat"
    words = f"{len(measured)} CPU{'s' if len(measured) != 1 else ''} measured by {tool}"
    if latency.get("duration_s"):
        words += f" for {latency['duration_s']} s"
    limits = [f"{name} {_us(v)} µs" for name, v in (("max", max_limit), ("p99", p99_limit)) if v is not None]
    words += f"; thresholds {', '.join(limits)}" if limits else "; no threshold set"
    worst = max(measured, key=lambda r: (r.max_us, -r.cpu))
    words += f"; worst max {_us(worst.max_us)} µs on CPU {worst.cpu} ({worst.role})"
    return words


def _chart(rows: list[CpuRow], max_limit: float | None) -> Chart | None:
    """A horizontal bar per measured CPU: its max latency, a tick at its p99; the threshold as a line."""
    measured = [r for r in rows if r.max_us is not None]
    if not measured:
        return None
    top = max([r.max_us or 0 for r in measured] + ([max_limit] if max_limit is not None else []))
    scale = _nice(max(top, 1))

    def x(value: float) -> int:
        return round(CHART_BARS * value / scale)

    bars = []
    for i, r in enumerate(measured):
        bars.append(
            ChartBar(
                label=f"CPU {r.cpu} {r.role}",
                y=20 + i * CHART_ROW,
                width=max(1, x(r.max_us or 0)),
                p99_x=None if r.p99_us is None else x(r.p99_us),
                value=f"{_us(r.max_us)}" + (" over threshold" if r.over else ""),
                fill=LATENCY_SCALE[r.bucket or 0][1],
                over=r.over,
            )
        )
    ticks = [(x(scale * k / 4), _us(scale * k / 4)) for k in range(5)]
    height = 20 + len(measured) * CHART_ROW + 22
    return Chart(
        width=CHART_LABEL + CHART_BARS + 110,
        height=height,
        left=CHART_LABEL,
        bars=bars,
        scale_max=scale,
        ticks=ticks,
        threshold_x=None if max_limit is None else x(max_limit),
        threshold="" if max_limit is None else f"threshold {_us(max_limit)} µs",
        title=f"Max latency per CPU (µs), p99 as a tick; scale 0-{scale} µs",
    )


def lines(view: VerifyView | None, label) -> list[str]:
    """The text report's verify lines of one host; ``label(title)`` pads the title column."""
    if view is None:
        return [label("verify") + "never verified"]
    head = f"{view.verdict} (since {view.taken}" + (f", kernel {view.release}" if view.release else "") + ")"
    out = [label("verify") + head + (f": {view.summary}" if view.summary else "")]
    for f in view.findings:
        cpus = f" [CPU {f['cpus']}]" if f["cpus"] else ""
        out.append(label("") + f"{f['severity']} {f['check']}{cpus}: {f['message']}")
    noisy = view.not_quiet
    if noisy:
        for i, r in enumerate(noisy):
            out.append(label("not quiet" if i == 0 else "") + f"CPU {r.cpu} ({r.role}): {r.why}")
    elif view.rows:
        out.append(label("not quiet") + "none")
    out.append(label("latency") + view.latency)
    settings: dict[tuple[str, str], list[int]] = {}  # (role, power words) -> its CPUs
    for r in view.rows:
        if r.power:
            settings.setdefault((r.role, r.power), []).append(r.cpu)
    for i, ((role, words), cpus) in enumerate(sorted(settings.items(), key=lambda item: item[1])):
        out.append(label("power" if i == 0 else "") + f"CPU {format_cpulist(cpus)} ({role}): {words}")
    measured = [r for r in view.rows if r.max_us is not None]
    if measured:
        table = [("cpu", "role", "max µs", "p99 µs", "p99.9 µs", "")]
        table += [
            (str(r.cpu), r.role, _us(r.max_us), _us(r.p99_us), _us(r.p999_us), "over threshold" if r.over else "")
            for r in measured
        ]
        widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
        for t in table:
            cells = [c.rjust(w) if 2 <= i <= 4 else c.ljust(w) for i, (c, w) in enumerate(zip(t, widths, strict=True))]
            out.append(label("") + "  ".join(cells).rstrip())
    return out
