"""Power and frequency facts (issue 41): what an Intel, an AMD and a VM node offer, read from sysfs."""

from __future__ import annotations

import dataclasses
import os

import pytest
from cpupools.hardware import power
from sysfs import CORPUS, write_tree


def tree(tmp_path, shape: str, kind: str) -> str:
    return write_tree(str(tmp_path / kind), dataclasses.replace(CORPUS[shape], power=kind))


def test_intel_pstate_intel_idle_and_the_uncore(tmp_path):
    root = tree(tmp_path, "2s8c-nosmt", "intel")
    facts = power.read_power(root, range(16))
    freq = facts["cpufreq"]
    assert (freq["driver"], freq["mode"], freq["turbo"]) == ("intel_pstate", "active", True)
    # One policy per CPU on intel_pstate, the same settings on each: one group.
    [policy] = freq["policies"]
    assert policy["cpus"] == "0-15"
    assert (policy["governor"], policy["governors"]) == ("powersave", ["performance", "powersave"])
    assert (policy["min_khz"], policy["max_khz"]) == (800000, 3800000)
    assert policy["epp"] == "balance_performance" and "performance" in policy["epps"]
    idle = facts["cpuidle"]
    assert (idle["driver"], idle["governor"]) == ("intel_idle", "menu")
    [group] = idle["groups"]
    assert [s["name"] for s in group["states"]] == ["POLL", "C1", "C1E", "C6"]
    assert group["states"][3] == {"index": 3, "name": "C6", "latency_us": 290, "residency_us": 800}
    assert group["disabled"] == []
    uncore = facts["uncore"]
    assert uncore["driver"] == "intel_uncore_frequency"
    assert [(d["name"], d["package"], d["die"]) for d in uncore["domains"]] == [
        ("package_00_die_00", 0, 0),
        ("package_01_die_00", 1, 0),
    ]
    assert uncore["domains"][0]["initial_max_khz"] == 2500000


def test_amd_pstate_epp_and_acpi_idle(tmp_path):
    root = tree(tmp_path, "1s8c-smt2", "amd")
    facts = power.read_power(root, range(16))
    assert (facts["cpufreq"]["driver"], facts["cpufreq"]["mode"], facts["cpufreq"]["turbo"]) == (
        "amd-pstate-epp",
        "active",
        True,
    )
    assert facts["cpuidle"]["driver"] == "acpi_idle"
    assert [s["name"] for s in facts["cpuidle"]["groups"][0]["states"]] == ["POLL", "C1", "C2"]
    assert facts["uncore"] == {"driver": None, "domains": []}


def test_a_vm_has_no_cpufreq_and_haltpoll(tmp_path):
    root = tree(tmp_path, "1s8c-smt2", "vm")
    facts = power.read_power(root, range(16))
    assert facts["cpufreq"] == {"driver": None, "mode": None, "turbo": None, "policies": []}
    assert facts["cpuidle"]["driver"] == "haltpoll"
    cpus = power.per_cpu(facts)
    assert cpus[3] == {
        "governor": None,
        "scaling_min_khz": None,
        "scaling_max_khz": None,
        "states": ["POLL", "haltpoll idle"],
        "disabled": [],
        "deepest": "haltpoll idle",
    }


def test_a_node_without_any_of_it(tmp_path):
    root = write_tree(str(tmp_path / "bare"), CORPUS["1s8c-smt2"])
    facts = power.read_power(root, range(16))
    assert facts == {
        "cpufreq": {"driver": None, "mode": None, "turbo": None, "policies": []},
        "cpuidle": {"driver": None, "governor": None, "groups": []},
        "uncore": {"driver": None, "domains": []},
    }
    assert power.per_cpu(facts) == {}


