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


# The per-pool settings: their shape (to_settings), then against the node (plan_power) -----------------

POOLS = ("exclusive", "shared", "exclusive-non-isolcpus", "infra")


def test_settings_take_a_fixed_frequency_as_min_and_max_and_keep_the_rest():
    got = power.to_settings(
        {"exclusive": {"governor": "performance", "frequency_khz": "3000000", "cstate_limit": "C1"}, "uncore": {}}
        | {"uncore": {"min_khz": 2000000}},
        POOLS,
    )
    assert got == {
        "exclusive": {"governor": "performance", "min_khz": 3000000, "max_khz": 3000000, "cstate_limit": "C1"},
        "uncore": {"min_khz": 2000000},
    }
    assert power.to_settings({}, POOLS) == {} and power.to_settings(None, POOLS) == {}


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"exclusiv": {"governor": "performance"}}, "exclusiv: not a pool; give one of exclusive"),
        ({"exclusive": {"gov": "performance"}}, "gov is not a setting"),
        ({"exclusive": {}}, "exclusive: give a mapping of settings"),
        ({"exclusive": {"frequency_khz": 3000000, "max_khz": 3800000}}, "not both"),
        ({"exclusive": {"min_khz": 3000000, "max_khz": 2000000}}, "min_khz 3000000 is above max_khz 2000000"),
        ({"exclusive": {"max_khz": "3GHz"}}, "'3GHz' is not a frequency in kHz"),
        ({"exclusive": {"max_khz": True}}, "True is not a frequency in kHz"),
        ({"exclusive": {"governor": "perf ormance"}}, "is not a governor name"),
        ({"exclusive": {"epp": 300}}, "300 is above 255"),
        ({"exclusive": {"cstate_limit": "C1; rm -rf /"}}, "exclusive.cstate_limit: 'C1; rm -rf /' is not a C-state"),
        ({"uncore": {"governor": "performance"}}, "uncore: governor is not a setting; give min_khz, max_khz"),
        ("exclusive", "is not a mapping of pool to settings"),
    ],
)
def test_settings_of_the_wrong_shape_are_refused_naming_the_key(raw, said):
    with pytest.raises(power.PowerError, match=None) as caught:
        power.to_settings(raw, POOLS)
    assert said in str(caught.value), str(caught.value)


def plan(tmp_path, kind: str, settings: dict, pools: dict | None = None, shape: str = "2s8c-nosmt") -> dict:
    root = tree(tmp_path, shape, kind)
    facts = power.read_power(root, range(16))
    pools = pools or {"exclusive": [2, 3, 10, 11], "shared": [4, 5], "infra": [0, 1, 8, 9]}
    return power.plan_power(power.to_settings(settings, POOLS), facts, pools, "node-a")


def test_an_intel_node_takes_a_governor_a_fixed_frequency_a_cstate_limit_and_the_uncore(tmp_path):
    got = plan(
        tmp_path,
        "intel",
        {
            "exclusive": {"governor": "performance", "frequency_khz": 3000000, "cstate_limit": "C1"},
            "infra": {"governor": "powersave", "epp": "balance_power"},
            "uncore": {"min_khz": 2000000, "max_khz": 2000000},
        },
    )
    assert (got["driver"], got["mode"], got["idle_driver"]) == ("intel_pstate", "active", "intel_idle")
    exclusive, infra = got["cpus"]
    assert exclusive == {
        "cpus": "2-3,10-11",
        "pool": "exclusive",
        "governor": "performance",
        "min_khz": 3000000,
        "max_khz": 3000000,
        "cstates_off": [2, 3],  # C1E and C6: deeper than C1
        "cstates_on": [0, 1],
        "cstate_names": {"0": "POLL", "1": "C1", "2": "C1E", "3": "C6"},
    }
    assert infra == {"cpus": "0-1,8-9", "pool": "infra", "governor": "powersave", "epp": "balance_power"}
    assert got["uncore"] == {
        "package_00_die_00": {"min_khz": 2000000, "max_khz": 2000000},
        "package_01_die_00": {"min_khz": 2000000, "max_khz": 2000000},
    }


@pytest.mark.parametrize(
    ("kind", "settings", "said"),
    [
        (
            "intel",
            {"exclusive": {"governor": "ondemand"}},
            "governor ondemand is not offered on CPU 2 (driver "
            "intel_pstate, mode active); it has performance, powersave",
        ),
        ("intel", {"exclusive": {"frequency_khz": 4500000}}, "min_khz 4500000 kHz is outside CPU 2's range"),
        ("intel", {"exclusive": {"governor": "performance", "epp": "balance_power"}}, "pins the preference"),
        ("intel", {"exclusive": {"epp": "turbo"}}, "epp turbo is not offered on CPU 2; it has default, performance"),
        ("intel", {"exclusive": {"cstate_limit": "C7"}}, "C7 is not a C-state of node-a (CPUs 2-3,10-11); it has POLL"),
        ("intel", {"uncore": {"max_khz": 3000000}}, "3000000 kHz is outside package_00_die_00's range 800000-2500000"),
        ("amd", {"uncore": {"max_khz": 2000000}}, "the node has no intel_uncore_frequency driver"),
        ("vm", {"exclusive": {"governor": "performance"}}, "CPUs 2-3,10-11 have no cpufreq policy (no cpufreq driver)"),
        ("vm", {"infra": {"epp": "performance"}}, "CPUs 0-1,8-9 have no cpufreq policy"),
    ],
)
def test_what_the_node_does_not_offer_is_refused_saying_what_it_has(tmp_path, kind, settings, said):
    with pytest.raises(power.PowerError) as caught:
        plan(tmp_path, kind, settings)
    assert said in str(caught.value), str(caught.value)


def test_an_amd_node_by_exit_latency_and_a_vm_by_name(tmp_path):
    amd = plan(tmp_path / "a", "amd", {"exclusive": {"cstate_limit": "latency:10", "governor": "performance"}})
    [entry] = amd["cpus"]
    assert (entry["cstates_off"], entry["cstates_on"]) == ([2], [0, 1])  # C2 (18 µs) is out
    vm = plan(tmp_path / "v", "vm", {"exclusive": {"cstate_limit": "POLL"}})
    [entry] = vm["cpus"]
    assert entry["cstates_off"] == [1] and entry["cstate_names"]["1"] == "haltpoll idle"
    assert "governor" not in entry


def test_an_empty_pool_plans_nothing_and_no_settings_plan_nothing(tmp_path):
    got = plan(tmp_path, "intel", {"shared": {"governor": "performance"}}, pools={"shared": [], "exclusive": [2]})
    assert got["cpus"] == [] and got["uncore"] == {}
    assert plan(tmp_path / "b", "intel", {}) == {}
