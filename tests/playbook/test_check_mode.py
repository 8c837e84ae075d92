"""Check mode predicts exactly, and writes nothing anywhere.

Each test runs ``site.yml`` (or ``uninstall.yml``) with ``--check --diff``,
then for real, from a fresh copy of the checkout, and asserts for every host:

* the check run wrote nothing: the node roots and the whole checkout (``build/``,
  ``sandbox/``, the report) are byte for byte and mtime for mtime as before,
  and no temporary directory is left on the controller;
* the tasks the check run reported as changed are exactly the tasks the real
  run then changed (same play, same task, same count; handlers included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from helpers import REPO, PlaybookResult, ansible_env, tree_snapshot
from k8s_fake import FakeKube, write_kubeconfig
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

HOSTS = ("localhost",)


class Checkout:
    """A fresh copy of the repository (tracked and new files, nothing git ignores), run from its root."""

    def __init__(self, tmp_path: Path, controller_tmp: Path) -> None:
        self.dir = tmp_path / "checkout"
        # The controller's TMPDIR: a short path of its own (ansible-core 2.21 cannot start under a TMPDIR
        # longer than 75 characters: docs/collection.md, "ansible-core 2.21 and a long TMPDIR").
        self.tmp = controller_tmp
        self.vars = tmp_path
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        for rel in filter(None, (name.decode() for name in listed)):
            src, dest = REPO / rel, self.dir / rel
            if src.is_symlink():  # the collection link collections/ansible_collections/cpupools/cpupools
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(os.readlink(src))
            elif src.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
        self.count = 0
        self.last_check: PlaybookResult | None = None

    def run(self, playbook: str, *args: str, inventory: Path | None = None, **extra) -> PlaybookResult:
        self.count += 1
        cmd = [str(Path(os.sys.executable).parent / "ansible-playbook"), playbook]
        if inventory is not None:
            cmd += ["-i", str(inventory)]
        if extra:
            vars_file = self.vars / f"vars-{self.count}.json"
            vars_file.write_text(json.dumps(extra))
            cmd += ["-e", f"@{vars_file}"]
        env = ansible_env(
            ANSIBLE_CONFIG=str(self.dir / "ansible.cfg"),
            TMPDIR=str(self.tmp),
            ANSIBLE_LOCAL_TEMP=str(self.vars / "ansible-local"),
        )
        proc = subprocess.run([*cmd, *args], cwd=self.dir, env=env, capture_output=True, text=True, check=False)
        data = json.loads(proc.stdout[proc.stdout.index("{") :]) if "{" in proc.stdout else None
        return PlaybookResult(proc.returncode, proc.stdout, proc.stderr, data)

    def snapshot(self, *extra_roots: Path) -> dict:
        snap = {"checkout": tree_snapshot(self.dir), "controller-tmp": sorted(os.listdir(self.tmp))}
        for root in extra_roots:
            snap[str(root)] = tree_snapshot(root) if root.exists() else None
        return snap


def changed_tasks(res: PlaybookResult, host: str) -> Counter:
    """``(play, task) -> count`` of the tasks (handlers included) that changed on ``host``."""
    out: Counter = Counter()
    for play in (res.data or {}).get("plays", []):
        for task in play.get("tasks", []):
            result = task["hosts"].get(host)
            if result and result.get("changed"):
                out[(play["play"]["name"], task["task"]["name"])] += 1
    return out


def check_then_apply(
    checkout: Checkout, playbook: str, *args: str, hosts=HOSTS, roots=(), inventory=None, after_check=None, **extra
) -> PlaybookResult:
    """``--check --diff`` then the real run; asserts the prediction was exact and the check wrote nothing.

    ``after_check`` is called between the two runs (to look at what else the check must not have written).
    """
    before = checkout.snapshot(*roots)
    check = checkout.run(playbook, "--check", "--diff", *args, inventory=inventory, **extra)
    assert check.rc == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert checkout.snapshot(*roots) == before, "check mode wrote something"
    if after_check is not None:
        after_check()
    checkout.last_check = check
    real = checkout.run(playbook, *args, inventory=inventory, **extra)
    assert real.rc == 0, real.stdout[-4000:] + real.stderr[-2000:]
    for host in hosts:
        predicted, happened = changed_tasks(check, host), changed_tasks(real, host)
        assert predicted == happened, (
            f"{host}: predicted but not changed: {sorted(predicted - happened)}; "
            f"changed but not predicted: {sorted(happened - predicted)}"
        )
        assert check.changed(host) == real.changed(host)
    return real


@pytest.fixture
def checkout(tmp_path):
    controller_tmp = Path(tempfile.mkdtemp(prefix="cpupools-ctl-", dir="/tmp"))
    try:
        yield Checkout(tmp_path, controller_tmp)
    finally:
        shutil.rmtree(controller_tmp, ignore_errors=True)


def sandbox(checkout: Checkout, host: str = "localhost") -> Path:
    return checkout.dir / "sandbox" / host


def test_fresh_rerun_resize_uninstall(checkout):
    # Fresh checkout, fresh node: no build/, no sandbox/.
    assert not (checkout.dir / "build").exists() and not (checkout.dir / "sandbox").exists()
    first = check_then_apply(checkout, "site.yml")
    assert first.changed() > 0
    # The check run built the agent in a temporary directory of the controller, and removed it.
    stage = checkout.last_check.result("Create a temporary directory for the check-mode build")["path"]
    assert stage.startswith(f"{checkout.tmp}/cpupools-agent-check-") and not Path(stage).exists()
    assert checkout.last_check.result("Build the cmk zipapp on the controller")["changed"] is True
    assert (checkout.dir / "build" / "agent" / "cmk.pyz").is_file()
    assert (sandbox(checkout) / "etc/default/grub.d/99-cpupools.cfg").is_file()
    assert (checkout.dir / "sandbox" / "report.html").is_file()

    rerun = check_then_apply(checkout, "site.yml")
    assert rerun.changed() == 0

    resized = check_then_apply(checkout, "site.yml", cpupools_num_exclusive_cores=6)
    assert resized.changed() > 0
    dropin = (sandbox(checkout) / "etc/default/grub.d/99-cpupools.cfg").read_text()
    assert resized.result("Write the kernel arguments into the boot loader configuration")["changed"] is True
    assert "isolcpus=" in dropin

    removed = check_then_apply(checkout, "playbooks/uninstall.yml", cpupools_num_exclusive_cores=6)
    assert removed.changed() > 0
    assert not (sandbox(checkout) / "etc/default/grub.d/99-cpupools.cfg").exists()
    assert not (sandbox(checkout) / "opt/bin/cmk").exists()


def test_fresh_node_with_a_boot_loader_tool_predicts_the_regeneration(checkout):
    """With update-grub on the node, check mode predicts the write and the handler's regeneration."""
    tool = sandbox(checkout) / "usr/sbin/update-grub"
    tool.parent.mkdir(parents=True)
    shutil.copy(REPO / "tests/fixtures/kargs/fake-update-grub", tool)
    (sandbox(checkout) / "etc/default").mkdir(parents=True)
    (sandbox(checkout) / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX="quiet"\n')
    real = check_then_apply(checkout, "site.yml", "--tags", "plan,kernel")
    assert real.result("Regenerate the boot loader configuration")["changed"] is True
    assert "isolcpus=managed_irq,domain," in (sandbox(checkout) / "boot/grub/grub.cfg").read_text()
    again = check_then_apply(checkout, "site.yml", "--tags", "plan,kernel")
    assert again.changed() == 0


def test_adopt_then_generate(checkout):
    topology = checkout.dir / "inventories/local/topology"
    cmdline = topology / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().rstrip("\n") + " isolcpus=1-5,23-27,45-49,67-71\n")
    adopted = check_then_apply(checkout, "site.yml", cpupools_isolcpus_source="adopt")
    assert adopted.changed() > 0
    generated = check_then_apply(checkout, "site.yml", cpupools_isolcpus_source="generate")
    assert generated.result("Write the kernel arguments into the boot loader configuration")["changed"] is True


