"""Bad input of every kind, through the real site.yml: refused in the plan play, one line, nothing written.

Each case runs ``ansible-playbook site.yml`` on a one-host inventory whose
node root is a fresh sandbox and whose facts come from the bundled 2 x 22-core
SMT2 topology (or a broken copy of it), with the bad value given in the
inventory YAML, as JSON ``-e @file`` (types kept) or as ``-e key=value`` (a
string). It asserts, for each:

* the run fails, in the plan play, and no later play starts;
* exactly one task failed, with a one-line message that starts with
  ``host localhost: <the variable>:`` and says what is wrong with the value;
* no Python traceback anywhere in the output;
* nothing changed on the node root (the sandbox), beside it (the report), or
  in the controller's checkout (build/, sandbox/, reports/).

A value given with ``-e`` applies to every host of a run, so each of those
cases needs an ``ansible-playbook`` run of its own. The cases whose bad value
is in the inventory, or in the node's or facts' files, are per host: they run
together, one host each, in one run (the plan play refuses them all in its
one module task, each host with its own message; ``any_errors_fatal`` stops
the run after that task).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cpupools.core.cpulist import parse_cpulist
from helpers import REPO, run_playbook, tree_snapshot, wait_for
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

TOPOLOGY = REPO / "inventories" / "local" / "topology"
CHECKOUT_DIRS = ("build", "sandbox", "reports")


@dataclass
class Case:
    id: str
    variable: str
    message: str
    yaml: str = ""  # group_vars text added to the inventory
    json: dict = field(default_factory=dict)  # -e @file.json (YAML/JSON types)
    cli: tuple[str, ...] = ()  # -e key=value (strings, as an operator types them)
    prepare: str = ""  # name of a setup in PREPARE

    @property
    def early(self) -> bool:
        """The whole-inventory check refuses it on the controller, in the first play (no node needed)."""
        from cpupools.planning.inputs import check_inventory

        sys.path.insert(0, str(REPO / "collections"))
        from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import controller_refusal

        values = dict(yaml.safe_load(self.yaml) or {}) if self.yaml else {}
        values.update(self.json)
        values.update(pair.split("=", 1) for pair in self.cli)
        return bool(check_inventory([("localhost", values)], controller=controller_refusal)[1])

    @property
    def per_host(self) -> bool:
        """Nothing on the command line: the case can be one host among others in a run."""
        return not self.json and not self.cli


CASES = [
    # sizes
    Case(
        "too-many-cores",
        "cpupools_num_exclusive_cores",
        "60 exclusive cores + 1 shared core requested, 42 available after 1 infra core per NUMA node (auto)",
        json={"cpupools_num_exclusive_cores": 60},
    ),
    # A count no host has is refused by the plan, which says what this host can give, from YAML and from -e alike.
    Case(
        "count-beyond-any-host",
        "cpupools_num_exclusive_cores",
        "100000000000000000000 exclusive cores + 1 shared core requested, 42 available after 1 infra core per "
        "NUMA node (auto)",
        yaml="cpupools_num_exclusive_cores: 100000000000000000000\n",
    ),
    Case(
        "count-beyond-any-host-from-e",
        "cpupools_num_exclusive_cores",
        "100000000000000000000 exclusive cores + 1 shared core requested, 42 available after 1 infra core per "
        "NUMA node (auto)",
        cli=("cpupools_num_exclusive_cores=100000000000000000000",),
    ),
    Case(
        "count-below-minus-one",
        "cpupools_num_shared_cores",
        "-2 is below -1; give a number of cores, or -1 for all remaining",
        json={"cpupools_num_shared_cores": -2},
    ),
    Case(
        "both-minus-one",
        "cpupools_num_exclusive_cores",
        "num_exclusive_cores and num_shared_cores are both -1",
        json={"cpupools_num_exclusive_cores": -1, "cpupools_num_shared_cores": -1},
    ),
    Case(
        "infra-too-many",
        "cpupools_infra_cores",
        "30 infra cores requested on NUMA node 0, which has only 22 cores",
        cli=("cpupools_infra_cores=30",),
    ),
    # types
    Case(
        "float-count",
        "cpupools_num_exclusive_cores",
        "1.5 is not an integer",
        json={"cpupools_num_exclusive_cores": 1.5},
    ),
    Case("bool-count", "cpupools_num_shared_cores", "True is not an integer", json={"cpupools_num_shared_cores": True}),
    Case(
        "float-infra",
        "cpupools_infra_cores",
        "1.5 is neither auto, a number of cores per NUMA node nor a cpulist",
        json={"cpupools_infra_cores": 1.5},
    ),
    Case("list-as-count", "cpupools_lock_timeout", "[30] is not an integer", json={"cpupools_lock_timeout": [30]}),
    Case("bool-as-str", "cpupools_report_title", "False is not a string", json={"cpupools_report_title": False}),
    # strings from -e
    Case(
        "double-minus",
        "cpupools_num_exclusive_cores",
        "'--4' is not an integer",
        cli=("cpupools_num_exclusive_cores=--4",),
    ),
    Case(
        "superscript-digit",
        "cpupools_num_exclusive_cores",
        "'²' is not an integer",
        cli=("cpupools_num_exclusive_cores=²",),
    ),
    Case("empty-from-e", "cpupools_num_shared_cores", "'' is not an integer", cli=("cpupools_num_shared_cores=",)),
    Case(
        "interval-word",
        "cpupools_reconcile_interval",
        "'soon' is not an integer",
        cli=("cpupools_reconcile_interval=soon",),
    ),
    Case("interval-zero", "cpupools_reconcile_interval", "0 is below 1", cli=("cpupools_reconcile_interval=0",)),
    # the housekeeper (one host each in the fleet run: group_vars)
    Case(
        "housekeep-word", "cpupools_housekeep", "'sometimes' is not a boolean", yaml="cpupools_housekeep: sometimes\n"
    ),
    Case(
        "housekeep-interval-short",
        "cpupools_housekeep_interval",
        "5 is below 10",
        yaml="cpupools_housekeep_interval: 5\n",
    ),
    Case(
        "housekeep-keep-text",
        "cpupools_housekeep_keep",
        "'ptp4l,phc2sys' is not a list of arguments",
        yaml="cpupools_housekeep_keep: ptp4l,phc2sys\n",
    ),
    Case(
        "housekeep-keep-regex",
        "cpupools_housekeep_keep",
        "'ptp4l(' is not a regular expression",
        yaml="cpupools_housekeep_keep: ['ptp4l(']\n",
    ),
    Case(
        "bool-word",
        "cpupools_k8s_taint",
        "'maybe' is not a boolean; give true or false",
        cli=("cpupools_k8s_taint=maybe",),
    ),
    Case(
        "huge-number",
        "cpupools_num_exclusive_cores",
        "is not an integer",
        cli=("cpupools_num_exclusive_cores=" + "9" * 5000,),
    ),
    Case(
        "infra-count-from-e-isolates-nothing-of-cpu0",
        "cpupools_infra_cores",
        "0 infra cores per NUMA node; at least 1 is needed",
        cli=("cpupools_infra_cores=0",),
    ),
    # nulls and empties
    Case(
        "null-in-inventory",
        "cpupools_num_exclusive_cores",
        "is empty (null); give a value or remove the line to use the default",
        yaml="cpupools_num_exclusive_cores:\n",
    ),
    Case("null-from-json", "cpupools_agent_path", "is empty (null)", json={"cpupools_agent_path": None}),
    Case("empty-root", "cpupools_root", "'' is empty", json={"cpupools_root": ""}),
    Case("empty-title", "cpupools_report_title", "'' is empty", json={"cpupools_report_title": ""}),
    # the controller's work directory (cpupools_work_dir), created by the plan play before any stage writes
    Case(
        "work-dir-relative", "cpupools_work_dir", "'cache' is not an absolute path", yaml="cpupools_work_dir: cache\n"
    ),
    Case(
        "work-dir-file-in-the-way",
        "cpupools_work_dir",
        "'/proc/version/cpupools' is not a directory (/proc/version is in its way) on the controller",
        yaml="cpupools_work_dir: /proc/version/cpupools\n",
    ),
    # modes and choices
    Case(
        "vertical",
        "cpupools_exclusive_mode",
        "'vertical' is not one of packed, spread",
        yaml="cpupools_exclusive_mode: vertical\n",
    ),
    Case(
        "source",
        "cpupools_isolcpus_source",
        "'guess' is not one of generate, adopt",
        cli=("cpupools_isolcpus_source=guess",),
    ),
    Case("state", "cpupools_state", "'gone' is not one of present, absent", cli=("cpupools_state=gone",)),
    Case(
        "isolated-infra",
        "cpupools_isolated_pools",
        "'infra' is not one of exclusive, shared",
        json={"cpupools_isolated_pools": ["exclusive", "infra"]},
    ),
    Case(
        "backend",
        "cpupools_kernel_args_backend",
        "'lilo' is not one of auto, grub, grubby, kernel-install",
        cli=("cpupools_kernel_args_backend=lilo",),
    ),
    Case(
        "isolcpus-flag",
        "cpupools_isolcpus_flags",
        "'nohz_full' is not one of nohz, domain, managed_irq",
        json={"cpupools_isolcpus_flags": ["domain", "nohz_full"]},
    ),
    # cpulists
    Case(
        "cpulist-four-billion",  # beyond any node: refused on the controller, before the node's count is known
        "cpupools_excl_non_isolcpus",
        "item 1 '0-4000000000': CPU 4000000000 is beyond the last possible CPU 65535",
        cli=("cpupools_excl_non_isolcpus=0-4000000000",),
    ),
    Case(
        "cpulist-beyond-the-node",  # beyond this node only: refused by the plan play, with the node's number
        "cpupools_excl_non_isolcpus",
        "item 1 '0-100': CPU 100 is beyond the last possible CPU 87",
        cli=("cpupools_excl_non_isolcpus=0-100",),
    ),
    Case(
        "cpulist-open-range",
        "cpupools_excl_non_isolcpus",
        "item 1 '1-': '' is not a CPU number",
        json={"cpupools_excl_non_isolcpus": "1-"},
    ),
    Case(
        "cpulist-split-core",
        "cpupools_excl_non_isolcpus",
        "6 splits core 6,50",
        json={"cpupools_excl_non_isolcpus": "6"},
    ),
    Case(
        "infra-leaves-cpu0",
        "cpupools_infra_cores",
        "2-3,46-47 leaves the core of CPU 0 (0,44) to an isolated pool",
        json={"cpupools_infra_cores": "2-3,46-47", "cpupools_num_exclusive_cores": -1},
    ),
    # roots
    Case("relative-root", "cpupools_root", "'sandbox' is not an absolute path", cli=("cpupools_root=sandbox",)),
    Case("root-is-a-file", "cpupools_root", "is not a directory", prepare="root_is_a_file"),
    Case("root-under-a-file", "cpupools_root", "is in its way)", prepare="root_under_a_file"),
    Case(
        "facts-root-missing",
        "cpupools_facts_root",
        "no such directory",
        json={"cpupools_facts_root": "/nonexistent/topology"},
    ),
    Case("facts-root-empty", "cpupools_facts_root", "'' is empty", json={"cpupools_facts_root": ""}),
    Case(
        "relative-conf-dir",
        "cpupools_conf_dir",
        "'etc/cmk' is not an absolute path",
        cli=("cpupools_conf_dir=etc/cmk",),
    ),
    # inconsistent sysfs fixtures
    Case(
        "sysfs-siblings-disagree",
        "cpupools_facts_root",
        "cpu1 and cpu9 disagree on their siblings",
        prepare="siblings_disagree",
    ),
    Case(
        "sysfs-huge-siblings",
        "cpupools_facts_root",
        "CPU 4000000000 is beyond the last possible CPU 15",
        prepare="huge_siblings",
    ),
    Case("sysfs-no-cpus", "cpupools_facts_root", "has no sys/devices/system/cpu directory", prepare="empty_facts_root"),
    # a foreign drop-in: the kernel stage would refuse, the plan play refuses first
    Case(
        "foreign-grub-dropin", "cpupools_isolcpus_flags", "50-foreign.cfg sets isolcpus=1-3", prepare="foreign_dropin"
    ),
    Case(
        "dropin-name",
        "cpupools_grub_dropin_name",
        "'../evil' is not a file name",
        cli=("cpupools_grub_dropin_name=../evil",),
    ),
    # agent knobs
    Case(
        "unknown-task-group",
        "cpupools_task_group",
        "group 'no-such-group' does not exist on the node",
        cli=("cpupools_task_group=no-such-group",),
    ),
    Case(
        "shebang",
        "cpupools_agent_shebang",
        "'python3' is not an interpreter line",
        cli=("cpupools_agent_shebang=python3",),
    ),
    Case(
        "metrics-relative",
        "cpupools_metrics_dir",
        "'metrics' is not an absolute path",
        cli=("cpupools_metrics_dir=metrics",),
    ),
    # Kubernetes knobs
    Case(
        "labels-as-list",
        "cpupools_k8s_labels",
        "['rt'] is not a mapping of label name to value",
        json={"cpupools_k8s_labels": ["rt"]},
    ),
    Case(
        "label-value",
        "cpupools_k8s_labels",
        "label team: value 'a b' is not a valid Kubernetes label value",
        json={"cpupools_k8s_labels": {"team": "a b"}},
    ),
    Case(
        "resource-name",
        "cpupools_k8s_exclusive_resource",
        "'exclusive-cores' is not an extended resource name",
        cli=("cpupools_k8s_exclusive_resource=exclusive-cores",),
    ),
    Case(
        "kubeconfig-missing",  # a path on the controller: checked by the plan module's action, not on the node
        "cpupools_k8s_kubeconfig",
        "kubeconfig /nonexistent/kubeconfig does not exist or is not a file on the controller",
        cli=("cpupools_k8s_kubeconfig=/nonexistent/kubeconfig",),
    ),
    Case(
        "bytecode-python-missing",  # a program on the controller: checked by the plan module's action too
        "cpupools_agent_bytecode_pythons",
        "/nonexistent/python3 is not a program on the controller",
        cli=("cpupools_agent_bytecode_pythons=/usr/bin/python3,/nonexistent/python3",),
    ),
    Case(
        "bytecode-python-relative",
        "cpupools_agent_bytecode_pythons",
        "'python3.11' is not an absolute path",
        json={"cpupools_agent_bytecode_pythons": ["python3.11"]},
    ),
    Case(
        "poll-nan",
        "cpupools_k8s_drain_poll_interval",
        "'nan' is not a number of seconds",
        cli=("cpupools_k8s_drain_poll_interval=nan",),
    ),
    # report knobs
    Case("report-print", "cpupools_report_print", "'loud' is not a boolean", cli=("cpupools_report_print=loud",)),
    Case(
        "cpuaffinity-not-auto-or-bool",
        "cpupools_systemd_cpuaffinity",
        "'sometimes' is not auto or a boolean; give auto, true or false",
        cli=("cpupools_systemd_cpuaffinity=sometimes",),
    ),
    Case(
        "report-html-relative",
        "cpupools_report_html",
        "'report.html' is not an absolute path",
        cli=("cpupools_report_html=report.html",),
    ),
    # runtimes (docs/runtimes.md): an unknown one, and a layout the chosen runtime cannot express
    Case(
        "runtime-unknown", "cpupools_runtime", "'cri-rm' is not one of cmk, kubelet", cli=("cpupools_runtime=cri-rm",)
    ),
    Case(
        "runtime-cannot-express",
        "cpupools_isolated_pools",
        "nri-topology-aware hands isolated CPUs out only exclusively, so the isolated shared pool",
        cli=("cpupools_runtime=nri-topology-aware", "cpupools_isolated_pools=exclusive,shared"),
    ),
    # reboot knobs
    Case(
        "simulate-as-string",
        "cpupools_reboot_simulate_command",
        "'true' is not a list of arguments",
        json={"cpupools_reboot_simulate_command": "true"},
    ),
]


def _root_is_a_file(tmp_path: Path) -> dict:
    (tmp_path / "rootfile").write_text("not a directory\n")
    return {"cpupools_root": str(tmp_path / "rootfile")}


def _root_under_a_file(tmp_path: Path) -> dict:
    (tmp_path / "rootfile").write_text("not a directory\n")
    return {"cpupools_root": str(tmp_path / "rootfile" / "sandbox")}


def _siblings_disagree(tmp_path: Path) -> dict:
    root = write_tree(str(tmp_path / "facts"), CORPUS["2s8c-nosmt"])
    Path(root, "sys/devices/system/cpu/cpu1/topology/thread_siblings_list").write_text("1,9\n")
    return {"cpupools_facts_root": root}


def _huge_siblings(tmp_path: Path) -> dict:
    root = write_tree(str(tmp_path / "facts"), CORPUS["2s8c-nosmt"])
    Path(root, "sys/devices/system/cpu/cpu1/topology/thread_siblings_list").write_text("1-4000000000\n")
    return {"cpupools_facts_root": root}


def _empty_facts_root(tmp_path: Path) -> dict:
    (tmp_path / "facts").mkdir()
    return {"cpupools_facts_root": str(tmp_path / "facts")}


def _foreign_dropin(tmp_path: Path) -> dict:
    grub_d = tmp_path / "sandbox" / "etc" / "default" / "grub.d"
    grub_d.mkdir(parents=True)
    (grub_d / "50-foreign.cfg").write_text('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX isolcpus=1-3"\n')
    return {}


PREPARE = {
    "root_is_a_file": _root_is_a_file,
    "root_under_a_file": _root_under_a_file,
    "siblings_disagree": _siblings_disagree,
    "huge_siblings": _huge_siblings,
    "empty_facts_root": _empty_facts_root,
    "foreign_dropin": _foreign_dropin,
}


def write_inventory(tmp_path: Path, text: str = "") -> Path:
    """A one-host inventory like the embedded one, rooted in ``tmp_path``."""
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "cpupools_nodes").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            ---
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
    base = textwrap.dedent(
        f"""\
        ---
        cpupools_facts_root: {TOPOLOGY}
        cpupools_root: {tmp_path / "sandbox"}
        cpupools_report_html: {tmp_path / "report.html"}
        cpupools_kernel_args_backend: grub
        cpupools_num_exclusive_cores: 8
        cpupools_num_shared_cores: 1
        """
    )
    (inv / "group_vars" / "cpupools_nodes" / "main.yml").write_text(base + text)
    return inv / "hosts.yml"


#: The controller's digest store (plugin_utils/digest_store.py): content-addressed files any good run beside
#: this one adds (the tests run in parallel), and each host's record of what its last slim result named, which a
#: good run beside this one rewrites for its own ``localhost``; a refused host's result names nothing and stores
#: nothing (test_bad_input_of_each_host_is_refused_for_that_host_before_anything_is_written).
STORES = ("build/topology/", "build/plan/", "build/hosts/")


def checkout_snapshot() -> dict:
    return {
        name: (
            (REPO / name).exists(),
            {k: v for k, v in tree_snapshot(REPO / name).items() if not f"{name}/{k}".startswith(STORES)},
        )
        for name in CHECKOUT_DIRS
    }


@pytest.fixture(scope="module")
def built_agent():
    """Build the agent as the role would, so a concurrent good run never writes build/ meanwhile."""
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "build_agent.py"),
            "--shebang=/bin/sh",
            str(REPO / "build/agent/cmk"),
        ],
        check=True,
        capture_output=True,
    )


#: The plays a refused run starts: what needs no node is refused on the controller by the first
#: play's whole-inventory check (docs/awx.md), the rest by the plan play, on the node.
EARLY = ["Find the cpupools nodes"]
LATE = ["Find the cpupools nodes", "Plan the CPU pools"]


def assert_refused_in_plan_play(res, variable: str, message: str, early: bool = False) -> str:
    output = res.stdout + res.stderr
    assert res.rc != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    plays = [play["play"]["name"] for play in (res.data or {}).get("plays", [])]
    assert plays == (EARLY if early else LATE), plays
    failed = [
        str(result.get("msg")) for task in res.tasks() for result in task["hosts"].values() if result.get("failed")
    ]
    assert len(failed) == 1, failed
    msg = failed[0]
    assert "\n" not in msg, msg
    assert msg.startswith(f"host localhost: {variable}: "), msg
    assert message in msg, msg
    return msg


@pytest.mark.parametrize("case", [case for case in CASES if not case.per_host], ids=lambda c: c.id)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, built_agent, case):
    inventory = write_inventory(tmp_path, case.yaml)
    extra = dict(case.json)
    if case.prepare:
        extra.update(PREPARE[case.prepare](tmp_path))
    args = [arg for pair in case.cli for arg in ("-e", pair)]
    node_before = tree_snapshot(tmp_path)
    checkout_before = checkout_snapshot()
    res = run_playbook(REPO / "site.yml", tmp_path, extra or None, *args, inventory=str(inventory))
    assert_refused_in_plan_play(res, case.variable, case.message, case.early)
    # The extra-vars file is the only new file, and it was written before the run.
    after = {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith("extra-vars-")}
    assert after == {k: v for k, v in node_before.items() if not k.startswith("extra-vars-")}
    assert not (tmp_path / "report.html").exists()
    assert checkout_snapshot() == checkout_before


def write_fleet_inventory(tmp_path: Path, cases: list[Case]) -> Path:
    """One host per case, named by its id, in a group of its own whose group_vars hold the case.

    Each host has its own node root (``<id>/sandbox``); the fleet has one report.
    """
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    groups = {}
    for case in cases:
        group = "case_" + case.id.replace("-", "_")
        groups[group] = {"hosts": {case.id: {"ansible_connection": "local"}}}
        home = tmp_path / case.id
        home.mkdir()
        prepared = PREPARE[case.prepare](home) if case.prepare else {}
        base = {
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "cpupools_facts_root": str(TOPOLOGY),
            "cpupools_root": str(home / "sandbox"),
            "cpupools_report_html": str(tmp_path / "report.html"),
            "cpupools_kernel_args_backend": "grub",
            "cpupools_num_exclusive_cores": 8,
            "cpupools_num_shared_cores": 1,
            **prepared,
        }
        (inv / "group_vars" / f"{group}.yml").write_text(yaml.safe_dump(base) + case.yaml)
    hosts = {"all": {"children": {"cpupools_nodes": {"children": groups}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv / "hosts.yml"


def test_bad_input_of_each_host_is_refused_for_that_host_before_anything_is_written(tmp_path, built_agent):
    cases = [case for case in CASES if case.per_host]
    assert len(cases) > 1 and len({case.id for case in cases}) == len(cases)
    early = [case for case in cases if case.early]
    late = [case for case in cases if not case.early]
    assert early and len(late) > 1, (early, late)
    # All of them in one run: the whole-inventory check refuses every host with a value bad on any
    # node, in one message, in the first play, and no host is planned.
    inventory = write_fleet_inventory(tmp_path / "all", cases)
    before = tree_snapshot(tmp_path)
    checkout_before = checkout_snapshot()
    res = run_playbook(REPO / "site.yml", tmp_path, None, inventory=str(inventory))
    output = res.stdout + res.stderr
    assert res.rc != 0 and "Traceback" not in output, output[-3000:]
    plays = [play["play"]["name"] for play in (res.data or {}).get("plays", [])]
    assert plays == EARLY, plays
    msg = res.messages()
    assert "\n" not in msg, msg
    assert msg.startswith("host "), msg
    for case in early:
        assert f"host {case.id}: {case.variable}: " in msg and case.message in msg, (case.id, msg)
    for case in late:
        assert f"host {case.id}:" not in msg, (case.id, msg)
    assert tree_snapshot(tmp_path) == before
    # Those only a node can refuse, in one run: the plan play refuses each host with its own message.
    inventory = write_fleet_inventory(tmp_path / "late", late)
    before = tree_snapshot(tmp_path)
    res = run_playbook(REPO / "site.yml", tmp_path, None, inventory=str(inventory))
    output = res.stdout + res.stderr
    assert res.rc != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    plays = [play["play"]["name"] for play in (res.data or {}).get("plays", [])]
    assert plays == LATE, plays
    failed: dict[str, list[str]] = {}
    for task in res.tasks():
        for host, result in task["hosts"].items():
            if result.get("failed"):
                failed.setdefault(host, []).append(str(result.get("msg")))
    # Every host refused, once, with its own one-line message and no other's.
    assert sorted(failed) == sorted(case.id for case in late), failed
    for case in late:
        assert len(failed[case.id]) == 1, (case.id, failed[case.id])
        msg = failed[case.id][0]
        assert "\n" not in msg, msg
        assert msg.startswith(f"host {case.id}: {case.variable}: "), msg
        assert case.message in msg, msg
    assert tree_snapshot(tmp_path) == before
    assert not list(tmp_path.rglob("report.html"))
    assert checkout_snapshot() == checkout_before
    # Hosts no other test names: no record of what a slim result named (build/hosts/), which the
    # snapshot leaves out because good runs beside this one rewrite localhost's.
    records = [REPO / "build" / "hosts" / f"{hashlib.sha256(case.id.encode()).hexdigest()}.json" for case in cases]
    assert not [record for record in records if record.exists()], records


def test_unknown_variables_are_warned_about_with_the_closest_name(tmp_path, built_agent):
    inventory = write_inventory(tmp_path, "cpupools_num_exclusive_core: 3\ncpupools_isolated_pool: [exclusive]\n")
    res = run_playbook(
        REPO / "site.yml",
        tmp_path,
        None,
        "--tags",
        "plan",
        "-e",
        "cpupools_num_exclusive_cores=",
        inventory=str(inventory),
    )
    # The misspelt names are warned about first, then the empty value is refused, on the controller
    # (the whole-inventory check warns as the plan play would: that play does not run).
    output = res.stdout + res.stderr
    assert (
        "host localhost: cpupools_num_exclusive_core is not a cpupools variable "
        "(did you mean cpupools_num_exclusive_cores?); it is ignored" in output
    )
    assert (
        "host localhost: cpupools_isolated_pool is not a cpupools variable "
        "(did you mean cpupools_isolated_pools?); it is ignored" in output
    )
    assert_refused_in_plan_play(res, "cpupools_num_exclusive_cores", "'' is not an integer", early=True)


def test_count_from_e_means_cores_per_socket(tmp_path):
    """'-e cpupools_infra_cores=2' is two infra cores per socket, as 2 in YAML is; CPU 0 stays infra."""
    inventory = write_inventory(tmp_path)
    plans = []
    for args in (("-e", "cpupools_infra_cores=2"), ("-e", '{"cpupools_infra_cores": 2}')):
        res = run_playbook(REPO / "site.yml", tmp_path, None, "--tags", "plan", *args, inventory=str(inventory))
        assert res.rc == 0, res.stdout[-3000:]
        # The first play plans; the report play's plan role is skipped (the plan is there).
        planned = [t["hosts"]["localhost"]["plan"] for t in res.tasks() if "plan" in t["hosts"].get("localhost", {})]
        plans.append(planned[0])
    assert plans[0] == plans[1]
    infra = parse_cpulist(plans[0]["pool_cpus"]["infra"])
    assert {0, 1, 44, 45, 22, 23, 66, 67} <= set(infra)  # the first 2 cores of each socket
    assert 0 not in parse_cpulist(plans[0]["isolated_cpus"])


def test_resize_live_tasks_cannot_fit_is_refused_before_the_kernel_stage(tmp_path, built_agent):
    """Issue 11: the refusal comes from the plan play, so the GRUB drop-in keeps the old layout."""
    inventory = write_inventory(tmp_path)
    first = run_playbook(REPO / "site.yml", tmp_path, None, inventory=str(inventory))
    assert first.rc == 0, first.stdout[-3000:]
    sandbox = tmp_path / "sandbox"
    conf = sandbox / "etc" / "cmk"
    holder = subprocess.Popen(
        [str(sandbox / "opt/bin/cmk"), "isolate", f"--conf-dir={conf}", "--pool=exclusive", "sleep", "600"],
        env={**os.environ, "CMK_PROC_FS": "/proc"},
    )
    try:

        def held() -> bool:
            return any(str(holder.pid) in p.read_text().split() for p in conf.glob("pools/exclusive/*/*/tasks"))

        wait_for(held, f"timed out waiting for PID {holder.pid} in a tasks file")
        before = tree_snapshot(sandbox)
        res = run_playbook(REPO / "site.yml", tmp_path, {"cpupools_num_exclusive_cores": 0}, inventory=str(inventory))
        msg = assert_refused_in_plan_play(res, "cpupools_plan", "refusing to change the pool state")
        assert str(holder.pid) in msg
        assert tree_snapshot(sandbox) == before
        assert holder.poll() is None  # the workload kept running
    finally:
        holder.terminate()
        holder.wait(timeout=30)


def test_uninstall_checks_the_inputs_before_removing_anything(tmp_path, built_agent):
    inventory = write_inventory(tmp_path)
    assert run_playbook(REPO / "site.yml", tmp_path, None, inventory=str(inventory)).rc == 0
    before = tree_snapshot(tmp_path / "sandbox")
    res = run_playbook(
        REPO / "playbooks" / "uninstall.yml",
        tmp_path,
        None,
        "-e",
        "cpupools_agent_force=perhaps",
        inventory=str(inventory),
    )
    output = res.stdout + res.stderr
    assert res.rc != 0 and "Traceback" not in output
    plays = [play["play"]["name"] for play in (res.data or {}).get("plays", [])]
    assert plays == EARLY, plays  # the whole-inventory check, on the controller
    assert res.messages() == "host localhost: cpupools_agent_force: 'perhaps' is not a boolean; give true or false"
    assert tree_snapshot(tmp_path / "sandbox") == before
