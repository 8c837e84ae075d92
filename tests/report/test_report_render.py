"""The text and HTML renderers over the fixture corpus: content, drift, escaping, determinism."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser

import pytest
from cpupools.core.cpulist import format_cpulist, parse_cpulist
from cpupools.core.errors import CpupoolsError, ReportError
from cpupools.report import analysis
from cpupools.report.analysis import OFFLINE, STRANDED, analyse, analyse_host
from cpupools.report.text import render_text, render_text_lines
from report_page import render_html
from sysfs import CORPUS

TWO_SOCKET = {"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"}


class Page(HTMLParser):
    """What the HTML holds: every CPU cell of the picture, every section, all visible text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.cells: dict[str, list[tuple[int, set[str]]]] = {}  # host -> [(cpu, classes)]
        self.host: str | None = None
        self.text: list[str] = []
        self.tags: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        classes = set((attrs.get("class") or "").split())
        if tag == "section" and "host" in classes:
            self.host = attrs["id"].removeprefix("host-")
            self.cells[self.host] = []
        title = attrs.get("title") or ""
        if "t" in classes and title.startswith("CPU "):
            cpu = int(title.split(":")[0].split()[1])
            self.cells[self.host].append((cpu, classes))

    def handle_data(self, data):
        self.text.append(data)

    def pool_of(self, host: str) -> dict[int, str]:
        out = {}
        for cpu, classes in self.cells[host]:
            pools = [c.removeprefix("c-") for c in classes if c.startswith("c-")]
            assert len(pools) == 1, (cpu, classes)
            assert cpu not in out, f"CPU {cpu} drawn twice"
            out[cpu] = pools[0]
        return out

    def marked(self, host: str, cls: str) -> list[int]:
        return sorted(cpu for cpu, classes in self.cells[host] if cls in classes)


@pytest.mark.parametrize("name", sorted(n for n in CORPUS if n != "1s16c-smt-off"))  # that one is refused
def test_every_cpu_drawn_once_in_its_planned_pool(host_input, name):
    request = {"num_exclusive_cores": 2, "num_shared_cores": 1}
    if name == "8s64c-smt2":
        request = {"num_exclusive_cores": 64, "num_shared_cores": 8, "exclusive_mode": "spread"}
    entry = host_input(name, request)
    plan, facts = entry["plan"], entry["topology"]
    page = Page(render_html([entry]))
    drawn = page.pool_of(name)
    expected = {cpu: pool for pool, cpus in plan["pool_cpus"].items() for cpu in parse_cpulist(cpus)}
    expected.update({cpu: OFFLINE for cpu in parse_cpulist(facts["offline"])})
    assert drawn == expected
    # The text table lists every pool of every socket, cpulists compressed.
    text = render_text([entry])
    for pool, sockets in plan["pools"].items():
        filled = {s: lists for s, lists in sockets.items() if lists} or {"-": []}
        for socket, lists in filled.items():
            cpus = format_cpulist(c for lst in lists for c in parse_cpulist(lst)) or "-"
            assert re.search(
                rf"^  {re.escape(pool)}\s+{re.escape(socket)}\s+\d+\s+\d+\s+{re.escape(cpus)}(\s|$)", text, re.M
            ), (
                pool,
                socket,
                text,
            )


def test_picture_groups_threads_by_core_socket_and_numa(host_input):
    entry = host_input("2s8c-2numa")
    view = analyse_host(entry)
    assert [s.socket for s in view.sockets] == [0, 1]
    assert [node.node for node in view.sockets[0].numa] == [0, 1]
    assert [node.node for node in view.sockets[1].numa] == [2, 3]
    first = view.sockets[0].numa[0].cores[0]
    assert first.label == "0,16" and [t.cpu for t in first.threads] == [0, 16]
    html = render_html([entry])
    assert html.count('class="numa"') == 4
    assert html.count('class="core"') == 16


def test_hosts_given_one_topology_object_read_it_once_and_show_what_each_shows_alone(host_input, monkeypatch):
    # the report's action gives every host naming one stored topology the same object
    first = host_input("2s22c-smt2", TWO_SOCKET, host="node-1", numa_facts=True)
    second = host_input("2s22c-smt2", {"num_exclusive_cores": 2}, host="node-2", numa_facts=True)
    third = host_input("1s64c-smt2-nps4", host="node-3", numa_facts=True)
    assert second["topology"] == first["topology"] and second["topology"] is not first["topology"]
    second["topology"] = first["topology"]
    alone = [analyse_host(entry) for entry in (first, second, third)]
    reads = []
    real = analysis._read_facts
    monkeypatch.setattr(analysis, "_read_facts", lambda facts: reads.append(facts) or real(facts))
    views = analyse([first, second, third])
    assert [id(facts) for facts in reads] == [id(first["topology"]), id(third["topology"])]
    assert views == alone
    # each host's own plan on the shared model
    assert views[0].isolated_planned != views[1].isolated_planned
    assert views[1].isolated_planned == format_cpulist(parse_cpulist(second["plan"]["isolated_cpus"]))
    # a host with an equal but separate facts object is read again: identity, not equality, is shared
    fourth = host_input("2s22c-smt2", host="node-4", numa_facts=True)
    reads.clear()
    assert analyse([first, fourth])[1] == analyse_host(fourth)
    assert len(reads) == 3


