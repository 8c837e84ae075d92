"""playbooks/verify.yml over a fleet of two sandbox nodes: every node is reported, then the bad one fails.

The nodes' facts roots are fixture trees (tests/fixtures/sysfs.py): the plan
play plans them, finds their kernel arguments written nowhere (a reboot is
pending) and the verify play reads what the trees show. node-bad's unbound
workqueues may run anywhere. One run, then the same in check mode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import REPO, tree_snapshot
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow
NODES = ("node-ok", "node-bad")


def fleet(tmp_path: Path) -> tuple[str, dict[str, Path]]:
    roots = {}
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for node in NODES:
        root = tmp_path / node
        write_tree(str(root), CORPUS["1s8c-smt2"])
        (root / "var/lib/node_exporter").mkdir(parents=True)
        roots[node] = root
        lines += [
            f"        {node}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_root: {root}",
        ]
    mask = roots["node-bad"] / "sys/devices/virtual/workqueue/cpumask"
    mask.parent.mkdir(parents=True)
    mask.write_text("ffff\n")
    lines += [
        "  vars:",
        "    cpupools_kernel_args_backend: grub",
        "    cpupools_num_exclusive_cores: 3",
        "    cpupools_num_shared_cores: 1",
        f"    cpupools_report_html: {tmp_path / 'report/verify.html'}",
        "    cpupools_metrics_dir: /var/lib/node_exporter",
        # Nothing is booted with the planned arguments here: only the workqueue check may fail a node.
        "    cpupools_verify_fail_on: [workqueue]",
    ]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    return str(inventory), roots


def changed_tasks(res) -> list[str]:
    return [t["task"]["name"] for t in res.tasks() if any(h.get("changed") for h in t["hosts"].values())]


def test_verify_reports_every_node_then_fails_the_bad_one(playbook, tmp_path):
    inventory, roots = fleet(tmp_path)
    before = {node: tree_snapshot(root) for node, root in roots.items()}

    # Under --tags verify, as an operator runs it from site-wide tags: the report role's tasks, tagged
    # report in the role, take the include's verify tag too (apply:).
    checked = playbook(
        REPO / "playbooks/verify.yml",
        {"cpupools_verify_latency": True},
        "--check",
        "--tags",
        "verify",
        inventory=inventory,
    )
    assert checked.rc != 0  # node-bad fails in check mode too: its checks only read
    assert changed_tasks(checked) == ["cpupools_report : Render the fleet report"]  # the page it would write
    would = checked.result("Verify that the isolated CPUs are quiet", "node-ok")
    assert would["latency"]["skipped"].startswith("check mode: would run "), would["latency"]
    assert {node: tree_snapshot(root) for node, root in roots.items()} == before  # no metrics written
    assert not (tmp_path / "report").exists()

    res = playbook(REPO / "playbooks/verify.yml", None, inventory=inventory)
    assert res.rc != 0
    message = res.messages()
    assert "host node-bad: verify failed: unbound workqueues may run on isolated CPU" in message
    assert "host node-ok: verify failed" not in message
    assert changed_tasks(res) == ["cpupools_report : Render the fleet report"]  # nothing on the nodes

    ok = res.result("Verify that the isolated CPUs are quiet", "node-ok")
    assert ok["ok"] is True and ok["reboot_pending"] is True
    assert ok["summary"].startswith("reboot pending; ")
    nohz = [f for f in ok["findings"] if f["check"] == "nohz" and f["severity"] == "fail"]
    assert nohz and all("(reboot pending: the running kernel predates the plan)" in f["message"] for f in nohz)

    # The report, rendered before the last play failed node-bad, has both nodes.
    report = json.loads((tmp_path / "report/verify.json").read_text())
    verdicts = {row["host"]: row["verify"]["ok"] for row in report["hosts"]}
    assert verdicts == {"node-ok": True, "node-bad": False}, verdicts
    assert "unbound workqueues may run on isolated CPU" in (tmp_path / "report/verify.html").read_text()

    # Each node's textfile, for node_exporter: what verify found, whatever fails the run. node-ok passes
    # cpupools_verify_fail_on, but its tick is not off yet (its nohz check fails until the reboot).
    for node in NODES:
        prom = (roots[node] / "var/lib/node_exporter/cpupools_verify.prom").read_text()
        assert "\ncpupools_verify_ok 0\n" in prom and "\ncpupools_reboot_pending 1\n" in prom, prom

    # With no check that fails a node, the run passes; the metric still says what was found.
    res = playbook(REPO / "playbooks/verify.yml", {"cpupools_verify_fail_on": []}, inventory=inventory)
    assert res.rc == 0, res.messages() or res.stdout[-3000:]
    assert res.result("Verify that the isolated CPUs are quiet", "node-bad")["ok"] is True
    prom = (roots["node-bad"] / "var/lib/node_exporter/cpupools_verify.prom").read_text()
    assert "\ncpupools_verify_ok 0\n" in prom, prom
    assert '\ncpupools_verify_findings{check="workqueue",severity="fail"} 1\n' in prom, prom

    # Verifying again finds the same: a read-only run, every node's recap changed=0, the page left as it is.
    page = tmp_path / "report/verify.html"
    stamps = (page.stat().st_mtime_ns, page.with_suffix(".json").stat().st_mtime_ns)
    res = playbook(REPO / "playbooks/verify.yml", {"cpupools_verify_fail_on": []}, inventory=inventory)
    assert res.rc == 0 and [res.changed(node) for node in NODES] == [0, 0], changed_tasks(res)
    assert (page.stat().st_mtime_ns, page.with_suffix(".json").stat().st_mtime_ns) == stamps
