"""The benchmarks run, at a small size, and print each figure beside its target (issue 43).

Figures are not asserted: timings belong to bench/ runs on a quiet machine
(docs/performance.md), not to a test beside other jobs. What is checked is
that each bench still runs against today's code and says what it measures.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO


def bench(*argv: str) -> str:
    res = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_the_facts_and_plan_bench_prints_each_figure_beside_its_target():
    out = bench("bench/plan_bench.py", "--runs", "1")
    assert "fixture: 8s64c-smt2, 1024 CPUs, 512 cores, 8 sockets" in out, out
    assert re.search(r"the cpupools_facts module in-process .*: median [\d.]+ ms, .*\(target <= 100 ms\)", out), out
    assert len(re.findall(r"planning \[.*\].*median [\d.]+ ms.*\(target < 50 ms\)", out)) == 3, out


def test_the_big_reconcile_bench_frees_every_entry_and_reports_the_waits():
    out = bench("bench/bench_agent.py", "--only-big-reconcile", "--entries", "300")
    assert re.search(
        r"cmk reconcile over 300 dead entries \(one cpulist each\): [\d.]+ s \(target <= 3 s at 10,000\), 300 freed",
        out,
    ), out
    assert re.search(r"lock waits .*: \d+ waits, max [\d.]+ ms, p99 [\d.]+ ms  \(target: max < 100 ms\)", out), out


@pytest.mark.slow
def test_the_fleet_bench_prints_the_ratios_the_serial_part_and_the_result_sizes_beside_their_targets():
    out = bench("bench/fleet_bench.py", "--hosts", "2,3", "--first-hosts", "2", "--rounds", "1", "--no-big", "--sizes")
    for hosts in (2, 3):
        assert f"{hosts} hosts, ansible-core" in out, out
        # every copy has the controller's record of the seed's last result, as a first run would have left it
        assert re.search(rf"^{hosts} hosts: the seed's record of its last result copied to \d+ hosts", out, re.M), out
    assert (
        len(
            re.findall(
                r"re-run / ping: wall [\d.]+ \(target <= 1.25\); main-process CPU [\d.]+ \(target <= 1.25\)", out
            )
        )
        == 2
    )
    assert (
        len(re.findall(r"re-run's serial part: tasks run once for the play [\d.]+ s, .* per host [\d.]+ ms", out)) == 2
    )
    # the main process's CPU without its polling for a free worker: a share of it, never more
    waits = re.findall(r"without its wait for a free worker .*: re-run ([\d.]+), ping ([\d.]+) CPU s/host", out)
    mains = re.findall(r"^  (?:rerun|ping ): .*CPU s/host [\d.]+ all, ([\d.]+) main process", out, re.M)
    assert len(waits) == 2 and len(mains) == 4, out
    assert all(0 < float(w) <= float(m) for w, m in zip([x for pair in waits for x in pair], mains, strict=True)), out
    # the controller's CPU: the main process and the task's workers, so more than the main process alone
    controllers = re.findall(r"the controller's CPU .*: re-run ([\d.]+), ping ([\d.]+) CPU s/host", out)
    assert len(controllers) == 2, out
    assert all(float(c) > float(m) for c, m in zip([x for pair in controllers for x in pair], mains, strict=True)), out
    assert re.search(r"per added host, 2 to 3 hosts, .*ratio [\d.-]+ \(target: .*\); tasks run once", out), out
    # the simulated nodes have what a real one has (a kernel release, its config): a converged one warns of nothing
    rerun_warnings = re.findall(r"^  rerun: .* changed .*; (\d+) warnings$", out, re.M)
    assert rerun_warnings == ["0", "0"], out
    # the converged re-run's plan result, per host, beside its target: a number under it
    size = re.search(r"^ +(\d+)  Plan the CPU pools \(\d+ results\) \(target <= 2000 per host\)$", out, re.M)
    assert size and int(size.group(1)) <= 2000, out
