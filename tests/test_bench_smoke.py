"""The benchmarks run, at a small size, and print each figure beside its target (issue 43).

Figures are not asserted: timings belong to bench/ runs on a quiet machine
(docs/performance.md), not to a test beside other jobs. What is checked is
that each bench still runs against today's code and says what it measures.
"""

from __future__ import annotations

import re
import subprocess
import sys

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
    assert re.search(r"cmk reconcile over 300 dead entries \(one cpulist each\): [\d.]+ s, 300 freed", out), out
    assert re.search(r"lock waits .*: \d+ waits, max [\d.]+ ms, p99 [\d.]+ ms  \(target: max < 100 ms\)", out), out
