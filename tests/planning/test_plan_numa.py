"""The planner below the socket: spread over NUMA nodes, pools kept inside L3 domains.

Every expected plan here was worked out by hand from the fixture's shape (the
comment above each assertion gives the reasoning), not copied from output.
Fixture numbering (tests/fixtures/sysfs.py): cores are numbered socket after
socket; with SMT2 the sibling of CPU i is i + (all cores); a socket's cores
are cut into ``nodes_per_socket`` equal NUMA nodes in order, and into L3
domains of ``l3_cores`` consecutive cores.
"""

from __future__ import annotations

import pytest
from cpupools.hardware.locality import choose_local, fewest_groups
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools


def plan_for(root, **raw):
    return plan_pools(gather_topology(str(root)), make_request(raw))


# 2s32c-smt2-nps2: 64 cores, CPU i and i+64 are one core.
#   node 0 = cores 0-15  (L3 0 = cores 0-7,   L3 1 = cores 8-15)
#   node 1 = cores 16-31 (L3 2 = cores 16-23, L3 3 = cores 24-31)
#   node 2 = cores 32-47 (L3 4 = cores 32-39, L3 5 = cores 40-47)
#   node 3 = cores 48-63 (L3 6 = cores 48-55, L3 7 = cores 56-63)
# Housekeeping (infra_cores: auto): every NUMA node has 32 threads, so one
# core each, its first: cores 0, 16, 32 and 48. L3 0, 2, 4 and 6 hold
# housekeeping ("dirty"); L3 1, 3, 5 and 7 are clean.


def test_spread_alternates_sockets_then_nodes(corpus_root):
    plan = plan_for(
        corpus_root["2s32c-smt2-nps2"],
        num_exclusive_cores=8,
        exclusive_mode="spread",
        num_shared_cores=2,
        shared_mode="spread",
    )
    # Sockets alternate (s0, s1, s0, s1, ...) and each socket alternates its
    # nodes, so the nodes come n0, n2, n1, n3, n0, n2, n1, n3: two cores each.
    # On each node the two go to its clean L3: 8, 9 (L3 1); 24, 25 (L3 3);
    # 40, 41 (L3 5); 56, 57 (L3 7).
    assert plan["handout_order"]["exclusive"] == [
        "8,72",
        "40,104",
        "24,88",
        "56,120",
        "9,73",
        "41,105",
        "25,89",
        "57,121",
    ]
    assert plan["pools"]["exclusive"] == {
        "0": ["8,72", "24,88", "9,73", "25,89"],
        "1": ["40,104", "56,120", "41,105", "57,121"],
    }
    # Shared spread starts its own balance: s0 n0, then s1 n2; each goes where
    # housekeeping already is: L3 0 -> core 1; L3 4 -> core 33.
    assert plan["pools"]["shared"] == {"0": ["1,65"], "1": ["33,97"]}
    assert plan["isolated_cpus"] == "1,8-9,24-25,33,40-41,56-57,65,72-73,88-89,97,104-105,120-121"
    assert plan["reserved_cpus"] == "0,16,32,48,64,80,96,112"


def test_packed_keeps_exclusive_in_a_clean_l3(corpus_root):
    plan = plan_for(corpus_root["2s32c-smt2-nps2"], num_exclusive_cores=8, num_shared_cores=4)
    # Packed fills node 0 first (15 free cores): 8 exclusive and 4 shared.
    # Shared goes to L3 0 beside housekeeping (cores 1-4); exclusive takes the
    # clean L3 1 whole (cores 8-15).
    assert plan["handout_order"]["exclusive"] == [f"{c},{c + 64}" for c in range(8, 16)]
    assert plan["pools"]["shared"] == {"0": ["1,2,3,4,65,66,67,68"], "1": []}


def test_a_shared_pool_larger_than_the_dirty_l3_spills_into_the_fewest_clean_ones(corpus_root):
    plan = plan_for(corpus_root["2s32c-smt2-nps2"], num_exclusive_cores=4, num_shared_cores=8)
    # Node 0 has 4 exclusive and 8 shared of its 15 free cores. Shared fills
    # L3 0 beside housekeeping (cores 1-7) and needs one more: core 8 of L3 1.
    # No clean L3 is left on node 0, so exclusive takes the next cores of L3 1
    # (9-12); the 12 cores cannot fit in two L3 domains of 7 and 8 with
    # exclusive alone in one.
    assert plan["pool_cpus"]["shared"] == "1-8,65-72"
    assert plan["pool_cpus"]["exclusive"] == "9-12,73-76"


