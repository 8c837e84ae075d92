"""The pod injection policy's CEL, evaluated by the real API server on pods created as dry runs."""

from __future__ import annotations

import copy
import ssl

import pytest
from cpupools.cluster.k8s_admission import ensure_admission
from cpupools.cluster.k8s_advertise import Credentials, stdlib_transport
from cpupools.cluster.k8s_apply import Api
from helpers import wait_for

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
PROC_FS = {"name": "CMK_PROC_FS", "value": "/host/proc"}


class Injector:
    """Publishes the policy (as the role does) and admits pods through the server as dry runs."""

    def __init__(self, real, namespace: str) -> None:
        self.real = real
        self.namespace = namespace
        context = ssl.create_default_context(cafile=str(real.pki.ca))
        self.api = Api(stdlib_transport(Credentials(real.url, context, real.product_token)), real.url, "")

    def publish(self, **options) -> None:
        """Publish the policy with ``options`` and wait until the server applies it."""
        ensure_admission(self.api, "present", check_mode=False, **options)
        probe = pod(container(requests={options.get("exclusive_resource", EXCL): "1"}))
        # The server's policy cache follows the stored object within a second
        # or so; the probe is one only the policy just published changes.
        wait_for(lambda: self.admit(probe)["spec"].get("volumes"), "the policy did not take effect", interval=0.1)

    def admit(self, body: dict) -> dict:
        """The pod as the server would store it (``dryRun=All``: nothing is stored)."""
        resp = self.real.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", body, query={"dryRun": "All"})
        assert resp.status == 201, resp.body.get("message") if isinstance(resp.body, dict) else resp.body
        return resp.body


@pytest.fixture(scope="module")
def injector(real_kube):
    ns = real_kube.namespace(real_kube.unique("cel"))
    inject = Injector(real_kube, ns)
    inject.publish()
    yield inject
    for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
        real_kube.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/cpupools-cmk-inject")


def pod(*containers: dict, labels=None, annotations=None, **spec) -> dict:
    meta = {"generateName": "app-"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"automountServiceAccountToken": False, "containers": list(containers), **spec},
    }


def container(name="app", requests=None, limits=None, **extra) -> dict:
    """A container; an extended resource it requests is limited to the same amount (the server requires it)."""
    c = {"name": name, "image": "registry.example/app:1", **extra}
    limits = {**{k: v for k, v in (requests or {}).items() if "/" in k}, **(limits or {})} or None
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        c["resources"] = resources
    return c


# What the tests compare: the fields the policy may touch, without the server's own defaults.


def tolerations(admitted: dict) -> list[dict]:
    """The pod's tolerations without the two the DefaultTolerationSeconds plugin adds to every pod."""
    return [
        t for t in admitted["spec"].get("tolerations") or [] if not t.get("key", "").startswith("node.kubernetes.io/")
    ]


def volumes(admitted: dict) -> list[dict]:
    out = []
    for v in admitted["spec"].get("volumes") or []:
        v = copy.deepcopy(v)
        if v.get("hostPath", {}).get("type") == "":
            del v["hostPath"]["type"]  # the server's default
        out.append(v)
    return out


def env(admitted: dict, field: str = "containers") -> dict:
    return {c["name"]: c.get("env", []) for c in admitted["spec"].get(field) or []}


def mounts(admitted: dict, field: str = "containers") -> dict:
    return {c["name"]: c.get("volumeMounts", []) for c in admitted["spec"].get(field) or []}


def test_a_pod_with_only_its_request_gets_everything_the_readme_pod_spec_writes_by_hand(injector):
    before = pod(container(requests={EXCL: "2", "cpu": "1"}))
    after = injector.admit(before)
    assert tolerations(after) == [TOLERATION]
    assert volumes(after) == VOLUMES
    assert env(after) == {"app": [PROC_FS, {"name": "CMK_NUM_CORES", "value": "2"}]}
    assert mounts(after) == {"app": MOUNTS}
    (c,) = after["spec"]["containers"]
    assert c["resources"] == {"requests": {EXCL: "2", "cpu": "1"}, "limits": {EXCL: "2"}}
    assert c["image"] == "registry.example/app:1" and "initContainers" not in after["spec"]


