"""A host's worker does not load what ansible-playbook's main process can load once for all.

ansible-playbook forks a worker per task and host. ansible-core loads its
own Jinja filters and tests the first time a process templates one, and
loading them runs ``ldconfig -p`` (``ansible.utils.encrypt`` asks
``ctypes.util.find_library`` for libcrypt). The main process loads them when
it imports one of the collection's actions, before it forks that task's
workers (plugins/plugin_utils/jinja_plugins.py), and the plan task has no
templated argument (its action reads the host's variables). So a run of the
plan play execs ``ldconfig`` as often for four hosts as for one, though
every host's values use a filter; without the main process's load, each
host's plan worker runs it again (docs/performance.md, "Filters loaded once").
The same import builds the template lexer, which each worker of a registered
task would otherwise build to compile its ``register:`` expression.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from helpers import REPO, local_nodes, run_playbook

LDCONFIG = re.compile(r'^\d+\s+execve\("[^"]*/ldconfig"', re.M)


def ldconfig_execs(tmp_path, names):
    topology = str(REPO / "inventories" / "local" / "topology")
    hosts = {
        name: {
            "cpupools_facts_root": topology,
            "cpupools_root": str(tmp_path / "roots" / name),
            "cpupools_kernel_args_backend": "{{ 'GRUB' | lower }}",  # a filter in every host's values
        }
        for name in names
    }
    inventory = local_nodes(tmp_path / f"hosts-{len(names)}.yml", hosts)
    trace = tmp_path / f"execve-{len(names)}"
    strace = ["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace)]
    res = run_playbook(REPO / "playbooks" / "plan.yml", tmp_path, None, "--check", inventory=inventory, wrapper=strace)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
    planned = [task["hosts"] for task in res.tasks() if task["task"]["name"] == "Plan the CPU pools"]
    ran = [(task["task"]["name"], sorted(task["hosts"])) for task in res.tasks()]
    assert planned and sorted(planned[0]) == sorted(names), (ran, res.stdout[-3000:], res.stderr[-3000:])
    assert all(r["inputs"]["kernel_args_backend"] == "grub" for r in planned[0].values())
    return len(LDCONFIG.findall(trace.read_text()))


def test_the_hosts_workers_do_not_load_the_filters_again(tmp_path):
    one = ldconfig_execs(tmp_path, ["node0"])
    four = ldconfig_execs(tmp_path, ["node0", "node1", "node2", "node3"])
    assert one >= 1, "no ldconfig at all: the trace no longer sees what it counts"  # the main process's own
    assert four == one, f"{four} ldconfig runs for four hosts, {one} for one: a worker per host loads them"


# A worker forked after the main process loaded: ansible-core 2.21 compiles the task's register: expression
# there (after the action ran), with a lexer it built itself unless the main process had built it before.
WORKER = """
import os, sys
from ansible._internal._templating import _jinja_bits
from ansible.template import Templar, trust_as_template
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import jinja_plugins
if sys.argv[1] == "load":
    jinja_plugins.load()
def refuse(self, *args, **kwargs):
    os._exit(2)  # a lexer built in the worker
_jinja_bits.AnsibleLexer.__init__ = refuse
pid = os.fork()
if pid == 0:
    os._exit(0 if Templar().evaluate_expression(trust_as_template("1 + 2")) == 3 else 3)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_the_main_process_builds_the_lexer_a_hosts_worker_compiles_with():
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    run = [sys.executable, "-c", WORKER]
    built = subprocess.run([*run, "load"], env=env, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    # the control: without the main process's load, the worker builds one (the check sees a build)
    alone = subprocess.run([*run, "none"], env=env, capture_output=True, text=True, check=False)
    assert alone.returncode == 2, alone.stderr[-2000:]