def test_settings_that_differ_per_cpu_are_grouped_and_read_per_cpu(tmp_path):
    """A tuned node: CPUs 2-3 on performance at a fixed frequency, C6 and C1E disabled on them; an offline
    CPU has no policy and no cpuidle directory, and a policy whose CPUs are all offline is left out."""
    root = tree(tmp_path, "2s8c-nosmt", "intel")
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    for cpu in (2, 3):
        policy = os.path.join(cpu_dir, "cpufreq", f"policy{cpu}")
        for name, value in (("scaling_governor", "performance"), ("scaling_min_freq", "3800000")):
            with open(os.path.join(policy, name), "w") as handle:
                handle.write(value + "\n")
        for state in (2, 3):
            with open(os.path.join(cpu_dir, f"cpu{cpu}", "cpuidle", f"state{state}", "disable"), "w") as handle:
                handle.write("1\n")
    with open(os.path.join(cpu_dir, "cpufreq", "policy15", "affected_cpus"), "w") as handle:
        handle.write("\n")
    facts = power.read_power(root, range(15))
    assert [p["cpus"] for p in facts["cpufreq"]["policies"]] == ["0-1,4-14", "2-3"]
    assert [g["cpus"] for g in facts["cpuidle"]["groups"]] == ["0-1,4-14", "2-3"]
    cpus = power.per_cpu(facts)
    assert 15 not in cpus
    assert cpus[2]["governor"] == "performance" and cpus[2]["scaling_min_khz"] == 3800000
    assert cpus[2]["disabled"] == ["C1E", "C6"] and cpus[2]["deepest"] == "C1"
    assert cpus[0]["deepest"] == "C6"


@pytest.mark.parametrize(
    ("limit", "disabled"),
    [
        ("C1", ["C1E", "C6"]),
        ("c1e", ["C6"]),
        ("C6", []),
        ("POLL", ["C1", "C1E", "C6"]),
        (2, ["C6"]),
        ("latency:1", ["C1E", "C6"]),
        ("10us", ["C6"]),
        (0, ["C1", "C1E", "C6"]),
    ],
)
def test_a_cstate_limit_by_name_or_by_exit_latency(tmp_path, limit, disabled):
    facts = power.read_power(tree(tmp_path, "1s8c-smt2", "intel"), range(16))
    states = facts["cpuidle"]["groups"][0]["states"]
    assert power.states_to_disable(states, limit) == disabled


def test_a_cstate_limit_the_node_cannot_take_is_refused_saying_what_it_has(tmp_path):
    facts = power.read_power(tree(tmp_path, "1s8c-smt2", "amd"), range(16))
    states = facts["cpuidle"]["groups"][0]["states"]
    with pytest.raises(power.PowerError, match=r"C6 is not a C-state of node-a; it has POLL \(0 µs\), C1 \(1 µs\), C2"):
        power.states_to_disable(states, "C6", "node-a")
    with pytest.raises(power.PowerError, match="no cpuidle states"):
        power.states_to_disable([], "C1", "node-a")
    for bad in (True, None, "", -1):
        with pytest.raises(power.PowerError):
            power.states_to_disable(states, bad)


def test_the_facts_module_reads_them_when_asked_and_only_then(tmp_path):
    from helpers import run_module

    root = tree(tmp_path, "2s8c-sstbf", "intel")
    asked = run_module("cpupools_facts", {"root": root, "power": True}, tmp_path)
    facts = asked["ansible_facts"]["cpupools"]
    assert facts["power"]["cpufreq"]["policies"][0]["cpus"] == "0-31"
    assert facts["power"]["cpuidle"]["groups"][0]["cpus"] == "0-31"
    assert facts["power"]["uncore"]["driver"] == "intel_uncore_frequency"
    assert facts["sst_bf"]["available"]  # the topology facts as before
    plain = run_module("cpupools_facts", {"root": root}, tmp_path)
    assert "power" not in plain["ansible_facts"]["cpupools"]
    # A policy file the kernel would never write fails the module, naming what it read.
    with open(os.path.join(root, "sys/devices/system/cpu/cpufreq/policy5/affected_cpus"), "w") as handle:
        handle.write("five\n")
    broken = run_module("cpupools_facts", {"root": root, "power": True}, tmp_path)
    assert broken.get("failed") and "policy5/affected_cpus" in broken["msg"], broken
