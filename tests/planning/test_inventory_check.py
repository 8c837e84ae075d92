"""The whole-inventory check (inputs.check_inventory): every host's values, on the controller, no topology."""

from __future__ import annotations

import time

from cpupools.planning.inputs import SHOWN_REFUSALS, check_inventory, inventory_refusal


def fleet(n: int, bad: dict[int, dict] | None = None):
    for i in range(n):
        values = {"cpupools_num_exclusive_cores": 4, "cpupools_infra_cores": "auto", "cpupools_root": f"/srv/{i}"}
        values.update((bad or {}).get(i, {}))
        yield f"node-{i:05d}", values


def test_a_bad_value_on_any_host_is_refused_naming_the_host_and_the_variable():
    count, refusals, _ = check_inventory(fleet(10_000, {9_999: {"cpupools_shared_mode": "sideways"}}))
    assert count == 10_000
    assert len(refusals) == 1 and refusals[0].startswith("host node-09999: cpupools_shared_mode: ")
    assert inventory_refusal(count, refusals) == refusals[0]  # as the plan play words it


def test_many_bad_hosts_are_counted_and_the_first_named():
    bad = {i: {"cpupools_num_shared_cores": "x"} for i in range(0, 100, 2)}
    count, refusals, _ = check_inventory(fleet(100, bad))
    message = inventory_refusal(count, refusals)
    assert message.startswith("host node-00000: cpupools_num_shared_cores: ")
    assert message.count("host node-") == SHOWN_REFUSALS
    assert message.endswith(f"; and {50 - SHOWN_REFUSALS} more of the 100 hosts")
    assert "node-00098" not in message


def test_what_needs_the_node_is_left_to_the_plan_play():
    # CPU 5000 exists on no fixture: only the node's possible CPUs can refuse it.
    count, refusals, _ = check_inventory(fleet(3, {1: {"cpupools_excl_non_isolcpus": "5000-5001"}}))
    assert (count, refusals) == (3, [])
    assert inventory_refusal(count, refusals) is None


def test_the_controllers_own_check_runs_on_every_valid_host():
    seen = []

    def controller(host, values):
        seen.append((host, values["num_exclusive_cores"]))
        return f"host {host}: no" if host == "node-00001" else None

    count, refusals, _ = check_inventory(fleet(3, {2: {"cpupools_runtime": "nope"}}), controller=controller)
    assert count == 3
    assert seen == [("node-00000", 4), ("node-00001", 4)]
    assert refusals[0] == "host node-00001: no" and refusals[1].startswith("host node-00002: cpupools_runtime")


def test_ten_thousand_hosts_take_seconds():
    start = time.process_time()
    count, refusals, _ = check_inventory(fleet(10_000))
    spent = time.process_time() - start
    assert (count, refusals) == (10_000, [])
    assert spent < 10, spent  # about 1.5 s of CPU here; hostvars add about as much again in a play


def test_unknown_names_are_warned_about_once_per_name_with_the_hosts():
    misspelt = {i: {"cpupools_num_exclusive_core": 3} for i in range(5)}
    _, refusals, warnings = check_inventory(fleet(6, misspelt))
    assert refusals == []
    assert warnings == [
        "hosts node-00000, node-00001, node-00002 and 2 more: cpupools_num_exclusive_core is not a cpupools "
        "variable (did you mean cpupools_num_exclusive_cores?); it is ignored"
    ]
