"""The policy's CEL, evaluated on sample pods with cel-python (tests/k8s/cel_support.py says how)."""

from __future__ import annotations

import copy

import pytest
from cel_support import PolicyError, admit, apply_configuration, evaluate, matches
from cpupools.k8s_admission import desired_policy

EXCL = "cmk.intel.com/exclusive-cores"
ENI = "cmk.intel.com/exclusive-non-isolcpus-cores"

#: What the README's pod spec carries, i.e. what the policy must add.
TOLERATION = {"key": "cmk", "operator": "Exists"}
VOLUMES = [
    {"name": "cmk-bin", "hostPath": {"path": "/opt/bin"}},
    {"name": "cmk-conf", "hostPath": {"path": "/etc/cmk"}},
    {"name": "host-proc", "hostPath": {"path": "/proc"}},
]
MOUNTS = [
    {"name": "cmk-bin", "mountPath": "/opt/bin", "readOnly": True},
    {"name": "cmk-conf", "mountPath": "/etc/cmk"},
    {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True},
]


@pytest.fixture(scope="module")
def policy():
    return desired_policy("v1")


def pod(*containers: dict, labels=None, annotations=None, **spec) -> dict:
    meta = {"name": "app", "namespace": "telco"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": list(containers), **spec}}


def container(name="app", requests=None, limits=None, **extra) -> dict:
    c = {"name": name, "image": "registry.example/app:1", **extra}
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        c["resources"] = resources
    return c


def test_a_pod_with_only_its_request_gets_everything_the_readme_pod_spec_writes_by_hand(policy):
    before = pod(container(requests={EXCL: "2", "cpu": "1"}, limits={EXCL: "2"}))
    after = admit(policy, before)
    assert after["spec"]["tolerations"] == [TOLERATION]
    assert after["spec"]["volumes"] == VOLUMES
    (c,) = after["spec"]["containers"]
    assert c["env"] == [{"name": "CMK_PROC_FS", "value": "/host/proc"}, {"name": "CMK_NUM_CORES", "value": "2"}]
    assert c["volumeMounts"] == MOUNTS
    assert c["resources"] == before["spec"]["containers"][0]["resources"]
    assert c["image"] == "registry.example/app:1"


def test_the_readme_pod_spec_is_left_exactly_as_it_is(policy):
    readme = pod(
        container(
            requests={EXCL: "1"},
            limits={EXCL: "1"},
            env=[{"name": "CMK_PROC_FS", "value": "/host/proc"}],
            volumeMounts=copy.deepcopy(MOUNTS),
        ),
        tolerations=[TOLERATION],
        volumes=copy.deepcopy(VOLUMES),
    )
    # CMK_NUM_CORES is the one thing the README leaves to CMK's default of 1: the policy adds it
    after = admit(policy, readme)
    expected = copy.deepcopy(readme)
    expected["spec"]["containers"][0]["env"].append({"name": "CMK_NUM_CORES", "value": "1"})
    assert after == expected


def test_admitting_twice_changes_nothing_the_second_time(policy):
    once = admit(policy, pod(container(requests={EXCL: "3"}), container("sidecar")))
    assert admit(policy, once) == once


def test_pods_without_a_request_or_opt_in_are_not_touched(policy):
    plain = pod(container(requests={"cpu": "2"}), tolerations=[{"key": "x", "operator": "Exists"}])
    assert not matches(policy, plain)
    assert admit(policy, plain) == plain
    assert not matches(policy, pod(container(), labels={"cmk.intel.com/mutate": "false"}))


@pytest.mark.parametrize(
    "where",
    [{"labels": {"cmk.intel.com/mutate": "true"}}, {"annotations": {"cmk.intel.com/mutate": "1"}}],
    ids=["label", "cmk-annotation"],
)
def test_opting_in_by_label_or_cmk_annotation_injects_without_cmk_num_cores(policy, where):
    after = admit(policy, pod(container(), **where))
    assert after["spec"]["volumes"] == VOLUMES
    assert after["spec"]["containers"][0]["env"] == [{"name": "CMK_PROC_FS", "value": "/host/proc"}]


def test_cmk_num_cores_comes_from_the_request_else_the_limit_of_each_container(policy):
    after = admit(
        policy,
        pod(
            container("limit-only", limits={EXCL: "4"}),
            container("eni", requests={ENI: "1"}),
            container("both", requests={EXCL: "2"}, limits={EXCL: "5"}),
            container("shared"),
        ),
    )
    env = {c["name"]: {e["name"]: e["value"] for e in c["env"]} for c in after["spec"]["containers"]}
    assert env["limit-only"]["CMK_NUM_CORES"] == "4"
    assert env["eni"]["CMK_NUM_CORES"] == "1"
    assert env["both"]["CMK_NUM_CORES"] == "2"
    assert "CMK_NUM_CORES" not in env["shared"]
    assert all(e["CMK_PROC_FS"] == "/host/proc" for e in env.values())


def test_what_the_pod_sets_itself_wins(policy):
    mine = pod(
        container(
            requests={EXCL: "2"},
            env=[{"name": "CMK_NUM_CORES", "value": "1"}, {"name": "CMK_PROC_FS", "value": "/hostproc"}],
            volumeMounts=[{"name": "my-proc", "mountPath": "/host/proc"}],
        ),
        volumes=[{"name": "cmk-bin", "emptyDir": {}}, {"name": "my-proc", "hostPath": {"path": "/proc"}}],
    )
    after = admit(policy, mine)
    c = after["spec"]["containers"][0]
    assert c["env"] == mine["spec"]["containers"][0]["env"]
    # /host/proc is taken by the pod's own mount; the other two are added
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/host/proc", "/opt/bin", "/etc/cmk"]
    # the pod's own cmk-bin volume is kept as it is, the missing ones are added
    assert after["spec"]["volumes"][:2] == mine["spec"]["volumes"]
    assert [v["name"] for v in after["spec"]["volumes"]] == ["cmk-bin", "my-proc", "cmk-conf", "host-proc"]


@pytest.mark.parametrize(
    ("tolerations", "added"),
    [
        ([{"key": "dedicated", "operator": "Equal", "value": "rt", "effect": "NoExecute"}], True),
        ([{"operator": "Exists"}], False),  # tolerates every taint already
        ([{"key": "cmk", "operator": "Equal", "value": "true", "effect": "NoSchedule"}], False),
        ([{"key": "cmk", "operator": "Equal", "value": "false"}], True),
        ([{"key": "cmk", "operator": "Exists", "effect": "NoExecute"}], True),
    ],
)
def test_the_toleration_is_appended_only_when_nothing_tolerates_the_cmk_taint(policy, tolerations, added):
    after = admit(policy, pod(container(requests={EXCL: "1"}), tolerations=copy.deepcopy(tolerations)))
    assert after["spec"]["tolerations"] == tolerations + ([TOLERATION] if added else [])


def test_renamed_resources_and_opt_in_are_what_the_policy_looks_for():
    renamed = desired_policy("v1", "example.com/pinned", "example.com/pinned-eni", "example.com/inject")
    assert matches(renamed, pod(container(requests={"example.com/pinned": "1"})))
    assert matches(renamed, pod(container(), labels={"example.com/inject": "True"}))
    assert not matches(renamed, pod(container(requests={EXCL: "1"})))
    after = admit(renamed, pod(container(limits={"example.com/pinned-eni": "3"})))
    assert {"name": "CMK_NUM_CORES", "value": "3"} in after["spec"]["containers"][0]["env"]


def test_the_adapter_refuses_what_the_server_would_refuse():
    """The stand-ins for the server's type check and merge rules can fail."""
    with pytest.raises(PolicyError, match="no field"):
        evaluate("Object{spec: Object.spec{hostPID: true}}", pod(container()))
    with pytest.raises(PolicyError, match="atomic list"):
        apply_configuration(pod(container()), {"spec": {"tolerations": [TOLERATION]}})
    with pytest.raises(PolicyError, match="syntax"):
        evaluate("object.spec.containers.exists(c,", pod(container()))
    flapping = {
        "spec": {
            "reinvocationPolicy": "IfNeeded",
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {
                        "expression": "[JSONPatch{op: 'add', path: '/spec/tolerations/-', "
                        "value: Object.spec.tolerations{key: 'x', operator: 'Exists'}}]"
                    },
                }
            ],
        }
    }
    with pytest.raises(PolicyError, match="not idempotent"):
        admit(flapping, pod(container(), tolerations=[]))


def test_cmk_num_cores_is_text_even_if_the_quantity_is_typed_as_int_or_string(policy):
    """An env value must be a string; the expression converts whatever type the schema gives the quantity."""
    after = admit(policy, pod(container(requests={EXCL: 2})))
    assert {"name": "CMK_NUM_CORES", "value": "2"} in after["spec"]["containers"][0]["env"]
