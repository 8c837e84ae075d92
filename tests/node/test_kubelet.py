"""The kubelet runtime's derivation from the plan (module_utils/cpupools/node/kubelet.py), checked by hand."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from cpupools.core.cpulist import parse_cpulist
from cpupools.core.errors import PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.node import kubelet
from cpupools.planning.inputs import validate_inputs
from cpupools.planning.plan import make_request, plan_pools

SETTINGS = {"isolcpus_flags": "auto", "kubelet_policy_options": "auto"}


def derive(corpus_root, name, settings=None, **request):
    topology = gather_topology(str(corpus_root[name]))
    raw = {"num_exclusive_cores": -1, "num_shared_cores": 0, "runtime": "kubelet"}
    raw.update(request)
    plan = plan_pools(topology, make_request(raw))
    return plan, kubelet.derive_config(plan, kubelet.node_shape(topology, plan), {**SETTINGS, **(settings or {})})


def test_one_socket_with_smt(corpus_root):
    # 1s8c-smt2: CPU n and n+8 share a core; 16 threads keep one housekeeping core: CPUs 0 and 8.
    # No kubelet on this machine to ask: the options are those of kubelet 1.33.
    _, config = derive(corpus_root, "1s8c-smt2")
    assert config == {
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": {"full-pcpus-only": "true", "strict-cpu-reservation": "true"},
        "reservedSystemCPUs": "0,8",
        "topologyManagerPolicy": "best-effort",
        "topologyManagerScope": "container",
    }


def test_cores_no_pool_takes_are_the_kubelets_not_reserved(corpus_root):
    # 4 exclusive cores of 8 asked: the kubelet still gets the other 3 (it hands out and shares every
    # CPU it does not reserve), all isolated; only the housekeeping core is reserved.
    plan, config = derive(corpus_root, "1s8c-smt2", num_exclusive_cores=4, num_shared_cores=1)
    assert plan["pool_cpus"] == {"exclusive": "1-7,9-15", "shared": "", "infra": "0,8"}
    assert plan["isolated_cpus"] == "1-7,9-15"
    assert config["reservedSystemCPUs"] == "0,8"
    assert plan["allocatable_cpus"] == 14
    assert "cpupools_num_shared_cores (1) makes no pool of its own" in plan["notes"][0]


def test_two_numa_nodes_per_socket_keep_housekeeping_each(corpus_root):
    # 2s8c-2numa: nodes of 4 cores (0-3, 4-7, 8-11, 12-15), CPU n+16 the sibling of n, no L3
    # information: one housekeeping core per NUMA node, cores 0, 4, 8 and 12.
    _, config = derive(corpus_root, "2s8c-2numa")
    assert config["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert config["reservedSystemCPUs"] == "0,4,8,12,16,20,24,28"


def test_no_smt_no_full_pcpus(corpus_root):
    # 2s8c-nosmt: CPUs 0-7 socket 0, 8-15 socket 1, one NUMA node per socket.
    _, config = derive(corpus_root, "2s8c-nosmt")
    assert config["cpuManagerPolicyOptions"] == {
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }
    assert config["reservedSystemCPUs"] == "0,8"


def test_epyc_nps4_reserves_housekeeping_only_and_aligns_by_ccd(corpus_root):
    # 2 x 96 cores, SMT2 (CPU n+192), NPS4: NUMA nodes of 24 cores (48 threads: one housekeeping
    # core each), three 8-core CCDs per node. The node: 16 exclusive + 4 shared cores asked.
    plan, config = derive(
        corpus_root, "2s96c-smt2-nps4", {"kubelet_version": "1.36"}, num_exclusive_cores=16, num_shared_cores=4
    )
    firsts = [0, 24, 48, 72, 96, 120, 144, 168]
    assert config["reservedSystemCPUs"] == ",".join(map(str, firsts + [c + 192 for c in firsts]))
    assert plan["allocatable_cpus"] == 384 - 16
    # Several L3 domains per NUMA node: a pod's CPUs in one CCD, which the kubelet refuses to combine
    # with distribute-cpus-across-numa.
    assert config["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "prefer-align-cpus-by-uncorecache": "true",
    }
    # A 1.33 kubelet has that option only as alpha: auto keeps to what it has on by default.
    _, older = derive(corpus_root, "2s96c-smt2-nps4", {"kubelet_version": "1.33"})
    assert older["cpuManagerPolicyOptions"] == {
        "full-pcpus-only": "true",
        "strict-cpu-reservation": "true",
        "distribute-cpus-across-numa": "true",
    }


def test_sub_numa_clustering_one_l3_over_the_socket_distributes_across_numa(corpus_root):
    # SNC4: one L3 per socket, four NUMA nodes of 12 cores (24 threads: one housekeeping core each).
    plan, config = derive(corpus_root, "2s48c-smt2-snc4", {"kubelet_version": "1.36"})
    assert "distribute-cpus-across-numa" in config["cpuManagerPolicyOptions"]
    assert "prefer-align-cpus-by-uncorecache" not in config["cpuManagerPolicyOptions"]
    assert len(parse_cpulist(config["reservedSystemCPUs"])) == 16
    assert {n: row["reserved"] for n, row in plan["numa"].items()}["5"] == "60,156"


def test_hybrid_reserves_the_e_cores_and_leaves_strict_reservation_off(corpus_root):
    # 6 P cores (CPUs 0-11, siblings adjacent) and 8 E cores (12-19): the kubelet cannot keep pods off E
    # cores, so they are reserved with the housekeeping core 0-1; Burstable pods may still run on them,
    # so strict-cpu-reservation stays off.
    plan, config = derive(corpus_root, "1s6p8e-hybrid", {"kubelet_version": "1.36"})
    assert config["reservedSystemCPUs"] == "0-1,12-19"
    assert plan["isolated_cpus"] == "2-11"
    assert config["cpuManagerPolicyOptions"] == {"full-pcpus-only": "true"}
    assert any("cannot tell P cores from E cores" in n for n in plan["notes"])
    assert any("20 CPUs / 14 cores" in n for n in plan["notes"])
    # Asked to, the kubelet gets them.
    plan, config = derive(corpus_root, "1s6p8e-hybrid", {"kubelet_version": "1.36"}, exclusive_core_type="any")
    assert config["reservedSystemCPUs"] == "0-1"
    assert "strict-cpu-reservation" in config["cpuManagerPolicyOptions"]


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


def test_an_alpha_option_turns_its_feature_gate_on(corpus_root):
    _, config = derive(
        corpus_root,
        "2s8c-nosmt",
        {"kubelet_version": "1.36", "kubelet_policy_options": ["distribute-cpus-across-cores", "align-by-socket"]},
    )
    assert config["cpuManagerPolicyOptions"] == {"align-by-socket": "true", "distribute-cpus-across-cores": "true"}
    assert config["featureGates"] == {"CPUManagerPolicyAlphaOptions": True}
    text = kubelet.render_dropin(config, "kubelet")
    assert "featureGates:\n  CPUManagerPolicyAlphaOptions: true\n" in text
    # GA and beta options need no gate.
    _, config = derive(corpus_root, "2s8c-nosmt", {"kubelet_version": "1.36"})
    assert "featureGates" not in config


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (
            {"kubelet_version": "1.30", "kubelet_policy_options": ["distribute-cpus-across-cores"]},
            "distribute-cpus-across-cores needs kubelet 1.31 or later, and this node's kubelet is 1.30",
        ),
        (
            {"kubelet_policy_options": ["prefer-align-cpus-by-uncorecache"], "kubelet_version": "auto"},
            "needs kubelet 1.32 or later, and this node's kubelet is 1.33 (assumed",
        ),
        (
            {"kubelet_policy_options": ["align-by-socket"], "kubelet_topology_policy": "single-numa-node"},
            "align-by-socket cannot be used with the Topology Manager policy single-numa-node",
        ),
    ],
)
def test_options_the_kubelet_would_refuse_to_start_with(corpus_root, settings, words):
    if "assumed" in words:  # 1.33 has the option (alpha): allowed, with its gate
        _, config = derive(corpus_root, "1s8c-smt2", settings)
        assert config["featureGates"] == {"CPUManagerPolicyAlphaOptions": True}
        return
    with pytest.raises(PlanError) as err:
        derive(corpus_root, "1s8c-smt2", settings)
    assert err.value.field == "kubelet_policy_options"
    assert words in str(err.value)


def test_align_by_socket_needs_a_numa_node_per_socket():
    shape = kubelet.NodeShape(sockets=2, numa_nodes=1)
    with pytest.raises(PlanError, match="2 sockets and 1 NUMA node"):
        kubelet.check_options({"align-by-socket": "true"}, (1, 36), True, shape, "best-effort")


@pytest.mark.parametrize(
    ("settings", "request_", "field", "words"),
    [
        ({"isolcpus_flags": ["managed_irq", "domain"]}, {}, "isolcpus_flags", "domain flag would take CPUs 1-7,9-15"),
        ({"isolcpus_flags": []}, {}, "isolcpus_flags", "domain flag"),
        ({}, {"excl_non_isolcpus": "7,15"}, "excl_non_isolcpus", "CPUs 7,15 are an exclusive-non-isolcpus pool"),
        ({}, {"num_exclusive_cores": 8}, "num_exclusive_cores", "the kubelet can hand out 7 cores"),
        ({}, {"infra_cores": 8}, "num_exclusive_cores", "the kubelet can hand out 0 cores"),
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
            kubelet.NodeShape(threads_per_core=2, siblings={0: (0, 4), 4: (0, 4)}),
            {**SETTINGS, "kubelet_policy_options": ["full-pcpus-only"]},
        )
    assert err.value.field == "kubelet_policy_options"


def test_reserved_cpus_that_are_isolated_are_refused():
    plan = {"pool_cpus": {"infra": "0-1", "exclusive": "2-3"}, "isolated_cpus": "1-3"}
    with pytest.raises(PlanError, match="would include isolated CPUs 1"):
        kubelet.derive_config(plan, kubelet.NodeShape(siblings={}), SETTINGS)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("strict-cpu-reservation,full-pcpus-only", ["full-pcpus-only", "strict-cpu-reservation"]),
        ("", []),
        ([], []),
        (["distribute-cpus-across-numa", "distribute-cpus-across-numa"], ["distribute-cpus-across-numa"]),
        ("align-by-socket", ["align-by-socket"]),
    ],
)
def test_policy_options_from_yaml_and_from_e_text(raw, expected):
    assert kubelet.to_policy_options(raw, "kubelet_policy_options") == expected


def test_policy_options_refusals_through_the_one_input_check():
    with pytest.raises(PlanError) as err:
        validate_inputs({"cpupools_kubelet_policy_options": "full-pcpus-only,align-by-cache"})
    assert err.value.describe("node-1") == (
        "host node-1: cpupools_kubelet_policy_options: 'align-by-cache' is not auto or one of "
        "full-pcpus-only, strict-cpu-reservation, prefer-align-cpus-by-uncorecache, distribute-cpus-across-numa, "
        "align-by-socket, distribute-cpus-across-cores"
    )
    with pytest.raises(PlanError) as err:
        validate_inputs(
            {"cpupools_kubelet_policy_options": "prefer-align-cpus-by-uncorecache,distribute-cpus-across-numa"}
        )
    assert str(err.value) == (
        "prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa cannot be used together "
        "(the kubelet refuses to start with both)"
    )
    with pytest.raises(PlanError, match="'crio' is not one of cmk, kubelet"):
        validate_inputs({"cpupools_runtime": "crio"})
    assert validate_inputs({"cpupools_runtime": " Kubelet"}).values["runtime"] == "kubelet"
    assert validate_inputs({"cpupools_kubelet_version": "v1.34.2"}).values["kubelet_version"] == "1.34"
    with pytest.raises(PlanError, match=r"'2\.1' is neither auto nor a Kubernetes version"):
        validate_inputs({"cpupools_kubelet_version": "2.1"})


def run(argv: list[str]) -> tuple[int, str, str]:
    """What the modules pass to ``detect_version``: ``AnsibleModule.run_command``'s contract."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def _kubelet(tmp_path, monkeypatch, script: str) -> None:
    """A kubelet first on PATH that runs ``script``."""
    binary = tmp_path / "kubelet"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(("printed", "version"), [("Kubernetes v1.36.2", "1.36"), ("Kubernetes v1.34", "1.34")])