def test_text_report_of_a_pending_node(host_input):
    entry = host_input(
        "2s22c-smt2",
        TWO_SOCKET,
        host="node-1",
        kernel={"reboot_required": True, "pending": ["isolcpus", "nohz_full"], "desired_cmdline_args": {}},
    )
    lines = render_text_lines([entry])
    text = "\n".join(lines)
    assert lines[0].startswith("== node-1 [pending]: 2 sockets, 44 cores, 88 CPUs online (2 per core); mode generate")
    assert re.search(r"^  exclusive\s+0\s+3\s+6\s+1-3,45-47\s+0/3$", text, re.M)
    assert re.search(r"^  exclusive\s+1\s+3\s+6\s+23-25,67-69\s+0/3$", text, re.M)
    assert re.search(r"^  shared\s+0\s+2\s+4\s+4-5,48-49$", text, re.M)
    assert not re.search(r"^  shared\s+1", text, re.M)  # no row for a socket without shared CPUs

    assert (
        "isolated CPUs   active none; planned 1-5,23-25,45-49,67-69 (+1-5,23-25,45-49,67-69 to isolate at next boot)"
        in text
    )
    assert "kernel          reboot required (pending: isolcpus, nohz_full)" in text
    assert "cmk.intel.com/exclusive-cores: expected 6, advertised - (not collected)" in text
    assert "drift           none" in text
    assert lines[-1] == "fleet: 1 host; 1 pending (node-1); 6 exclusive cores"


def test_an_empty_pool_gets_one_row(host_input):
    text = render_text([host_input("1s8c-smt2", {"num_shared_cores": 0})])
    assert re.search(r"^  shared\s+-\s+0\s+0\s+-$", text, re.M), text


def test_kernel_that_differs_without_a_pending_reboot_is_drift(host_input):
    entry = host_input("1s8c-smt2", spec={"isolated": "1-7,9-15"}, kernel={"reboot_required": False})
    view = analyse_host(entry)
    assert view.status == "drift"
    assert (view.to_isolate, view.to_release) == ("", "6-7,14-15")
    assert view.drift == [
        "kernel: the running kernel isolates 1-7,9-15, the plan 1-5,9-13, and the boot configuration has no "
        "pending change"
    ]
    page = Page(render_html([entry]))
    assert page.marked("1s8c-smt2", "p-release") == [6, 7, 14, 15]
    assert page.marked("1s8c-smt2", "p-isolate") == []


def test_isolcpus_without_the_domain_flag_isolates_its_cpus_though_sysfs_shows_none(host_input):
    """The kubelet runtime's isolcpus=managed_irq,<cpus>: the real Debian 13 guest's
    /sys/devices/system/cpu/isolated was empty on the kernel booted with it, and that is no drift."""
    plain = host_input("1s8c-smt2")
    iso = plain["plan"]["isolated_cpus"]
    cmdline = f"BOOT_IMAGE=/vmlinuz root=/dev/vda1 isolcpus=managed_irq,{iso} nohz_full={iso}"
    entry = host_input("1s8c-smt2", spec={"isolated": "", "cmdline": cmdline}, kernel={"reboot_required": False})
    view = analyse_host(entry)
    assert view.isolated_active == iso and view.to_isolate == "" and view.to_release == ""
    assert not [d for d in view.drift if d.startswith("kernel:")], view.drift


def test_a_runtime_without_cmks_pool_state_has_no_state_drift(host_input):
    """On a kubelet node the agent stage removes CMK's pool state: none is expected (the real guest's report
    said every planned pool was missing from it)."""
    entry = host_input("1s8c-smt2", {"runtime": "kubelet"}, state={"present": True, "tasks": {}})
    view = analyse_host(entry)
    assert not [d for d in view.drift if d.startswith("state:")], view.drift
    assert view.tasks_note == "none kept by cpupools (runtime kubelet)"


def test_kernel_status_not_collected_is_pending_with_the_doubt_spelt_out(host_input):
    view = analyse_host(host_input("1s8c-smt2"))
    assert view.status == "pending" and view.drift == []
    assert view.kernel.startswith("not collected: the running kernel differs from the plan")


