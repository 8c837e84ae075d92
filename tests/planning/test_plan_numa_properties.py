"""NUMA and L3 invariants of the planner and of the hand-out rule, over generated topologies (hypothesis)."""

from __future__ import annotations

from collections import Counter

from cpupools.core.cpulist import parse_cpulist
from cpupools.hardware.locality import choose_local
from cpupools.hardware.topology import Cpu, KernelArgs, Topology
from cpupools.planning.plan import EXCLUSIVE, INFRA, SHARED, make_request, plan_pools
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sysfs import Spec


@st.composite
def numa_topologies(draw):
    """Sockets cut into NUMA nodes and L3 domains of any size (a domain may span nodes, as with SNC)."""
    nodes = draw(st.integers(1, 4))
    spec = Spec(
        sockets=draw(st.integers(1, 3)),
        cores_per_socket=draw(st.integers(nodes, 24)),
        threads=draw(st.sampled_from([1, 2])),
        numbering=draw(st.sampled_from(["distant", "adjacent"])),
        nodes_per_socket=nodes,
    )
    l3_cores = draw(st.integers(0, spec.cores_per_socket))  # 0: no L3 information
    cpus = {}
    for c in spec.cpus():
        core_in_socket = c["core_id"]
        l3 = None if not l3_cores else c["socket"] * 1000 + core_in_socket // l3_cores
        cpus[c["id"]] = Cpu(c["id"], c["socket"], 0, c["node"], c["core_id"], tuple(c["siblings"]), None, l3)
    return Topology(cpus=cpus, kernel=KernelArgs())


def min_domains(free_per_domain: Counter, count: int) -> int:
    """The fewest L3 domains ``count`` cores can come from: the largest domains first."""
    total, used = 0, 0
    for size in sorted(free_per_domain.values(), reverse=True):
        if total >= count:
            break
        total += size
        used += 1
    return used


@st.composite
def plans(draw):
    topo = draw(numa_topologies())
    infra = draw(st.integers(1, 2))  # per NUMA node
    per_node = Counter(c.node for c in topo.cores)
    assume(all(n > infra for n in per_node.values()))
    free = sum(n - infra for n in per_node.values())
    excl = draw(st.integers(0, free))
    shared = draw(st.integers(0, free - excl))
    raw = {
        "num_exclusive_cores": excl,
        "num_shared_cores": shared,
        "exclusive_mode": draw(st.sampled_from(["packed", "spread"])),
        "shared_mode": draw(st.sampled_from(["packed", "spread"])),
        "infra_cores": infra,
    }
    return topo, raw


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(plans())
def test_exclusive_takes_the_fewest_clean_l3_domains(case):
    """Per NUMA node: exclusive cores in L3 domains without housekeeping or shared cores touch as few of them
    as the free cores there allowed (a domain with room for all of them is kept whole;
    tests/planning/test_plan_modern_properties.py holds the rule that clean domains come first)."""
    topo, raw = case
    plan = plan_pools(topo, make_request(raw))
    reserved = {topo.core_of(c).index for c in parse_cpulist(plan["reserved_cpus"])}
    shared = {topo.core_of(c).index for c in parse_cpulist(plan["pool_cpus"][SHARED])}
    mine = {topo.core_of(c).index for c in parse_cpulist(plan["pool_cpus"][EXCLUSIVE])}
    if raw["num_exclusive_cores"] == -1 or raw["num_shared_cores"] == -1:
        return  # one pool takes every core left: nothing to choose
    for node in topo.numa_nodes:
        on_node = [c for c in topo.cores if c.node == node]
        dirty = {c.l3 for c in on_node if c.index in reserved | shared}
        clean_picked = [c for c in on_node if c.index in mine and c.l3 not in dirty]
        if not clean_picked or len({c.l3 for c in on_node}) == 1:
            continue
        free = Counter(c.l3 for c in on_node if c.l3 not in dirty and c.index not in reserved | shared)
        touched = {c.l3 for c in clean_picked}
        assert len(touched) == min_domains(free, len(clean_picked)), (
            f"exclusive on node {node}: {len(clean_picked)} cores over L3 {sorted(touched, key=str)}, free {dict(free)}"
        )
    assert plan["counts"][INFRA] == len(topo.cores) - plan["counts"][EXCLUSIVE] - plan["counts"][SHARED]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(plans())
def test_spread_balances_numa_nodes_within_a_socket(case):
    """With spread, a socket's nodes differ by more than one core only where the smaller had none left."""
    topo, raw = case
    assume(raw["exclusive_mode"] == "spread")
    plan = plan_pools(topo, make_request(raw))
    mine = {topo.core_of(c).index for c in parse_cpulist(plan["pool_cpus"][EXCLUSIVE])}
    infra = {topo.core_of(c).index for c in parse_cpulist(plan["reserved_cpus"])}
    for socket in topo.sockets:
        count = Counter(c.node for c in topo.cores_on(socket) if c.index in mine)
        spare = Counter(c.node for c in topo.cores_on(socket) if c.index not in mine | infra)
        for a in topo.nodes_on(socket):
            for b in topo.nodes_on(socket):
                if count[a] > count[b] + 1:
                    assert spare[b] == 0, f"socket {socket}: {dict(count)} with spare {dict(spare)}"


@st.composite
def handouts(draw):
    """A plan's exclusive lists, some of them held, and a CMK_NUM_CORES."""
    topo, raw = draw(plans())
    assume(raw["num_exclusive_cores"] >= 1)
    plan = plan_pools(topo, make_request(raw))
    lists = plan["handout_order"][EXCLUSIVE]
    held = draw(st.sets(st.sampled_from(lists), max_size=len(lists) - 1))
    free = [cl for cl in lists if cl not in held]
    count = draw(st.integers(1, len(free)))
    return topo, free, count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(handouts())
def test_a_multi_core_handout_stays_on_one_numa_node_when_one_can_hold_it(case):
    topo, free, count = case

    def node(cl):
        return topo.cpus[parse_cpulist(cl)[0]].node

    def l3(cl):
        return topo.cpus[parse_cpulist(cl)[0]].l3

    chosen = choose_local(free, count, node, l3)
    assert len(chosen) == count and len(set(chosen)) == count and set(chosen) <= set(free)
    assert chosen == [cl for cl in free if cl in chosen], "hand-out order kept"
    per_node = Counter(node(cl) for cl in free)
    if count == 1:
        assert chosen == free[:1], "one core: the first free list, as CMK"
    if any(n >= count for n in per_node.values()):
        nodes = {node(cl) for cl in chosen}
        assert len(nodes) == 1, f"{count} lists over nodes {nodes} though one node holds them: {dict(per_node)}"
        (where,) = nodes
        free_l3 = Counter(l3(cl) for cl in free if node(cl) == where)
        assert len({l3(cl) for cl in chosen}) == min_domains(free_l3, count)
    else:
        # no node holds them: as few nodes as can be
        assert len({node(cl) for cl in chosen}) == min_domains(per_node, count)
