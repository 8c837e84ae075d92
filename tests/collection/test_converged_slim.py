"""A converged host's result, slimmed by cpupools_converged itself where the controller holds its parts.

The action gives the module ``stored``, the digests the host's last slim
result named (plugin_utils/digest_store.py ``named``); the module leaves out
what they name when its own digests are the same, with the function the
controller stores by. The playbook's side (the third run of a converged node
gets the same result and report) is tests/playbook/test_site.py.
"""

from __future__ import annotations

import copy
import json
import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.hardware import topology as topo
from ansible_collections.cpupools.cpupools.plugins.modules.cpupools_converged import slim
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import digest_store

FACTS = topo.gather_topology(str(REPO / "inventories" / "local" / "topology")).to_facts()


def converged():
    return {
        "ansible_facts": {"cpupools": copy.deepcopy(FACTS)},
        "plan": {"pools": {"exclusive": "2-5"}},
        "exports": {"cpupools_plan": None, "cpupools_kernel_status": {"cmdline": "isolcpus=2-5"}},
        "files": {"state": {"content": "x" * 100}},
        "agent_leftovers": [],
        "inputs": {"root": "/"},
        "todo": [],
    }


def digests_as_the_controller_stores_them(result):
    """What the action would store, from the result as it reaches the controller (JSON)."""
    wire = json.loads(json.dumps(result))
    return {
        "topology": digest_store.encode(wire["ansible_facts"]["cpupools"])[1],
        "plan": digest_store.encode({"plan": wire["plan"], "exports": wire["exports"]})[1],
    }


def test_what_the_controller_holds_is_named_and_left_out():
    result = converged()
    stored = digests_as_the_controller_stores_them(result)
    slim(result, stored)
    assert result == {
        "topology_digest": stored["topology"],
        "plan_digest": stored["plan"],
        "inputs": {"root": "/"},  # the action checks them on the controller, then leaves them out
        "todo": [],
    }


def test_what_differs_from_what_the_controller_holds_travels_whole():
    result = converged()
    stored = digests_as_the_controller_stores_them(result)
    result["ansible_facts"]["cpupools"]["online"] = "0-86"  # a CPU went offline since the last run
    result["exports"]["cpupools_kernel_status"] = {"cmdline": "isolcpus=2-6"}
    slim(result, stored)
    assert {"ansible_facts", "plan", "exports"} <= set(result)
    assert not {"topology_digest", "plan_digest", "files", "agent_leftovers"} & set(result)
    # nothing stored (a first slim run, a work directory deleted): the same, and the files still go
    result = converged()
    slim(result, {})
    assert {"ansible_facts", "plan", "exports", "inputs"} <= set(result) and "files" not in result