def test_host_vars_exception(checkout):
    """Two nodes of one class, one with a host_vars exception: each host's prediction is exact."""
    inventory = checkout.dir / "inventories" / "twonodes"
    (inventory / "group_vars" / "cpupools_nodes").mkdir(parents=True)
    (inventory / "host_vars").mkdir()
    local = (checkout.dir / "inventories/local/group_vars/cpupools_nodes/main.yml").read_text()
    (inventory / "group_vars" / "cpupools_nodes" / "main.yml").write_text(
        local.replace("{{ inventory_dir }}/topology", "{{ inventory_dir }}/../local/topology")
    )
    (inventory / "hosts.yml").write_text(
        "all:\n  children:\n    cpupools_nodes:\n      hosts:\n"
        + "".join(
            f"        {name}:\n          ansible_connection: local\n"
            "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
            for name in ("node1", "node2")
        )
    )
    (inventory / "host_vars" / "node2.yml").write_text(
        "---\n# This one has fewer cores to spare.\ncpupools_num_exclusive_cores: 4\n"
    )
    hosts = ("node1", "node2")
    first = check_then_apply(checkout, "site.yml", hosts=hosts, inventory=inventory / "hosts.yml")
    assert first.changed("node1") > 0 and first.changed("node2") > 0
    one = (sandbox(checkout, "node1") / "etc/default/grub.d/99-cpupools.cfg").read_text()
    two = (sandbox(checkout, "node2") / "etc/default/grub.d/99-cpupools.cfg").read_text()
    assert one != two
    again = check_then_apply(checkout, "site.yml", hosts=hosts, inventory=inventory / "hosts.yml")
    assert again.changed("node1") == again.changed("node2") == 0


