"""The node_exporter textfiles (metrics.py), read back by a strict parser of the text exposition format.

``prometheus_client`` is not in the dev set; ``parse`` below checks what
node_exporter's textfile collector and Prometheus's parser refuse: HELP and
TYPE once per family and before its samples, families not interleaved,
metric and label name syntax, label value escapes (only ``\\\\``, ``\\"`` and
``\\n``), no duplicate label or series, sample values that are numbers, the
file ending in a newline; and the naming rules (``_total`` exactly on
counters).
"""

from __future__ import annotations

import calendar
import math
import os
import re
import time

import pytest
from cpupools.node import metrics
from verify_results import noisy

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class FormatError(AssertionError):
    pass


def _value(text: str, where: str) -> float:
    if text in ("NaN", "+Inf", "-Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        raise FormatError(f"{where}: {text!r} is not a sample value")
    return float(text)


def _labels(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y"`` -> pairs, unescaped; refuses any other escape and unquoted or duplicate labels."""
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        if not m or text[m.end() : m.end() + 2] != '="':
            raise FormatError(f"{where}: bad label at {text[pos:]!r}")
        name = m.group()
        if name.startswith("__"):
            raise FormatError(f"{where}: label {name} is reserved")
        pos = m.end() + 2
        out = []
        while True:
            if pos >= len(text):
                raise FormatError(f"{where}: unterminated label value")
            ch = text[pos]
            if ch == "\\":
                nxt = text[pos + 1 : pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise FormatError(f"{where}: bad escape \\{nxt}")
                out.append("\n" if nxt == "n" else nxt)
                pos += 2
            elif ch == '"':
                pos += 1
                break
            elif ch == "\n":
                raise FormatError(f"{where}: raw newline in a label value")
            else:
                out.append(ch)
                pos += 1
        if any(n == name for n, _ in pairs):
            raise FormatError(f"{where}: label {name} twice")
        pairs.append((name, "".join(out)))
        if pos < len(text):
            if text[pos] != ",":
                raise FormatError(f"{where}: expected ',' at {text[pos:]!r}")
            pos += 1
    return tuple(sorted(pairs))


def parse(text: str) -> dict[str, dict]:
    """``{family: {"type", "help", "samples": {labels: value}}}``; ``FormatError`` on anything malformed."""
    if not text.endswith("\n"):
        raise FormatError("the file does not end in a newline")
    families: dict[str, dict] = {}
    done: set[str] = set()
    current = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n}"
        if line.startswith("#"):
            m = re.fullmatch(r"# (HELP|TYPE) (\S+) (.*)", line)
            if not m:
                if line.startswith(("# HELP", "# TYPE")):
                    raise FormatError(f"{where}: malformed {line!r}")
                continue  # a comment
            kind, name, rest = m.groups()
            if not METRIC.fullmatch(name):
                raise FormatError(f"{where}: bad metric name {name!r}")
            if name in done:
                raise FormatError(f"{where}: family {name} interleaved")
            if current is not None and current != name:
                done.add(current)
            current = name
            fam = families.setdefault(name, {"type": None, "help": None, "samples": {}})
            if fam["samples"]:
                raise FormatError(f"{where}: {kind} of {name} after its samples")
            if kind == "TYPE":
                if fam["type"] is not None or rest not in TYPES:
                    raise FormatError(f"{where}: TYPE of {name} twice or unknown ({rest!r})")
                fam["type"] = rest
            else:
                if fam["help"] is not None:
                    raise FormatError(f"{where}: HELP of {name} twice")
                if re.search(r"\\[^\\n]", rest):
                    raise FormatError(f"{where}: bad escape in HELP")
                fam["help"] = rest.replace("\\n", "\n").replace("\\\\", "\\")
            continue
        if not line:
            raise FormatError(f"{where}: empty line")
        m = METRIC.match(line)
        if not m:
            raise FormatError(f"{where}: no metric name in {line!r}")
        name = m.group()
        rest = line[m.end() :]
        labels: tuple = ()
        if rest.startswith("{"):
            # the label block ends at the last '}' followed by a space and a value
            close = rest.rfind("} ")
            if close < 0:
                raise FormatError(f"{where}: unterminated labels")
            labels = _labels(rest[1:close], where)
            rest = rest[close + 1 :]
        parts = rest.split(" ")
        if parts[0] != "" or len(parts) not in (2, 3):
            raise FormatError(f"{where}: expected one space, a value and an optional timestamp: {line!r}")
        value = _value(parts[1], where)
        if len(parts) == 3 and not re.fullmatch(r"-?\d+", parts[2]):
            raise FormatError(f"{where}: bad timestamp {parts[2]!r}")
        if name in done or (current is not None and current != name):
            raise FormatError(f"{where}: sample of {name} outside its family")
        fam = families.get(name)
        if fam is None or fam["type"] is None:
            raise FormatError(f"{where}: {name} has no TYPE before its samples")
        if labels in fam["samples"]:
            raise FormatError(f"{where}: series {name}{dict(labels)} twice")
        fam["samples"][labels] = value
    for name, fam in families.items():
        if fam["type"] == "counter" and not name.endswith("_total"):
            raise FormatError(f"counter {name} does not end in _total")
        if fam["type"] != "counter" and name.endswith("_total"):
            raise FormatError(f"{fam['type']} {name} ends in _total (counters only)")
    return families


def value(families: dict, name: str, **labels: str) -> float:
    return families[name]["samples"][tuple(sorted(labels.items()))]


@pytest.mark.parametrize(
    "bad",
    [
        "x 1",  # no newline at the end
        '# TYPE x gauge\nx{a="1\\t"} 1\n',  # an escape the format does not have
        '# TYPE x gauge\nx{a="1"} 1\nx{a="1"} 2\n',  # the same series twice
        "# TYPE x gauge\n# TYPE y gauge\ny 1\nx 1\n",  # families interleaved
        "x 1\n",  # no TYPE
        "# TYPE x_total gauge\nx_total 1\n",  # _total on a gauge
        "# TYPE x counter\nx 1\n",  # a counter without _total
        "# TYPE x gauge\nx{a=1} 1\n",  # an unquoted label value
        "# TYPE x gauge\nx one\n",  # not a number
        "# TYPE 1x gauge\n1x 1\n",  # a bad metric name
    ],
)
def test_the_parser_refuses_what_prometheus_refuses(bad):
    with pytest.raises(FormatError):
        parse(bad)


def test_verify_metrics_say_what_verify_found():
    text = metrics.render_verify(noisy())
    fams = parse(text)
    assert value(fams, "cpupools_verify_ok") == 0
    assert value(fams, "cpupools_reboot_pending") == 0  # the result does not say one is pending
    assert value(parse(metrics.render_verify({**noisy(), "reboot_pending": True})), "cpupools_reboot_pending") == 1
    taken = calendar.timegm((2026, 11, 26, 19, 40, 0, 0, 0, 0))
    assert value(fams, "cpupools_verify_timestamp_seconds") == taken
    found = fams["cpupools_verify_findings"]["samples"]
    assert value(fams, "cpupools_verify_findings", check="latency", severity="fail") == 1
    assert value(fams, "cpupools_verify_findings", check="process", severity="fail") == 1
    assert value(fams, "cpupools_verify_findings", check="irq", severity="warn") == 1
    assert value(fams, "cpupools_verify_findings", check="irq", severity="fail") == 0  # present, 0: alertable
    assert len(found) == len(metrics.VERIFY_CHECKS) * len(metrics.SEVERITIES)
    assert value(fams, "cpupools_cpu_quiet", cpu="4", role="exclusive") == 0
    assert value(fams, "cpupools_cpu_quiet", cpu="7", role="shared") == 1
    assert value(fams, "cpupools_cpu_quiet", cpu="0", role="housekeeping") == 1
    assert value(fams, "cpupools_cpu_latency_max_microseconds", cpu="5", role="exclusive") == 180
    assert value(fams, "cpupools_cpu_latency_p99_microseconds", cpu="5", role="exclusive") == 40
    assert value(fams, "cpupools_cpu_latency_p999_microseconds", cpu="0", role="housekeeping") == 21
    measured = {dict(k)["cpu"] for k in fams["cpupools_cpu_latency_max_microseconds"]["samples"]}
    assert measured == {"0", "2", "3", "4", "5"}  # CPUs 6-7 were not measured: no series, not 0
    # Power and frequency as verify read them back, where a CPU has them (CPUs without: no series).
    assert value(fams, "cpupools_cpu_scaling_max_khz", cpu="2", role="exclusive") == 3000000
    assert value(fams, "cpupools_cpu_scaling_min_khz", cpu="0", role="housekeeping") == 800000
    assert {dict(k)["cpu"] for k in fams["cpupools_cpu_scaling_max_khz"]["samples"]} == {"0", "2"}
    info = "cpupools_cpu_power_info"
    assert value(fams, info, cpu="2", role="exclusive", governor="performance", deepest_cstate="C1") == 1
    assert value(fams, info, cpu="0", role="housekeeping", governor="powersave", deepest_cstate="C6") == 1
    assert all(f["type"] == "gauge" for f in fams.values())
    assert metrics.render_verify(noisy()) == text  # deterministic


def test_a_clean_verify_without_measurement_is_ok_and_has_no_latency_series():
    result = noisy()
    result.update(ok=True, findings=[])
    for row in result["per_cpu"].values():
        row.update(quiet=True, latency=None)
    fams = parse(metrics.render_verify(result))
    assert value(fams, "cpupools_verify_ok") == 1
    assert sum(fams["cpupools_verify_findings"]["samples"].values()) == 0
    assert "cpupools_cpu_latency_max_microseconds" not in fams


def test_reconcile_metrics_escape_label_values_and_name_cpulists():
    usage = {
        "exclusive": metrics.PoolUsage(4, 2, (1, 2, 45, 46), (3, 47, 5, 49)),
        "shared": metrics.PoolUsage(1, 0),
        'odd"pool\\with\nnewline': (1, 1),
    }
    fams = parse(metrics.render_reconcile(usage, 7))
    assert value(fams, "cpupools_pool_cpulists", pool="exclusive") == 4
    assert value(fams, "cpupools_pool_free_cpulists", pool='odd"pool\\with\nnewline') == 1
    assert value(fams, "cpupools_pool_held_cpus", pool="exclusive") == 4
    assert value(fams, "cpupools_pool_free_cpus", pool="exclusive") == 4
    assert value(fams, "cpupools_pool_cpus_info", pool="exclusive", held="1-2,45-46", free="3,5,47,49") == 1
    assert set(dict(k)["pool"] for k in fams["cpupools_pool_held_cpus"]["samples"]) == {"exclusive"}  # shared: none
    assert fams["cpupools_reclaimed_cpulists_total"]["type"] == "counter"
    assert value(fams, "cpupools_reclaimed_cpulists_total") == 7
    assert metrics.previous_counter(metrics.render_reconcile(usage, 7)) == 7


def test_numbers_are_exposition_values():
    assert [metrics.number(v) for v in (3, 2.0, 1.25, True, math.nan, math.inf)] == [
        "3",
        "2",
        "1.25",
        "1",
        "NaN",
        "+Inf",
    ]


def test_write_textfile_is_atomic_0644_and_leaves_an_unchanged_file_alone(tmp_path):
    old = os.umask(0o077)
    try:
        assert metrics.write_textfile(str(tmp_path), "cpupools_verify.prom", "a 1\n") is True
    finally:
        os.umask(old)
    path = tmp_path / "cpupools_verify.prom"
    assert path.read_text() == "a 1\n"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    inode, mtime = path.stat().st_ino, path.stat().st_mtime_ns
    time.sleep(0.01)
    assert metrics.write_textfile(str(tmp_path), "cpupools_verify.prom", "a 1\n") is False
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (inode, mtime)
    assert metrics.write_textfile(str(tmp_path), "cpupools_verify.prom", "a 2\n") is True
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert os.listdir(tmp_path) == ["cpupools_verify.prom"]  # no temporary file left


def test_write_textfile_names_the_file_it_cannot_write(tmp_path):
    with pytest.raises(metrics.CpupoolsError, match=r"metrics directory .*/missing"):
        metrics.write_textfile(str(tmp_path / "missing"), "cpupools.prom", "a 1\n")
