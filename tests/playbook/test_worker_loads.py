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
"""

from __future__ import annotations

import re

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
    assert planned and sorted(planned[0]) == sorted(names)
    assert all(r["inputs"]["kernel_args_backend"] == "grub" for r in planned[0].values())
    return len(LDCONFIG.findall(trace.read_text()))


def test_the_hosts_workers_do_not_load_the_filters_again(tmp_path):
    one = ldconfig_execs(tmp_path, ["node0"])
    four = ldconfig_execs(tmp_path, ["node0", "node1", "node2", "node3"])
    assert one >= 1, "no ldconfig at all: the trace no longer sees what it counts"  # the main process's own
    assert four == one, f"{four} ldconfig runs for four hosts, {one} for one: a worker per host loads them"
