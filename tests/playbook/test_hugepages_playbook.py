"""Hugepages through the real plan and kernel plays, on a fixture node root.

The facts come from a 2-node fixture tree with hugepage files; the node root
is a fresh sandbox with a GRUB layout. Check mode first (nothing written,
the same tasks predicted), then the real run (kernel arguments, unit, script,
configuration), a re-run that changes nothing, a change of counts given as
``-e`` text, the unit's script run against a fixture, and uninstall.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, run_playbook, tree_snapshot
from sysfs import Spec, write_tree

pytestmark = pytest.mark.slow

PLAYBOOK = """
- name: Plan
  ansible.builtin.import_playbook: {repo}/playbooks/plan.yml
- name: Kernel
  ansible.builtin.import_playbook: {repo}/playbooks/kernel.yml
- name: Show what the report reads
  hosts: cpupools_nodes
  gather_facts: false
  roles:
    - role: cpupools  # the plan (cpupools_plan) is this role's default, read from the plan result
  tasks:
    - name: Show the hugepage facts and plan
      ansible.builtin.debug:
        msg:
          facts: "{{{{ ansible_facts.cpupools.hugepages }}}}"
          memory: "{{{{ ansible_facts.cpupools.memory }}}}"
          plan: "{{{{ cpupools_plan.hugepages }}}}"
"""
UNINSTALL = """
- name: Uninstall
  ansible.builtin.import_playbook: {repo}/playbooks/uninstall.yml
"""
DROPIN = "etc/default/grub.d/99-cpupools.cfg"
CONF = "etc/cpupools-hugepages.conf"
SCRIPT = "usr/local/sbin/cpupools-hugepages"
UNIT = "etc/systemd/system/cpupools-hugepages.service"
NODE_FILE = "/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/nr_hugepages"
GROUP_VARS = """\
cpupools_hugepages:
  - {size: 1G, count: 4}
  - {size: 2M, count: 512, numa_node: 0}
  - {size: 2M, count: 256, numa_node: 1}
cpupools_hugepages_default_size: 1G
"""


def setup(tmp_path: Path, group_vars: str = GROUP_VARS) -> tuple[Path, Path, Path]:
    facts = Path(write_tree(str(tmp_path / "facts"), Spec(sockets=2, cores_per_socket=4, threads=2)))
    sandbox = tmp_path / "sandbox"
    (sandbox / "etc/default/grub.d").mkdir(parents=True)
    (sandbox / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX="console=ttyS0"\n')
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "cpupools_nodes").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              children:
                cpupools_nodes:
                  hosts:
                    localhost:
                      ansible_connection: local
                      ansible_python_interpreter: "{{ ansible_playbook_python }}"
            """
        )
    )
    (inv / "group_vars" / "cpupools_nodes" / "main.yml").write_text(
        f"cpupools_facts_root: {facts}\n"
        f"cpupools_root: {sandbox}\n"
        "cpupools_kernel_args_backend: grub\n"
        "cpupools_num_exclusive_cores: 2\n"
        "cpupools_num_shared_cores: 1\n"
        "cpupools_agent_force: true\n" + group_vars
    )
    playbook = tmp_path / "hugepages.yml"
    playbook.write_text(PLAYBOOK.format(repo=REPO))
    (tmp_path / "uninstall.yml").write_text(UNINSTALL.format(repo=REPO))
    return inv / "hosts.yml", sandbox, facts


def run(tmp_path, inventory, name="hugepages.yml", *args):
    return run_playbook(tmp_path / name, tmp_path, None, *args, inventory=str(inventory))


def shown(res) -> dict:
    task = next(t for t in res.tasks() if t["task"]["name"] == "Show the hugepage facts and plan")
    return task["hosts"]["localhost"]["msg"]


def changed_tasks(res) -> list[str]:
    return sorted(t["task"]["name"] for t in res.tasks() if any(h.get("changed") for h in t["hosts"].values()))


