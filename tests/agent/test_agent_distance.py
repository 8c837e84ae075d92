"""``cmk isolate`` with more cores than one NUMA node holds takes the nearest nodes (issue 25).

Real ``cmk isolate`` processes on fixture trees whose distance table makes the
old rule (hand-out order, largest node first) cross a socket. The pool states
are written from hand-made plans, so the hand-out order is the one the test
names, whatever the planner does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from agent_support import agent_env, make_plan, tasks_of
from sysfs import Spec

# 2 sockets x 8 cores, SMT2 (sibling of CPU i is i + 16), one L3 per 4 cores.
# The firmware numbers the NUMA nodes across the sockets: node 0 = cores 0-3
# and node 2 = cores 4-7 on socket 0, node 1 = cores 8-11 and node 3 = cores
# 12-15 on socket 1. Node 0's nearest node is node 2.
SHAPE = Spec(sockets=2, cores_per_socket=8, threads=2, nodes_per_socket=2, l3_cores=4)
SWAP = {1: 2, 2: 1}  # the fixture numbers nodes socket after socket
INTERLEAVED = [
    [10, 32, 12, 32],
    [32, 10, 32, 12],
    [12, 32, 10, 32],
    [32, 12, 32, 10],
]


def cores(*ids):
    return [f"{c},{c + 16}" for c in ids]


# Exclusive: cores 1-3 (node 0), 5-7 (node 2), 9-11 (node 1), 13-15 (node 3);
# infra: the first core of each node. Spread hand-out order, alternating the
# sockets and, on each, its nodes: nodes 0, 1, 2, 3, 0, 1, ...
INTERLEAVED_PLAN = make_plan(
    {
        "exclusive": {"0": cores(1, 2, 3, 5, 6, 7), "1": cores(9, 10, 11, 13, 14, 15)},
        "infra": {"0": [",".join(cores(0, 4))], "1": [",".join(cores(8, 12))]},
    },
    {"exclusive": cores(1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15)},
)


def renumber_nodes(root: Path, swap: dict[int, int], rows: list[list[int]]) -> None:
    """Give the nodes of the tree under ``root`` other numbers, and write ``rows`` as their distance table."""
    nodes = root / "sys/devices/system/node"
    for old in swap:
        (nodes / f"node{old}").rename(nodes / f"was{old}")
    for old, new in swap.items():
        (nodes / f"was{old}").rename(nodes / f"node{new}")
    for cpu in (root / "sys/devices/system/cpu").glob("cpu[0-9]*"):
        for old, new in swap.items():
            if (cpu / f"node{old}").is_dir():
                (cpu / f"node{old}").rename(cpu / f"node{new}.new")
        for link in cpu.glob("node*.new"):
            link.rename(cpu / link.name[: -len(".new")])
    for node, row in enumerate(rows):
        (nodes / f"node{node}/distance").write_text(" ".join(map(str, row)) + "\n")


@pytest.fixture
def interleaved(make_root, state_dir):
    """``(conf, sysfs root)`` of the interleaved shape with INTERLEAVED_PLAN's state."""
    root = make_root(SHAPE, "sysfs")
    renumber_nodes(root, SWAP, INTERLEAVED)
    assert (root / "sys/devices/system/node/node2/cpulist").read_text() == "4-7,20-23\n"
    return state_dir(INTERLEAVED_PLAN), root


def isolate_env(cmk, conf, root, cores):
    """``(CMK_CPUS_ASSIGNED, CMK_NUMA_NODES_ASSIGNED, CMK_L3_DOMAINS_ASSIGNED)`` of one isolate's command."""
    argv = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "env"]
    env = agent_env(CPUPOOLS_SYSFS_ROOT=str(root), CMK_NUM_CORES=str(cores))
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    out = dict(line.split("=", 1) for line in res.stdout.splitlines() if line.startswith("CMK_"))
    return out["CMK_CPUS_ASSIGNED"], out["CMK_NUMA_NODES_ASSIGNED"], out["CMK_L3_DOMAINS_ASSIGNED"]


