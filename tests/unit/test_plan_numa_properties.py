"""NUMA and L3 invariants of the planner and of the hand-out rule, over generated topologies (hypothesis)."""

from __future__ import annotations

from collections import Counter

from cpupools.cpulist import parse_cpulist
from cpupools.locality import choose_local
from cpupools.plan import EXCLUSIVE, INFRA, SHARED, make_request, plan_pools
from cpupools.topology import Cpu, KernelArgs, Topology
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
    infra = draw(st.integers(1, 2))
    assume(all(len(topo.cores_on(s)) > infra for s in topo.sockets))
    free = sum(len(topo.cores_on(s)) - infra for s in topo.sockets)
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
def test_a_pool_splits_no_l3_domain_it_could_have_kept_whole(case):
    """Per pool and NUMA node: the pool's cores there touch the fewest L3 domains the free cores allowed.

    So a pool never takes part of a domain when a domain with room for all of
    its cores on that node was free, and never touches more domains than it must.
    """
    topo, raw = case
    plan = plan_pools(topo, make_request(raw))
    taken = {c.index for s in topo.sockets for c in topo.cores_on(s)[: raw["infra_cores"]]}
    for pool in (EXCLUSIVE, SHARED):  # exclusive is placed first
        mine = {topo.core_of(c).index for c in parse_cpulist(plan["pool_cpus"][pool])}
        for node in topo.numa_nodes:
            on_node = [c for c in topo.cores if c.node == node]
            picked = [c for c in on_node if c.index in mine]
            if not picked:
                continue
            free = Counter(c.l3 for c in on_node if c.index not in taken)
            touched = {c.l3 for c in picked}
            assert len(touched) == min_domains(free, len(picked)), (
                f"{pool} on node {node}: {len(picked)} cores over L3 {sorted(touched, key=str)}, free {dict(free)}"
            )
        taken |= mine
    assert plan["counts"][INFRA] == len(topo.cores) - plan["counts"][EXCLUSIVE] - plan["counts"][SHARED]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(plans())
def test_spread_balances_numa_nodes_within_a_socket(case):
    """With spread, a socket's nodes differ by more than one core only where the smaller had none left."""
    topo, raw = case
    assume(raw["exclusive_mode"] == "spread")
    plan = plan_pools(topo, make_request(raw))
    mine = {topo.core_of(c).index for c in parse_cpulist(plan["pool_cpus"][EXCLUSIVE])}
    infra = {c.index for s in topo.sockets for c in topo.cores_on(s)[: raw["infra_cores"]]}
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
