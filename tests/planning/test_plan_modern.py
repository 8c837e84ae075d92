"""Today's machines, every runtime: plans worked out by hand from what the kernel shows of them (issue 25).

The fixtures (tests/fixtures/sysfs.py) write what these machines' kernels
expose: cache ``index2``/``index3`` ``shared_cpu_list`` and ``id``, the
kernel's cluster (``cluster_cpus_list``), NUMA distances, ``smt/control``
and the hybrid PMU directories. The comment above each assertion gives the
reasoning; none is copied from output.
"""

from __future__ import annotations

import pytest
from cpupools.core.errors import PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.node.kubelet import derive_config, node_shape
from cpupools.planning.plan import make_request, plan_pools
from cpupools.planning.runtimes import check_runtime, core_numbers, render

RUNTIMES = ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons", "kubelet")
SHAPES = (
    "2s96c-smt2-nps4",
    "2s48c-smt2-snc4",
    "1s144c-srf-snc2",
    "1s6p8e-hybrid",
    "1s4b4l-capacity",
    "1s16c-smt-off",
    "1s16c-nosmt-boot",
)


@pytest.fixture(scope="module")
def topo(corpus_root):
    """The shapes' topologies, read from the session's corpus (written once per test process)."""
    trees = {name: gather_topology(corpus_root[name]) for name in SHAPES}
    return trees.__getitem__


def plans(topology, pooler="multiThreaded", **raw):
    """The plan for every runtime, checked by the runtime (what the plan play does), and rendered."""
    out = {}
    for runtime in RUNTIMES:
        plan = plan_pools(topology, make_request({**raw, "runtime": runtime}))
        check_runtime(plan, core_numbers([list(c.cpus) for c in topology.cores]), runtime, pooler)
        if runtime == "kubelet":
            settings = {"isolcpus_flags": "auto", "kubelet_policy_options": "auto", "kubelet_version": "1.36"}
            plan["kubelet"] = {"config": derive_config(plan, node_shape(topology, plan), settings)}
        elif runtime != "cmk":
            plan["rendered"] = render(plan, runtime, pooler)
        out[runtime] = plan
    return out


def pools(plan):
    return {k: v for k, v in plan["pool_cpus"].items() if k in ("exclusive", "shared")}


def test_epyc_genoa_nps4(topo):
    # 2 x 96 cores, SMT2 (CPU c+192), NPS4: NUMA node n holds cores 24n..24n+23 = three 8-core CCDs
    # (L3 3n, 3n+1, 3n+2). 48 threads per node: auto keeps one housekeeping core on each, its first.
    plan = plans(topo("2s96c-smt2-nps4"), num_exclusive_cores=16, num_shared_cores=4)
    firsts = [0, 24, 48, 72, 96, 120, 144, 168]
    reserved = ",".join(map(str, firsts + [c + 192 for c in firsts]))
    # Packed: 16 exclusive and 4 shared cores all from node 0. Shared beside housekeeping in CCD 0
    # (cores 1-4); exclusive takes CCDs 1 and 2 whole (cores 8-23), neither holding housekeeping.
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "8-23,200-215", "shared": "1-4,193-196"}, runtime
        assert plan[runtime]["reserved_cpus"] == reserved
    assert plan["cmk"]["isolated_cpus"] == "1-4,8-23,193-196,200-215"
    # nri-topology-aware hands isolated CPUs out only exclusively: auto isolates exclusive only.
    assert plan["nri-topology-aware"]["isolated_cpus"] == "8-23,200-215"
    for runtime in ("nri-topology-aware", "nri-balloons"):
        assert plan[runtime]["rendered"]["object"]["spec"]["reservedResources"] == {"cpu": "cpuset:" + reserved}
    balloons = {t["name"]: t for t in plan["nri-balloons"]["rendered"]["object"]["spec"]["balloonTypes"]}
    assert (balloons["exclusive"]["maxBalloons"], balloons["exclusive"]["maxCPUs"]) == (16, 32)
    # CPU-Pooler's default pool is where everything else runs: housekeeping and the cores no pool took.
    assert '  default:\n    cpus: "0,5-7,24-192,197-199,216-383"\n' in plan["cpu-pooler"]["rendered"]["file"]
    # The kubelet: reservedSystemCPUs is housekeeping only; the 368 other CPUs are the kubelet's,
    # isolated; a pod's CPUs in one CCD (several L3 domains per NUMA node).
    kubelet = plan["kubelet"]
    assert kubelet["kubelet"]["config"]["reservedSystemCPUs"] == reserved
    assert kubelet["allocatable_cpus"] == 368 and kubelet["pool_cpus"]["infra"] == reserved
    assert kubelet["isolated_cpus"] == kubelet["pool_cpus"]["exclusive"]
    assert kubelet["kubelet"]["config"]["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "prefer-align-cpus-by-uncorecache": "true",
    }


def test_xeon_sub_numa_clustering_snc4(topo):
    # 2 x 48 cores, SMT2 (c+96), SNC4: nodes of 12 cores, one L3 over each socket (nothing to choose
    # between within a node). 24 threads per node: one housekeeping core each, its first.
    plan = plans(topo("2s48c-smt2-snc4"), num_exclusive_cores=16, num_shared_cores=4)
    firsts = [0, 12, 24, 36, 48, 60, 72, 84]
    reserved = ",".join(map(str, firsts + [c + 96 for c in firsts]))
    # Packed, first free cores: exclusive node 0's 11 (1-11) and 5 of node 1 (13-17); shared the
    # next 4 of node 1 (18-21).
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "1-11,13-17,97-107,109-113", "shared": "18-21,114-117"}
        assert plan[runtime]["reserved_cpus"] == reserved
    kubelet = plan["kubelet"]
    assert kubelet["kubelet"]["config"]["reservedSystemCPUs"] == reserved
    assert kubelet["allocatable_cpus"] == 192 - 16
    # One L3 per node: the kubelet spreads a multi-node pod evenly instead.
    assert "distribute-cpus-across-numa" in kubelet["kubelet"]["config"]["cpuManagerPolicyOptions"]