def test_packed_pool_larger_than_a_node(corpus_root):
    plan = plan_for(corpus_root["2s32c-smt2-nps2"], num_exclusive_cores=20, num_shared_cores=0)
    # Node 0 gives all of its 15 free cores (1-15); the other 5 come from
    # node 1's clean L3 3 (cores 24-28), not from L3 2 beside housekeeping.
    assert plan["pool_cpus"]["exclusive"] == "1-15,24-28,65-79,88-92"


def test_sub_numa_clustering_spread_uses_every_node(corpus_root):
    # 2s24c-smt2-snc2: node 0 = cores 0-11, node 1 = 12-23, node 2 = 24-35,
    # node 3 = 36-47; one L3 per socket. Housekeeping: one core per node
    # (24 threads each): 0, 12, 24, 36.
    plan = plan_for(corpus_root["2s24c-smt2-snc2"], num_exclusive_cores=4, exclusive_mode="spread")
    # s0 n0 (core 1), s1 n2 (core 25), s0 n1 (core 13), s1 n3 (core 37).
    # Socket-only spread gave 1, 25, 2, 26: both of a socket's cores on one node.
    assert plan["handout_order"]["exclusive"] == ["1,49", "25,73", "13,61", "37,85"]
    assert plan["reserved_cpus"] == "0,12,24,36,48,60,72,84"


def test_nps4_one_l3_per_node(corpus_root):
    # 1s32c-nps4-noid: no SMT, nodes 0-3 of 8 cores each, one L3 per node.
    # Housekeeping: the first core of each node, 0, 8, 16, 24.
    plan = plan_for(
        corpus_root["1s32c-nps4-noid"],
        num_exclusive_cores=6,
        exclusive_mode="spread",
        num_shared_cores=3,
        shared_mode="spread",
    )
    # One socket, so only nodes alternate: n0 n1 n2 n3 n0 n1 -> 1, 9, 17, 25, 2, 10.
    assert plan["handout_order"]["exclusive"] == ["1", "9", "17", "25", "2", "10"]
    # Shared starts over at n0: next free cores 3 (n0), 11 (n1), 18 (n2).
    assert plan["pools"]["shared"] == {"0": ["3,11,18"]}


@pytest.mark.parametrize(
    "raw",
    [
        {"num_exclusive_cores": 5, "exclusive_mode": "spread", "num_shared_cores": 3, "shared_mode": "spread"},
        {"num_exclusive_cores": 9, "num_shared_cores": 2},
        {"num_exclusive_cores": -1, "num_shared_cores": 4, "shared_mode": "spread", "infra_cores": 2},
    ],
)
def test_shapes_cmk_handled_are_unchanged(make_root, raw):
    # One NUMA node and one L3 per socket (what CMK assumed): the L3 and
    # distance information changes nothing, the plan is that of the same
    # shape without cache directories, and spread is the socket round robin.
    from sysfs import Spec

    bare = make_root(Spec(sockets=2, cores_per_socket=12, threads=2), "bare")
    cached = make_root(Spec(sockets=2, cores_per_socket=12, threads=2, l3_cores=12), "cached")
    with_l3 = plan_for(cached, **raw)
    assert gather_topology(str(cached)).to_facts()["l3_domains"] == {"0": "0-11,24-35", "1": "12-23,36-47"}
    assert with_l3 == plan_for(bare, **raw)


def test_socket_round_robin_where_one_node_per_socket(corpus_root):
    plan = plan_for(corpus_root["2s22c-smt2"], num_exclusive_cores=4, exclusive_mode="spread", num_shared_cores=2)
    assert plan["handout_order"]["exclusive"] == ["1,45", "23,67", "2,46", "24,68"]
    assert plan["pools"]["shared"] == {"0": ["3,4,47,48"], "1": []}


