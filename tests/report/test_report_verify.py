"""The fleet report shows each host's last verify: per CPU quiet or not and what was found, the jitter
figures, the picture coloured by measured max latency, a latency chart, and the JSON beside the page."""

from __future__ import annotations

import json
import os
import re
import time
from html.parser import HTMLParser

import pytest
from cpupools.core.errors import ReportError
from cpupools.report import report, report_store
from cpupools.report.report_verify import LATENCY_SCALE
from cpupools.report.text import render_text
from report_page import TEMPLATE, render_html
from verify_results import noisy

#: 8 cores, SMT2 on adjacent ids: exclusive 2-5, shared 6-7, infra 0-1 and 8-15 (the fixture's CPUs).
CORPUS, REQUEST = "1s8c-adjacent", {"num_exclusive_cores": 2, "num_shared_cores": 1}


class Cells(HTMLParser):
    """Per host, each CPU cell of the picture's classes; the page's text; the chart's bars."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.cells: dict[str, dict[int, set[str]]] = {}
        self.titles: dict[str, dict[int, str]] = {}
        self.bars: list[dict[str, str]] = []
        self.text: list[str] = []
        self.host = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        if tag == "section" and "host" in classes:
            self.host = attrs["id"].removeprefix("host-")
            self.cells[self.host], self.titles[self.host] = {}, {}
        title = attrs.get("title") or ""
        if tag == "div" and "t" in classes and title.startswith("CPU "):
            cpu = int(title.split(":")[0].split()[1])
            self.cells[self.host][cpu] = classes
            self.titles[self.host][cpu] = title
        if tag == "rect" and "bar" in classes:
            self.bars.append({"host": self.host, **attrs})

    def handle_data(self, data):
        self.text.append(data)

    @property
    def words(self) -> str:
        return re.sub(r"\s+", " ", " ".join(self.text))


@pytest.fixture
def fleet(host_input):
    """node-1 verified (an IRQ on shared CPU 6, sshd on exclusive CPU 4, CPU 5 at 180 µs over a 50 µs
    threshold); node-2 never verified."""
    return [
        host_input(CORPUS, REQUEST, host="node-1", verify=noisy()),
        host_input(CORPUS, REQUEST, host="node-2"),
    ]


def test_the_page_shows_what_verify_found_per_cpu(fleet):
    page = Cells(render_html(fleet))
    words = page.words
    for text in (
        "IRQ 25 (virtio0-input.0) is effective on isolated CPU 6 (affinity 6-7); not managed",
        "pid 812 (sshd) ran on exclusive CPU 4, not held",
        "CPU 5: max latency 180 us, over the threshold of 50 us",
        "180 (over threshold)",
        "5 CPUs measured by oslat 2.5 for 10 s; thresholds max 50 µs; worst max 180 µs on CPU 5 (exclusive)",
        "Since 2026-11-26T19:40:00Z, kernel 6.1.0-28-amd64",
        "cmk pid 1234",
        "never verified",  # node-2
        "1 failed verify (node-1)",
    ):
        assert text in words, text
    # findings worst first: the fails, then the warning, then the note
    order = [words.index(t) for t in ("CPU 5: max latency", "pid 812 (sshd) ran", "IRQ 25 (virtio0", "unbound work")]
    assert order == sorted(order)
    assert "pid 812 (sshd)" in page.titles["node-1"][4] and "not quiet" in page.titles["node-1"][4]
    assert "max latency 180 µs, p99 40 µs" in page.titles["node-1"][5]
    # power and frequency as verify read them back (cpupools_power): in the CPU's hover text
    assert page.titles["node-1"][2].endswith("; performance, 3 GHz fixed, deepest C-state C1"), page.titles["node-1"][2]
    assert "powersave, 0.8-3.5 GHz, deepest C-state C6" in page.titles["node-1"][0]
    assert "GHz" not in page.titles["node-1"][4]  # no power read on CPU 4: nothing said


def test_measured_cpus_are_coloured_by_max_latency_and_the_rest_stay_as_they_were(fleet):
    html = render_html(fleet)
    cells = Cells(html).cells
    node1, node2 = cells["node-1"], cells["node-2"]
    # 180 µs -> the darkest step, 30 µs (housekeeping CPU 0) -> 20-49, 12 -> 10-19, 7 and 4 -> under 10
    expected = {5: "lat-4", 0: "lat-2", 4: "lat-1", 2: "lat-0", 3: "lat-0"}
    for cpu, step in expected.items():
        assert {"lat", step} <= node1[cpu], (cpu, node1[cpu])
    for cpu in set(node1) - set(expected):  # not measured: the pool's colour only
        assert not any(c.startswith("lat") for c in node1[cpu]), (cpu, node1[cpu])
    assert "c-exclusive" in node1[5] and "c-infra" in node1[0]  # the pool stays (the stripe's colour)
    # the quiet mark: CPUs 4, 5, 6 are not quiet; 7 is quiet; 1 was not verified
    assert {cpu for cpu, c in node1.items() if "noisy" in c} == {4, 5, 6}
    # a host never verified looks as before
    assert all(not (c & {"lat", "noisy"}) and not any(x.startswith("lat-") for x in c) for c in node2.values())
    # the scale: its colours in the page's CSS, after the pools' (a measured cell shows the latency colour)
    for i, (_, bg, fg, _) in enumerate(LATENCY_SCALE):
        rule = f".lat-{i},.lat-{i}>span{{background-color:{bg};color:{fg}}}"
        assert rule in html
        assert html.index(rule) > html.index(".c-infra,.c-infra>span{")
    legend = html[html.index('id="latency-scale"') : html.index("</p>", html.index('id="latency-scale"'))]
    assert [t for _, _, _, t in LATENCY_SCALE] == re.findall(r"</span>([^<]+)</span>", legend)
    assert "!: not quiet at the last verify" in html


def test_each_verified_node_has_an_inline_latency_chart(fleet):
    html = render_html(fleet)
    page = Cells(html)
    bars = [b for b in page.bars if b["host"] == "node-1"]
    assert len(bars) == 5 and not [b for b in page.bars if b["host"] == "node-2"]
    widths = {int(b["y"]): int(b["width"]) for b in bars}  # rows in CPU order: 0, 2, 3, 4, 5
    assert list(widths.values()) == [63, 15, 8, 25, 378]  # 30, 7, 4, 12, 180 µs on a 0-200 µs scale of 420 px
    assert [b["fill"] for b in bars] == [LATENCY_SCALE[i][1] for i in (2, 0, 0, 1, 4)]
    assert html.count('class="bar over"') == 1  # CPU 5
    assert html.count('class="threshold"') == 1 and "threshold 50 µs" in html
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert "href" not in svg and "<script" not in svg  # self-contained, no script


def test_the_text_report_lists_the_findings_and_the_figures(fleet):
    text = render_text(fleet)
    assert "  verify          fail (since 2026-11-26T19:40:00Z, kernel 6.1.0-28-amd64): 3 of 6 isolated" in text
    assert "  not quiet       CPU 4 (exclusive): pid 812 (sshd)\n" in text
    assert "                  CPU 5 (exclusive): latency fail\n" in text
    assert "                  CPU 6 (shared): IRQ 25 virtio0-input.0\n" in text
    assert re.search(r"\n {18}5 +exclusive +180 +40 +150 +over threshold\n", text), text
    assert "  power           CPU 0 (housekeeping): powersave, 0.8-3.5 GHz, deepest C-state C6\n" in text
    assert "                  CPU 2 (exclusive): performance, 3 GHz fixed, deepest C-state C1\n" in text
    assert "  verify          never verified\n" in text
    assert "1 failed verify (node-1)" in text.splitlines()[-1]


def test_a_malformed_verify_result_is_named(host_input):
    entry = host_input(CORPUS, REQUEST, host="node-1", verify={"per_cpu": {"x": {}}})
    with pytest.raises(ReportError, match=r"host node-1: cpupools_verify_result: per_cpu: 'x' is not a CPU number"):
        render_text([entry])


def run_report(tmp_path, hosts, check_mode=False, **params):
    args = {
        "hosts": hosts,
        "html_path": str(tmp_path / "out" / "cpupools-report.html"),
        "template": TEMPLATE,
        "title": "cpupools report",
        **params,
    }
    return report.report(args, check_mode)


def test_the_json_beside_the_page_holds_the_verify_results_and_is_idempotent(tmp_path, fleet):
    first = run_report(tmp_path, fleet)
    path = tmp_path / "out" / "cpupools-report.json"
    assert first["changed"] and first["json_path"] == str(path)
    assert first["hosts"]["node-1"]["verify"] == "fail" and first["hosts"]["node-2"]["verify"] is None
    data = json.loads(path.read_text())
    assert data["format"] == 1
    one, two = data["hosts"]
    assert one["host"] == "node-1" and one["verify"] == noisy()
    assert one["plan"]["pool_cpus"] == {"exclusive": "2-5", "shared": "6-7", "infra": "0-1,8-15"}
    assert one["plan"]["isolated_cpus"] == "2-7" and one["plan"]["mode"] == "generate"
    assert two["host"] == "node-2" and two["verify"] is None
    assert "1 failed verify (node-1)" in data["fleet"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    stamp = path.stat().st_mtime_ns
    time.sleep(0.01)
    again = run_report(tmp_path, fleet)
    assert again["changed"] is False and "diff" not in again
    assert path.stat().st_mtime_ns == stamp
    # A new verify result changes the JSON (and the page); check mode says so and writes nothing.
    fleet[1]["verify"] = noisy() | {"ok": True, "findings": []}
    predicted = run_report(tmp_path, fleet, check_mode=True)
    assert predicted["changed"] is True
    assert {d["after_header"] for d in predicted["diff"]} == {str(path), str(path.with_suffix(".html"))}
    assert path.stat().st_mtime_ns == stamp and json.loads(path.read_text())["hosts"][1]["verify"] is None
    assert sorted(os.listdir(path.parent)) == ["cpupools-report.html", "cpupools-report.json"]


def test_the_store_keeps_each_hosts_last_verify(tmp_path, fleet):
    store = str(tmp_path / "store")
    inventory = ["node-1", "node-2"]
    run_report(tmp_path, fleet, store=store, inventory_hosts=inventory, now=1_000, run="verify run")
    unverified = [dict(entry, verify=None) for entry in fleet]  # a later site.yml: no verify this time
    later = run_report(tmp_path, unverified, store=store, inventory_hosts=inventory, now=2_000, run="site run")
    assert later["hosts"]["node-1"]["verify"] == "fail"  # shown from the store
    # The same data as the verify run left: no file rewritten, each keeps its time and run; the site run
    # reported them (their modification time).
    assert later["changed"] is False and later["store"]["written"] == []
    stored, _ = report_store.read(store)
    assert stored["node-1"].entry["verify"] == noisy() and stored["node-1"].run == "verify run"
    assert (stored["node-1"].taken, stored["node-1"].seen) == (1_000, 2_000)
    assert stored["node-2"].entry.get("verify") is None
    # playbooks/fleet_report.yml: no host of its own, the whole fleet from the store
    fleet_only = run_report(tmp_path, [], store=store, inventory_hosts=inventory, now=3_000)
    assert fleet_only["hosts"]["node-1"]["verify"] == "fail"
    data = json.loads((tmp_path / "out" / "cpupools-report.json").read_text())
    assert data["hosts"][0]["verify"]["findings"][0]["check"] == "latency"
    assert data["store"]["taken"]["node-1"] == {"at": "1970-01-01T00:16:40Z", "run": "verify run"}