def test_sierra_forest_e_core_modules(topo):
    # 144 E cores, no SMT, two NUMA nodes (0-71, 72-143), one L3, four cores per L2 module
    # (module k = cores 4k..4k+3). 72 threads per node: three housekeeping cores each, kept in one
    # module: 0-2 and 72-74.
    plan = plans(topo("1s144c-srf-snc2"), num_exclusive_cores=16, num_shared_cores=4)
    # Shared beside housekeeping: core 3 (module 0), then the fewest clean modules: 4-6 (module 1).
    # Exclusive: four whole modules nothing else uses, 8-23; no exclusive core shares an L2.
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "8-23", "shared": "3-6"}, runtime
        assert plan[runtime]["reserved_cpus"] == "0-2,72-74"
    assert plan["kubelet"]["kubelet"]["config"]["cpuManagerPolicyOptions"] == {
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert plan["kubelet"]["allocatable_cpus"] == 138


def test_hybrid_p_and_e_cores(topo):
    # Raptor Lake: 6 P cores with adjacent siblings (CPUs 0-11), 8 E cores (12-19) in two L2 modules
    # (12-15, 16-19), one L3. 20 threads: one housekeeping core, the core of CPU 0 (0-1).
    # CPU-Pooler's multiThreaded policy takes a listed CPU id as the lscpu core number: with adjacent
    # sibling numbering it would hand out another core's threads, so only singleThreaded is accepted.
    with pytest.raises(PlanError, match="set cpupools_pooler_ht_policy: singleThreaded"):
        plans(topo("1s6p8e-hybrid"), num_exclusive_cores=4, num_shared_cores=2)
    plan = plans(topo("1s6p8e-hybrid"), "singleThreaded", num_exclusive_cores=4, num_shared_cores=2)
    # Shared takes E cores, from one module (12, 13); exclusive P cores only (cores 1-4: CPUs 2-9).
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "2-9", "shared": "12-13"}, runtime
        assert plan[runtime]["reserved_cpus"] == "0-1"
    assert plan["cmk"]["pool_cpus"]["infra"] == "0-1,10-11,14-19"
    # P and E base frequencies differ by design: no SST-BF preference.
    assert plan["cmk"]["sst_bf_cores"] == ""
    types = {t["name"]: t for t in plan["nri-balloons"]["rendered"]["object"]["spec"]["balloonTypes"]}
    assert (types["exclusive"]["preferCoreType"], types["shared"]["preferCoreType"]) == ("performance", "efficient")
    # The kubelet cannot keep pods off E cores: they are reserved, and pods get the P cores.
    kubelet = plan["kubelet"]
    assert kubelet["kubelet"]["config"]["reservedSystemCPUs"] == "0-1,12-19"
    assert kubelet["pool_cpus"]["exclusive"] == "2-11" and kubelet["allocatable_cpus"] == 10
    # More exclusive cores than P cores: refused with what fits.
    with pytest.raises(PlanError) as err:
        plan_pools(topo("1s6p8e-hybrid"), make_request({"num_exclusive_cores": 6, "num_shared_cores": 1}))
    assert str(err.value) == (
        "6 exclusive cores + 1 shared core requested, 13 available after 1 infra core per NUMA node (auto), "
        "of which 5 can be exclusive (P cores; set cpupools_exclusive_core_type: any to hand out E cores too)"
    )


def test_big_little_by_capacity(topo):
    # arm64: 4 big cores (capacity 1024, CPUs 0-3) and 4 LITTLE (446, CPUs 4-7, one L2 module).
    # Housekeeping: the core of CPU 0. Shared on a LITTLE core (4), exclusive on big ones (1, 2).
    plan = plans(topo("1s4b4l-capacity"), num_exclusive_cores=2, num_shared_cores=1)
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "1-2", "shared": "4"}, runtime
    assert plan["kubelet"]["kubelet"]["config"]["reservedSystemCPUs"] == "0,4-7"


def test_smt_switched_off_at_runtime_is_refused_for_every_runtime(topo):
    for runtime in RUNTIMES:
        with pytest.raises(PlanError) as err:
            plan_pools(topo("1s16c-smt-off"), make_request({"runtime": runtime}))
        assert err.value.field is None
        assert str(err.value).startswith(
            "SMT was switched off at runtime (smt/control is 'off'; CPUs 16-31 are offline) and the kernel "
            "command line has no nosmt"
        )


def test_booted_with_nosmt_plans_the_cores_as_they_are(topo):
    # 16 one-thread cores (the siblings 16-31 stay off: nosmt), one L3: the first free cores.
    plan = plans(topo("1s16c-nosmt-boot"), num_exclusive_cores=4, num_shared_cores=1)
    for runtime in ("cmk", "cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert pools(plan[runtime]) == {"exclusive": "1-4", "shared": "5"}, runtime
        assert plan[runtime]["warnings"] == []
        assert plan[runtime]["notes"] == [
            "SMT is off (nosmt on the kernel command line): CPUs 16-31 stay offline at boot"
        ]
    assert plan["kubelet"]["kubelet"]["config"]["reservedSystemCPUs"] == "0"