def test_the_readme_pod_spec_is_left_as_it_is(injector):
    readme = pod(
        container(requests={EXCL: "1"}, env=[PROC_FS], volumeMounts=copy.deepcopy(MOUNTS)),
        tolerations=[TOLERATION],
        volumes=copy.deepcopy(VOLUMES),
    )
    after = injector.admit(readme)
    # CMK_NUM_CORES is the one thing the README leaves to CMK's default of 1: the policy adds it
    assert env(after) == {"app": [PROC_FS, {"name": "CMK_NUM_CORES", "value": "1"}]}
    assert (volumes(after), mounts(after), tolerations(after)) == (VOLUMES, {"app": MOUNTS}, [TOLERATION])


def test_a_pod_written_for_cmks_webhookless_spec_gets_no_second_set_of_volumes(injector):
    """CMK's resources/pods/cmk-isolate-pod-no-webhook.yaml: its own volume names, a key-less toleration."""
    cmk_mounts = [
        {"name": "cmk-host-proc", "mountPath": "/host/proc", "readOnly": True},
        {"name": "cmk-install-dir", "mountPath": "/opt/bin"},
        {"name": "cmk-conf-dir", "mountPath": "/etc/cmk"},
    ]
    cmk_volumes = [
        {"name": "cmk-install-dir", "hostPath": {"path": "/opt/bin"}},
        {"name": "cmk-host-proc", "hostPath": {"path": "/proc"}},
        {"name": "cmk-conf-dir", "hostPath": {"path": "/etc/cmk"}},
    ]
    cmk_pod = pod(
        container("exclusive", requests={EXCL: "1"}, env=[PROC_FS], volumeMounts=cmk_mounts),
        container("shared", env=[PROC_FS], volumeMounts=copy.deepcopy(cmk_mounts)),
        container("late", env=[PROC_FS]),  # mounts nothing yet: gets the pod's own volumes, by what they mount
        tolerations=[{"operator": "Exists"}],
        volumes=cmk_volumes,
    )
    after = injector.admit(cmk_pod)
    assert volumes(after) == cmk_volumes
    assert tolerations(after) == [{"operator": "Exists"}]  # tolerates every taint already
    got = mounts(after)
    assert got["exclusive"] == cmk_mounts and got["shared"] == cmk_mounts
    assert got["late"] == [
        {"name": "cmk-install-dir", "mountPath": "/opt/bin", "readOnly": True},
        {"name": "cmk-conf-dir", "mountPath": "/etc/cmk"},
        {"name": "cmk-host-proc", "mountPath": "/host/proc", "readOnly": True},
    ]


def test_init_containers_get_what_containers_get_as_cmks_webhook_gave_them(injector):
    """CMK's intel/webhook.py mutated spec.initContainers too: mounts, CMK_PROC_FS, and their own CMK_NUM_CORES."""
    after = injector.admit(
        pod(
            container(requests={EXCL: "2"}),
            initContainers=[container("prepare"), container("pin-first", limits={EXCL: "1"})],
        )
    )
    assert env(after, "initContainers") == {
        "prepare": [PROC_FS],
        "pin-first": [PROC_FS, {"name": "CMK_NUM_CORES", "value": "1"}],
    }
    assert mounts(after, "initContainers") == {"prepare": MOUNTS, "pin-first": MOUNTS}
    assert volumes(after) == VOLUMES


def test_admitting_twice_changes_nothing_the_second_time(injector):
    once = injector.admit(pod(container(requests={EXCL: "3"}), container("sidecar"), initContainers=[container("i")]))
    again = copy.deepcopy(once)
    again["metadata"] = {"generateName": "app-"}
    assert injector.admit(again)["spec"] == once["spec"]


def test_pods_without_a_request_or_opt_in_are_not_touched(injector):
    plain = pod(container(requests={"cpu": "2"}), tolerations=[{"key": "x", "operator": "Exists"}])
    after = injector.admit(plain)
    assert "volumes" not in after["spec"] and env(after) == {"app": []} and mounts(after) == {"app": []}
    assert tolerations(after) == [{"key": "x", "operator": "Exists"}]
    assert "volumes" not in injector.admit(pod(container(), labels={"cmk.intel.com/mutate": "false"}))["spec"]


