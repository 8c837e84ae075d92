"""site.yml end to end on today's big servers (issue 10): 64-192 cores per socket, up to 1,024 CPUs.

Each shape runs the whole site.yml twice into a sandbox (the second run
changes nothing and leaves every file as it was), with the report. The state
it wrote must then be usable: every file name fits NAME_MAX, and the
installed ``cmk`` reads every list back with the plan's CPUs. The 2 x 128
shape is a CMK node being adopted with every other core isolated, so its
infra lists are too fragmented even for the compressed form and take the
``cpus-<n>-<digest>`` name.

Measured on 2 cores shared with other jobs: one site.yml run on 8 x 64 takes
33-37 s; the whole file takes about 4 minutes with ``-n 2`` (83 s for the
2 x 128 and 8 x 64 cases together).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time

import pytest
from cpupools.core.cpulist import parse_cpulist
from cpupools.node import state as st
from helpers import REPO, tree_snapshot
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

INVENTORY = str(REPO / "inventories" / "local" / "hosts.yml")
PATH_MAX = 4096

#: shape -> (sysfs changes, extra variables). The 2 x 128 node was set up by
#: hand for CMK with every other core isolated (a stride isolcpus).
SHAPES = {
    "1s64c-smt2-nps4": ({}, {}),
    "2s96c-smt2": ({}, {"cpupools_num_exclusive_cores": 48, "cpupools_num_shared_cores": 8}),
    "1s144c-nosmt": ({}, {"cpupools_num_exclusive_cores": 100}),
    "2s128c-smt2": (
        {
            "cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.1.0 root=/dev/vda1 ro isolcpus=1-255:1/2,257-511:1/2",
            "isolated": "1-255:1/2,257-511:1/2",
        },
        {"cpupools_isolcpus_source": "adopt", "cpupools_num_exclusive_cores": 120, "cpupools_num_shared_cores": 8},
    ),
    "8s64c-smt2": ({}, {}),
}


def outputs(tmp_path):
    snap = tree_snapshot(tmp_path / "sandbox")
    report = tmp_path / "report.html"
    snap["report.html"] = (hashlib.sha256(report.read_bytes()).hexdigest(), report.stat().st_mtime_ns)
    return snap


def planned(res):
    """The plan of the plan play (playbooks/plan.yml runs the plan role's tasks, not the role)."""
    for task in res.tasks():
        out = task["hosts"].get("localhost", {})
        if task["task"]["name"] == "Plan the CPU pools" and "plan" in out:
            return out["plan"]
    raise AssertionError("the plan task did not run")


def cmk(sandbox, *args):
    return subprocess.run(
        [str(sandbox / "opt/bin/cmk"), *args],
        env={"PATH": "/usr/bin:/bin", "CMK_PROC_FS": "/proc"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_site_applies_twice_on_a_big_node(playbook, tmp_path, shape):
    changes, extra = SHAPES[shape]
    facts = tmp_path / "topology"
    write_tree(str(facts), dataclasses.replace(CORPUS[shape], **changes))
    sandbox = tmp_path / "sandbox"
    extra_vars = {
        "cpupools_facts_root": str(facts),
        "cpupools_root": str(sandbox),
        "cpupools_report_html": str(tmp_path / "report.html"),
        **extra,
    }
    started = time.monotonic()
    first = playbook(REPO / "site.yml", extra_vars, inventory=INVENTORY)
    took = time.monotonic() - started
    assert first.rc == 0, first.messages() or first.stdout[-3000:] + first.stderr[-3000:]
    assert first.changed() > 0
    plan = planned(first)
    snapshot = outputs(tmp_path)
    second = playbook(REPO / "site.yml", extra_vars, inventory=INVENTORY)
    assert second.rc == 0, second.messages() or second.stdout[-3000:]
    assert second.changed() == 0, [t["task"]["name"] for t in second.tasks() if t["hosts"]["localhost"].get("changed")]
    assert outputs(tmp_path) == snapshot
    print(f"{shape}: first site.yml run {took:.1f} s")

    conf = sandbox / "etc/cmk"
    for path in conf.rglob("*"):
        assert len(path.name.encode()) <= st.NAME_MAX, path
        assert len(str(path).encode()) < PATH_MAX, path
    # The installed agent reads every list back with the plan's CPUs.
    described = cmk(sandbox, "describe", f"--conf-dir={conf}")
    assert described.returncode == 0, described.stderr
    pools = json.loads(described.stdout)["pools"]
    for pool, cpus in plan["pool_cpus"].items():
        got = sorted(int(c) for lists in pools[pool]["cpuLists"] for c in lists.split(","))
        assert got == parse_cpulist(cpus), pool
    # A workload in the infra pool gets the whole pool in CMK's comma form.
    infra = cmk(
        sandbox,
        "isolate",
        f"--conf-dir={conf}",
        "--pool=infra",
        "--no-affinity",
        "--",
        "sh",
        "-c",
        "echo $CMK_CPUS_INFRA",
    )
    assert infra.returncode == 0, infra.stderr
    assert sorted(int(c) for c in infra.stdout.strip().split(",")) == parse_cpulist(plan["pool_cpus"]["infra"])
    reconciled = cmk(sandbox, "reconcile", f"--conf-dir={conf}")
    assert reconciled.returncode == 0 and json.loads(reconciled.stdout) == {"reclaimedCpuLists": []}
    if shape == "2s128c-smt2":
        names = os.listdir(conf / "pools/infra/0")
        assert len(names) == 1 and names[0].startswith(st.HASHED_PREFIX)
        assert (conf / "pools/infra/0" / names[0] / st.CPUS_FILE).read_text().startswith("0,2,4,")
    # The report's CPU map shows every infra CPU of the node as infra.
    report = (tmp_path / "report.html").read_text()
    # The cell's hover text goes on after the pool with its NUMA node and L3 domain ("; NUMA node 0").
    missing = [
        c for c in parse_cpulist(plan["pool_cpus"]["infra"]) if not re.search(f'title="CPU {c}: infra[;"]', report)
    ]
    assert missing == []