def test_the_kubelet_version_is_asked_of_the_node(tmp_path, monkeypatch, printed, version):
    _kubelet(tmp_path, monkeypatch, f"echo '{printed}'")
    assert kubelet.detect_version(run) == version


def test_without_a_kubelet_on_the_node_no_version_is_known(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(kubelet, "KUBELET_PATHS", (str(tmp_path / "usr/bin/kubelet"),))
    assert kubelet.detect_version(run) is None


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("exec sleep 30", r"auto: .*/kubelet --version did not answer in 1 s; set cpupools_kubelet_version"),
        ("echo 'E: no such flag' >&2; exit 2", r"--version exited 2 \(E: no such flag\); set cpupools_kubelet_version"),
        ("echo hello", r"--version printed no version \(hello\); set cpupools_kubelet_version"),
    ],
)
def test_a_kubelet_on_the_node_that_does_not_say_its_version_is_refused(tmp_path, monkeypatch, script, said):
    """Not taken for "no kubelet": that would derive the oldest version's options for a newer kubelet."""
    _kubelet(tmp_path, monkeypatch, script)
    monkeypatch.setattr(kubelet, "VERSION_TIMEOUT", 1)
    with pytest.raises(PlanError, match=said):
        kubelet.detect_version(run)


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
        'reservedSystemCPUs: "0,4,8,12,16,20,24,28"\n'
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


