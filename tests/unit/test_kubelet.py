"""The kubelet runtime's derivation from the plan (module_utils/cpupools/kubelet.py), checked by hand."""

from __future__ import annotations

import json

import pytest
from cpupools import kubelet
from cpupools.errors import PlanError
from cpupools.inputs import validate_inputs
from cpupools.plan import make_request, plan_pools
from cpupools.topology import gather_topology
from sysfs import CORPUS, write_tree

SETTINGS = {"isolcpus_flags": ["managed_irq"], "kubelet_policy_options": "auto"}


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory):
    """Only the small shapes these tests use (the whole corpus takes a minute to write)."""
    base = tmp_path_factory.mktemp("kubelet-corpus")
    return {name: write_tree(str(base / name), CORPUS[name]) for name in ("1s8c-smt2", "2s8c-2numa", "2s8c-nosmt")}


def derive(corpus_root, name, settings=None, **request):
    topology = gather_topology(str(corpus_root[name]))
    raw = {"num_exclusive_cores": -1, "num_shared_cores": 0}
    raw.update(request)
    plan = plan_pools(topology, make_request(raw))
    return plan, kubelet.derive_config(
        plan,
        threads_per_core=topology.threads_per_core,
        numa_nodes=len(topology.numa_nodes),
        siblings={cpu: topology.cpus[cpu].siblings for cpu in topology.cpus},
        settings={**SETTINGS, **(settings or {})},
    )


def test_one_socket_with_smt(corpus_root):
    # 1s8c-smt2: CPU n and n+8 share a core; infra = core 0 -> CPUs 0 and 8.
    _, config = derive(corpus_root, "1s8c-smt2")
    assert config == {
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": {"full-pcpus-only": "true", "strict-cpu-reservation": "true"},
        "reservedSystemCPUs": "0,8",
        "topologyManagerPolicy": "best-effort",
        "topologyManagerScope": "container",
    }


def test_cores_in_no_pool_are_reserved_with_the_infra_pool(corpus_root):
    # The plan puts cores no pool takes into the infra pool: 4 exclusive cores of 8 leave 3 there.
    plan, config = derive(corpus_root, "1s8c-smt2", num_exclusive_cores=4)
    assert plan["pool_cpus"]["infra"] == "0,5-8,13-15"
    assert config["reservedSystemCPUs"] == "0,5-8,13-15"


def test_two_numa_nodes_per_socket_distribute(corpus_root):
    # 2s8c-2numa: four NUMA nodes; infra is the first core of each socket: CPUs 0,8 (+16 siblings 16,24).
    _, config = derive(corpus_root, "2s8c-2numa")
    assert config["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert config["reservedSystemCPUs"] == "0,8,16,24"


def test_no_smt_no_full_pcpus(corpus_root):
    # 2s8c-nosmt: CPUs 0-7 socket 0, 8-15 socket 1, one NUMA node per socket.
    _, config = derive(corpus_root, "2s8c-nosmt")
    assert config["cpuManagerPolicyOptions"] == {
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert config["reservedSystemCPUs"] == "0,8"


def test_operator_options_and_topology_knobs(corpus_root):
    _, config = derive(
        corpus_root,
        "1s8c-smt2",
        {
            "kubelet_policy_options": [],
            "kubelet_topology_policy": "single-numa-node",
            "kubelet_topology_scope": "pod",
        },
    )
    assert config["cpuManagerPolicyOptions"] == {}
    assert (config["topologyManagerPolicy"], config["topologyManagerScope"]) == ("single-numa-node", "pod")


@pytest.mark.parametrize(
    ("settings", "request_", "field", "words"),
    [
        ({"isolcpus_flags": ["managed_irq", "domain"]}, {}, "isolcpus_flags", "domain flag would take CPUs 1-7,9-15"),
        ({"isolcpus_flags": []}, {}, "isolcpus_flags", "domain flag"),
        ({}, {"num_exclusive_cores": 0, "num_shared_cores": 2}, "num_exclusive_cores", "no exclusive CPU"),
        ({}, {"excl_non_isolcpus": "7,15"}, "excl_non_isolcpus", "CPUs 7,15 are an exclusive-non-isolcpus pool"),
    ],
)
def test_refusals_name_the_variable_and_the_cpus(corpus_root, settings, request_, field, words):
    with pytest.raises(PlanError) as err:
        derive(corpus_root, "1s8c-smt2", settings, **request_)
    assert err.value.field == field
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_full_pcpus_only_refuses_a_reserved_set_that_splits_a_core():
    plan = {"pool_cpus": {"infra": "0", "exclusive": "1-3,5-7"}, "isolated_cpus": "1-3,5-7"}
    with pytest.raises(PlanError, match="CPU 0 shares its core") as err:
        kubelet.derive_config(
            plan,
            threads_per_core=2,
            numa_nodes=1,
            siblings={0: (0, 4), 4: (0, 4)},
            settings={**SETTINGS, "kubelet_policy_options": ["full-pcpus-only"]},
        )
    assert err.value.field == "kubelet_policy_options"


def test_reserved_cpus_that_are_isolated_are_refused():
    plan = {"pool_cpus": {"infra": "0-1", "exclusive": "2-3"}, "isolated_cpus": "1-3"}
    with pytest.raises(PlanError, match="would include isolated CPUs 1"):
        kubelet.derive_config(plan, threads_per_core=1, numa_nodes=1, siblings={}, settings=SETTINGS)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("strict-cpu-reservation,full-pcpus-only", ["full-pcpus-only", "strict-cpu-reservation"]),
        ("", []),
        ([], []),
        (["distribute-cpus-across-numa", "distribute-cpus-across-numa"], ["distribute-cpus-across-numa"]),
    ],
)
def test_policy_options_from_yaml_and_from_e_text(raw, expected):
    assert kubelet.to_policy_options(raw, "kubelet_policy_options") == expected


