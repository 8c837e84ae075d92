"""Topology facts read from the fixture corpus of sysfs trees."""

from __future__ import annotations

import json
import os

import pytest
from cpupools.errors import CpulistError, TopologyError
from cpupools.topology import Topology, gather_topology
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


@pytest.mark.parametrize("name", ["2s22c-smt2", "2s8c-offline", "2s8c-sstbf", "2s8c-2numa"])
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
