"""The actions' check of their arguments against their module's spec: plugin_utils/inputs.py ``checked_args``.

The refusals as a user sees them are tests/playbook/test_bad_input.py; these
are the check's own cases, the report's spec as the example.
"""

from __future__ import annotations

import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.report.report import ARGUMENT_SPEC
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import checked_args


def test_a_fleet_named_as_is_is_passed_on_not_copied_and_the_rest_is_checked_as_before():
    hosts = [{"host": "a", "plan": {"pool_cpus": {"shared": "1"}}}, {"host": "b"}]
    params, refusal = checked_args({"hosts": hosts, "store_max_age": "7"}, ARGUMENT_SPEC, "cpupools report", ("hosts",))
    assert refusal is None
    assert params["hosts"] is hosts  # the validator deep-copies what it checks: a fleet's inputs, per host
    assert params["store_max_age"] == 7 and params["failed_hosts"] == [] and params["title"] == "cpupools report"
    copied, _ = checked_args({"hosts": hosts}, ARGUMENT_SPEC, "cpupools report")
    assert copied["hosts"] == hosts and copied["hosts"][0] is not hosts[0]  # without as_is: the validator's copy


def test_what_is_not_a_list_of_dicts_gets_the_validators_refusal():
    for hosts, words in (
        (["a"], "Elements value for option 'hosts'"),
        ("not a list", "Elements value for option 'hosts'"),
        ([{"host": "a"}, 3], "Elements value for option 'hosts'"),
    ):
        params, refusal = checked_args({"hosts": hosts}, ARGUMENT_SPEC, "cpupools report", ("hosts",))
        assert params is None and refusal.startswith("cpupools report: ") and words in refusal, refusal
    # an unknown option is still refused beside an as-is fleet
    _, refusal = checked_args({"hosts": [], "colour": "red"}, ARGUMENT_SPEC, "cpupools report", ("hosts",))
    assert refusal.startswith("cpupools report: unsupported parameters: colour. Supported parameters"), refusal
    # the fleet is required, as-is or not
    _, refusal = checked_args({}, ARGUMENT_SPEC, "cpupools report", ("hosts",))
    assert "missing required arguments: hosts" in refusal