def test_policy_options_refusals_through_the_one_input_check():
    with pytest.raises(PlanError) as err:
        validate_inputs({"cpupools_kubelet_policy_options": "full-pcpus-only,align-by-socket"})
    assert err.value.describe("node-1") == (
        "host node-1: cpupools_kubelet_policy_options: 'align-by-socket' is not auto or one of "
        "full-pcpus-only, strict-cpu-reservation, distribute-cpus-across-numa"
    )
    with pytest.raises(PlanError, match="'crio' is not one of cmk, kubelet"):
        validate_inputs({"cpupools_runtime": "crio"})
    assert validate_inputs({"cpupools_runtime": " Kubelet"}).values["runtime"] == "kubelet"


def test_the_drop_in_is_the_same_bytes_for_the_same_config(corpus_root):
    _, config = derive(corpus_root, "2s8c-2numa")
    text = kubelet.render_dropin(config, "kubelet")
    assert text == kubelet.render_dropin(dict(config), "kubelet")
    assert text.startswith("# Ansible managed by cpupools: edits here are overwritten (docs/kubelet.md).\n# kubelet")
    body = text[text.index("apiVersion") :]
    assert body == (
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        'cpuManagerPolicy: "static"\n'
        "cpuManagerPolicyOptions:\n"
        '  full-pcpus-only: "true"\n'
        '  strict-cpu-reservation: "true"\n'
        '  distribute-cpus-across-numa: "true"\n'
        'reservedSystemCPUs: "0,8,16,24"\n'
        'topologyManagerPolicy: "best-effort"\n'
        'topologyManagerScope: "container"\n'
    )


STATIC = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,8", "cpuManagerPolicyOptions": {}}


def state(policy, default="0-15", entries=None):
    return json.dumps({"policyName": policy, "defaultCpuSet": default, "entries": entries or {}, "checksum": 1})


@pytest.mark.parametrize(
    ("subset", "record", "state_text", "required", "why"),
    [
        (STATIC, None, None, False, ""),  # the kubelet never ran: it starts with the drop-in
        (STATIC, None, state("none", ""), True, "runs with policy 'none' not set by cpupools"),
        (STATIC, {"applied": STATIC}, state("static"), False, ""),
        (STATIC, {"applied": {**STATIC, "reservedSystemCPUs": "0"}}, state("static"), True, "reservedSystemCPUs"),
        (STATIC, {"applied": STATIC}, state("none", ""), True, "the kubelet's state has policy 'none'"),
        (None, {"applied": STATIC}, state("static"), True, "to be removed"),
        (None, None, state("none", ""), False, ""),
    ],
)
def test_when_the_kubelet_must_restart(subset, record, state_text, required, why):
    assert kubelet.decide(subset, record, state_text)[0] is required
    assert why in kubelet.decide(subset, record, state_text)[1]


def test_a_corrupt_state_file_is_one_line():
    with pytest.raises(PlanError, match="cpu_manager_state is not JSON"):
        kubelet.decide(STATIC, None, "{nope")


