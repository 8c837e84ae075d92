"""The cpupools_k8s role publishing and removing the pod injection policy: real ansible-playbook against the fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cel_support import admit
from k8s_support import TOKEN

pytestmark = pytest.mark.slow

POLICIES = ("mutatingadmissionpolicies", "cpupools-cmk-inject")
BINDINGS = ("mutatingadmissionpolicybindings", "cpupools-cmk-inject")
PYTHON = "{{ ansible_playbook_python }}"
TASK = "Publish or remove the pod injection policy"
ROLE_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_k8s
"""


@pytest.fixture
def fleet(tmp_path, fake, kubeconfig, make_plan):
    """``(inventory, extra vars)``: two hosts, node-1 and node-2, configured through the one fake cluster."""
    fake.add_node("node-2")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        name: {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}
                        for name in ("node-1", "node-2")
                    }
                }
            }
        )
    )
    return str(inventory), {"cpupools_plan": make_plan(), "cpupools_k8s_kubeconfig": str(kubeconfig)}


def admission_writes(fake):
    return [w for w in fake.writes() if "admissionregistration" in w.path]


def test_the_role_publishes_once_for_the_cluster_then_changes_nothing(playbook, fake, fleet):
    inventory, extra = fleet
    check = playbook(ROLE_PLAY, extra, "--check", "--diff", inventory=inventory)
    assert check.rc == 0, check.stdout
    predicted = check.result(TASK, "node-1")
    assert predicted["changed"] and (predicted["policy"], predicted["binding"]) == ("created", "created")
    assert check.result(TASK, "node-2").get("skipped")
    assert fake.writes() == []

    first = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert first.rc == 0, first.stdout
    assert first.result(TASK, "node-1")["api_version"] == "admissionregistration.k8s.io/v1"
    assert first.changed("node-1") == 2 and first.changed("node-2") == 1  # node-2: its Node only
    assert set(fake.admission) == {POLICIES, BINDINGS}
    assert len(admission_writes(fake)) == 2
    assert TOKEN not in first.stdout + first.stderr

    second = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert second.rc == 0 and second.changed("node-1") == 0 and second.changed("node-2") == 0
    assert len(admission_writes(fake)) == 2

    # the published policy, as stored by the server, does what it promises to a pod that only asks
    pod = {
        "metadata": {"name": "dpdk"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"cmk.intel.com/exclusive-cores": "2"}}}]},
    }
    mutated = admit(fake.admission[POLICIES], pod)
    assert {"name": "CMK_NUM_CORES", "value": "2"} in mutated["spec"]["containers"][0]["env"]


def test_values_from_e_mean_the_same_and_false_removes_the_policy(playbook, fake, fleet):
    inventory, extra = fleet
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
    assert res.rc == 0 and res.result(TASK, "node-1")["policy"] == "updated"
    spec = fake.admission[POLICIES]["spec"]
    assert spec["failurePolicy"] == "Ignore" and "'example.com/inject'" in spec["matchConditions"][0]["expression"]
    off = playbook(ROLE_PLAY, extra, "-e", "cpupools_k8s_admission=false", inventory=inventory)
    assert off.rc == 0 and off.result(TASK, "node-1")["policy"] == "deleted"
    assert fake.admission == {}


def test_an_older_server_gets_a_warning_with_its_version_and_keeps_the_documented_pod_spec(playbook, fake, fleet):
    inventory, extra = fleet
    fake.admission_versions, fake.version = (), "v1.33.4"
    res = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert res.rc == 0, res.stdout
    out = res.result(TASK, "node-1")
    assert out["changed"] is False and out["policy"] == "unsupported" and out["server_version"] == "v1.33.4"
    assert any("(v1.33.4) serves no MutatingAdmissionPolicy" in w for w in out["warnings"])
    assert admission_writes(fake) == []


def test_uninstalling_some_nodes_keeps_the_policy_for_the_others(playbook, fake, fleet):
    inventory, extra = fleet
    assert playbook(ROLE_PLAY, extra, inventory=inventory).rc == 0
    absent = dict(extra, cpupools_state="absent")
    one = playbook(ROLE_PLAY, absent, "--limit", "node-1", inventory=inventory)
    assert one.rc == 0, one.stdout
    assert one.result(TASK, "node-1")["kept_for"] == ["node-2"]
    assert set(fake.admission) == {POLICIES, BINDINGS}
    check = playbook(ROLE_PLAY, absent, "--check", inventory=inventory)
    assert check.rc == 0 and check.result(TASK, "node-1")["policy"] == "deleted" and len(fake.admission) == 2
    rest = playbook(ROLE_PLAY, absent, inventory=inventory)
    assert rest.rc == 0 and rest.result(TASK, "node-1")["policy"] == "deleted"
    assert fake.admission == {}
    again = playbook(ROLE_PLAY, absent, inventory=inventory)
    assert again.rc == 0 and again.changed("node-1") == 0 and again.changed("node-2") == 0


def test_a_play_without_cmk_nodes_publishes_no_policy(playbook, fake, fleet):
    """The policy serves cmk isolate workloads: nodes of other runtimes neither publish nor remove it."""
    inventory, extra = fleet
    run = playbook(ROLE_PLAY, extra, "-e", "cpupools_runtime=cpu-pooler", inventory=inventory)
    assert run.rc == 0, run.stdout
    assert run.result(TASK, "node-1").get("skipped") and run.result(TASK, "node-2").get("skipped")
    assert fake.admission == {} and admission_writes(fake) == []
    # One cmk node in the play is enough to publish it.
    first = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert first.rc == 0 and set(fake.admission) == {POLICIES, BINDINGS}
    again = playbook(ROLE_PLAY, extra, "-e", "cpupools_runtime=cpu-pooler", inventory=inventory)
    assert again.rc == 0 and set(fake.admission) == {POLICIES, BINDINGS}  # kept for cmk nodes elsewhere


def test_a_host_uninstalled_first_does_not_stop_a_cmk_host_publishing(playbook, fake, fleet):
    """Issue 25: each host's own state decides its part, whichever host comes first.

    node-1 (first) is being uninstalled, node-2 is a cmk node. Before, the
    first host's state made the play an uninstall: node-1 was chosen and
    removed the policy (none was published for node-2).
    """
    inventory, extra = fleet
    hosts = json.loads(Path(inventory).read_text())
    hosts["all"]["hosts"]["node-1"]["cpupools_state"] = "absent"
    Path(inventory).write_text(json.dumps(hosts))
    run = playbook(ROLE_PLAY, extra, inventory=inventory)
    assert run.rc == 0, run.stdout
    assert run.result(TASK, "node-1").get("skipped")
    assert run.result(TASK, "node-2")["policy"] == "created"
    assert set(fake.admission) == {POLICIES, BINDINGS}
