"""``cmk housekeep`` (issue 41) on real processes: the built zipapp, as its unit runs it, in a PID namespace.

A PID namespace of its own with its own /proc (``unshare --pid --fork
--mount-proc``) shows the housekeeper only the processes started in it, so
the pass moves them and nothing else of the machine the tests run on; sysfs
is a fixture tree (``CPUPOOLS_SYSFS_ROOT``), so the workqueue masks it writes
are the fixture's, not the machine's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cpupools.core.cpulist import format_cpulist, parse_cpulist
from cpupools.node import housekeep

CPUS = sorted(os.sched_getaffinity(0))

#: Inside the namespace: an unpinned sleep, one pinned onto the isolated CPU by hand, one whose name the
#: configuration keeps; check mode, the pass, a second pass; each process's CPUs after each.
SCRIPT = r"""
set -e
sleep 300 & free=$!
taskset -c "$ISOLATED" sleep 300 & pinned=$!
"$KEEPME" 300 & kept=$!
cpus() { for p in $free $pinned $kept; do taskset -pc "$p" | sed 's/.*: //'; done | paste -sd' '; }
"$PYTHON" "$CMK.pyz" housekeep --config="$CONF" --check > "$OUT/check.json"
cpus > "$OUT/after-check"
"$PYTHON" "$CMK.pyz" housekeep --config="$CONF" > "$OUT/run.json" 2> "$OUT/run.err"
cpus > "$OUT/after-run"
"$PYTHON" "$CMK.pyz" housekeep --config="$CONF" > "$OUT/again.json"
kill $free $pinned $kept
"""


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], check=False).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to move a task between")
@pytest.mark.skipif(not shutil.which("taskset") or not _can_unshare(), reason="needs taskset and a PID namespace")
def test_the_zipapp_moves_what_nobody_pinned_and_nothing_else(cmk, tmp_path):
    keep, isolated = CPUS[0], CPUS[-1]
    sysfs = tmp_path / "sysfs"
    for rel, text in (
        ("sys/devices/system/cpu/online", format_cpulist(CPUS) + "\n"),
        ("sys/devices/virtual/workqueue/cpumask", "ffffffff\n"),
    ):
        (sysfs / rel).parent.mkdir(parents=True, exist_ok=True)
        (sysfs / rel).write_text(text)
    keepme = tmp_path / "keepme"  # a task's name (comm) is the name it was started by
    keepme.symlink_to(shutil.which("sleep") or "/bin/sleep")
    conf = tmp_path / "housekeep.conf"
    conf.write_text(housekeep.render_config(str(isolated), str(keep), None, ["keepme"]))
    out = tmp_path / "out"
    out.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "PYTHON": shutil.which("python3") or "/usr/bin/python3",
        "CMK": cmk,
        "CONF": str(conf),
        "OUT": str(out),
        "KEEPME": str(keepme),
        "ISOLATED": str(isolated),
        "CPUPOOLS_SYSFS_ROOT": str(sysfs),
    }
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    everywhere = format_cpulist(CPUS)

    def seen(name: str) -> list[str]:  # taskset -pc's lists, canonical
        return [format_cpulist(parse_cpulist(cpus)) for cpus in (out / name).read_text().split()]

    checked = json.loads((out / "check.json").read_text())
    assert seen("after-check") == [everywhere, str(isolated), everywhere]
    assert "sleep" in {m["comm"] for m in checked["moves"]}
    assert {m["status"] for m in checked["moves"]} == {"would move"}
    # The pass: the unpinned sleep (and the shell around it) to the housekeeping CPU; the pinned one and
    # the kept one stay; the workqueue mask of the fixture loses the isolated CPU.
    assert seen("after-run") == [str(keep), str(isolated), everywhere]
    ran = json.loads((out / "run.json").read_text())
    assert ran["moves"] and {m["status"] for m in ran["moves"]} == {"moved"}, ran["moves"]
    assert "keepme" not in {m["comm"] for m in ran["moves"]}
    assert (sysfs / "sys/devices/virtual/workqueue/cpumask").read_text() == f"{1 << keep:x}\n"
    assert (out / "run.err").read_text().startswith("cmk housekeep: ")
    # A second pass finds nothing left to move (what started since, the pass's own python, aside).
    again = json.loads((out / "again.json").read_text())
    assert [m for m in again["moves"] if m["comm"] not in ("python3", "cmk")] == [], again["moves"]
    assert again["workqueues"] == []


def test_a_configuration_cmk_cannot_use_is_status_78(cmk, tmp_path):
    missing = subprocess.run(
        [cmk, "housekeep", f"--config={tmp_path / 'none.conf'}"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 78 and "none.conf" in missing.stderr
    bad = tmp_path / "bad.conf"
    bad.write_text("isolated=1\n")
    refused = subprocess.run([cmk, "housekeep", f"--config={bad}"], capture_output=True, text=True, check=False)
    assert refused.returncode == 78 and "not a housekeeper configuration" in refused.stderr
    usage = subprocess.run([cmk, "housekeep", "--bogus"], capture_output=True, text=True, check=False)
    assert usage.returncode == 64


def test_the_zipapp_sets_the_power_of_a_pool_then_gives_it_back(cmk, tmp_path):
    """As the boot unit (--power-only) and the uninstall (--restore, first with --check) run it, on the
    fixtures' Intel server tree (CPUs 0-1: the CPUs of this machine, which the configuration must name)."""
    import dataclasses

    from cpupools.hardware import power
    from sysfs import CORPUS, write_tree

    root = write_tree(str(tmp_path / "node"), dataclasses.replace(CORPUS["2s8c-nosmt"], power="intel"))
    settings = power.to_settings({"exclusive": {"governor": "performance", "cstate_limit": "C1"}}, ("exclusive",))
    plan = power.plan_power(settings, power.read_power(root, range(16)), {"exclusive": [CPUS[-1]]}, "node")
    conf = tmp_path / "housekeep.conf"
    conf.write_text(housekeep.render_config(str(CPUS[-1]), str(CPUS[0]), None, (), plan))
    governor = Path(root, f"sys/devices/system/cpu/cpu{CPUS[-1]}/cpufreq/scaling_governor")
    env = {"PATH": os.environ["PATH"], "CPUPOOLS_SYSFS_ROOT": root}

    python = shutil.which("python3") or "/usr/bin/python3"

    def run(*args: str) -> dict:
        proc = subprocess.run(
            [python, "-IS", f"{cmk}.pyz", "housekeep", f"--config={conf}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    first = run("--power-only")
    assert {w["status"] for w in first["power"]} == {"written"} and len(first["power"]) == 3  # governor, C1E, C6 off
    assert first["moves"] == [] and governor.read_text().strip() == "performance"
    assert run("--power-only")["power"] == []
    assert {w["status"] for w in run("--restore", "--check")["power"]} == {"would restore"}
    assert governor.read_text().strip() == "performance"
    assert {w["status"] for w in run("--restore")["power"]} == {"restored"}
    assert governor.read_text().strip() == "powersave"
    assert not os.path.exists(os.path.join(root, "var/lib/cpupools/power-saved.json"))
