"""What the report says about today's machines: housekeeping per NUMA node, core types, the runtime and,
for the kubelet, the CPUs pods can use; offline, present and possible CPUs."""

from __future__ import annotations

import html

from cpupools.report.analysis import analyse_host
from cpupools.report.text import render_text
from report_page import render_html


def line(text: str, title: str) -> str:
    return next(row for row in text.splitlines() if row.startswith(f"  {title} "))[18:]


def test_the_kubelet_node_says_how_many_cpus_pods_can_use(host_input):
    entry = host_input(
        "2s96c-smt2-nps4", {"num_exclusive_cores": -1, "num_shared_cores": 0, "runtime": "kubelet"}, host="epyc"
    )
    entry["plan"]["kubelet"] = {
        "version": "1.36",
        "version_known": True,
        "config": {"cpuManagerPolicyOptions": {"full-pcpus-only": "true", "prefer-align-cpus-by-uncorecache": "true"}},
    }
    text = render_text([entry])
    assert text.startswith("== epyc [pending]: 2 sockets, 192 cores, 384 CPUs online (2 per core); mode generate")
    assert "; runtime kubelet\n" in text.splitlines()[0] + "\n"
    assert line(text, "housekeeping") == "0,24,48,72,96,120,144,168,192,216,240,264,288,312,336,360 (16 CPUs)"
    assert line(text, "workloads").startswith("pods can use 368 of 384 CPUs: reservedSystemCPUs is the housekeeping")
    assert line(text, "workloads").endswith("options full-pcpus-only, prefer-align-cpus-by-uncorecache (kubelet 1.36)")
    # The NUMA table names each node's housekeeping CPUs.
    numa = [row.split() for row in text.splitlines() if row.startswith("  ") and row.split()[0].isdigit()][:8]
    assert [r[6] for r in numa] == [f"{24 * n},{24 * n + 192}" for n in range(8)]
    words = html.unescape(render_html([entry]))
    assert "<th>Runtime</th><td>kubelet: pods can use 368 of 384 CPUs" in words
    assert "housekeeping CPUs" in words


def test_a_hybrid_shows_its_core_types(host_input):
    entry = host_input("1s6p8e-hybrid", {"num_exclusive_cores": 2, "num_shared_cores": 2})
    text = render_text([entry])
    assert line(text, "core types") == "P 0-11 (6 cores), E 12-19 (8 cores)"
    assert "<th>Core types</th><td>P 0-11 (6 cores), E 12-19 (8 cores)</td>" in render_html([entry])
    assert analyse_host(entry).runtime == "cmk"


def test_smt_off_and_offline_cpus_are_said(host_input):
    entry = host_input("1s16c-nosmt-boot", {"num_exclusive_cores": 2})
    text = render_text([entry])
    assert line(text, "CPUs") == "offline 16-31; SMT off"
    assert line(text, "warnings") == "none"  # SMT kept off at boot is no warning
    assert line(text, "notes") == "SMT is off (nosmt on the kernel command line): CPUs 16-31 stay offline at boot"


def test_plans_from_before_the_runtime_keep_their_report(host_input):
    entry = host_input("2s22c-smt2")
    for key in ("runtime", "reserved_cpus", "numa", "notes", "allocatable_cpus"):
        entry["plan"].pop(key)
    text = render_text([entry])
    assert "runtime" not in text.splitlines()[0] and "housekeeping" not in text and "workloads" not in text