def test_kernel_in_line_with_plan_is_ok_and_marks_nothing(host_input):
    plain = host_input("1s8c-smt2")
    iso = plain["plan"]["isolated_cpus"]
    entry = host_input(
        "1s8c-smt2",
        spec={"isolated": iso},
        kernel={"reboot_required": False},
        state={"tasks": {p: {c: [] for s in socks.values() for c in s} for p, socks in plain["plan"]["pools"].items()}},
        k8s={"enabled": True, "advertised": {"cmk.intel.com/exclusive-cores": 4}},
    )
    view = analyse_host(entry)
    assert view.drift == [] and view.status == "ok", view.drift
    page = Page(render_html([entry]))
    assert page.marked("1s8c-smt2", "p-isolate") == [] and page.marked("1s8c-smt2", "p-release") == []
    assert "cmk.intel.com/exclusive-cores: expected 4, advertised 4 ok" in render_text([entry])


def test_pending_isolation_is_marked_on_exactly_the_changing_threads(host_input):
    # 2s8c-2numa: NUMA nodes of 4 cores, each keeping its first for housekeeping (cores 0, 4, 8,
    # 12); the plan isolates 1-3, 5 (exclusive) and 6 (shared) with their siblings 17-19, 21, 22.
    entry = host_input("2s8c-2numa", spec={"isolated": "1-5,8"}, kernel={"reboot_required": True})
    page = Page(render_html([entry]))
    plan_iso = set(parse_cpulist(entry["plan"]["isolated_cpus"]))
    assert plan_iso == {1, 2, 3, 5, 6, 17, 18, 19, 21, 22}
    assert page.marked("2s8c-2numa", "p-isolate") == sorted(plan_iso - {1, 2, 3, 4, 5, 8})
    assert page.marked("2s8c-2numa", "p-release") == [4, 8]
    assert analyse_host(entry).status == "pending"


def test_state_and_k8s_drift(host_input):
    plain = host_input("1s8c-smt2")
    pools = plain["plan"]["pools"]
    tasks = {p: {c: [] for s in socks.values() for c in s} for p, socks in pools.items()}
    tasks["exclusive"]["1,9"] = [4242, 17]
    tasks["exclusive"]["7,15"] = [99]  # a cpulist the plan does not have
    del tasks["exclusive"]["2,10"]
    entry = host_input(
        "1s8c-smt2",
        host="n",
        state={"tasks": tasks},
        k8s={
            "enabled": True,
            "advertised": {"cmk.intel.com/exclusive-cores": 3},
            "expected": {"cmk.intel.com/exclusive-cores": 4},
        },
    )
    view = analyse_host(entry)
    assert view.drift == [
        "state: task(s) 99 hold exclusive cpulist 7,15, which the plan does not have",
        "state: pool exclusive cpulists differ from the plan (missing 2,10, not planned 7,15)",
        "k8s: cmk.intel.com/exclusive-cores advertised 3, expected 4",
    ]
    text = render_text([entry])
    assert "live tasks      3 tasks on 2 cpulists" in text
    assert "exclusive 1,9: 17, 4242" in text
    assert re.search(r"^  exclusive\s+0\s+4\s+8\s+1-4,9-12\s+1/4$", text, re.M)
    page = Page(render_html([entry]))
    assert page.marked("n", "busy") == [1, 7, 9, 15]


def test_missing_state_dir_and_skipped_k8s(host_input):
    entry = host_input("1s8c-smt2", state={"present": False}, k8s={"enabled": False, "skipped_reason": "no kubeconfig"})
    text = render_text([entry])
    assert "live tasks      state directory not written yet" in text
    assert "state: the pool state directory does not exist yet" in text
    assert "expected 4, advertised - (skipped: no kubeconfig)" in text


def test_adopt_mode_draws_stranded_cpus(host_input):
    entry = host_input(
        "2s8c-nosmt",
        {"isolcpus_source": "adopt", "num_exclusive_cores": 2, "num_shared_cores": 1},
        spec={"cmdline": "ro isolcpus=1-6", "isolated": "1-6"},
    )
    stranded = parse_cpulist(entry["plan"]["stranded_cpus"])
    assert stranded  # the fixture must actually strand cores, or this test proves nothing
    page = Page(render_html([entry]))
    assert sorted(c for c, p in page.pool_of("2s8c-nosmt").items() if p == STRANDED) == stranded
    text = render_text([entry])
    assert f"stranded CPUs   {format_cpulist(stranded)}" in text
    assert "warnings        3 isolated cores" in text


def test_exclusive_non_isolcpus_pool_and_its_resource(host_input):
    entry = host_input("1s8c-smt2", {"excl_non_isolcpus": "6,14"}, k8s={"enabled": True, "advertised": {}})
    page = Page(render_html([entry]))
    assert sorted(c for c, p in page.pool_of("1s8c-smt2").items() if p == "exclusive-non-isolcpus") == [6, 14]
    view = analyse_host(entry)
    assert ("cmk.intel.com/exclusive-non-isolcpus-cores", "1", "-", "DRIFT") in view.resources


