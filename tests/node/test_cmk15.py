"""CMK v1.5's ConfigMap as cpupools reads it, and how its tasks are carried into the pool state."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from cpupools.core.errors import K8sError, StateError
from cpupools.node import cmk15
from cpupools.node import state_writer as sw

#: As CMK v1.5's init and isolate write it (yaml.dump, keys sorted, PIDs as strings): 2 sockets, SMT,
#: shared lists core by core, two exclusive lists held.
V15_TEXT = yaml.dump(
    {
        "exclusive": {0: {"1,45": ["48624"], "2,46": []}, 1: {"23,67": ["48630"], "24,68": []}},
        "shared": {0: {"3,47,4,48": []}, 1: {}},
        "infra": {0: {"0,44": ["1"]}, 1: {"22,66": []}},
    }
)
PLAN = {
    "version": 1,
    "pools": {
        "exclusive": {"0": ["1,45", "2,46"], "1": ["23,67", "24,68"]},
        "shared": {"0": ["3,4,47,48"], "1": []},
        "infra": {"0": ["0,44"], "1": ["22,66"]},
    },
    "exclusive_pools": ["exclusive"],
    "handout_order": {"exclusive": ["1,45", "23,67", "2,46", "24,68"]},
}


def test_cmk_v15_config_is_read_as_cmk_wrote_it():
    tasks = cmk15.parse_config(yaml.safe_load(V15_TEXT), "ConfigMap default/cmk-config-node7")
    assert tasks == {
        "exclusive": {"0": {"1,45": [48624], "2,46": []}, "1": {"23,67": [48630], "24,68": []}},
        "infra": {"0": {"0,44": [1]}, "1": {"22,66": []}},
        "shared": {"0": {"3,47,4,48": []}, "1": {}},
    }
    assert cmk15.named_pids(tasks) == [1, 48624, 48630]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("- a list", "data.config is not a map of pools"),
        ("reserved: {0: {'1': []}}", "names pool 'reserved'; CMK v1.5 knows exclusive"),
        ("exclusive: {x: {'1': []}}", "socket 'x' is not a socket number"),
        ("exclusive: {0: {'1-3': []}}", "'1-3' is not a cpulist in CMK's form"),
        ("exclusive: {0: {'1,1': []}}", "'1,1' is not a cpulist in CMK's form"),
        ("exclusive: {0: {'1': ['-5']}}", "task '-5' is not a PID"),
        ("exclusive: {0: {'1': ['99999999']}}", "task '99999999' is not a PID"),
        ("exclusive: {0: {'1': '123'}}", "the tasks are not a list"),
        (f"exclusive: {{0: {{'1': ['{'9' * 5000}']}}}}", "task '999999999999999"),
    ],
)
def test_anything_else_in_the_configmap_is_refused_by_name(config, message):
    with pytest.raises(K8sError) as exc:
        cmk15.parse_config(yaml.safe_load(config), "ConfigMap default/cmk-config-node7")
    assert str(exc.value).startswith("ConfigMap default/cmk-config-node7: ") and message in str(exc.value)
    assert len(str(exc.value)) < 200


class FakeApi:
    """Answers GETs of the ConfigMap from a list of objects, one per read (the last one repeats)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.paths = []

    def raw(self, method, path, body=None, content_type=None, query=None):
        assert method == "GET"
        self.paths.append(path)
        if "/namespaces/default/" not in path:
            return 404, {}
        return (200, self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])


def configmap(owner: str, text: str = V15_TEXT) -> dict:
    return {"metadata": {"name": "cmk-config-node7", "annotations": {"Owner": owner}}, "data": {"config": text}}


def test_read_waits_while_a_v15_holder_has_the_lock():
    api = FakeApi([configmap("dpdk-0"), configmap("dpdk-0"), configmap("")])
    slept = []
    result = cmk15.read_tasks(api, "node7", ["default", "intel-cmk"], yaml.safe_load, sleep=slept.append)
    assert slept == [1.0, 1.0] and result["configmaps"] == ["default/cmk-config-node7"]
    assert result["pids"] == [1, 48624, 48630] and result["warnings"] == []
    assert api.paths[-1] == "/api/v1/namespaces/intel-cmk/configmaps/cmk-config-node7"