@pytest.mark.parametrize(
    "where",
    [{"labels": {"cmk.intel.com/mutate": "true"}}, {"annotations": {"cmk.intel.com/mutate": "1"}}],
    ids=["label", "cmk-annotation"],
)
def test_opting_in_by_label_or_cmk_annotation_injects_without_cmk_num_cores(injector, where):
    after = injector.admit(pod(container(), **where))
    assert volumes(after) == VOLUMES
    assert env(after) == {"app": [PROC_FS]}


def test_cmk_num_cores_comes_from_the_request_else_the_limit_of_each_container(injector):
    after = injector.admit(
        pod(
            container("limit-only", limits={EXCL: "4"}),
            container("eni", requests={ENI: "1"}),
            container("both", requests={EXCL: "2"}),
            container("shared"),
        )
    )
    values = {name: {e["name"]: e["value"] for e in entries} for name, entries in env(after).items()}
    assert values["limit-only"]["CMK_NUM_CORES"] == "4"  # the server copies a limit into a missing request
    assert values["eni"]["CMK_NUM_CORES"] == "1"
    assert values["both"]["CMK_NUM_CORES"] == "2"
    assert "CMK_NUM_CORES" not in values["shared"]
    assert all(e["CMK_PROC_FS"] == "/host/proc" for e in values.values())


def test_what_the_pod_sets_itself_wins(injector):
    mine = pod(
        container(
            requests={EXCL: "2"},
            env=[{"name": "CMK_NUM_CORES", "value": "1"}, {"name": "CMK_PROC_FS", "value": "/hostproc"}],
            volumeMounts=[{"name": "my-proc", "mountPath": "/host/proc"}],
        ),
        volumes=[{"name": "cmk-bin", "emptyDir": {}}, {"name": "my-proc", "hostPath": {"path": "/proc"}}],
    )
    after = injector.admit(mine)
    assert env(after)["app"] == mine["spec"]["containers"][0]["env"]
    # /host/proc is taken by the pod's own mount; the other two are added, cmk-bin being the pod's own volume
    assert [(m["name"], m["mountPath"]) for m in mounts(after)["app"]] == [
        ("my-proc", "/host/proc"),
        ("cmk-bin", "/opt/bin"),
        ("cmk-conf", "/etc/cmk"),
    ]
    assert [v["name"] for v in volumes(after)] == ["cmk-bin", "my-proc", "cmk-conf"]
    assert volumes(after)[0] == {"name": "cmk-bin", "emptyDir": {}}


@pytest.mark.parametrize(
    ("given", "added"),
    [
        ([{"key": "dedicated", "operator": "Equal", "value": "rt", "effect": "NoExecute"}], True),
        ([{"operator": "Exists"}], False),  # tolerates every taint already (CMK's own pods)
        ([{"key": "cmk", "operator": "Equal", "value": "true", "effect": "NoSchedule"}], False),
        ([{"key": "cmk", "operator": "Equal", "value": "false"}], True),
        ([{"key": "cmk", "operator": "Exists", "effect": "NoExecute"}], True),
    ],
)
def test_the_toleration_is_appended_only_when_nothing_tolerates_the_cmk_taint(injector, given, added):
    after = injector.admit(pod(container(requests={EXCL: "1"}), tolerations=copy.deepcopy(given)))
    assert tolerations(after) == given + ([TOLERATION] if added else [])


def test_renamed_resources_and_opt_in_are_what_the_policy_looks_for(injector):
    injector.publish(
        exclusive_resource="example.com/pinned", eni_resource="example.com/pinned-eni", opt_in="example.com/inject"
    )
    try:
        assert volumes(injector.admit(pod(container(requests={"example.com/pinned": "1"})))) == VOLUMES
        assert volumes(injector.admit(pod(container(), labels={"example.com/inject": "True"}))) == VOLUMES
        assert "volumes" not in injector.admit(pod(container(requests={EXCL: "1"})))["spec"]
        after = injector.admit(pod(container(limits={"example.com/pinned-eni": "3"})))
        assert {"name": "CMK_NUM_CORES", "value": "3"} in env(after)["app"]
    finally:
        injector.publish()