def test_check_then_converge_then_nothing_changes(tmp_path):
    inventory, sandbox, facts = setup(tmp_path)
    before = tree_snapshot(sandbox)
    check = run(tmp_path, inventory, "hugepages.yml", "--check")
    assert check.rc == 0, check.stdout[-3000:]
    assert tree_snapshot(sandbox) == before

    res = run(tmp_path, inventory)
    assert res.rc == 0, res.stdout[-3000:]
    # Check mode predicted exactly the tasks the real run changed.
    assert changed_tasks(check) == changed_tasks(res)
    assert "cpupools_kernel : Write the hugepages configuration, script and unit" in changed_tasks(res)
    dropin = (sandbox / DROPIN).read_text()
    assert ' default_hugepagesz=1G hugepagesz=1G hugepages=4"' in dropin
    conf = (sandbox / CONF).read_text()
    assert [line for line in conf.splitlines() if not line.startswith("#")] == [
        f"512 {NODE_FILE.format(0)}",
        f"256 {NODE_FILE.format(1)}",
    ]
    unit = (sandbox / UNIT).read_text()
    assert "ExecStart=/usr/local/sbin/cpupools-hugepages /etc/cpupools-hugepages.conf" in unit
    assert "WantedBy=sysinit.target" in unit
    assert (sandbox / SCRIPT).stat().st_mode & 0o777 == 0o755
    # What the report reads: facts per node and size, MemTotal, planned pages.
    msg = shown(res)
    assert msg["facts"]["1"]["2M"] == {"total": 0, "free": 0}
    assert msg["memory"] == {"0": 16384 * 1024, "1": 16384 * 1024}
    assert msg["plan"]["planned"] == {"any": {"1G": 4}, "0": {"2M": 512}, "1": {"2M": 256}}
    exported = next(t for t in res.tasks() if "Export whether a reboot" in t["task"]["name"])
    pending = exported["hosts"]["localhost"]["ansible_facts"]["cpupools_pending_kernel_args"]
    assert {p["arg"] for p in pending} >= {"default_hugepagesz", "hugepagesz", "hugepages"}

    converged = tree_snapshot(sandbox)
    again = run(tmp_path, inventory)
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again)
    assert tree_snapshot(sandbox) == converged

    # New counts given as -e text (a string): the same meaning as the YAML list. The
    # node now runs a kernel that reads per-node counts (5.16+): 1G pages per node go
    # on the command line too, in the kernel's node format, and no longer to the unit.
    (facts / "proc/sys/kernel").mkdir(parents=True)
    (facts / "proc/sys/kernel/osrelease").write_text("6.1.0-18-amd64\n")
    more = run(tmp_path, inventory, "hugepages.yml", "-e", "cpupools_hugepages=1G:4:0,1G:2:1,2M:1024:0,2M:256:1")
    assert more.rc == 0, more.stdout[-3000:]
    assert ' default_hugepagesz=1G hugepagesz=1G hugepages=0:4,1:2"' in (sandbox / DROPIN).read_text()
    assert [line for line in (sandbox / CONF).read_text().splitlines() if not line.startswith("#")] == [
        f"1024 {NODE_FILE.format(0)}",
        f"256 {NODE_FILE.format(1)}",
    ]
    assert (sandbox / UNIT).read_text() == unit

    removed = run(tmp_path, inventory, "uninstall.yml")
    assert removed.rc == 0, removed.stdout[-3000:]
    for rel in (DROPIN, CONF, SCRIPT, UNIT):
        assert not (sandbox / rel).exists(), rel
    assert (sandbox / "etc/default/grub").read_text() == 'GRUB_CMDLINE_LINUX="console=ttyS0"\n'
    again = run(tmp_path, inventory, "uninstall.yml")
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again)


