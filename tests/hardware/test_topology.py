"""Topology facts read from the fixture corpus of sysfs trees."""

from __future__ import annotations

import json
import os

import pytest
from cpupools.core.errors import CpulistError, TopologyError
from cpupools.hardware.topology import Topology, gather_topology
from sysfs import Spec


def test_two_sockets_distant_siblings(corpus_root):
    topo = gather_topology(corpus_root["2s22c-smt2"])
    assert len(topo.cpus) == 88
    assert len(topo.cores) == 44
    assert topo.sockets == [0, 1]
    assert all(core.cpus == (core.first, core.first + 44) for core in topo.cores)
    assert [c.first for c in topo.cores_on(1)] == list(range(22, 44))
    facts = topo.to_facts()
    assert facts["sockets"]["0"]["cpus"] == "0-21,44-65"
    assert facts["sockets"]["1"]["cores"][0] == "22,66"
    assert facts["threads_per_core"] == 2
    assert facts["kernel"]["isolcpus"] == {"set": False, "cpus": "", "flags": []}
    assert facts["kernel"]["nohz_full_active"] == ""


def test_adjacent_siblings_are_read_not_guessed(corpus_root):
    topo = gather_topology(corpus_root["1s8c-adjacent"])
    assert [core.cpus for core in topo.cores][:3] == [(0, 1), (2, 3), (4, 5)]


def test_core_id_holes_and_restart_per_socket(corpus_root):
    topo = gather_topology(corpus_root["2s8c-coreid-holes"])
    assert len(topo.cores) == 16
    # sysfs core_id has holes and restarts per socket; logical indexes do not.
    assert [c.index for c in topo.cores] == list(range(16))
    assert sorted({c.core_id for c in topo.cores_on(0)}) == sorted({c.core_id for c in topo.cores_on(1)})
    assert 1 not in {c.core_id for c in topo.cores}


def test_offline_cpus(corpus_root):
    topo = gather_topology(corpus_root["2s8c-offline"])
    facts = topo.to_facts()
    assert facts["offline"] == "5,21,30-31"
    assert 5 not in topo.cpus
    # cpu 21 is the sibling of 5: core 5 keeps nothing, core (5,21) is gone;
    # cores 14 and 15 lose their second thread.
    assert topo.core_of(14).cpus == (14,)
    assert all(5 not in core.cpus and 21 not in core.cpus for core in topo.cores)
    assert len(topo.cores) == 15


def test_numa_nodes_per_socket(corpus_root):
    topo = gather_topology(corpus_root["2s8c-2numa"])
    assert list(topo.numa_nodes) == [0, 1, 2, 3]
    assert topo.to_facts()["sockets"]["1"]["numa_nodes"] == [2, 3]


def test_smt4_and_old_kernel(corpus_root):
    assert gather_topology(corpus_root["1s4c-smt4"]).threads_per_core == 4
    old = gather_topology(corpus_root["1s8c-oldkernel"])
    assert old.cores[0].cpus == (0, 8)


def test_sst_bf(corpus_root):
    facts = gather_topology(corpus_root["2s8c-sstbf"]).to_facts()
    assert facts["sst_bf"]["available"] is True
    assert facts["sst_bf"]["high_priority_cpus"] == "0-2,8-10,16-18,24-26"
    assert facts["sst_bf"]["base_frequencies_khz"] == [2100000, 2700000]
    assert gather_topology(corpus_root["2s22c-smt2"]).to_facts()["sst_bf"]["available"] is False


def test_big_machine(corpus_root):
    topo = gather_topology(corpus_root["8s64c-smt2"])
    assert len(topo.cpus) == 1024
    assert topo.sockets == list(range(8))


@pytest.mark.parametrize(
    "name", ["2s22c-smt2", "2s8c-offline", "2s8c-sstbf", "2s8c-2numa", "2s32c-smt2-nps2", "1s32c-nps4-noid"]
)
def test_facts_round_trip_through_json(corpus_root, name):
    topo = gather_topology(corpus_root[name])
    again = Topology.from_facts(json.loads(json.dumps(topo.to_facts())))
    assert again.to_facts() == topo.to_facts()