def test_a_lock_held_for_ever_is_read_as_it_is_with_a_warning():
    result = cmk15.read_tasks(FakeApi([configmap("gone-pod")]), "node7", ["default"], yaml.safe_load, wait=0)
    assert result["pids"] == [1, 48624, 48630]
    assert result["warnings"] == [
        "default/cmk-config-node7 stayed locked by 'gone-pod' for 0 s (a holder that died keeps CMK v1.5's "
        "lock for ever); its task lists were read as they are"
    ]


def test_traces_of_cmk_v15_on_a_node(tmp_path):
    assert cmk15.traces_on_node(str(tmp_path), "/etc/cmk", "/opt/bin/cmk") == ""  # nothing installed
    (tmp_path / "opt/bin").mkdir(parents=True)
    (tmp_path / "opt/bin/cmk").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 600)  # CMK's PyInstaller binary
    traces = cmk15.traces_on_node(str(tmp_path), "/etc/cmk", "/opt/bin/cmk")
    assert traces == "/opt/bin/cmk is CMK's cmk, not cpupools', and /etc/cmk holds no pool state"
    (tmp_path / "etc/cmk/pools").mkdir(parents=True)  # CMK v1.4's state (or cpupools'): not v1.5
    assert cmk15.traces_on_node(str(tmp_path), "/etc/cmk", "/opt/bin/cmk") == ""


@pytest.fixture
def running():
    """A process that runs (a v1.5 workload's isolate) and the PID of one that has ended."""
    proc = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    yield proc.pid, ended.pid
    proc.kill()
    proc.wait()


def test_live_v15_tasks_are_carried_and_dead_ones_left_out(tmp_path, running):
    live, dead = running
    conf = tmp_path / "cmk"
    v15 = {
        "configmaps": ["default/cmk-config-node7"],
        "tasks": {"exclusive": {"0": {"2,46": [live]}, "1": {"23,67": [dead]}}, "shared": {"0": {"3,47,4,48": [live]}}},
    }
    with pytest.raises(StateError) as exc:  # CMK v1.5 on the node and its lists not read: refused
        sw.apply_state(str(conf), PLAN, cmk15_traces="/opt/bin/cmk is CMK's cmk", update_affinity=False)
    assert exc.value.field == "k8s_kubeconfig" and not conf.exists()
    check = sw.apply_state(str(conf), PLAN, cmk_v15=v15, cmk15_traces="x", check_mode=True, update_affinity=False)
    assert check["changed"] and not conf.exists()
    result = sw.apply_state(str(conf), PLAN, cmk_v15=v15, cmk15_traces="x", update_affinity=False)
    assert result["cmk_v15"] == {
        "configmaps": ["default/cmk-config-node7"],
        "live": [live],
        "dead": [dead],
        "carried": [live],
    }
    assert (conf / "pools/exclusive/0/2,46/tasks").read_text() == str(live)
    assert (conf / "pools/exclusive/1/23,67/tasks").read_text() == ""
    assert (conf / "pools/shared/0/3,4,47,48/tasks").read_text() == str(live)  # CMK's core-by-core name, same CPUs
    # Carried once: the next run with the same ConfigMap changes nothing.
    again = sw.apply_state(str(conf), PLAN, cmk_v15=v15, update_affinity=False)
    assert again["changed"] is False and again["cmk_v15"]["carried"] == []


def test_a_read_that_found_no_configmap_lets_the_state_start_empty(tmp_path):
    """A foreign cmk but no v1.5 ConfigMap in the cluster: nothing to carry, nothing refused."""
    conf = tmp_path / "cmk"
    nothing = {"configmaps": [], "tasks": {}}
    result = sw.apply_state(str(conf), PLAN, cmk_v15=nothing, cmk15_traces="x", update_affinity=False)
    assert result["changed"] and result["cmk_v15"] == {"configmaps": [], "live": [], "dead": [], "carried": []}
    assert (conf / "pools/exclusive/0/1,45/tasks").read_text() == ""
