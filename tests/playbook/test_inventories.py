"""site.yml from the checkout with a dynamic inventory, and a run that matches no cpupools node.

Fleets live in dynamic inventories (netbox, kubernetes.core, a cloud's
plugin) whose hosts reach ``cpupools_nodes`` through the ``constructed``
plugin: here a static source lists two hosts with a tag, and a
``constructed`` source puts the tagged one into ``cpupools_nodes`` with
``keyed_groups`` and gives it a pool size with ``compose``. ansible.cfg
must enable the plugin, and a run whose inventory or ``--limit`` leaves
``cpupools_nodes`` empty must fail saying so, not exit 0 having done nothing.
"""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import REPO, run_playbook

pytestmark = pytest.mark.slow

TOPOLOGY = REPO / "inventories" / "local" / "topology"


def _inventory(tmp_path):
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "cpupools_facts_root": str(TOPOLOGY),
            "cpupools_root": str(tmp_path / "roots" / name),
            "cpupools_kernel_args_backend": "grub",
            "fleet_role": role,
            "fleet_pinned_cores": 3,
        }
        for name, role in (("pinned-1", "nodes"), ("web-1", "web"))
    }
    static = tmp_path / "fleet.yml"
    static.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    constructed = tmp_path / "constructed.yml"
    constructed.write_text(
        yaml.safe_dump(
            {
                "plugin": "ansible.builtin.constructed",
                "strict": True,
                "keyed_groups": [{"key": "fleet_role", "prefix": "cpupools"}],
                "compose": {"cpupools_num_exclusive_cores": "fleet_pinned_cores"},
            }
        )
    )
    return str(static), f"--inventory={constructed}"


def test_site_runs_on_the_hosts_a_constructed_inventory_puts_in_cpupools_nodes(tmp_path):
    static, constructed = _inventory(tmp_path)
    report = tmp_path / "report.html"
    extra = {"cpupools_report_html": str(report)}
    res = run_playbook(REPO / "site.yml", tmp_path, extra, constructed, inventory=static)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert set(res.stats) == {"pinned-1"}, res.stats
    assert res.changed("pinned-1") > 0
    pinned = tmp_path / "roots" / "pinned-1"
    assert (pinned / "etc/default/grub.d/99-cpupools.cfg").is_file()
    assert (pinned / "opt/bin/cmk").is_file()
    pools = json.loads((pinned / "etc/cmk/cpupools.json").read_text())
    assert len(pools["handout_order"]["exclusive"]) == 3, pools  # compose gave the host its size
    assert not (tmp_path / "roots" / "web-1").exists()
    assert report.is_file()

    # The same inventory limited to the host outside cpupools_nodes: refused, saying so, nothing written.
    web = run_playbook(REPO / "site.yml", tmp_path, None, constructed, "--limit=web-1", inventory=static)
    assert web.rc != 0, web.stdout[-3000:]
    assert "no host of this run is in the group cpupools_nodes" in web.messages(), web.messages()
    assert "--limit web-1" in web.messages()
    assert not (tmp_path / "roots" / "web-1").exists()