def test_verify_the_fresh_state():
    online = set(range(16))
    assert kubelet.verify_state(json.loads(state("static")), STATIC, online) == []
    assert kubelet.verify_state(json.loads(state("none", "")), STATIC, online) == [
        "policyName is 'none', wanted 'static'"
    ]
    assert kubelet.verify_state(json.loads(state("static", "1-7,9-15")), STATIC, online) == [
        "defaultCpuSet 1-7,9-15 lacks reserved CPUs 0,8",
        "defaultCpuSet and assignments cover 1-7,9-15, the node has 0-15 online",
    ]
    # Not ours any more: whatever policy the operator's own configuration set is fine.
    assert kubelet.verify_state(json.loads(state("none", "")), None, online) == []


def test_waiting_for_the_state_file_gives_up_after_the_timeout(tmp_path):
    ticks = iter(range(100))
    path = tmp_path / "cpu_manager_state"
    waited = []

    def sleep(seconds):
        waited.append(seconds)
        if len(waited) == 3:
            path.write_text(state("static"))

    assert kubelet.wait_for_state(str(path), 10, clock=lambda: next(ticks), sleep=sleep) == state("static")
    assert len(waited) == 3
    assert kubelet.wait_for_state(str(tmp_path / "never"), 2, clock=lambda: next(ticks), sleep=lambda s: None) is None


def node_at(root, check=False):
    from cpupools.bootloader import Host

    host = Host(str(root), lambda *a, **k: (0, "", ""), check_mode=check, wrapper=[])
    return kubelet.Node(host, "/etc/kubernetes/kubelet.conf.d/50-cpupools.conf")


CONFIG = {**STATIC, "topologyManagerPolicy": "best-effort", "topologyManagerScope": "container"}


def test_configure_writes_where_no_kubelet_ran_and_then_changes_nothing(tmp_path):
    first = kubelet.configure(node_at(tmp_path), CONFIG, "kubelet", kubelet.HEADER)
    assert first["changed"] and first["restart_required"] is False
    dropin = tmp_path / "etc/kubernetes/kubelet.conf.d/50-cpupools.conf"
    assert dropin.read_text() == first["content"]
    record = json.loads((tmp_path / "var/lib/cpupools/kubelet-cpu-manager.json").read_text())
    assert record == {"applied": kubelet.restart_subset(CONFIG)}
    mtime = dropin.stat().st_mtime_ns
    second = kubelet.configure(node_at(tmp_path), CONFIG, "kubelet", kubelet.HEADER)
    assert second["changed"] is False and second["actions"] == []
    assert dropin.stat().st_mtime_ns == mtime


def test_a_running_kubelet_leaves_the_change_pending_until_the_stopped_apply(tmp_path):
    state_file = tmp_path / "var/lib/kubelet/cpu_manager_state"
    state_file.parent.mkdir(parents=True)
    state_file.write_text(state("none", ""))
    # Check mode and a real run agree: nothing is written under a running kubelet.
    for check in (True, False):
        result = kubelet.configure(node_at(tmp_path, check), CONFIG, "kubelet", kubelet.HEADER)
        assert (result["changed"], result["restart_required"]) == (False, True)
    assert not (tmp_path / "etc").exists()
    predicted = kubelet.apply_stopped(node_at(tmp_path, check=True), result["content"])
    assert predicted["actions"] == [
        "write /etc/kubernetes/kubelet.conf.d/50-cpupools.conf",
        "remove /var/lib/kubelet/cpu_manager_state",
    ]
    assert state_file.exists()
    kubelet.apply_stopped(node_at(tmp_path), result["content"])
    assert not state_file.exists()
    # The kubelet starts and writes its fresh state; verify records what it runs with.
    state_file.write_text(state("static", "0-15"))
    done = kubelet.verify_started(node_at(tmp_path), CONFIG, set(range(16)), 1)
    assert done["kubelet_policy"] == "static" and done["changed"]
    after = kubelet.configure(node_at(tmp_path), CONFIG, "kubelet", kubelet.HEADER)
    assert (after["changed"], after["restart_required"]) == (False, False)


def test_verify_fails_with_one_line_when_the_kubelet_never_writes_its_state(tmp_path):
    with pytest.raises(PlanError) as err:
        kubelet.verify_started(node_at(tmp_path), CONFIG, set(range(16)), 0.2, interval=0.05)
    assert str(err.value) == (
        "the kubelet did not write /var/lib/kubelet/cpu_manager_state within 0.2 seconds of its start. "
        "The node stays cordoned and the rollout stops here."
    )
