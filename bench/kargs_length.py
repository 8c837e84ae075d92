"""Print how long cpupools' kernel arguments get on large fixture hosts.

Run: .venv/bin/python bench/kargs_length.py
Prints one line per case: the case and the bytes of the owned arguments
(isolcpus= nohz_full= rcu_nocbs= irqaffinity=) against x86's 2047-byte limit.
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugins", "module_utils"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))

from cpupools.core.cpulist import format_cpulist  # noqa: E402
from cpupools.hardware.topology import gather_topology  # noqa: E402
from cpupools.node import kargs  # noqa: E402
from cpupools.planning.plan import make_request, plan_pools  # noqa: E402
from sysfs import CORPUS, write_tree  # noqa: E402

CASES = {
    "all exclusive, 8 shared, spread": {"num_exclusive_cores": -1, "num_shared_cores": 8, "exclusive_mode": "spread"},
    "200 exclusive + 16 shared, spread": {
        "num_exclusive_cores": 200,
        "num_shared_cores": 16,
        "exclusive_mode": "spread",
        "shared_mode": "spread",
    },
    "200 exclusive + 16 shared, packed": {"num_exclusive_cores": 200, "num_shared_cores": 16},
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("2s22c-smt2", "8s64c-smt2"):
            topo = gather_topology(write_tree(os.path.join(tmp, name), CORPUS[name]))
            for case, request in CASES.items():
                try:
                    plan = plan_pools(topo, make_request(request))
                except ValueError as exc:
                    print(f"{name:12} {case:36} (does not fit: {exc})")
                    continue
                args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions())
                print(f"{name:12} {case:36} {len(kargs.render_args(args)):5} bytes")
            every_other = [cpu for core in topo.cores[1::2] for cpu in core.cpus]
            print(f"{name:12} {'isolcpus of every other core alone':36} {len(format_cpulist(every_other)):5} bytes")
    print(f"limit (x86 COMMAND_LINE_SIZE {kargs.COMMAND_LINE_SIZE}, NUL included): {kargs.COMMAND_LINE_SIZE - 1} bytes")


if __name__ == "__main__":
    main()