def test_verify_a_fresh_state_of_strict_cpu_reservation():
    """The real kubelet v1.36 with strict-cpu-reservation keeps the reserved CPUs out of its default set.

    What it wrote on the guest (8 CPUs, reservedSystemCPUs 0-1,4-5): defaultCpuSet 2-3,6-7;
    with a Guaranteed pod of 2 CPUs: defaultCpuSet 6-7 and the pod's 2-3.
    """
    strict = {**STATIC, "reservedSystemCPUs": "0-1,4-5", "cpuManagerPolicyOptions": {"strict-cpu-reservation": "true"}}
    online = set(range(8))
    assert kubelet.verify_state(json.loads(state("static", "2-3,6-7")), strict, online) == []
    held = json.loads(state("static", "6-7", {"uid-1": {"app": "2-3"}}))
    assert kubelet.verify_state(held, strict, online) == []
    # A default set holding reserved CPUs is a kubelet that did not apply the option.
    assert kubelet.verify_state(json.loads(state("static", "0-7")), strict, online) == [
        "defaultCpuSet 0-7 holds reserved CPUs 0-1,4-5, which strict-cpu-reservation keeps out of it"
    ]
    assert kubelet.verify_state(json.loads(state("static", "2-3")), strict, online) == [
        "defaultCpuSet and assignments cover 2-3, the node has 0-7 online of which 0-1,4-5 are reserved"
    ]


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


