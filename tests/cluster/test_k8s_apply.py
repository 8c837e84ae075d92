"""``cpupools.cluster.k8s_apply``'s CRD handling over the stdlib transport: the conditions a real server sets."""

from __future__ import annotations

import threading

import pytest
from cpupools.cluster.k8s import desired_node, layout_crd, layout_object
from cpupools.cluster.k8s_advertise import Credentials, stdlib_transport
from cpupools.cluster.k8s_apply import Api, ApiStatus, ensure_crd, ensure_layout, ensure_node
from k8s_support import TOKEN

NAME = "cpupoollayouts.cpupools.io"
CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{NAME}"
CLASH = "pools.cpupools.io"
MERGE = "application/merge-patch+json"


def clashing_crd() -> dict:
    other = layout_crd()
    other["metadata"] = {"name": CLASH}
    other["spec"]["names"] = {"kind": "CpuPoolLayout", "plural": "pools", "singular": "pool"}
    return other


@pytest.fixture
def no_layout_crd(cluster, no_layout_crd):
    """No layout CRD at the start; none left that blocks the next test (a finalizer, a clashing CRD)."""
    yield
    for name in (CLASH, NAME):
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        if cluster.real.get(path) is not None:
            cluster.real.request("PATCH", path, {"metadata": {"finalizers": None}}, content_type=MERGE)
            cluster.real.delete_crd(name)


def conditions(crd: dict) -> dict:
    return {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}


# Against the real server -------------------------------------------------------------------------


def test_a_crd_being_deleted_is_waited_for_then_created_again(cluster, no_layout_crd, make_plan):
    """An uninstall (or a person) deleting the CRD as a run starts: it goes away by itself, so wait, then create.

    The CRD is held in deletion by a finalizer, released a second later. While held, the real server
    shows it Terminating while it deletes its objects, then Established again with a deletionTimestamp:
    a layout written then would vanish with it.
    """
    real = cluster.real
    held = layout_crd()
    held["metadata"]["finalizers"] = ["example.com/hold"]
    real.ensure_crd(held)
    real.ok("POST", "/apis/cpupools.io/v1/cpupoollayouts", layout_object(cluster.node, make_plan(), {}))
    assert real.request("DELETE", CRD).status == 200
    release = threading.Timer(
        1.0, lambda: real.ok("PATCH", CRD, {"metadata": {"finalizers": None}}, content_type=MERGE)
    )
    api = cluster.api()
    assert ensure_crd(api, check_mode=True) == "created"  # a real run would create it again
    release.start()
    try:
        assert ensure_crd(api, check_mode=False, wait=30.0) == "created"
    finally:
        release.join()
    crd = real.get(CRD)
    assert "deletionTimestamp" not in crd["metadata"] and conditions(crd)["Established"] == "True"
    assert ensure_layout(api, layout_object(cluster.node, make_plan(), {}), check_mode=False) == "created"


def test_a_crd_that_stays_deleted_fails_at_the_deadline_naming_it(cluster, no_layout_crd):
    real = cluster.real
    held = layout_crd()
    held["metadata"]["finalizers"] = ["example.com/hold"]
    real.ensure_crd(held)
    real.request("DELETE", CRD)
    with pytest.raises(ApiStatus) as exc:
        ensure_crd(cluster.api(), check_mode=False, wait=1.0)
    assert str(exc.value).startswith(
        f"API server {cluster.url}: the CustomResourceDefinition {NAME} was still being deleted after 1s (conditions: "
    )
    assert cluster.writes() == []


def test_two_hosts_creating_it_at_once_both_wait_for_it(cluster, no_layout_crd, make_plan):
    """Two first runs at once: one POST wins, the other gets 409 and waits for the CRD the winner made."""
    nodes = [cluster.node, cluster.add_node()]
    results: dict = {}

    def run(node):
        api = cluster.api(node)
        try:
            results[node] = (
                ensure_crd(api, check_mode=False),
                ensure_layout(api, layout_object(node, make_plan(), {}), False),
            )
        except ApiStatus as exc:  # pragma: no cover - the failure this test is about
            results[node] = str(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r[0] for r in results.values()) == ["created", "unchanged"], results
    assert [r[1] for r in results.values()] == ["created", "created"], results


def test_names_another_crd_holds_are_said_at_once_check_mode_too(cluster, no_layout_crd):
    real = cluster.real
    real.ensure_crd(clashing_crd())
    api = cluster.api()
    with pytest.raises(ApiStatus) as first:
        ensure_crd(api, check_mode=False, wait=20.0)  # creates ours; the server does not accept its names
    with pytest.raises(ApiStatus) as check:
        ensure_crd(api, check_mode=True, wait=20.0)
    for exc in (first, check):  # the real server checks the list kind first
        assert (
            f"the CustomResourceDefinition {NAME} cannot be used: "
            'NamesAccepted=False (ListKindConflict: "CpuPoolLayoutList" is already in use)'
        ) in str(exc.value)
        assert "another CustomResourceDefinition of group cpupools.io holds these names" in str(exc.value)
    assert [e["verb"] for e in cluster.writes()] == ["create"]  # ours, once; check mode wrote nothing
    assert conditions(real.get(CRD)) == {"NamesAccepted": "False", "Established": "False"}


def test_an_established_crd_is_unchanged_after_one_read(cluster):
    cluster.real.ensure_crd(layout_crd())
    assert ensure_crd(cluster.api(), check_mode=False) == "unchanged"
    assert [(e["verb"], e["requestURI"]) for e in cluster.events()] == [("get", CRD)]


