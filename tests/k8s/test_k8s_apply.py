"""``cpupools.k8s_apply.ensure_crd`` over the agent's stdlib transport, against the fake: the CRD conditions."""

from __future__ import annotations

import pytest
from cpupools.k8s import desired_node, layout_crd
from cpupools.k8s_advertise import Credentials, stdlib_transport
from cpupools.k8s_apply import Api, ApiStatus, ensure_crd, ensure_node
from k8s_support import TOKEN

NAME = "cpupoollayouts.cpupools.io"


@pytest.fixture
def api(fake):
    return Api(stdlib_transport(Credentials(fake.url, None, TOKEN)), fake.url, "node-1")


def clashing_crd() -> dict:
    other = layout_crd()
    other["metadata"] = {"name": "pools.cpupools.io"}
    other["spec"]["names"] = {"kind": "CpuPoolLayout", "plural": "pools", "singular": "pool"}
    return other


def test_a_crd_never_established_fails_at_the_deadline_naming_its_conditions(fake, api):
    fake.crd_establish_delay = 600
    with pytest.raises(ApiStatus) as exc:
        ensure_crd(api, check_mode=False, wait=1.0)
    assert str(exc.value) == (
        f"API server {fake.url}: the CustomResourceDefinition {NAME} was not Established within 1s "
        "(conditions: NamesAccepted=True (NoConflicts: no conflicts found), "
        "Established=False (Installing: the initial names have been accepted))"
    )
    assert [w.method for w in fake.writes()] == ["POST"]


def test_check_mode_predicts_the_name_clash_and_writes_nothing(fake, api):
    fake.add_crd(clashing_crd())
    fake.add_crd(layout_crd())  # ours, left by an earlier run: its names were never accepted
    with pytest.raises(ApiStatus, match=r'NamesAccepted=False \(KindConflict: "CpuPoolLayout" is already in use\)'):
        ensure_crd(api, check_mode=True, wait=5.0)
    assert fake.writes() == []


def test_a_crd_being_deleted_is_said_at_once(fake, api):
    crd = fake.add_crd(layout_crd())
    crd["status"]["conditions"].append(
        {"type": "Terminating", "status": "True", "reason": "InstanceDeletionInProgress", "message": "deleting"}
    )
    with pytest.raises(ApiStatus, match="it is being deleted; run again once the deletion has finished"):
        ensure_crd(api, check_mode=False, wait=30.0)
    assert fake.writes() == []


def test_an_established_crd_is_unchanged_after_one_read(fake, api):
    fake.add_crd(layout_crd())
    assert ensure_crd(api, check_mode=False) == "unchanged"
    assert [(r.method, r.path) for r in fake.requests] == [
        ("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{NAME}")
    ]


def test_a_422_that_is_not_a_conflict_is_reported_after_one_read(fake, api, make_plan):
    # The node did not move since our read, so the 422 is the server refusing the change itself.
    fake.fail("PATCH", r"^/api/v1/nodes/node-1$", 422, 'Node "node-1" is invalid: metadata.labels: Invalid value')
    with pytest.raises(ApiStatus, match=r'failed with 422: Node "node-1" is invalid: metadata.labels'):
        ensure_node(api, desired_node(make_plan()), check_mode=False)
    assert [r.method for r in fake.requests] == ["GET", "PATCH", "GET"]