def test_absent_parts_say_not_collected():
    entry = {"host": "bare"}
    text = render_text([entry])
    assert text.count("not collected") >= 5
    assert text.splitlines()[0] == "== bare [unplanned]"
    page = render_html([entry])
    assert "topology not collected" in page
    assert analyse_host({"host": "bare", "plan": None, "kernel": None}).status == "unplanned"


def test_everything_is_escaped(host_input):
    evil = '<script>alert("x")</script>&amp;'
    entry = host_input(
        "1s8c-smt2",
        host=evil,
        kernel={"reboot_required": True, "pending": ['isolcpus="<marquee>"']},
        k8s={"enabled": True, "advertised": {"<blink>res</blink>": 1}, "expected": {}},
    )
    entry["plan"]["warnings"] = ["<img src=x onerror=alert(1)>"]
    page = render_html([entry], failed=["<u>gone</u>"], title="<title>", generated="<now>")
    assert "<script" not in page and "<img" not in page and "<marquee" not in page and "<blink" not in page
    assert "<u>" not in page and "<now>" not in page and "<title><title>" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;amp;" in page  # markupsafe writes " as &#34;
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    parsed = Page(page)
    assert evil in parsed.cells  # the section id round-trips to the real name
    assert evil in "".join(parsed.text)


def test_html_is_self_contained():
    page = render_html([{"host": "a"}])
    assert not re.search(r"(src|href)\s*=", page, re.I)
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    assert "<script" not in page


def test_same_input_same_bytes_whatever_the_key_order(host_input):
    a = host_input(
        "2s22c-smt2", TWO_SOCKET, host="a", state={"tasks": {"shared": {"4,5,48,49": [3, 1]}, "exclusive": {}}}
    )
    b = host_input("4s6c-smt2", host="b")
    hosts = [a, b]
    text, page = render_text(hosts), render_html(hosts)
    shuffled = json.loads(json.dumps(hosts))
    for entry in shuffled:
        for key in ("plan", "topology"):
            entry[key] = dict(reversed(list(entry[key].items())))
        entry["plan"]["pools"] = dict(reversed(list(entry["plan"]["pools"].items())))
    shuffled[0]["state"]["tasks"] = {"exclusive": {}, "shared": {"4,5,48,49": [1, 3]}}
    assert render_text(shuffled) == text
    assert render_html(shuffled) == page
    assert render_html(copy.deepcopy(hosts)) == page
    # No clock: a timestamp appears only when passed in.
    assert render_html(hosts, generated="2024-05-01") != page and "2024-05-01" in render_html(
        hosts, generated="2024-05-01"
    )


def test_fleet_summary_counts_each_status(host_input):
    ok_src = host_input("1s8c-smt2")
    ok = host_input("1s8c-smt2", host="ok", spec={"isolated": ok_src["plan"]["isolated_cpus"]}, kernel={})
    pending = host_input("1s8c-smt2", host="pending", kernel={"reboot_required": True})
    drift = host_input("1s8c-smt2", host="drift", kernel={"reboot_required": False})
    lines = render_text_lines([ok, pending, drift, {"host": "bare"}], failed=["dead"])
    assert lines[-1] == (
        "fleet: 4 hosts; 1 as planned; 1 pending (pending); 1 drifted (drift); 1 unplanned (bare); "
        "12 exclusive cores; 1 failed earlier and not reported (dead)"
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"host": "h", "plan": "oops"}, "host h: cpupools_plan: expected a dict, got str"),
        ({"host": "h", "plan": {"pool_cpus": {}}}, "host h: cpupools_plan: has no 'pools' dict"),
        ({"host": "h", "topology": {"cpus": []}}, "host h: ansible_facts.cpupools: "),
        (
            {"host": "h", "k8s": {"enabled": True, "advertised": {"r": "many"}}},
            "host h: cpupools_k8s_status: advertised r",
        ),
        (
            {"host": "h", "state": {"tasks": {"exclusive": {"1-x": [1]}}}},
            "host h: cpupools_agent_status: malformed exclusive state cpulist '1-x': item 1 '1-x': "
            "'x' is not a CPU number",
        ),
        ({"nohost": 1}, "every report input needs a 'host' name"),
    ],
)
def test_malformed_input_is_one_clear_error(entry, message):
    with pytest.raises(ReportError) as exc:
        render_text([entry])
    assert str(exc.value).startswith(message), str(exc.value)
    assert isinstance(exc.value, CpupoolsError)


def test_a_host_named_twice_is_refused():
    with pytest.raises(ReportError, match="host a appears twice"):
        render_text([{"host": "a"}, {"host": "a"}])
