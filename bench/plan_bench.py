#!/usr/bin/env python3
"""Benchmark: facts gathering and planning on the 1024-CPU fixture.

Targets (issue 2): planning in-process under 50 ms; facts gathering under
300 ms; (issue 43) the cpupools_facts module's in-process time (its
AnsibleModule, the read, the facts and the JSON it prints) at most 100 ms.
Prints the median and worst of N runs of each; exits 0 either way (figures,
not assertions).

    .venv/bin/python bench/plan_bench.py [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "plugins" / "module_utils"), str(REPO / "tests" / "fixtures"), str(REPO / "collections")]

from cpupools.hardware.topology import Topology, gather_topology  # noqa: E402
from cpupools.planning.plan import make_request, plan_pools  # noqa: E402
from sysfs import CORPUS, write_tree  # noqa: E402

REQUESTS = {
    "defaults": {},
    "spread 200/40": {
        "num_exclusive_cores": 200,
        "num_shared_cores": 40,
        "exclusive_mode": "spread",
        "shared_mode": "spread",
    },
    "exclusive -1": {"num_exclusive_cores": -1, "num_shared_cores": 8, "exclusive_mode": "spread"},
}


def timed(fn, runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), max(samples)


def facts_module(root: str, work: str) -> None:
    """One in-process run of the cpupools_facts module's main(), as Ansible starts it (arguments in a file)."""
    from ansible_collections.cpupools.cpupools.plugins.modules import cpupools_facts

    args = os.path.join(work, "args.json")
    with open(args, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {"root": root}}, handle)
    sys.argv = ["cpupools_facts", args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cpupools_facts.main()
    if '"failed"' in out.getvalue()[:200]:
        raise SystemExit(out.getvalue()[:2000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    # sysfs is in memory (kernfs): the fixture's ~8,000 files go on tmpfs where there is one, not on a
    # disk whose page cache the machine may be reclaiming (the figures moved 179-293 ms there).
    where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        root = write_tree(tmp, CORPUS["8s64c-smt2"])
        topo = gather_topology(root)
        print(
            f"fixture: 8s64c-smt2, {len(topo.cpus)} CPUs, {len(topo.cores)} cores, {len(topo.sockets)} sockets, "
            f"under {where or tempfile.gettempdir()}"
        )
        med, worst = timed(lambda: gather_topology(root).to_facts(), args.runs)
        print(
            f"facts gathering (read sysfs + build + to_facts): median {med:.1f} ms, worst {worst:.1f} ms "
            "(target < 300 ms)"
        )
        facts_module(root, tmp)  # imports once, outside the timing
        med, worst = timed(lambda: facts_module(root, tmp), args.runs)
        print(
            f"the cpupools_facts module in-process (arguments, read, facts, JSON out): median {med:.1f} ms, "
            f"worst {worst:.1f} ms (target <= 100 ms)"
        )
        facts = topo.to_facts()
        for name, raw in REQUESTS.items():
            med, worst = timed(lambda raw=raw: plan_pools(Topology.from_facts(facts), make_request(raw)), args.runs)
            print(
                f"planning [{name}] (from facts, as the module does): median {med:.1f} ms, worst {worst:.1f} ms "
                "(target < 50 ms)"
            )


if __name__ == "__main__":
    main()
