"""The cpupools_k8s role publishing and removing the pod injection policy: real ansible-playbook, the real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

V1 = "/apis/admissionregistration.k8s.io/v1"
POLICY = f"{V1}/mutatingadmissionpolicies/cpupools-cmk-inject"
BINDING = f"{V1}/mutatingadmissionpolicybindings/cpupools-cmk-inject"
PYTHON = "{{ ansible_playbook_python }}"
TASK = "Publish or remove the pod injection policy"
ROLE_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_k8s
"""


@pytest.fixture
def fleet(tmp_path, cluster, no_admission, make_plan):
    """``(inventory, extra vars, hosts)``: two hosts, each its own Node, configured through the one real cluster."""
    hosts = [cluster.node, cluster.add_node()]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        name: {"ansible_connection": "local", "ansible_python_interpreter": PYTHON} for name in hosts
                    }
                }
            }
        )
    )
    return str(inventory), {"cpupools_plan": make_plan(), "cpupools_k8s_kubeconfig": str(cluster.kubeconfig())}, hosts


def admission_writes(cluster):
    return [e for e in cluster.writes() if "admissionregistration" in e["requestURI"]]


def test_the_role_publishes_once_for_the_cluster_then_changes_nothing(playbook, cluster, fleet):
    inventory, extra, (one, two) = fleet
    check = playbook(ROLE_PLAY, extra, "--check", "--diff", inventory=inventory)
    assert check.rc == 0, check.stdout
    predicted = check.result(TASK, one)
    assert predicted["changed"] and (predicted["policy"], predicted["binding"]) == ("created", "created")
    assert check.result(TASK, two).get("skipped")
    assert cluster.writes() == []

    first = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert first.rc == 0, first.stdout
    assert first.result(TASK, one)["api_version"] == "admissionregistration.k8s.io/v1"
    assert first.changed(one) == 2 and first.changed(two) == 1  # the second host: its Node only
    assert cluster.real.get(POLICY) is not None and cluster.real.get(BINDING) is not None
    assert len(admission_writes(cluster)) == 2
    assert cluster.real.product_token not in first.stdout + first.stderr

    second = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert second.rc == 0 and second.changed(one) == 0 and second.changed(two) == 0
    assert len(admission_writes(cluster)) == 2


def test_values_from_e_mean_the_same_and_false_removes_the_policy(playbook, cluster, fleet):
    inventory, extra, (one, _) = fleet
    assert playbook(ROLE_PLAY, extra, inventory=inventory).rc == 0
    res = playbook(
        ROLE_PLAY,
        extra,
        "-e",
        "cpupools_k8s_admission_failure_policy=Ignore",
        "-e",
        "cpupools_k8s_admission_opt_in=example.com/inject",
        inventory=inventory,
    )
    assert res.rc == 0 and res.result(TASK, one)["policy"] == "updated"
    spec = cluster.real.get(POLICY)["spec"]
    assert spec["failurePolicy"] == "Ignore" and "'example.com/inject'" in spec["matchConditions"][0]["expression"]
    off = playbook(ROLE_PLAY, extra, "-e", "cpupools_k8s_admission=false", inventory=inventory)
    assert off.rc == 0 and off.result(TASK, one)["policy"] == "deleted"
    assert cluster.real.get(POLICY) is None and cluster.real.get(BINDING) is None


def test_uninstalling_some_nodes_keeps_the_policy_for_the_others(playbook, cluster, fleet):
    inventory, extra, (one, two) = fleet
    assert playbook(ROLE_PLAY, extra, inventory=inventory).rc == 0
    absent = dict(extra, cpupools_state="absent")
    first = playbook(ROLE_PLAY, absent, "--limit", one, inventory=inventory)
    assert first.rc == 0, first.stdout
    assert first.result(TASK, one)["kept_for"] == [two]
    assert cluster.real.get(POLICY) is not None
    check = playbook(ROLE_PLAY, absent, "--check", inventory=inventory)
    assert check.rc == 0 and check.result(TASK, one)["policy"] == "deleted" and cluster.real.get(POLICY) is not None
    rest = playbook(ROLE_PLAY, absent, inventory=inventory)
    assert rest.rc == 0 and rest.result(TASK, one)["policy"] == "deleted"
    assert cluster.real.get(POLICY) is None and cluster.real.get(BINDING) is None
    again = playbook(ROLE_PLAY, absent, inventory=inventory)
    assert again.rc == 0 and again.changed(one) == 0 and again.changed(two) == 0


def test_a_play_without_cmk_nodes_publishes_no_policy(playbook, cluster, fleet):
    """The policy serves cmk isolate workloads: nodes of other runtimes neither publish nor remove it."""
    inventory, extra, (one, two) = fleet
    extra = dict(extra, cpupools_runtime_namespace=cluster.real.namespace(cluster.real.unique("rt")))
    run = playbook(ROLE_PLAY, extra, "-e", "cpupools_runtime=cpu-pooler", inventory=inventory)
    assert run.rc == 0, run.stdout
    assert run.result(TASK, one).get("skipped") and run.result(TASK, two).get("skipped")
    assert cluster.real.get(POLICY) is None and admission_writes(cluster) == []
    # One cmk node in the play is enough to publish it.
    first = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert first.rc == 0 and cluster.real.get(POLICY) is not None
    again = playbook(ROLE_PLAY, extra, "-e", "cpupools_runtime=cpu-pooler", inventory=inventory)
    assert again.rc == 0 and cluster.real.get(POLICY) is not None  # kept for cmk nodes elsewhere


def test_a_host_uninstalled_first_does_not_stop_a_cmk_host_publishing(playbook, cluster, fleet):
    """Issue 25: each host's own state decides its part, whichever host comes first.

    The first host is being uninstalled, the second is a cmk node. Before, the
    first host's state made the play an uninstall: the first was chosen and
    removed the policy (none was published for the second).
    """
    inventory, extra, (one, two) = fleet
    hosts = json.loads(Path(inventory).read_text())
    hosts["all"]["hosts"][one]["cpupools_state"] = "absent"
    Path(inventory).write_text(json.dumps(hosts))
    run = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert run.rc == 0, run.stdout
    assert run.result(TASK, one).get("skipped")
    assert run.result(TASK, two)["policy"] == "created"
    assert cluster.real.get(POLICY) is not None and cluster.real.get(BINDING) is not None