def test_kernel_arguments_from_cmdline(make_root):
    root = make_root(
        Spec(
            sockets=1,
            cores_per_socket=8,
            threads=2,
            cmdline="ro isolcpus=managed_irq,domain,1-3,9-11 nohz_full=1-3,9-11 rcu_nocbs=1-3 irqaffinity=0",
            isolated="1-3,9-11",
            nohz_full="1-3,9-11",
        )
    )
    kernel = gather_topology(str(root)).to_facts()["kernel"]
    assert kernel["isolcpus"] == {"set": True, "cpus": "1-3,9-11", "flags": ["managed_irq", "domain"]}
    assert kernel["nohz_full"] == "1-3,9-11"
    assert kernel["rcu_nocbs"] == "1-3"
    assert kernel["irqaffinity"] == "0"
    assert kernel["isolated"] == "1-3,9-11"
    assert kernel["nohz_full_active"] == "1-3,9-11"


def test_malformed_cmdline_is_refused(make_root):
    root = make_root(Spec(cmdline="ro isolcpus=1-3,x"))
    with pytest.raises(
        CpulistError, match=r"malformed /proc/cmdline isolcpus= '1-3,x': item 2 'x': 'x' is not a CPU number"
    ):
        gather_topology(str(root))


def test_inconsistent_siblings_are_refused(make_root):
    root = make_root(Spec(sockets=1, cores_per_socket=2, threads=2))
    path = os.path.join(root, "sys/devices/system/cpu/cpu2/topology/thread_siblings_list")
    with open(path, "w") as handle:
        handle.write("2\n")
    with pytest.raises(TopologyError, match="cpu0 and cpu2 disagree on their siblings"):
        gather_topology(str(root))


def test_missing_tree_is_a_clear_error(tmp_path):
    with pytest.raises(TopologyError, match=r"cannot list .*/sys/devices/system/cpu"):
        gather_topology(str(tmp_path))


# NUMA nodes and L3 cache domains (issue 15) ------------------------------------


def test_ccx_l3_domains_and_nps2_distances(corpus_root):
    # 2 sockets x 32 cores, SMT2 (sibling of i is i+64), 2 NUMA nodes per
    # socket (16 cores each), one L3 per 8 consecutive cores: 8 domains,
    # two per node, each a CCD's 8 cores and their 8 siblings.
    topo = gather_topology(corpus_root["2s32c-smt2-nps2"])
    facts = topo.to_facts()
    assert facts["l3_domains"]["0"] == "0-7,64-71"
    assert facts["l3_domains"]["3"] == "24-31,88-95"
    assert facts["l3_domains"]["7"] == "56-63,120-127"
    assert len(facts["l3_domains"]) == 8
    assert facts["numa_nodes"]["1"] == "16-31,80-95"
    # a CPU and its sibling share the domain; core 8 (cpus 8,72) opens domain 1
    by_id = {c["id"]: c for c in facts["cpus"]}
    assert (by_id[7]["l3"], by_id[71]["l3"], by_id[8]["l3"], by_id[72]["l3"]) == (0, 0, 1, 1)
    assert facts["numa_distances"] == {
        "0": [10, 12, 32, 32],
        "1": [12, 10, 32, 32],
        "2": [32, 32, 10, 12],
        "3": [32, 32, 12, 10],
    }
    assert topo.nodes_on(1) == [2, 3]
    assert {core.l3 for core in topo.cores if core.node == 3} == {6, 7}


def test_sub_numa_clustering_one_l3_over_two_nodes(corpus_root):
    # Intel SNC2: the socket's one L3 is shared by both of its NUMA nodes.
    facts = gather_topology(corpus_root["2s24c-smt2-snc2"]).to_facts()
    assert facts["l3_domains"] == {"0": "0-23,48-71", "1": "24-47,72-95"}
    assert facts["numa_nodes"]["0"] == "0-11,48-59" and facts["numa_nodes"]["1"] == "12-23,60-71"
    assert facts["numa_distances"]["0"] == [10, 11, 21, 21]


