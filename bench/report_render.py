"""Time the report renderers over a simulated fleet; prints its figures.

Usage: .venv/bin/python bench/report_render.py [HOSTS]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "plugins", "module_utils"), os.path.join(HERE, "..", "tests", "fixtures")]

from cpupools.hardware.topology import gather_topology  # noqa: E402
from cpupools.planning.plan import make_request, plan_pools  # noqa: E402
from cpupools.report.analysis import analyse  # noqa: E402
from cpupools.report.page import TEMPLATE, page_model, render_page  # noqa: E402
from cpupools.report.text import text_lines  # noqa: E402
from sysfs import CORPUS, write_tree  # noqa: E402

PAGE = os.path.join(HERE, "..", "roles", "cpupools_report", "templates", TEMPLATE)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    with tempfile.TemporaryDirectory() as tmp:
        entries = {}
        for name, request in (("2s22c-smt2", {"num_exclusive_cores": 8}), ("8s64c-smt2", {"num_exclusive_cores": 64})):
            topo = gather_topology(write_tree(os.path.join(tmp, name), CORPUS[name]))
            entries[name] = {"topology": topo.to_facts(), "plan": plan_pools(topo, make_request(request))}
    for name, entry in entries.items():
        hosts = [dict(entry, host=f"node-{i:03d}") for i in range(count)]
        start = time.perf_counter()
        views = analyse(hosts)
        lines = text_lines(views)
        page = render_page(page_model(views), PAGE)
        took = time.perf_counter() - start
        print(
            f"{count} hosts of {name}: {took:.2f} s ({took / count * 1000:.1f} ms/host), "
            f"text {len(lines)} lines, html {len(page) / 1024:.0f} KiB"
        )


if __name__ == "__main__":
    main()
