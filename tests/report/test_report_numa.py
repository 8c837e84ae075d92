"""NUMA nodes, L3 domains and hugepages in the report; escaping and determinism of the template page.

The NUMA/L3 facts (per CPU ``l3``, ``l3_domains``, ``numa_distances``) and
the hugepage facts are built by hand here (conftest ``add_numa_facts``), in
the shape the facts module gives them; old facts without them must still work.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from cpupools.core.errors import ReportError
from cpupools.report.analysis import analyse_host
from cpupools.report.text import render_text, render_text_lines
from report_page import render_html
from sysfs import CORPUS

NPS4 = "1s64c-smt2-nps4"  # 1 socket, 4 NUMA nodes of 16 cores, L3 domains of 8 cores: 0-15,64-79 is node 0


class Tags(HTMLParser):
    """Every start tag with its attributes, and the visible text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def with_class(self, cls: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.tags if cls in (a.get("class") or "").split()]

    def cell_titles(self) -> dict[int, str]:
        out = {}
        for attrs in self.with_class("t"):
            title = attrs.get("title") or ""
            if title.startswith("CPU "):
                out[int(title.split(":")[0].split()[1])] = title
        return out


def rows(text: str, head: str) -> list[list[str]]:
    """The rows of the text table whose header line starts with ``head``, split on runs of spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  " + head))
    out = []
    for line in lines[start + 1 :]:
        if not re.match(r"^  \d", line):
            break
        out.append(line.split())
    return out


@pytest.fixture
def nps4(host_input):
    # 12 exclusive + 4 shared cores, packed: the plan of today puts them all on NUMA node 0-1.
    return host_input(NPS4, {"num_exclusive_cores": 12, "num_shared_cores": 4}, host="epyc", numa_facts=True)


def test_numa_table_names_each_node_its_l3_domains_pools_and_distances(nps4):
    text = render_text([nps4])
    header = next(line for line in text.splitlines() if line.startswith("  numa "))
    columns = ["numa", "socket", "cores", "cpus", "cpulist", "l3", "housekeeping"]
    assert header.split() == [*columns, "exclusive", "shared", "infra", "distances"]
    table = rows(text, "numa ")
    # Each node's housekeeping: its first core (one thread per 32 of its 32 threads).
    assert [r[6] for r in table] == ["0,64", "16,80", "32,96", "48,112"]
    table = [r[:6] + r[7:] for r in table]
    # Hand-checked: node n holds cores 16n..16n+15 (CPUs c and c+64), L3 domains 2n and 2n+1.
    assert [r[:6] for r in table] == [
        ["0", "0", "16", "32", "0-15,64-79", "0-1"],
        ["1", "0", "16", "32", "16-31,80-95", "2-3"],
        ["2", "0", "16", "32", "32-47,96-111", "4-5"],
        ["3", "0", "16", "32", "48-63,112-127", "6-7"],
    ]
    assert [" ".join(r[9:]) for r in table] == ["10 12 12 12", "12 10 12 12", "12 12 10 12", "12 12 12 10"]
    # Pool columns count physical cores; each pool's cores over the nodes add up to the plan's.
    pools = {"exclusive": 6, "shared": 7, "infra": 8}
    for pool, col in pools.items():
        assert sum(int(r[col]) for r in table) == {"exclusive": 12, "shared": 4, "infra": 48}[pool], pool
    assert all(sum(int(r[c]) for c in pools.values()) == 16 for r in table)  # every core of a node in one pool


def test_l3_table_lists_every_domain_with_its_node_and_pools(nps4):
    text = render_text([nps4])
    table = rows(text, "l3 ")
    assert [r[:5] for r in table] == [
        [str(d), str(d // 2), "8", "16", f"{8 * d}-{8 * d + 7},{64 + 8 * d}-{64 + 8 * d + 7}"] for d in range(8)
    ]
    view = analyse_host(nps4)
    pool_cpus = nps4["plan"]["pool_cpus"]
    # The fixture's plan, packed: node 0 (cores 0-15, L3 0 = 0-7, L3 1 = 8-15) after its
    # housekeeping core 0 has 15 cores for 12 exclusive and 3 shared ones. Shared goes beside
    # housekeeping in L3 0 (1-3); exclusive takes the clean L3 1 whole, then the rest of L3 0
    # (4-7). The 4th shared core is node 1's, beside its housekeeping core 16 in L3 2: core 17.
    assert pool_cpus["exclusive"] == "4-15,68-79"
    assert pool_cpus["shared"] == "1-3,17,65-67,81"
    assert view.l3[0].pools == "exclusive 4, shared 3, infra 1"
    assert view.l3[1].pools == "exclusive 8"
    assert view.l3[2].pools == "shared 1, infra 7"


def test_picture_nests_l3_domains_in_numa_nodes_and_names_both_on_every_cpu(nps4):
    page = Tags(render_html([nps4]))
    assert len(page.with_class("numa")) == 4 and [a["data-numa"] for a in page.with_class("numa")] == list("0123")
    assert [a["data-l3"] for a in page.with_class("l3")] == [str(d) for d in range(8)]
    assert len(page.with_class("core")) == 64
    titles = page.cell_titles()
    assert len(titles) == 128
    by_id = {c["id"]: c for c in CORPUS[NPS4].cpus()}
    for cpu, title in titles.items():
        assert f"; NUMA node {by_id[cpu]['node']}; L3 {by_id[cpu]['l3']}" in title, title
    text = "".join(page.text)
    assert "socket 0 · 64 cores · NUMA nodes 0-3 · L3 domains 0-7" in text
    assert "NUMA node 2 · 16 cores · L3 4-5" in text and "L3 5 · 8 cores" in text
    assert "L3 domains (8)" in text


def test_l3_shared_by_two_numa_nodes_is_named_not_boxed(host_input):
    """Sub-NUMA clustering: one L3 per socket spans both NUMA nodes of the socket."""
    entry = host_input("2s8c-2numa", numa_facts=True)
    facts = entry["topology"]
    for cpu in facts["cpus"]:
        cpu["l3"] = cpu["socket"]
    facts["l3_domains"] = {"0": "0-7,16-23", "1": "8-15,24-31"}
    page = Tags(render_html([entry]))
    assert page.with_class("l3") == []  # no NUMA node holds two L3 domains: nothing to box
    assert len(page.with_class("numa")) == 4
    text = "".join(page.text)
    assert "NUMA node 1 · 4 cores · L3 0" in text and "NUMA node 2 · 4 cores · L3 1" in text
    assert [r[:5] for r in rows(render_text([entry]), "l3 ")] == [
        ["0", "0-1", "8", "16", "0-7,16-23"],
        ["1", "2-3", "8", "16", "8-15,24-31"],
    ]


def test_old_facts_without_numa_keys_show_no_l3(host_input):
    entry = host_input("2s8c-2numa")
    # Facts of a cpupools before NUMA/L3 support: no l3, l3_domains, numa_distances keys.
    for key in ("l3_domains", "numa_distances"):
        entry["topology"].pop(key, None)
    for cpu in entry["topology"]["cpus"]:
        cpu.pop("l3", None)
    text = render_text([entry])
    header = next(line for line in text.splitlines() if line.startswith("  numa "))
    assert header.split() == [
        "numa",
        "socket",
        "cores",
        "cpus",
        "cpulist",
        "housekeeping",
        "exclusive",
        "shared",
        "infra",
    ]
    assert not re.search(r"^  l3 ", text, re.M)
    page = render_html([entry])
    assert 'class="l3"' not in page and "L3" not in page and "distances" not in page
    assert Tags(page).cell_titles()[0] == "CPU 0: infra; NUMA node 0"


PLANNED = [
    {"size": "1G", "count": 16, "numa_node": 0},
    {"size": "1GB", "count": 16, "numa_node": 1},
    {"size": "2048kB", "count": 512},
]
PRESENT = {
    "0": {"1G": {"total": 16, "free": 12}, "2M": {"total": 0, "free": 0}},
    "1": {"1G": {"total": 8, "free": 8}, "2M": {"total": 100, "free": 90}},
    "2": {"1G": {"total": 0, "free": 0}, "2M": {"total": 0, "free": 0}},
    "3": {"1G": {"total": 0, "free": 0}},
}


def with_pages(entry: dict, planned=PLANNED, present=PRESENT) -> dict:
    if present is not None:
        entry["topology"]["hugepages"] = json.loads(json.dumps(present))
    if planned is not None:
        entry["hugepages"] = planned
    return entry


def test_hugepages_planned_against_present_per_node_and_size(host_input):
    iso = host_input(NPS4)["plan"]["isolated_cpus"]
    entry = with_pages(host_input(NPS4, host="h", spec={"isolated": iso}, kernel={"reboot_required": False}))
    lines = render_text_lines([entry])
    i = next(n for n, line in enumerate(lines) if line.startswith("  hugepages"))
    # Nodes ascending, then the counts not tied to a node; sizes ascending within each.
    assert lines[i : i + 3] == [
        "  hugepages       NUMA node 0 1G: planned 16, total 16, free 12; ok",
        "                  NUMA node 1 2M: planned -, total 100, free 90; not planned",
        "                  NUMA node 1 1G: planned 16, total 8, free 8; short by 8",
    ]
    assert lines[i + 3] == "                  all NUMA nodes 2M: planned 512, total 100, free 90; short by 412"
    view = analyse_host(entry)
    assert view.status == "drift"
    assert view.drift == [
        "hugepages: NUMA node 1 holds 8 1G pages, the plan 16",
        "hugepages: all NUMA nodes holds 100 2M pages, the plan 512",
    ]
    page = Tags(render_html([entry]))
    cells = [a for _, a in page.tags if a.get("class") == "drift"]
    assert len(cells) == 2 + 2  # two verdict cells, two drift lines in the facts table
    assert "short by 412" in "".join(page.text)


def test_short_hugepages_with_a_reboot_pending_are_pending_not_drift(host_input):
    entry = with_pages(host_input(NPS4, kernel={"reboot_required": True, "pending": ["hugepagesz"]}))
    view = analyse_host(entry)
    assert view.status == "pending" and view.drift == []
    assert [(r.node, r.size, r.verdict) for r in view.hugepages] == [
        ("0", "1G", "ok"),
        ("1", "2M", "not planned"),
        ("1", "1G", "pending reboot"),
        ("all", "2M", "pending reboot"),
    ]


def test_hugepages_only_planned_or_only_present(host_input):
    planned_only = analyse_host(with_pages(host_input(NPS4, kernel={}), present=None))
    assert [(r.node, r.size, r.planned, r.total, r.verdict) for r in planned_only.hugepages] == [
        ("0", "1G", "16", "-", "not collected"),
        ("1", "1G", "16", "-", "not collected"),
        ("all", "2M", "512", "-", "not collected"),
    ]
    assert not any(d.startswith("hugepages") for d in planned_only.drift)
    present_only = analyse_host(with_pages(host_input(NPS4, kernel={}), planned=None))
    assert [(r.node, r.size, r.planned, r.total) for r in present_only.hugepages] == [
        ("0", "1G", "-", "16"),
        ("1", "2M", "-", "100"),
        ("1", "1G", "-", "8"),
    ]
    assert not any(d.startswith("hugepages") for d in present_only.drift)
    neither = render_text([host_input(NPS4)])
    assert "hugepages" not in neither and "Hugepages" not in render_html([host_input(NPS4)])


def test_hugepages_given_as_text_with_e_mean_the_same(host_input):
    as_yaml = with_pages(host_input(NPS4, kernel={}))
    as_text = with_pages(host_input(NPS4, kernel={}), planned=json.dumps(PLANNED))
    assert render_text([as_text]) == render_text([as_yaml])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda e: e["topology"]["cpus"][3].update(l3="x"),
            "host h: ansible_facts.cpupools: l3 of cpu3: 'x' is not a number",
        ),
        (
            lambda e: e["topology"].update(l3_domains={"0": "0-3,zz"}),
            "host h: ansible_facts.cpupools: malformed l3_domains 0 '0-3,zz': item 2 'zz'",
        ),
        (
            lambda e: e["topology"].update(numa_distances={"0": "10 21"}),
            "host h: ansible_facts.cpupools: numa_distances 0: expected a list of distances, got '10 21'",
        ),
        (
            lambda e: e["topology"].update(hugepages={"0": {"huge": {"total": 1}}}),
            "host h: ansible_facts.cpupools: hugepages 0 size: 'huge' is not a hugepage size (1G, 2M, 2048kB)",
        ),
        (
            lambda e: e.update(hugepages=[{"size": "3X", "count": 1}]),
            "host h: cpupools_hugepages: size: '3X' is not a hugepage size (1G, 2M, 2048kB)",
        ),
        (
            lambda e: e.update(hugepages=[{"size": "1G", "count": "many"}]),
            "host h: cpupools_hugepages: count of 1G: 'many' is not a number",
        ),
        (
            lambda e: e.update(hugepages=[{"size": "2M", "count": "-4", "numa_node": 0}]),
            "host h: cpupools_hugepages: count of 2M: -4 is negative",
        ),
        (
            lambda e: e.update(hugepages="[{size: 1G"),
            "host h: cpupools_hugepages: '[{size: 1G' is not a list of hugepage reservations",
        ),
    ],
)
def test_malformed_numa_and_hugepage_input_is_one_clear_error(host_input, change, message):
    entry = host_input("1s8c-smt2", host="h", numa_facts=True)
    change(entry)
    with pytest.raises(ReportError) as exc:
        render_text([entry])
    assert str(exc.value).startswith(message), str(exc.value)


def test_hostile_names_cannot_leave_their_attribute_or_text(host_input):
    evil = "x\" onmouseover=\"alert(1)' data-x='<b>"
    entry = with_pages(host_input(NPS4, host=evil, numa_facts=True, kernel={}))
    entry["plan"]["warnings"] = ['"><script>alert(2)</script>']
    page = render_html([entry], failed=['"><i>'], title="</title><script>", generated="<!--")
    tags = Tags(page)
    assert all("onmouseover" not in attrs for _, attrs in tags.tags)
    assert all(tag not in ("script", "b", "i") for tag, _ in tags.tags)
    sections = [a for t, a in tags.tags if t == "section"]
    assert [a["id"] for a in sections] == [f"host-{evil}"]  # the whole name stays inside the attribute
    text = "".join(tags.text)
    assert evil in text and '"><script>alert(2)</script>' in text and "</title><script>" in text
    assert page.count("<!--") == 1  # only the template's own comment


def test_same_facts_in_another_key_order_give_the_same_bytes(host_input):
    entry = with_pages(host_input(NPS4, numa_facts=True, kernel={}))
    page, text = render_html([entry]), render_text([entry])
    shuffled = json.loads(json.dumps(entry))
    facts = shuffled["topology"]
    for key in ("l3_domains", "numa_distances", "hugepages"):
        facts[key] = dict(reversed(list(facts[key].items())))
    facts["hugepages"] = {n: dict(reversed(list(s.items()))) for n, s in facts["hugepages"].items()}
    facts["cpus"] = list(reversed(facts["cpus"]))
    shuffled["hugepages"] = list(reversed(shuffled["hugepages"]))
    assert render_html([shuffled]) == page and render_text([shuffled]) == text
    assert render_html([entry]) == page  # and again: nothing depends on a clock or on hash order


def test_a_node_of_256_cpus_in_32_l3_domains_is_drawn_whole(host_input):
    entry = host_input("2s128c-smt2", {"num_exclusive_cores": 40, "num_shared_cores": 8}, numa_facts=True)
    page = Tags(render_html([entry]))
    assert len(page.cell_titles()) == 512
    # No NUMA box (one node per socket); each socket's 16 L3 domains get a box of their own.
    assert page.with_class("numa") == [] and len(page.with_class("l3")) == 32
    details = [a for t, a in page.tags if t == "details"]
    assert details == [{"class": "l3-domains"}]  # 32 rows: folded, the picture stays on top
