"""cpupools_power through the real site.yml (issue 41): planned against the node's drivers, written
into the housekeeper's configuration, refused before anything is written where a node cannot take it.

A fleet of two node classes: an Intel server (intel_pstate, intel_idle, the uncore driver) with the
exclusive pool's governor, fixed frequency and C-state limit and the uncore's range in its host_vars,
and a VM (no cpufreq driver) given the fleet's governor by group_vars: refused, nothing written on any
node. With the VM's exception in its host_vars the run writes the Intel node's lines, and a second
run changes nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from helpers import REPO, run_playbook, tree_snapshot
from sysfs import CORPUS, write_tree

pytestmark = pytest.mark.slow

CONF = "etc/cpupools/housekeep.conf"


def test_power_is_planned_written_for_the_housekeeper_and_refused_where_the_node_lacks_it(tmp_path):
    hosts = {}
    for host, kind in (("intel-node", "intel"), ("vm-node", "vm")):
        facts = write_tree(str(tmp_path / "facts" / host), dataclasses.replace(CORPUS["2s8c-nosmt"], power=kind))
        hosts[host] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "cpupools_facts_root": facts,
            "cpupools_root": str(tmp_path / "roots" / host),
        }
        (tmp_path / "roots" / host).mkdir(parents=True)
    hosts["intel-node"]["cpupools_power"] = {
        "exclusive": {"governor": "performance", "frequency_khz": 3000000, "cstate_limit": "C1"},
        "uncore": {"min_khz": 2000000, "max_khz": 2000000},
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {"cpupools_nodes": {"hosts": hosts}},
                    "vars": {
                        "cpupools_num_exclusive_cores": 2,
                        "cpupools_num_shared_cores": 1,
                        "cpupools_kernel_args_backend": "grub",
                        "cpupools_report_html": str(tmp_path / "report.html"),
                        "cpupools_report_print": False,
                        "cpupools_power": {"exclusive": {"governor": "performance"}},
                    },
                }
            }
        )
    )

    def site():
        return run_playbook(REPO / "site.yml", tmp_path, None, inventory=str(inventory))

    refused = site()
    # The VM cannot take the fleet's governor: the plan play refuses, saying what it lacks, and no node of
    # the run is written (a bad value anywhere stops the run before its first write).
    assert refused.rc != 0
    said = refused.stdout + refused.stderr
    assert "host vm-node: cpupools_power.exclusive: CPUs" in said and "have no cpufreq policy" in said, said[-3000:]
    assert not [p for p in (tmp_path / "roots").rglob("*") if p.is_file()]

    # host_vars for the exception: the VM class leaves power alone.
    data = yaml.safe_load(inventory.read_text())
    data["all"]["children"]["cpupools_nodes"]["hosts"]["vm-node"]["cpupools_power"] = {}
    inventory.write_text(yaml.safe_dump(data))
    first = site()
    assert first.rc == 0, first.stdout[-3000:] + first.stderr[-2000:]
    conf = (tmp_path / "roots" / "intel-node" / CONF).read_text()
    lines = [line for line in conf.splitlines() if line.startswith(("power=", "uncore="))]
    exclusive = first.result("Plan the CPU pools", "intel-node")["plan"]["pool_cpus"]["exclusive"]
    assert lines[0] == (
        f"power={exclusive} pool=exclusive governor=performance min_khz=3000000 max_khz=3000000 "
        "cstates_off=2,3 cstates_on=0,1"
    ), conf
    assert lines[1:] == [
        "uncore=package_00_die_00 min_khz=2000000 max_khz=2000000",
        "uncore=package_01_die_00 min_khz=2000000 max_khz=2000000",
    ]
    vm_conf = (tmp_path / "roots" / "vm-node" / CONF).read_text()
    assert "power=" not in vm_conf and "uncore=" not in vm_conf
    unit = (tmp_path / "roots" / "intel-node" / "etc/systemd/system/cpupools-housekeep-power.service").read_text()
    assert "--power-only" in unit and "Before=containerd.service" in unit

    before = tree_snapshot(tmp_path / "roots" / "intel-node")
    again = site()
    assert again.rc == 0 and again.changed("intel-node") == 0
    assert tree_snapshot(tmp_path / "roots" / "intel-node") == before
