"""The plan on today's machines, over generated shapes (hypothesis): issue 25's invariants.

Shapes: sockets cut into NUMA nodes; L3 domains that split a node (AMD CCDs),
cover it or span several nodes (Intel SNC); L2 modules of four cores (E-core
Xeons); hybrid P+E parts; cores whose sibling is offline. Every runtime and
every way to size housekeeping. For each plan:

- every online CPU is in exactly one pool, pools take whole cores;
- every NUMA node keeps housekeeping (unless the operator's mapping says 0);
  ``infra_cores: auto`` keeps one thread per 32 of the node, in whole cores;
- no exclusive core shares an L3 domain or L2 module with housekeeping or
  shared cores while a core of a cleaner one on its NUMA node is left over;
- shared cores sit beside housekeeping before they open a clean L3 domain;
- exclusive cores are P cores (``exclusive_core_type: performance``) and no
  core with an offline sibling is isolated;
- under the kubelet, the reserved set is the housekeeping cores (and the E
  cores of a hybrid), every other CPU is allocatable and isolated.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from cpupools.core.cpulist import parse_cpulist
from cpupools.core.errors import PlanError
from cpupools.hardware.topology import EFFICIENCY, PERFORMANCE, Cpu, KernelArgs, Topology
from cpupools.planning.plan import EXCLUSIVE, INFRA, SHARED, make_request, plan_pools
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st


@st.composite
def shapes(draw):
    """A Topology built the way the kernel describes it (no files: fast)."""
    hybrid = draw(st.booleans()) and draw(st.booleans())
    sockets = 1 if hybrid else draw(st.integers(1, 2))
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(2, 12))
    threads = draw(st.sampled_from([1, 2]))
    l3_kind = draw(st.sampled_from(["none", "per-node", "ccd", "socket"]))
    ccd = draw(st.integers(2, 8))
    module = draw(st.sampled_from([1, 1, 4]))
    e_cores = draw(st.integers(1, 8)) if hybrid else 0
    p_cores = sockets * nodes * per_node
    cpus = {}
    core = 0
    for s in range(sockets):
        for n in range(nodes):
            for c in range(per_node):
                node = s * nodes + n
                ids = tuple(core + t * p_cores for t in range(threads))
                l3 = {"none": None, "per-node": node, "ccd": node * 100 + c // ccd, "socket": s}[l3_kind]
                # an L2 module (four E cores) never spans two NUMA nodes: numbered within its node
                l2 = 10000 + node * 1000 + c // module if module > 1 else core
                kind = PERFORMANCE if hybrid else None
                for cpu in ids:
                    cpus[cpu] = Cpu(cpu, s, 0, node, c, ids, None, l3, l2, kind)
                core += 1
    first_e = p_cores * threads
    for e in range(e_cores):
        cpu = first_e + e
        l3 = None if l3_kind == "none" else 0
        cpus[cpu] = Cpu(cpu, 0, 0, 0, 500 + e, (cpu,), None, l3, 20000 + e // 4, EFFICIENCY)
    offline: list[int] = []
    if threads == 2 and draw(st.booleans()):
        # the second thread of some cores offline (never CPU 0's core)
        victims = draw(st.sets(st.integers(1, p_cores - 1), max_size=3))
        for index in victims:
            gone = index + p_cores
            offline.append(gone)
            del cpus[gone]
            cpus[index] = replace(cpus[index], siblings=(index,))
    return Topology(cpus=cpus, offline=tuple(sorted(offline)), kernel=KernelArgs())


@st.composite
def cases(draw):
    topo = draw(shapes())
    nodes = sorted(topo.numa_nodes)
    infra = draw(
        st.one_of(
            st.just("auto"),
            st.integers(1, 2),
            st.dictionaries(st.sampled_from(nodes), st.sampled_from([0, 1, 2, "auto"]), min_size=1),
        )
    )
    raw = {
        "num_exclusive_cores": draw(st.integers(-1, 12)),
        "num_shared_cores": draw(st.integers(0, 4)),
        "exclusive_mode": draw(st.sampled_from(["packed", "spread"])),
        "shared_mode": draw(st.sampled_from(["packed", "spread"])),
        "infra_cores": infra,
        "runtime": draw(st.sampled_from(["cmk", "kubelet", "nri-balloons", "nri-topology-aware", "cpu-pooler"])),
        "exclusive_core_type": draw(st.sampled_from(["performance", "performance", "any"])),
    }
    if draw(st.booleans()) and raw["num_exclusive_cores"] != -1:
        raw["num_shared_cores"] = -1
    return topo, raw


def plan_or_skip(topo, raw):
    try:
        return plan_pools(topo, make_request(raw))
    except PlanError as exc:
        # What does not fit, or a mapping that leaves no housekeeping (or the core of CPU 0 isolated).
        assert exc.field in ("num_exclusive_cores", "num_shared_cores", "infra_cores"), str(exc)
        assume(False)


def cores(topo, text):
    return {topo.core_of(c).index for c in parse_cpulist(text)}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(cases())
def test_the_plan_on_todays_shapes(case):
    topo, raw = case
    plan = plan_or_skip(topo, raw)
    pools = {pool: cores(topo, plan["pool_cpus"][pool]) for pool in (EXCLUSIVE, SHARED, INFRA)}
    reserved = cores(topo, plan["reserved_cpus"])
    half = {c.index for c in topo.half_cores()}
    # A partition of the online CPUs into whole cores.
    seen = Counter(cpu for pool in plan["pool_cpus"].values() for cpu in parse_cpulist(pool))
    assert sorted(seen) == topo.online and set(seen.values()) == {1}
    for text in plan["pool_cpus"].values():
        cpus = set(parse_cpulist(text))
        assert all(set(topo.core_of(c).cpus) <= cpus for c in cpus), "a pool splits a core"
    assert reserved <= pools[INFRA]
    assert 0 not in parse_cpulist(plan["isolated_cpus"]), "the core of CPU 0 isolated"
    # Every NUMA node keeps housekeeping, as many threads as auto sizes it, unless the mapping says 0.
    mapping = raw["infra_cores"] if isinstance(raw["infra_cores"], dict) else {}
    for node, cpus in topo.numa_nodes.items():
        want = mapping.get(node, raw["infra_cores"] if isinstance(raw["infra_cores"], int) else "auto")
        mine = [c for c in topo.cores if c.node == node and c.index in reserved]
        if want == "auto":
            assert sum(len(c.cpus) for c in mine) >= math.ceil(len(cpus) / 32) and mine
        elif raw["runtime"] != "kubelet":
            assert len(mine) == want
        else:  # the kubelet also reserves what it cannot hand out: E cores, cores with an offline sibling
            assert len(mine) >= want
    # Nothing isolated that the next boot gives a non-isolated sibling.
    assert not cores(topo, plan["isolated_cpus"]) & half
    hybrid_p = topo.hybrid and raw["exclusive_core_type"] == "performance"
    if hybrid_p:
        assert all(topo.cores[i].core_type == PERFORMANCE for i in pools[EXCLUSIVE])
    if raw["runtime"] == "kubelet":
        # reservedSystemCPUs is housekeeping (with the E cores of a hybrid), every other CPU the kubelet's.
        assert pools[INFRA] == reserved and not pools[SHARED]
        assert plan["allocatable_cpus"] == len(topo.cpus) - len(parse_cpulist(plan["reserved_cpus"]))
        assert parse_cpulist(plan["isolated_cpus"]) == sorted(
            set(topo.cpus) - set(parse_cpulist(plan["reserved_cpus"]))
        )
        assert reserved - half - {c.index for c in topo.cores if c.core_type == EFFICIENCY} or not hybrid_p
        return
    # Cleanliness, node by node: no spare core an exclusive core could have taken is cleaner than it.
    noisy = reserved | pools[SHARED]
    for node in topo.numa_nodes:
        on_node = [c for c in topo.cores if c.node == node]
        dirty_l3 = {c.l3 for c in on_node if c.index in noisy and c.l3 is not None}
        dirty_l2 = {c.l2 for c in topo.cores if c.index in noisy and c.l2 is not None}

        def badness(core, dirty_l3=dirty_l3, dirty_l2=dirty_l2):
            return (core.l3 in dirty_l3, core.l2 in dirty_l2)

        eligible = [
            c
            for c in on_node
            if c.index not in half and not (hybrid_p and c.core_type == EFFICIENCY) and c.index not in noisy
        ]
        taken = [c for c in eligible if c.index in pools[EXCLUSIVE]]
        spare = [c for c in eligible if c.index in pools[INFRA] and c.index not in reserved]
        if taken and spare and (hybrid_p or not topo.hybrid):
            worst = max(badness(c) for c in taken)
            best = min(badness(c) for c in spare)
            assert worst <= best, (
                f"node {node}: exclusive core in {worst} (L3 dirty, L2 dirty) while a spare core in {best} is left"
            )
        # Shared beside housekeeping before it opens a clean L3 domain (E cores first on a hybrid).
        hk_l3 = {c.l3 for c in on_node if c.index in reserved and c.l3 is not None}
        shared_here = [c for c in on_node if c.index in pools[SHARED]]
        if (
            not topo.hybrid
            and any(c.l3 not in hk_l3 for c in shared_here)
            and SHARED in plan["request"]["isolated_pools"]
        ):
            left = [c for c in on_node if c.l3 in hk_l3 and c.index in pools[INFRA] - reserved and c.index not in half]
            assert not left, (
                f"node {node}: shared opened a clean L3 while {len(left)} cores beside housekeeping are spare"
            )


@pytest.mark.parametrize("runtime", ["cmk", "kubelet"])
def test_a_node_whose_every_core_has_an_offline_sibling_is_refused_by_the_numbers(runtime):
    # Two cores, the second with its sibling offline: one core left to isolate at most.
    cpus = {
        0: Cpu(0, 0, 0, 0, 0, (0, 2)),
        2: Cpu(2, 0, 0, 0, 0, (0, 2)),
        1: Cpu(1, 0, 0, 0, 1, (1,)),
    }
    topo = Topology(cpus=cpus, offline=(3,), kernel=KernelArgs())
    with pytest.raises(PlanError) as err:
        plan_pools(topo, make_request({"num_exclusive_cores": 1, "num_shared_cores": 0, "runtime": runtime}))
    assert err.value.field == "num_exclusive_cores"
    assert "offline sibling" in str(err.value) or "reserved core" in str(err.value)


def test_shared_takes_the_half_core_exclusive_cannot_use():
    # Found by the property above in CI: cores 0 (0,3) and 1 (1,4), and core 2 whose sibling (CPU 5) is
    # offline. Housekeeping takes core 0; exclusive may only take core 1 (a half core is never isolated);
    # shared, chosen first on the node, took core 1 too and left exclusive nothing (StopIteration).
    def cpu(n, core, siblings):
        return Cpu(
            id=n, socket=0, die=0, node=0, core_id=core, siblings=siblings,
            base_frequency_khz=None, l3=None, l2=10000, core_type=None, capacity=None,
        )  # fmt: skip

    cpus = {0: cpu(0, 0, (0, 3)), 3: cpu(3, 0, (0, 3)), 1: cpu(1, 1, (1, 4)), 4: cpu(4, 1, (1, 4))}
    cpus[2] = cpu(2, 2, (2,))
    topo = Topology(
        cpus=cpus,
        offline=(5,),
        kernel=KernelArgs(cmdline="", isolcpus=(), isolcpus_flags=(), isolcpus_set=False, nohz_full=None,
                          rcu_nocbs=None, irqaffinity=None, isolated_active=(), nohz_full_active=()),
        numa_distances={},
        present=(0, 1, 2, 3, 4, 5),
        possible=(0, 1, 2, 3, 4, 5),
        smt_control=None,
        smt_active=None,
    )  # fmt: skip
    raw = {"num_exclusive_cores": 1, "num_shared_cores": 1, "infra_cores": "auto", "runtime": "nri-topology-aware"}
    plan = plan_pools(topo, make_request(raw))
    assert plan["pool_cpus"] == {"exclusive": "1,4", "shared": "2", "infra": "0,3"}