def test_the_nearest_node_not_the_next_in_order(cmk, interleaved):
    conf, root = interleaved
    # Four cores: no node has more than three. Hand-out order put node 1 (the
    # other socket, 32) after node 0; node 2 is on node 0's socket (12):
    # node 0 whole (cores 1-3) and node 2's first, core 5.
    assert isolate_env(cmk, conf, root, 4) == ("1,17,2,18,3,19,5,21", "0,2", "0,1")
    # Seven cores need three nodes: every set of three crosses the sockets
    # and has one pair at 12: hand-out order, nodes 0, 1, 2 (3 + 3 + 1).
    assert isolate_env(cmk, conf, root, 7) == ("1,17,2,18,3,19,5,21,9,25,10,26,11,27", "0,1,2", "0,1,2")
    assert all(pids == [] for pids in tasks_of(conf).values())


def test_the_nearest_nodes_not_the_largest(cmk, interleaved, state_dir):
    _, root = interleaved
    # A live workload (this test's process) holds core 1 (node 0), core 5
    # (node 2) and all of node 3: nodes 0 and 2 have two free lists each,
    # node 1 three.
    me = [os.getpid()]
    held = {"exclusive": {"0": {"1,17": me, "5,21": me}, "1": {"13,29": me, "14,30": me, "15,31": me}}}
    conf = state_dir(INTERLEAVED_PLAN, held)
    # Four cores: the largest-first rule took node 1 whole and one list of
    # node 0, across the sockets; nodes 0 and 2 hold four at distance 12.
    assert isolate_env(cmk, conf, root, 4) == ("2,18,3,19,6,22,7,23", "0,2", "0,1")
    assert tasks_of(conf)["13,29"] == me and tasks_of(conf)["2,18"] == []


def test_a_two_socket_nps2_spread_pool_stays_on_one_socket(cmk, make_root, state_dir):
    # The corpus shape 2s32c-smt2-nps2 (nodes 0, 1 on socket 0; 2, 3 on socket
    # 1; CPU i + 64 the sibling of i; 8-core L3 domains) with the spread pool
    # tests/agent/test_agent_cmk.py's nps2 fixture works out: two cores per
    # node, hand-out order nodes 0, 2, 1, 3.
    root = make_root("2s32c-smt2-nps2", "sysfs")
    plan = make_plan(
        {
            "exclusive": {
                "0": ["1,65", "16,80", "2,66", "17,81"],
                "1": ["33,97", "48,112", "34,98", "49,113"],
            }
        },
        {"exclusive": ["1,65", "33,97", "16,80", "48,112", "2,66", "34,98", "17,81", "49,113"]},
    )
    conf = state_dir(plan)
    # Three cores: node 0 whole and one more. The hand-out order's next node
    # is node 2, on the other socket (32); node 1 is on socket 0 (12).
    assert isolate_env(cmk, conf, root, 3) == ("1,65,2,66,16,80", "0,1", "0,2")
    # Without the distance files, as before: the next node in hand-out order.
    for node in range(4):
        (root / f"sys/devices/system/node/node{node}/distance").unlink()
    assert isolate_env(cmk, conf, root, 3) == ("1,65,2,66,33,97", "0,2", "0,4")


def test_the_distance_table_is_read_only_when_one_node_is_not_enough(cmk, interleaved, tmp_path):
    conf, root = interleaved

    def distance_reads(cores):
        trace = tmp_path / f"trace{cores}"
        argv = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "true"]
        env = agent_env(CPUPOOLS_SYSFS_ROOT=str(root), CMK_NUM_CORES=str(cores))
        res = subprocess.run(["strace", "-qq", "-e", "trace=openat", "-o", str(trace), *argv], env=env, timeout=60)
        assert res.returncode == 0
        return sorted(
            line.split('"')[1].split("/")[-2] for line in trace.read_text().splitlines() if "/distance" in line
        )

    assert distance_reads(1) == distance_reads(3) == []
    assert distance_reads(4) == ["node0", "node1", "node2", "node3"]  # one read per node with free lists