#: The real kubelet v1.36's last words (journalctl -u kubelet -o cat) when the merged configuration asks
#: for two options it cannot combine (the guest's own kubelet.yaml set distribute-cpus-across-cores).
REFUSED = """\
I1128 15:50:13.611031     980 server.go:545] "Kubelet version" kubeletVersion="v1.36.2"
E1128 15:50:13.853935     980 container_manager_linux.go:343] "Failed to initialize cpu manager" \
err="new static policy error: static policy options full-pcpus-only and distribute-cpus-across-cores can not be \
used at the same time"
E1128 15:50:13.854473     980 run.go:72] "command failed" err="failed to run Kubelet: new static policy error: \
static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time"
kubelet.service: Main process exited, code=exited, status=1/FAILURE
"""


def test_the_kubelets_own_words_when_it_refuses_to_run():
    assert kubelet.kubelet_error(REFUSED) == (
        "failed to run Kubelet: new static policy error: static policy options full-pcpus-only and "
        "distribute-cpus-across-cores can not be used at the same time"
    )
    assert kubelet.kubelet_error('E1128 x.go:1] "oops" err="a \\"quoted\\" word"\n') == 'a "quoted" word'
    assert kubelet.kubelet_error("kubelet.service: Failed with result 'exit-code'.\n").startswith("kubelet.service")
    assert kubelet.kubelet_error("") == "(nothing in its log)"


def test_a_unit_systemd_keeps_restarting_fails_the_wait_with_the_kubelets_words(tmp_path):
    calls = []

    def run(argv):
        calls.append(argv[0])
        if argv[0] == "systemctl":
            return 0, f"NRestarts={min(len(calls), 9)}\nActiveState=activating\n", ""
        return 0, REFUSED, ""

    assert kubelet.unit_failure(lambda argv: (0, "NRestarts=1\nActiveState=active\n", ""), "kubelet") is None
    failed = lambda: kubelet.unit_failure(run, "kubelet")  # noqa: E731
    with pytest.raises(PlanError) as caught:
        kubelet.verify_started(node_at(tmp_path), CONFIG, set(range(16)), 60, interval=0, failed=failed)
    message = str(caught.value)
    assert "the kubelet (kubelet) exited 3 time(s) since its start and systemd keeps restarting it" in message
    assert "the kubelet says: failed to run Kubelet: new static policy error" in message
    assert message.endswith("The node stays cordoned and the rollout stops here.")
    assert calls.count("journalctl") == 1  # the log is read once, when the unit has failed


def node_at(root, check=False):
    from cpupools.node.bootloader import Host

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
