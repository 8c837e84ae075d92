"""Invariants of the planner over generated topologies (hypothesis)."""

from __future__ import annotations

from collections import Counter

from cpupools.core.cpulist import parse_cpulist
from cpupools.hardware.topology import Cpu, KernelArgs, Topology
from cpupools.planning.plan import EXCLUSIVE, INFRA, SHARED, make_request, plan_pools
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sysfs import Spec


@st.composite
def topologies(draw):
    spec = Spec(
        sockets=draw(st.integers(1, 4)),
        cores_per_socket=draw(st.integers(2, 10)),
        threads=draw(st.sampled_from([1, 2, 2, 4])),
        numbering=draw(st.sampled_from(["distant", "adjacent"])),
    )
    cpus_all = spec.cpus()
    offline = set(draw(st.sets(st.sampled_from([c["id"] for c in cpus_all if c["id"] != 0]), max_size=3)))
    cpus = {}
    for c in cpus_all:
        if c["id"] in offline:
            continue
        siblings = tuple(s for s in c["siblings"] if s not in offline)
        cpus[c["id"]] = Cpu(c["id"], c["socket"], 0, c["node"], c["core_id"], siblings)
    return Topology(cpus=cpus, offline=tuple(sorted(offline)), kernel=KernelArgs())


def cores_of(topo, cpulist_text):
    return {topo.core_of(c).index for c in parse_cpulist(cpulist_text)}


def half_cores(topo):
    """Cores with an offline sibling: at the next boot the sibling is back, so they are never isolated."""
    return {c.index for c in topo.half_cores()}


@st.composite
def generate_cases(draw):
    topo = draw(topologies())
    infra = draw(st.integers(1, 2))  # per NUMA node: one node per socket here
    assume(all(len(topo.cores_on(s)) >= infra for s in topo.sockets))
    # Housekeeping takes the core of CPU 0, then cores with an offline sibling, then the first ones.
    half = half_cores(topo)
    reserved = set()
    for s in topo.sockets:
        order = sorted(topo.cores_on(s), key=lambda c: (0 not in c.cpus, c.index not in half, c.first))
        reserved |= {c.index for c in order[:infra]}
    free = len([c for c in topo.cores if c.index not in reserved and c.index not in half])
    assume(free >= 2)
    excl = draw(st.integers(0, free - 1))
    shared = draw(st.integers(0, free - excl))
    if draw(st.booleans()):
        if draw(st.booleans()):
            excl = -1
            assume(shared < free)
        else:
            shared = -1
            assume(excl < free)
    raw = {
        "num_exclusive_cores": excl,
        "num_shared_cores": shared,
        "exclusive_mode": draw(st.sampled_from(["packed", "spread"])),
        "shared_mode": draw(st.sampled_from(["packed", "spread"])),
        "infra_cores": infra,
    }
    return topo, raw, free


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(generate_cases())
def test_generate_invariants(case):
    topo, raw, free = case
    plan = plan_pools(topo, make_request(raw))
    pools = plan["pools"]
    # Every cpulist is whole cores; pools are disjoint; the union is every online CPU.
    seen: Counter[int] = Counter()
    for pool, sockets in pools.items():
        for socket, lists in sockets.items():
            for text in lists:
                cpus = parse_cpulist(text)
                for cpu in cpus:
                    assert topo.cpus[cpu].socket == int(socket)
                    assert set(topo.core_of(cpu).cpus) <= set(cpus), f"{pool} splits a core"
                seen.update(cpus)
    assert all(n == 1 for n in seen.values()), "pools overlap"
    assert sorted(seen) == topo.online
    # Sizes are honoured exactly; no core with an offline sibling is isolated.
    excl, shared = raw["num_exclusive_cores"], raw["num_shared_cores"]
    if excl == -1:
        excl = free - shared
    if shared == -1:
        shared = free - excl
    assert plan["counts"][EXCLUSIVE] == excl
    assert plan["counts"][SHARED] == shared
    assert plan["counts"][INFRA] == len(topo.cores) - excl - shared
    assert not cores_of(topo, plan["isolated_cpus"]) & half_cores(topo)
    # Isolated CPUs are exactly exclusive + shared; housekeeping is infra.
    iso = parse_cpulist(plan["pool_cpus"][EXCLUSIVE]) + parse_cpulist(plan["pool_cpus"][SHARED])
    assert parse_cpulist(plan["isolated_cpus"]) == sorted(iso)
    assert parse_cpulist(plan["housekeeping_cpus"]) == parse_cpulist(plan["pool_cpus"][INFRA])
    # The core of CPU 0 is always infra.
    assert 0 in parse_cpulist(plan["pool_cpus"][INFRA])
    # Spread balances each pool across sockets: two sockets' shares differ by
    # more than one only where the smaller socket had no free core left.
    first, second = (SHARED, EXCLUSIVE) if raw["num_exclusive_cores"] == -1 else (EXCLUSIVE, SHARED)
    base_infra = cores_of(topo, plan["reserved_cpus"]) | half_cores(topo)
    for pool in (first, second):
        if raw[f"{pool}_mode"] != "spread":
            continue
        later = second if pool == first else None
        count = Counter(
            topo.cpus[min(topo.core_of(c).cpus)].socket
            for c in parse_cpulist(plan["pool_cpus"][pool])
            if c == min(topo.core_of(c).cpus)
        )
        spare = Counter()
        for core in topo.cores:
            infra_extra = core.index in cores_of(topo, plan["pool_cpus"][INFRA]) and core.index not in base_infra
            in_later = later is not None and core.index in cores_of(topo, plan["pool_cpus"][later])
            if infra_extra or in_later:
                spare[core.socket] += 1
        for a in topo.sockets:
            for b in topo.sockets:
                if count[a] > count[b] + 1:
                    assert spare[b] == 0, f"{pool} spread unbalanced: {dict(count)} with spare {dict(spare)}"