def test_adopt_ignores_numa_and_l3(make_root):
    # adopt reproduces cmk init, which knew sockets only: on NPS2 with
    # isolcpus=1-8,65-72 (cores 1-8) and spread, exclusive is the first 4
    # isolated cores of socket 0 in core order, splitting L3 0 and L3 1 as CMK did.
    from sysfs import Spec

    root = make_root(
        Spec(
            sockets=2,
            cores_per_socket=32,
            threads=2,
            nodes_per_socket=2,
            l3_cores=8,
            cmdline="ro isolcpus=1-8,65-72",
        )
    )
    plan = plan_for(root, isolcpus_source="adopt", num_exclusive_cores=4, num_shared_cores=4, exclusive_mode="spread")
    assert plan["handout_order"]["exclusive"] == ["1,65", "2,66", "3,67", "4,68"]
    assert plan["pools"]["shared"]["0"] == ["5,6,7,8,69,70,71,72"]


# The two choosing rules, on plain data -------------------------------------------


@pytest.mark.parametrize(
    ("groups", "count", "expected"),
    [
        # fits in one group: the smallest that holds it
        ("aaabbbbcc", 2, "cc"),
        ("aaabbbbcc", 3, "aaa"),
        ("aaabbbbcc", 4, "bbbb"),
        # no group holds 5: the largest (b) whole, then the smallest that holds 1 (c)
        ("aaabbbbcc", 5, "bbbbc"),
        ("aaabbbbcc", 9, "aaabbbbcc"),
        # ties: the group that comes first
        ("aabb", 2, "aa"),
        ("abab", 2, "aa"),
    ],
)
def test_fewest_groups(groups, count, expected):
    items = list(range(len(groups)))
    chosen = fewest_groups(items, lambda i: groups[i], count)
    assert "".join(groups[i] for i in chosen) == expected
    assert chosen == sorted(chosen)


def test_choose_local_prefers_one_node_and_one_l3():
    # items: (name, node, l3) in hand-out order
    items = [("a", 0, 0), ("b", 1, 2), ("c", 0, 1), ("d", 1, 2), ("e", 0, 1)]

    def pick(n):
        return "".join(i[0] for i in choose_local(items, n, lambda i: i[1], lambda i: i[2]))

    assert pick(1) == "a"  # one list: the first in hand-out order
    # two: node 0 can (a,c or c,e: one L3 with c,e) and node 1 can (b,d: one L3);
    # both touch one L3, node 0's first item comes first
    assert pick(2) == "ce"
    assert pick(3) == "ace"  # only node 0 holds three
    # four: no node holds them; node 0 whole (3) and one of node 1
    assert pick(4) == "abce"


def test_no_l3_information_keeps_the_first_free_cores(corpus_root):
    # 2s8c-2numa has NUMA nodes but no cache directories: within a node, core order.
    plan = plan_for(corpus_root["2s8c-2numa"], num_exclusive_cores=3, num_shared_cores=1)
    assert plan["pool_cpus"]["exclusive"] == "1-3,17-19"
    # and spread over its 4 nodes (4 cores each, the first of each housekeeping):
    # n0 (1), n2 (9), n1 (5), n3 (13)
    plan = plan_for(corpus_root["2s8c-2numa"], num_exclusive_cores=4, exclusive_mode="spread", num_shared_cores=0)
    assert plan["handout_order"]["exclusive"] == ["1,17", "9,25", "5,21", "13,29"]


def test_isolate_locality_treats_unreadable_sysfs_as_unknown(make_root):
    # What cmk isolate reads: a garbled node or cache file makes that answer
    # unknown (the hand-out order decides), never an error that stops a workload.
    from cpupools.hardware.locality import CpuLocality

    root = make_root("1s32c-nps4-noid")
    where = CpuLocality(str(root))
    assert (where.node(9), where.l3(9), where.l3(3)) == (1, 8, 0)
    (root / "sys/devices/system/node/node1/cpulist").write_text("garbage\n")
    (root / "sys/devices/system/cpu/cpu3/cache/index3/shared_cpu_list").write_text("zz\n")
    where = CpuLocality(str(root))
    assert (where.node(3), where.node(9), where.l3(3), where.l3(9)) == (None, None, None, 8)