# Against the fake: what a real server cannot be made to do at a chosen moment ---------------------


@pytest.fixture
def api(fake):
    return Api(stdlib_transport(Credentials(fake.url, None, TOKEN)), fake.url, "node-1")


def test_a_crd_never_established_fails_at_the_deadline_naming_its_conditions(fake, api):
    """Fake: a real server establishes an accepted CRD within milliseconds and cannot be held at Established=False."""
    fake.crd_establish_delay = 600
    with pytest.raises(ApiStatus) as exc:
        ensure_crd(api, check_mode=False, wait=1.0)
    assert str(exc.value) == (
        f"API server {fake.url}: the CustomResourceDefinition {NAME} was not Established within 1s "
        "(conditions: NamesAccepted=True (NoConflicts: no conflicts found), "
        "Established=False (Installing: the initial names have been accepted))"
    )
    assert [w.method for w in fake.writes()] == ["POST"]


def test_a_422_that_is_not_a_conflict_is_reported_after_one_read(fake, api, make_plan):
    """Fake: a real server does not refuse a valid node patch with 422 on demand."""
    # The node did not move since our read, so the 422 is the server refusing the change itself.
    fake.fail("PATCH", r"^/api/v1/nodes/node-1$", 422, 'Node "node-1" is invalid: metadata.labels: Invalid value')
    with pytest.raises(ApiStatus, match=r'failed with 422: Node "node-1" is invalid: metadata.labels'):
        ensure_node(api, desired_node(make_plan()), check_mode=False)
    assert [r.method for r in fake.requests] == ["GET", "PATCH", "GET"]


def test_a_layout_read_while_the_crds_storage_initializes_is_repeated(fake, api, make_plan):
    """Fake: the real server answers so only in the moment after a CRD is Established, too short to hit at will."""
    fake.add_crd(layout_crd())
    fake.fail("GET", r"/cpupoollayouts/node-1$", 429, "storage is (re)initializing", times=2)
    assert ensure_layout(api, layout_object("node-1", make_plan(), {}), check_mode=False) == "created"
    assert [r.method for r in fake.requests] == ["GET", "GET", "GET", "POST"]


def test_a_layout_write_refused_by_the_crds_old_storage_is_repeated_until_the_deadline(fake, api, make_plan):
    """Fake: the real server refuses so only while it swaps a just-updated CRD's storage (seen once in CI).

    After an update of the CRD the server tears the previous storage down; a request that reached it gets
    ``503 apiserver is shutting down`` before anything was stored, so the create and the update are sent again.
    """
    fake.add_crd(layout_crd())
    shutting = "apiserver is shutting down"
    fake.fail("POST", r"/cpupoollayouts$", 503, shutting, times=2)
    assert ensure_layout(api, layout_object("node-1", make_plan(), {}), check_mode=False) == "created"
    assert [r.method for r in fake.requests] == ["GET", "POST", "POST", "POST"]
    fake.fail("PUT", r"/cpupoollayouts/node-1$", 503, shutting)
    smaller = layout_object("node-1", make_plan(num_exclusive_cores=3), {})
    assert ensure_layout(api, smaller, check_mode=False) == "updated"
    assert [r.method for r in fake.requests][4:] == ["GET", "PUT", "PUT"]
    # A server that really stops: the write is refused at the deadline with what the server said.
    fake.fail("PUT", r"/cpupoollayouts/node-1$", 503, shutting, times=-1)
    with pytest.raises(ApiStatus, match=rf"PUT .*/cpupoollayouts/node-1 failed with 503: {shutting}"):
        ensure_layout(api, layout_object("node-1", make_plan(num_exclusive_cores=2), {}), check_mode=False, wait=0.5)


def test_the_uncordon_waits_for_a_ready_newer_than_the_drain_saw(cluster):
    """After a reboot the Node still says what the old kubelet posted: only a newer Ready readmits it."""
    from cpupools.cluster.k8s_apply import drain, wait_ready
    from cpupools.core.errors import K8sError
    from k8s_real import ready_condition

    api = cluster.api()
    drained = drain(api, False, timeout=10, poll=0.05)
    seen = drained["ready_heartbeat"]
    assert seen, drained  # the registration's Ready (tests/k8s_real.py posts it as the kubelet does)
    with pytest.raises(K8sError) as caught:
        wait_ready(api, seen, timeout=0.3, poll=0.05)
    assert "not Ready 0s after its kubelet was restarted (Ready: status True, reason KubeletReady" in str(caught.value)
    assert str(caught.value).endswith("the node stays cordoned") and caught.value.field == "k8s_drain_timeout"
    assert wait_ready(api, "", timeout=0.3, poll=0.05)["status"] == "True"  # no drain read: Ready is enough
    # The restarted kubelet's first status: a later heartbeat, from the node's own credentials.
    newer = dict(ready_condition(), lastHeartbeatTime="2999-01-01T00:00:00Z")
    patch = {"status": {"conditions": [newer]}}
    cluster.real.ok(
        "PATCH",
        f"/api/v1/nodes/{cluster.node}/status",
        patch,
        content_type="application/strategic-merge-patch+json",
        node=cluster.node,
    )
    assert wait_ready(api, seen, timeout=5, poll=0.05)["lastHeartbeatTime"] == "2999-01-01T00:00:00Z"