@settings(max_examples=150, deadline=None)
@given(generate_cases())
def test_same_input_same_output(case):
    topo, raw, _ = case
    assert plan_pools(topo, make_request(raw)) == plan_pools(topo, make_request(dict(raw)))


@st.composite
def adopt_cases(draw):
    topo = draw(topologies())
    candidates = [c.index for c in topo.cores if 0 not in c.cpus]
    assume(candidates)
    isolated_cores = draw(st.sets(st.sampled_from(candidates), min_size=1))
    iso = sorted(cpu for c in topo.cores if c.index in isolated_cores for cpu in c.cpus)
    if draw(st.booleans()):
        # half-isolate one other core
        others = [c for c in topo.cores if c.index not in isolated_cores and len(c.cpus) > 1 and 0 not in c.cpus]
        if others:
            iso.append(draw(st.sampled_from(others)).cpus[0])
    topo = Topology(
        cpus=topo.cpus, offline=topo.offline, kernel=KernelArgs(isolcpus=tuple(sorted(iso)), isolcpus_set=True)
    )
    n = len(isolated_cores)
    excl = draw(st.integers(0, n))
    shared = draw(st.integers(0, n - excl))
    return (
        topo,
        {
            "isolcpus_source": "adopt",
            "num_exclusive_cores": excl,
            "num_shared_cores": shared,
            "exclusive_mode": draw(st.sampled_from(["packed", "spread"])),
        },
        isolated_cores,
    )


@settings(max_examples=200, deadline=None)
@given(adopt_cases())
def test_adopt_invariants(case):
    topo, raw, isolated_cores = case
    plan = plan_pools(topo, make_request(raw))
    excl = cores_of(topo, plan["pool_cpus"][EXCLUSIVE])
    shared = cores_of(topo, plan["pool_cpus"][SHARED])
    infra = cores_of(topo, plan["pool_cpus"][INFRA])
    stranded = cores_of(topo, plan["stranded_cpus"])
    assert len(excl) == raw["num_exclusive_cores"] and len(shared) == raw["num_shared_cores"]
    assert excl | shared <= isolated_cores, "exclusive and shared come from isolated cores"
    assert not infra & isolated_cores, "no fully isolated core in infra"
    assert not (excl & shared or excl & infra or shared & infra)
    assert excl | shared | infra | stranded == {c.index for c in topo.cores}
    assert stranded == isolated_cores - excl - shared
    assert bool(stranded) == any("in no pool" in w for w in plan["warnings"])
