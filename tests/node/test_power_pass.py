"""Power per pool on the node (node/power.py): the housekeeper's lines, and sysfs set to them and back.

The trees are the fixtures' Intel server (tests/fixtures/sysfs.py, ``Spec.power``): the files and their
formats as the kernel shows them, written here as plain files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cpupools.core.errors import StateError
from cpupools.hardware import power as facts
from cpupools.node import housekeep, power
from cpupools.node.tasks import Facts
from sysfs import CORPUS, write_tree

CPU = "sys/devices/system/cpu"
POOLS = ("exclusive", "shared", "exclusive-non-isolcpus", "infra")


@pytest.fixture
def node(tmp_path) -> Path:
    return Path(write_tree(str(tmp_path / "node"), dataclasses.replace(CORPUS["2s8c-nosmt"], power="intel")))


def planned(node: Path, settings: dict, exclusive=(2, 3)) -> dict:
    """The configuration as the agent stage writes it and the housekeeper reads it back."""
    plan = facts.plan_power(
        facts.to_settings(settings, POOLS),
        facts.read_power(str(node), range(16)),
        {"exclusive": list(exclusive), "infra": [0, 1]},
        "node-a",
    )
    text = housekeep.render_config("2-3", "0-1", None, (), plan)
    return housekeep.parse_config(text)["power"]


def read(node: Path, rel: str) -> str:
    return (node / rel).read_text().strip()


SETTINGS = {
    "exclusive": {"governor": "performance", "frequency_khz": 3000000, "cstate_limit": "C1"},
    "uncore": {"min_khz": 2000000, "max_khz": 2000000},
}


def test_the_configuration_carries_the_plan_and_reads_back(node):
    config = planned(node, SETTINGS)
    assert config["cpus"] == [
        {
            "cpus": [2, 3],
            "pool": "exclusive",
            "governor": "performance",
            "min_khz": 3000000,
            "max_khz": 3000000,
            "cstates_off": [2, 3],
            "cstates_on": [0, 1],
        }
    ]
    assert config["uncore"]["package_01_die_00"] == {"min_khz": 2000000, "max_khz": 2000000}


def test_check_then_set_then_nothing_left_to_set(node):
    config = planned(node, SETTINGS)
    sysfs = Facts(str(node))
    check = power.power_pass(config, sysfs, check=True)
    # Per CPU: governor, min, max, two states off, two on (already on: not written); two uncore domains x 2.
    assert [w["status"] for w in check["writes"]] == ["would write"] * (2 * 5 + 4)
    assert read(node, f"{CPU}/cpu2/cpufreq/scaling_governor") == "powersave"  # check mode wrote nothing
    assert not (node / power.SAVED.lstrip("/")).exists()

    done = power.power_pass(config, sysfs)
    assert {w["status"] for w in done["writes"]} == {"written"}
    for cpu in (2, 3):
        assert read(node, f"{CPU}/cpu{cpu}/cpufreq/scaling_governor") == "performance"
        assert read(node, f"{CPU}/cpu{cpu}/cpufreq/scaling_min_freq") == "3000000"
        assert [read(node, f"{CPU}/cpu{cpu}/cpuidle/state{i}/disable") for i in range(4)] == ["0", "0", "1", "1"]
    assert read(node, f"{CPU}/cpu4/cpufreq/scaling_governor") == "powersave"  # not in the pool
    assert read(node, f"{CPU}/intel_uncore_frequency/package_00_die_00/max_freq_khz") == "2000000"
    saved = json.loads((node / power.SAVED.lstrip("/")).read_text())
    assert saved[f"{CPU}/cpu2/cpufreq/scaling_governor"] == "powersave"
    assert saved[f"{CPU}/cpu3/cpuidle/state3/disable"] == "0"
    assert f"{CPU}/cpu3/cpuidle/state0/disable" not in saved  # never changed

    again = power.power_pass(config, sysfs)
    assert again["writes"] == [] and again["summary"] == "power: every setting as planned"


def test_a_setting_changed_behind_its_back_is_put_back(node):
    config = planned(node, SETTINGS)
    sysfs = Facts(str(node))
    power.power_pass(config, sysfs)
    (node / f"{CPU}/cpu3/cpuidle/state3/disable").write_text("0\n")  # someone re-enabled C6
    fixed = power.power_pass(config, sysfs)
    assert [(w["path"], w["from"], w["to"], w["status"]) for w in fixed["writes"]] == [
        (f"/{CPU}/cpu3/cpuidle/state3/disable", "0", "1", "written")
    ]


def test_a_cpu_that_leaves_the_pool_gets_its_values_back_and_uninstall_restores_everything(node):
    sysfs = Facts(str(node))
    power.power_pass(planned(node, SETTINGS, exclusive=(2, 3)), sysfs)
    resized = power.power_pass(planned(node, SETTINGS, exclusive=(2, 4)), sysfs)
    restored = {w["path"] for w in resized["writes"] if w["status"] == "restored"}
    assert f"/{CPU}/cpu3/cpufreq/scaling_governor" in restored
    assert read(node, f"{CPU}/cpu3/cpufreq/scaling_governor") == "powersave"
    assert read(node, f"{CPU}/cpu3/cpuidle/state2/disable") == "0"
    assert read(node, f"{CPU}/cpu4/cpufreq/scaling_governor") == "performance"
    saved = json.loads((node / power.SAVED.lstrip("/")).read_text())
    assert not any("/cpu3/" in path for path in saved)

    check = power.power_pass(None, sysfs, check=True)
    assert check["writes"] and {w["status"] for w in check["writes"]} == {"would restore"}
    undone = power.power_pass(None, sysfs)
    assert {w["status"] for w in undone["writes"]} == {"restored"}
    for cpu in (2, 3, 4):
        assert read(node, f"{CPU}/cpu{cpu}/cpufreq/scaling_governor") == "powersave"
        assert read(node, f"{CPU}/cpu{cpu}/cpufreq/scaling_max_freq") == "3800000"
    assert read(node, f"{CPU}/intel_uncore_frequency/package_00_die_00/min_freq_khz") == "800000"
    assert not (node / power.SAVED.lstrip("/")).exists()
    assert power.power_pass(None, sysfs)["writes"] == []


def test_a_new_minimum_above_the_current_maximum_writes_the_maximum_first(node):
    sysfs = Facts(str(node))
    power.power_pass(planned(node, {"exclusive": {"frequency_khz": 1000000}}), sysfs)
    raised = power.power_pass(planned(node, {"exclusive": {"frequency_khz": 3000000}}), sysfs)
    files = [w["path"].rsplit("/", 1)[1] for w in raised["writes"] if "/cpu2/" in w["path"]]
    assert files == ["scaling_max_freq", "scaling_min_freq"]
    lowered = power.power_pass(planned(node, {"exclusive": {"frequency_khz": 900000}}), sysfs)
    files = [w["path"].rsplit("/", 1)[1] for w in lowered["writes"] if "/cpu2/" in w["path"]]
    assert files == ["scaling_min_freq", "scaling_max_freq"]


def test_a_file_that_went_away_is_said_and_the_rest_is_set(node):
    config = planned(node, {"exclusive": {"governor": "performance"}})
    governor = node / f"{CPU}/cpu2/cpufreq/scaling_governor"
    governor.unlink()
    governor.mkdir()  # neither read nor written (a driver unloaded, a CPU gone since the plan)
    done = power.power_pass(config, Facts(str(node)))
    by_path = {w["path"]: w for w in done["writes"]}
    assert by_path[f"/{CPU}/cpu3/cpufreq/scaling_governor"]["status"] == "written"
    assert by_path[f"/{CPU}/cpu2/cpufreq/scaling_governor"]["status"] == "refused"
    assert "refused" in done["summary"]


@pytest.mark.parametrize(
    "line",
    [
        "power=2-3 governor=performance bogus=1",
        "power=2-3 min_khz=3GHz",
        "power=2-3 cstates_off=C6",
        "power=2-3 governor=../../x",
        "power=x governor=performance",
        "uncore=../x min_khz=1",
    ],
)
def test_a_power_line_that_cannot_be_used_is_refused(line):
    with pytest.raises(StateError):
        housekeep.parse_config(f"isolated=2-3\nhousekeeping=0-1\n{line}\n")


def test_verify_fails_a_cpu_whose_settings_are_not_the_plans(node):
    from cpupools.verify.checks import check_power

    settings = facts.to_settings(SETTINGS, POOLS)
    plan = facts.plan_power(settings, facts.read_power(str(node), range(16)), {"exclusive": [2, 3]}, "node-a")
    before = check_power(plan, str(node))
    assert {f["check"] for f in before} == {"power"} and {f["severity"] for f in before} == {"fail"}
    assert any("governor powersave (planned performance)" in f["message"] and f["cpus"] == "2-3" for f in before)
    assert any("may enter C1E, C6" in f["message"] for f in before), before

    text = housekeep.render_config("2-3", "0-1", None, (), plan)
    power.power_pass(housekeep.parse_config(text)["power"], Facts(str(node)))
    assert check_power(plan, str(node)) == []
    (node / f"{CPU}/cpu3/cpuidle/state3/disable").write_text("0\n")
    (node / f"{CPU}/cpu2/cpuidle/state1/disable").write_text("1\n")
    [deeper, shallower] = check_power(plan, str(node))
    assert (deeper["cpus"], shallower["cpus"]) == ("2", "3") or (shallower["cpus"], deeper["cpus"]) == ("2", "3")
    messages = " / ".join(f["message"] for f in (deeper, shallower))
    assert "CPU 3: may enter C6" in messages and "CPU 2: may not enter C1 (planned on)" in messages
    assert check_power({}, str(node)) == []


def test_a_cpu_offline_when_it_leaves_the_pool_gets_its_values_back_when_it_returns(node):
    sysfs = Facts(str(node))
    power.power_pass(planned(node, {"exclusive": {"governor": "performance"}}, exclusive=(2, 3)), sysfs)
    policy = node / f"{CPU}/cpufreq/policy3"
    hidden = node / "policy3-offline"
    policy.rename(hidden)  # CPU 3 offline: its policy's files are gone from sysfs
    config = planned(node, {"exclusive": {"governor": "performance"}}, exclusive=(2,))
    assert power.power_pass(config, sysfs)["writes"] == []
    saved = json.loads((node / power.SAVED.lstrip("/")).read_text())
    assert saved[f"{CPU}/cpu3/cpufreq/scaling_governor"] == "powersave"  # kept for its return
    hidden.rename(policy)
    back = power.power_pass(config, sysfs)
    assert [(w["path"], w["to"], w["status"]) for w in back["writes"]] == [
        (f"/{CPU}/cpu3/cpufreq/scaling_governor", "powersave", "restored")
    ]


@pytest.mark.parametrize(
    "saved",
    ["not json", '{"sys/devices/system/cpu/../../../etc/shadow": "x"}', '{"etc/passwd": "x"}', "[1]"],
)
def test_saved_values_that_cannot_be_trusted_set_nothing_and_the_tasks_still_move(node, saved):
    path = node / power.SAVED.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(saved)
    config = housekeep.parse_config(
        housekeep.render_config("2-3", "0-1", None, (), {"cpus": [{"cpus": "2", "governor": "performance"}]})
    )
    with pytest.raises(StateError):
        power.power_pass(config["power"], Facts(str(node)))
    proc = node / "proc-empty"
    (proc / "proc").mkdir(parents=True)
    result = housekeep.housekeep(config, Facts(str(proc)), Facts(str(node)), proc_fs=str(proc / "proc"))
    assert result["power"] == [] and "power settings not set" in result["problem"]
    assert read(node, f"{CPU}/cpu2/cpufreq/scaling_governor") == "powersave"