def test_l3_without_id_file_is_numbered_by_its_lowest_cpu(corpus_root):
    facts = gather_topology(corpus_root["1s32c-nps4-noid"]).to_facts()
    assert facts["l3_domains"] == {"0": "0-7", "8": "8-15", "16": "16-23", "24": "24-31"}


def test_no_cache_directories_means_no_l3(corpus_root):
    facts = gather_topology(corpus_root["2s22c-smt2"]).to_facts()
    assert facts["l3_domains"] == {}
    assert {c["l3"] for c in facts["cpus"]} == {None}
    assert facts["numa_distances"] == {"0": [10, 32], "1": [32, 10]}


def test_l3_found_when_index3_is_not_the_l3(make_root):
    # Some arm64 kernels number cache indexes differently: the L3 is whichever index has level 3.
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, l3_cores=2))
    for cpu in range(4):
        cache = os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}/cache")
        os.rename(os.path.join(cache, "index3"), os.path.join(cache, "index5"))
        with open(os.path.join(cache, "index2", "level"), "w") as handle:
            handle.write("2\n")
    assert gather_topology(str(root)).to_facts()["l3_domains"] == {"0": "0-1", "1": "2-3"}


def test_inconsistent_l3_and_distances_are_refused(make_root):
    cache = "sys/devices/system/cpu/cpu{}/cache/index3/{}"
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, l3_cores=2))
    # The L3 is read for one CPU per domain (cpu0 for 0-1, cpu2 for 2-3): a list that claims a CPU of
    # another domain makes two domains of that CPU.
    with open(os.path.join(root, cache.format(0, "shared_cpu_list")), "w") as handle:
        handle.write("0-2\n")
    with pytest.raises(TopologyError, match=r"cpu2 is in L3 cache 0 and in L3 cache 1 \(according to cpu3\)"):
        gather_topology(str(root))
    # One id with two lists.
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, l3_cores=2), "same-id")
    with open(os.path.join(root, cache.format(2, "id")), "w") as handle:
        handle.write("0\n")
    with pytest.raises(TopologyError, match=r"L3 cache 0 is shared by CPUs 0-1 according to one CPU and by 2-3"):
        gather_topology(str(root))
    # A CPU's own file is not read where another CPU's list already named it (the plan needs one list per
    # domain; the kernel writes every CPU's from the same map): cpu1 follows cpu0's list.
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, l3_cores=2), "covered")
    with open(os.path.join(root, cache.format(1, "shared_cpu_list")), "w") as handle:
        handle.write("0-2\n")
    assert gather_topology(str(root)).to_facts()["l3_domains"] == {"0": "0-1", "1": "2-3"}
    root = make_root(Spec(sockets=2, cores_per_socket=2, threads=1), "two")
    with open(os.path.join(root, "sys/devices/system/node/node1/distance"), "w") as handle:
        handle.write("32 ten\n")
    with pytest.raises(TopologyError, match=r"node1/distance: '32 ten' is not a list of numbers"):
        gather_topology(str(root))
    with open(os.path.join(root, "sys/devices/system/node/node1/distance"), "w") as handle:
        handle.write("32\n")
    with pytest.raises(TopologyError, match=r"node1/distance has 1 entries for 2 NUMA nodes"):
        gather_topology(str(root))


def test_an_l2_id_given_twice_is_not_refused(make_root):
    """The L2 has never been checked for ids given twice (an arm64 firmware's cache ids need not be unique):
    each CPU takes the first L2, in CPU order, that names it; the L3's check is not the L2's."""
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, l3_cores=4, l2_cores=2))
    for cpu in range(4):
        with open(os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}/cache/index2/id"), "w") as handle:
            handle.write("7\n")
    facts = gather_topology(str(root)).to_facts()
    assert [c["l2"] for c in facts["cpus"]] == [7, 7, 7, 7]
    assert facts["l3_domains"] == {"0": "0-3"}
