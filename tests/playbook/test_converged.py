"""The converged check against the stages themselves (issue 14): one source of truth.

A fleet of one host per transition, each a kind of fixture shape (tests/fixtures/sysfs.py, FLEET), is set up
with site.yml. Each host then goes through one transition (a resize, changed
kernel arguments, an edited boot loader drop-in or irqbalance drop-in, a
removed unit, a changed cmk, an edited pool state, a changed file mode, or
none), and site.yml runs in check mode with the fast path off, so that every
stage predicts its own changes on every host. On every host, the stages the
cpupools_converged module names are exactly the stages that predict a change,
and exactly those the transition should touch. A real run with the fast path
on then leaves every host converged by the stages' own account.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from helpers import REPO, cache_tag, run_playbook
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

STAGE_PLAYS = {"Write the kernel arguments": "kernel", "Install the node agent and the pool state": "agent"}
#: The fleet: one host per transition, each on a kind of shape. The check's verdicts depend on what a
#: shape's files say (sibling numbering, holes, offline CPUs, SMT, NUMA without ids, CPU classes, an old
#: kernel, a CPU list the boot loader set), not on its size. Left out, to keep this, the suite's longest
#: test, within CI's time: the big servers of today (tests/planning/test_plan_modern.py works their plans
#: out by hand, tests/playbook/test_large_shapes.py takes four of them through site.yml twice, converged on
#: the second run), the plainer multi-socket shapes (2s22c, 4s6c, 2s6c-adjacent, 2s8c-2numa, 1s64c-nps4,
#: 2s32c-nps2, 2s24c-snc2), which the planning tests take, and since 2026-12-01 three shapes whose kind
#: another host here stands for (2s8c-nosmt: 1s16c-nosmt-boot; 1s4b4l-capacity and 2s8c-sstbf, CPU
#: classes: 1s6p8e-hybrid). The shape the plan refuses by design (SMT switched off at runtime) is
#: tests/planning's.
FLEET = (
    "1s8c-smt2",
    "1s8c-adjacent",
    "2s8c-coreid-holes",
    "2s8c-offline",
    "1s4c-smt4",
    "1s8c-oldkernel",
    "1s32c-nps4-noid",
    "1s6p8e-hybrid",
    "1s16c-nosmt-boot",
)


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "# edited by hand\n")


def _remove_cpulist(root: Path) -> None:
    lists = sorted((root / "etc/cmk/pools/exclusive").glob("*/*"))
    shutil.rmtree(lists[0])


#: transition -> (host variables, change to the node's files, stages that must run)
TRANSITIONS = {
    "none": ({}, None, set()),
    "resize": ({"cpupools_num_exclusive_cores": 1}, None, {"kernel", "agent"}),
    "kernel-args": ({"cpupools_nohz_full": "false"}, None, {"kernel"}),
    "grub-edited": ({}, lambda r: _edit(r / "etc/default/grub.d/99-cpupools.cfg"), {"kernel"}),
    "dropin-edited": (
        {},
        lambda r: _edit(r / "etc/systemd/system/irqbalance.service.d/50-cpupools.conf"),
        {"kernel"},
    ),
    "unit-removed": ({}, lambda r: (r / "etc/systemd/system/cpupools-reconcile.timer").unlink(), {"agent"}),
    "agent-changed": ({}, lambda r: (r / "opt/bin/cmk.pyz").open("ab").write(b"\0"), {"agent"}),
    "state-edited": ({}, _remove_cpulist, {"agent"}),
    "mode-changed": ({}, lambda r: os.chmod(r / "etc/cmk/cpupools.agent", 0o600), {"agent"}),
}


class Fleet:
    def __init__(self, base: Path, corpus_root: dict):
        self.base = base
        self.hosts = {name.replace("_", "-"): corpus_root[name] for name in FLEET}
        self.host_vars: dict[str, dict] = {host: {} for host in self.hosts}

    def root(self, host: str) -> Path:
        return self.base / "roots" / host

    def write_inventory(self) -> str:
        hosts = {}
        for host, facts in self.hosts.items():
            hosts[host] = {
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "cpupools_facts_root": facts,
                "cpupools_root": str(self.root(host)),
                **self.host_vars[host],
            }
        inventory = {
            "all": {
                "children": {"cpupools_nodes": {"hosts": hosts}},
                "vars": {
                    "cpupools_num_exclusive_cores": 2,
                    "cpupools_num_shared_cores": 1,
                    "cpupools_kernel_args_backend": "grub",
                    "cpupools_irqbalance_banned": True,
                    "cpupools_report_html": str(self.base / "report.html"),
                    "cpupools_report_print": False,
                },
            }
        }
        path = self.base / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory))
        return str(path)

    def run(self, *args: str):
        env_forks = {"ANSIBLE_FORKS": "4"}
        from helpers import ansible_env

        res = run_playbook(
            REPO / "site.yml", self.base, None, *args, inventory=self.write_inventory(), env=ansible_env(**env_forks)
        )
        assert res.rc == 0, res.stdout[-4000:] + res.stderr[-2000:]
        return res


def verdicts(res) -> dict[str, dict[str, list[str]]]:
    """host -> stage -> reasons, from the cpupools_converged task of the plan play."""
    out = {}
    for task in res.tasks():
        if task["task"]["name"] == "Plan the CPU pools":  # playbooks/plan.yml runs the role's tasks, not the role
            for host, result in task["hosts"].items():
                if not result.get("skipped"):  # a skipped result has no verdict
                    out[host] = result["stages"]
    return out


def changed_tasks(res) -> dict[str, list[str]]:
    """host -> the names of its changed tasks, in any play."""
    out: dict[str, list[str]] = defaultdict(list)
    for task in res.tasks():
        for host, result in task["hosts"].items():
            if result.get("changed"):
                out[host].append(task["task"]["name"])
    return out


def stage_results(res):
    """(stage, host, result) of every task result in the stage plays (handlers included)."""
    for play in res.data["plays"]:
        stage = STAGE_PLAYS.get(play["play"]["name"])
        for task in play["tasks"] if stage else ():
            for host, result in task["hosts"].items():
                yield stage, host, result


def predicted(res) -> dict[str, set[str]]:
    """host -> the stages with at least one changed task (handlers included)."""
    out: dict[str, set[str]] = defaultdict(set)
    for stage, host, result in stage_results(res):
        if result.get("changed"):
            out[host].add(stage)
    return out


def compare_all(fleet: Fleet, expected: dict[str, set[str]]) -> None:
    """Check mode with every stage running on every host: the verdicts must match the stages."""
    check = fleet.run("--check", "--diff", "-e", "cpupools_converged_check=false")
    said, did, names = verdicts(check), predicted(check), changed_tasks(check)
    assert set(said) == set(fleet.hosts)
    problems = []
    for host in fleet.hosts:
        named = {stage for stage, reasons in said[host].items() if reasons}
        if not named == did[host] == expected[host]:
            problems.append(
                f"{host}: check named {sorted(named)} {said[host]}, stages changed {sorted(did[host])} "
                f"{names[host]}, expected {sorted(expected[host])}"
            )
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("converged")
    corpus = {name: write_tree(str(base / "corpus" / name), CORPUS[name]) for name in FLEET}
    fleet = Fleet(base, corpus)
    first = fleet.run()
    assert first.changed(next(iter(fleet.hosts))) > 0
    return fleet


def test_every_shape_and_transition_agrees_with_the_stages(fleet):
    # Each host through one transition (on the "none" hosts, freshly converged), then check mode with
    # every stage running on every host: the check names exactly the stages that predict a change.
    names = list(TRANSITIONS)
    applied = {}
    expected = {}
    for i, host in enumerate(fleet.hosts):
        name = names[i % len(names)]
        variables, change, stages = TRANSITIONS[name]
        fleet.host_vars[host].update(variables)
        if change:
            change(fleet.root(host))
        applied[host], expected[host] = name, stages
    assert set(applied.values()) == set(names)
    compare_all(fleet, expected)

    # The fast path run repairs exactly those hosts, and each stage play runs on them alone: the plan play
    # groups the hosts with work (plugin_utils/stage_groups.py), the first host here being one without.
    real = fleet.run()
    ran = predicted(real)
    for host in fleet.hosts:
        assert ran[host] == expected[host], (host, applied[host], ran[host])
    assert expected[next(iter(fleet.hosts))] == set()
    for stage, hosts in stage_play_hosts(real).items():
        assert hosts == {host for host in fleet.hosts if stage in expected[host]}, stage
    # Then every host is converged by the stages' own account: every stage, run in check mode on every
    # shape, predicts no change, and the check says so. (This one run stands for the check of the freshly
    # converged fleet and the fast path re-run that were here before: the tags test below shows the
    # fast path skipping both stages on a converged host.)
    compare_all(fleet, {host: set() for host in fleet.hosts})


def stage_play_hosts(res) -> dict[str, set[str]]:
    """Stage -> the hosts its play ran any task on."""
    out: dict[str, set[str]] = {stage: set() for stage in STAGE_PLAYS.values()}
    for stage, host, _ in stage_results(res):
        out[stage].add(host)
    return out


def stage_tasks(res) -> dict[str, int]:
    """Stage play name -> number of task results in it."""
    return {
        STAGE_PLAYS[play["play"]["name"]]: sum(len(t["hosts"]) for t in play["tasks"])
        for play in res.data["plays"]
        if play["play"]["name"] in STAGE_PLAYS
    }


def test_tags_and_the_safety_valve_on_the_default_inventory(playbook, tmp_path):
    inventory = str(REPO / "inventories" / "local" / "hosts.yml")
    extra = {"cpupools_root": str(tmp_path / "sandbox"), "cpupools_report_html": str(tmp_path / "report.html")}

    def site(*args, **more):
        res = playbook(REPO / "site.yml", {**extra, **more}, *args, inventory=inventory)
        assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
        return res

    first = site()
    assert first.changed() > 0
    # Converged: the kernel and agent plays have no host, even when asked for by tag.
    quiet = site("--tags", "kernel,agent")
    assert stage_tasks(quiet) == {"kernel": 0, "agent": 0}
    assert quiet.result("Plan the CPU pools")["converged"] == ["kernel", "agent"]
    # One byte of the node's cmk.pyz changed: the agent stage puts the build back.
    pyz = tmp_path / "sandbox/opt/bin/cmk.pyz"
    good = pyz.read_bytes()
    pyz.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    repaired = site("--tags", "agent")
    plan = repaired.result("Plan the CPU pools")
    assert plan["stages"]["agent"] == ["cmk: /opt/bin/cmk.pyz differs from the build"]
    assert pyz.read_bytes() == good and repaired.changed() > 0
    # Drift under a tag: the tagged stage runs and repairs it; the other stage is left alone.
    dropin = tmp_path / "sandbox/etc/default/grub.d/99-cpupools.cfg"
    text = dropin.read_text()
    dropin.unlink()
    fixed = site("--tags", "kernel")
    reasons = fixed.result("Plan the CPU pools")["stages"]
    assert "kernel arguments: write /etc/default/grub.d/99-cpupools.cfg" in reasons["kernel"], reasons
    assert reasons["agent"] == [], reasons
    assert fixed.changed() > 0 and dropin.read_text() == text
    assert stage_tasks(fixed)["agent"] == 0
    # The safety valve runs every stage, and they change nothing.
    forced = site(cpupools_converged_check=False)
    counts = stage_tasks(forced)
    assert counts["kernel"] > 5 and counts["agent"] > 5, counts
    assert forced.changed() == 0
    # A controller that never built cmk (a fresh checkout, an AWX/AAP job's new container): the node's
    # copies are compared with the build made in memory; no stage runs and no build is written.
    fresh = tmp_path / "fresh-work-dir"
    elsewhere = site(cpupools_work_dir=str(fresh))
    assert elsewhere.result("Plan the CPU pools")["stages"] == {"kernel": [], "agent": []}
    assert stage_tasks(elsewhere) == {"kernel": 0, "agent": 0} and elsewhere.changed() == 0
    assert not (fresh / "build" / "agent").exists()
    # cpupools_agent_bytecode_pythons, as -e text: the build carries the bytecode of that Python's version (when
    # it is another than the controller's), the agent stage installs it once, and the re-run is converged.
    # Its own work directory: that build is not the checkout's, which test_bad_input holds unchanged meanwhile.
    node_python = "/usr/bin/python3"
    other = cache_tag(node_python)
    own = {"cpupools_work_dir": str(tmp_path / "bytecode-work-dir")}
    carried = site("-e", f"cpupools_agent_bytecode_pythons={node_python}", **own)
    reasons = carried.result("Plan the CPU pools")["stages"]["agent"]
    assert ("cmk: /opt/bin/cmk.pyz differs from the build" in reasons) is (other != sys.implementation.cache_tag)
    with zipfile.ZipFile(pyz) as zf:
        members = set(zf.namelist())
    assert f"cpupools-bytecode/{other}" in members and f"cpupools-bytecode/{sys.implementation.cache_tag}" in members
    again = site("-e", f"cpupools_agent_bytecode_pythons={node_python}", **own)
    assert stage_tasks(again) == {"kernel": 0, "agent": 0} and again.changed() == 0