def test_a_mixed_fleet_whose_first_host_does_not_run_cmk(checkout, tmp_path):
    """Issue 25: once-per-play tasks run when any host needs them, not when the first host does.

    node-1 (first) runs CPU-Pooler, node-2 cmk, on one fake cluster. The agent
    stage's build used to run only if the first host ran cmk: in a fresh
    checkout (no build/) node-2's install failed, and check mode failed on the
    missing staging directory. Each host ends as its runtime wants it, check
    mode predicted each host's changes exactly and wrote nothing (node roots,
    checkout, cluster), and node-2, the cmk host, published the cluster's pod
    injection policy.
    """
    runtimes = {"node-1": "cpu-pooler", "node-2": "cmk"}
    roots = {node: tmp_path / "nodes" / node for node in runtimes}
    with FakeKube(token="tok") as kube:
        lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
        for node, runtime in runtimes.items():
            kube.add_node(node)
            facts = write_tree(str(tmp_path / "facts" / node), CORPUS["2s8c-2numa"])
            lines += [
                f"        {node}:",
                "          ansible_connection: local",
                "          ansible_python_interpreter: '{{ ansible_playbook_python }}'",
                f"          cpupools_facts_root: {facts}",
                f"          cpupools_root: {roots[node]}",
                f"          cpupools_k8s_node_name: {node}",
                f"          cpupools_runtime: {runtime}",
            ]
        lines += [
            "  vars:",
            "    cpupools_kernel_args_backend: grub",
            "    cpupools_isolated_pools: [exclusive]",
            f"    cpupools_k8s_kubeconfig: {write_kubeconfig(tmp_path / 'kubeconfig', kube.url, token='tok')}",
            f"    cpupools_report_html: {tmp_path / 'report.html'}",
        ]
        inventory = tmp_path / "hosts.yml"
        inventory.write_text("\n".join(lines) + "\n")
        assert not (checkout.dir / "build").exists()

        def nothing_written_to_the_cluster():
            assert kube.writes() == [], "check mode wrote to the cluster"

        real = check_then_apply(
            checkout,
            "site.yml",
            hosts=tuple(runtimes),
            roots=tuple(roots.values()),
            inventory=inventory,
            after_check=nothing_written_to_the_cluster,
        )
        for node, root in roots.items():
            cmk = runtimes[node] == "cmk"
            assert (root / "opt/bin/cmk").is_file() == cmk, node
            assert (root / "etc/cmk/pools").is_dir() == cmk, node
            assert ("cmk.intel.com/cmk-node" in kube.nodes[node]["metadata"]["labels"]) == cmk, node
            assert "isolcpus=" in (root / "etc/default/grub.d/99-cpupools.cfg").read_text(), node
        assert (checkout.dir / "build" / "agent" / "cmk.pyz").is_file()
        assert real.result("Publish or remove the pod injection policy", "node-2")["changed"] is True
        assert real.result("Publish or remove the pod injection policy", "node-1").get("skipped")
        assert ("mutatingadmissionpolicies", "cpupools-cmk-inject") in kube.admission