def test_dropping_the_runtime_pages_removes_the_unit_and_keeps_the_kernel_arguments(tmp_path):
    inventory, sandbox, _ = setup(tmp_path)
    assert run(tmp_path, inventory).rc == 0
    res = run(tmp_path, inventory, "hugepages.yml", "-e", "cpupools_hugepages=1G:4")
    assert res.rc == 0, res.stdout[-3000:]
    assert not (sandbox / CONF).exists() and not (sandbox / UNIT).exists() and not (sandbox / SCRIPT).exists()
    assert ' hugepagesz=1G hugepages=4"' in (sandbox / DROPIN).read_text()
    none = run(
        tmp_path, inventory, "hugepages.yml", "-e", "cpupools_hugepages=", "-e", "cpupools_hugepages_default_size="
    )
    assert none.rc == 0, none.stdout[-3000:]
    assert "hugepage" not in (sandbox / DROPIN).read_text()


def test_the_units_script_writes_every_count_and_fails_loudly_on_one_it_cannot(tmp_path):
    inventory, sandbox, facts = setup(tmp_path)
    assert run(tmp_path, inventory).rc == 0
    script, conf = str(sandbox / SCRIPT), str(sandbox / CONF)
    done = subprocess.run([script, conf, str(facts)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert Path(f"{facts}{NODE_FILE.format(0)}").read_text() == "512\n"
    assert Path(f"{facts}{NODE_FILE.format(1)}").read_text() == "256\n"
    # A file that cannot be written (here a directory in its place): the other
    # counts are still written, the failure is named, the exit status says so.
    target = Path(f"{facts}{NODE_FILE.format(0)}")
    target.unlink()
    target.mkdir()
    Path(f"{facts}{NODE_FILE.format(1)}").write_text("0\n")
    failed = subprocess.run([script, conf, str(facts)], capture_output=True, text=True, check=False)
    assert failed.returncode == 1
    assert failed.stderr == f"cpupools-hugepages: cannot write 512 to {NODE_FILE.format(0)}\n"
    assert Path(f"{facts}{NODE_FILE.format(1)}").read_text() == "256\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-e", "cpupools_hugepages=1G:15:0"],
            "host localhost: cpupools_hugepages: NUMA node 0 cannot hold the hugepages asked: 15 x 1G = "
            "15360 MiB asked, 14336 MiB available (MemTotal 16384 MiB less cpupools_hugepages_keep_free_mb 2048 MiB)",
        ),
        (["-e", "cpupools_hugepages=16M:4"], "host localhost: cpupools_hugepages: size 16M is not a page size"),
        (["-e", "cpupools_hugepages=2M:4:7"], "host localhost: cpupools_hugepages: size 2M: NUMA node 7 does not"),
        (
            ["-e", "cpupools_hugepages=1G:4", "-e", "grub_cmdline=hugepagesz=2M hugepages=512"],
            "host localhost: cpupools_hugepages: /etc/default/grub sets hugepagesz=2M, and the plan needs "
            "hugepagesz=1G. cpupools never edits that file: remove hugepagesz= from it (and give those pages in "
            "cpupools_hugepages). Nothing was written",
        ),
    ],
    ids=["memory-short", "unknown-size", "no-such-node", "operators-own-pair"],
)
def test_refused_in_the_plan_play_with_the_numbers_before_anything_is_written(tmp_path, args, message):
    inventory, sandbox, _ = setup(tmp_path, "cpupools_hugepages_keep_free_mb: 2048\n")
    if "-e" in args and args[-1].startswith("grub_cmdline="):
        (sandbox / "etc/default/grub").write_text(f'GRUB_CMDLINE_LINUX="{args[-1].split("=", 1)[1]}"\n')
        args = args[:-2]
    before = tree_snapshot(sandbox)
    res = run(tmp_path, inventory, "hugepages.yml", *args)
    assert res.rc != 0
    assert "Traceback" not in res.stdout + res.stderr
    assert [p["play"]["name"] for p in res.data["plays"]] == ["Find the cpupools nodes", "Plan the CPU pools"]
    msg = res.messages()
    assert message in msg, msg
    assert "\n" not in msg
    assert tree_snapshot(sandbox) == before
