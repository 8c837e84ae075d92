"""``cpupools.cluster.k8s_admission``: discovery, publish, compare, remove, against the real server (v1.36, ``v1``).

An older server (``v1beta1`` on 1.35, nothing on 1.33) and a writer at a
chosen moment stay on the fake, each saying so.
"""

from __future__ import annotations

import copy

import pytest
from cpupools.cluster.k8s_admission import (
    BINDING_PLURAL,
    NAME,
    POLICY_PLURAL,
    desired_binding,
    desired_policy,
    ensure_admission,
    served_version,
)
from cpupools.cluster.k8s_advertise import Credentials, stdlib_transport
from cpupools.cluster.k8s_apply import Api, ApiStatus
from cpupools.core.errors import K8sError
from k8s_support import TOKEN

V1 = "/apis/admissionregistration.k8s.io/v1"
POLICY = f"{V1}/{POLICY_PLURAL}/{NAME}"
BINDING = f"{V1}/{BINDING_PLURAL}/{NAME}"
CMK_LABEL = "cmk.intel.com/cmk-node"


@pytest.fixture
def api(cluster, no_admission):
    return cluster.api("")


def writes(cluster):
    return [e for e in cluster.writes() if "admissionregistration" in e["requestURI"]]


def test_the_served_version_is_found_by_discovery(api):
    assert served_version(api) == "v1"


def test_first_run_creates_second_sends_no_write(cluster, api):
    first = ensure_admission(api, "present", check_mode=False)
    assert (first["changed"], first["policy"], first["binding"]) == (True, "created", "created")
    assert first["api_version"] == "admissionregistration.k8s.io/v1" and first["server_version"] == "v1.36.2"
    stored = cluster.real.get(POLICY)
    assert stored["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"  # a server default
    assert cluster.real.get(BINDING)["spec"]["policyName"] == NAME
    assert all("fieldValidation=Strict" in e["requestURI"] for e in writes(cluster))
    count = len(cluster.writes())
    second = ensure_admission(api, "present", check_mode=False)
    assert (second["changed"], second["policy"], second["binding"]) == (False, "unchanged", "unchanged")
    assert second["diff"]["before"] == second["diff"]["after"]
    assert len(cluster.writes()) == count


def test_check_mode_predicts_and_sends_only_reads(cluster, api):
    predicted = ensure_admission(api, "present", check_mode=True)
    assert (predicted["changed"], predicted["policy"], predicted["binding"]) == (True, "created", "created")
    assert cluster.writes() == [] and cluster.real.get(POLICY) is None


def test_an_edited_policy_is_put_back_keeping_others_labels(cluster, api):
    ensure_admission(api, "present", check_mode=False)
    edited = copy.deepcopy(cluster.real.get(POLICY))
    edited["metadata"]["labels"]["team"] = "platform"
    edited["spec"]["failurePolicy"] = "Ignore"
    cluster.real.ok("PUT", POLICY, edited)
    predicted = ensure_admission(api, "present", check_mode=True)
    assert predicted["policy"] == "updated" and predicted["binding"] == "unchanged"
    assert predicted["diff"]["before"]["policy"]["spec"]["failurePolicy"] == "Ignore"
    result = ensure_admission(api, "present", check_mode=False)
    assert result["policy"] == "updated"
    stored = cluster.real.get(POLICY)
    assert stored["spec"]["failurePolicy"] == "Fail" and stored["metadata"]["labels"]["team"] == "platform"
    assert stored["metadata"]["generation"] == 3


def test_absent_keeps_the_policy_while_other_nodes_are_cpupools_nodes(cluster, api):
    ensure_admission(api, "present", check_mode=False)
    node_1, node_2 = cluster.node, cluster.add_node(labels={CMK_LABEL: "true"})
    label = {"metadata": {"labels": {CMK_LABEL: "true"}}}
    cluster.real.ok("PATCH", f"/api/v1/nodes/{node_1}", label, content_type="application/merge-patch+json")
    kept = ensure_admission(api, "absent", check_mode=False, departing=[node_1])
    assert (kept["changed"], kept["policy"], kept["kept_for"]) == (False, "kept", [node_2])
    predicted = ensure_admission(api, "absent", check_mode=True, departing=[node_1, node_2])
    assert (predicted["policy"], predicted["binding"]) == ("deleted", "deleted")
    assert cluster.real.get(POLICY) is not None and cluster.real.get(BINDING) is not None
    gone = ensure_admission(api, "absent", check_mode=False, departing=[node_1, node_2])
    assert (gone["changed"], gone["policy"], gone["binding"]) == (True, "deleted", "deleted")
    assert cluster.real.get(POLICY) is None and cluster.real.get(BINDING) is None
    deletes = [e["requestURI"] for e in cluster.writes() if e["verb"] == "delete"]
    assert deletes == [BINDING, POLICY]
    again = ensure_admission(api, "absent", check_mode=False, departing=[node_1, node_2])
    assert (again["changed"], again["policy"]) == (False, "absent")


def test_forbidden_names_the_server_and_the_permissions(cluster, no_admission):
    nobody = cluster.api("", token=cluster.real.controller_token)  # a user granted nothing
    with pytest.raises(ApiStatus) as exc:
        ensure_admission(nobody, "present", check_mode=False)
    assert str(exc.value).startswith(f"API server {cluster.url}: GET {POLICY} is forbidden (403): ")
    assert "get/create/update/delete" in str(exc.value)


def test_bad_options_are_refused_before_any_request(cluster, api):
    with pytest.raises(K8sError, match="opt-in label"):
        ensure_admission(api, "present", check_mode=False, opt_in="not a label")
    assert cluster.events() == []


def test_the_server_refuses_unknown_fields_under_strict_validation(cluster, no_admission):
    """Why every write asks for ``fieldValidation=Strict``: without it a misspelt field is dropped silently."""
    policy = desired_policy("v1")
    policy["spec"]["mutation"] = []  # a typo of "mutations"
    resp = cluster.real.request("POST", f"{V1}/{POLICY_PLURAL}", policy, query={"fieldValidation": "Strict"})
    assert resp.status == 400 and 'unknown field "spec.mutation"' in resp.body["message"], resp.body
    dry = cluster.real.request("POST", f"{V1}/{POLICY_PLURAL}", policy, query={"dryRun": "All"})
    assert dry.status == 201 and "mutation" not in dry.body["spec"]


def test_the_server_refuses_a_binding_without_its_policy_name(cluster, no_admission):
    binding = desired_binding("v1")
    binding["spec"] = {}
    resp = cluster.real.request("POST", f"{V1}/{BINDING_PLURAL}", binding, query={"dryRun": "All"})
    assert resp.status == 422 and "spec.policyName: Required value" in resp.body["message"], resp.body


# Against the fake: older servers, and a writer at a chosen moment --------------------------------


@pytest.fixture
def fake_api(fake):
    return Api(stdlib_transport(Credentials(fake.url, None, TOKEN)), fake.url, "")


@pytest.mark.parametrize(
    ("versions", "server", "expected"), [(("v1beta1",), "v1.35.2", "v1beta1"), ((), "v1.33.4", None)]
)
def test_older_servers_are_found_by_discovery(fake, fake_api, versions, server, expected):
    """Fake: the real server of the tests is v1.36."""
    fake.admission_versions, fake.version = versions, server
    assert served_version(fake_api) == expected


def test_a_concurrent_writer_is_read_again_not_overwritten(fake, fake_api):
    """Fake: the other writer must land between our read and our PUT, a moment a real server cannot be held at."""
    ensure_admission(fake_api, "present", check_mode=False)
    fake.admission[(POLICY_PLURAL, NAME)]["spec"]["failurePolicy"] = "Ignore"

    def touch():
        fake.admission[(POLICY_PLURAL, NAME)]["metadata"]["resourceVersion"] = "999999"

    fake.before("PUT", f"{POLICY_PLURAL}/{NAME}$", touch)
    result = ensure_admission(fake_api, "present", check_mode=False)
    assert result["policy"] == "updated"
    assert [w.method for w in fake.writes()][-2:] == ["PUT", "PUT"]
    assert fake.admission[(POLICY_PLURAL, NAME)]["spec"]["failurePolicy"] == "Fail"


def test_a_server_without_the_api_gets_a_warning_naming_its_version_and_no_write(fake, fake_api):
    """Fake: an older server (1.33) serves no MutatingAdmissionPolicy."""
    fake.admission_versions, fake.version = (), "v1.33.4"
    result = ensure_admission(fake_api, "present", check_mode=False)
    assert (result["changed"], result["policy"], result["api_version"]) == (False, "unsupported", None)
    (warning,) = result["warnings"]
    assert f"API server {fake.url} (v1.33.4) serves no MutatingAdmissionPolicy" in warning
    assert "README.md" in warning
    assert fake.writes() == []


def test_a_beta_server_gets_the_same_objects_as_v1beta1(fake, fake_api):
    """Fake: an older server (1.35 with the feature gate) serves v1beta1 only."""
    fake.admission_versions, fake.version = ("v1beta1",), "v1.35.0"
    result = ensure_admission(fake_api, "present", check_mode=False)
    assert result["api_version"] == "admissionregistration.k8s.io/v1beta1" and result["policy"] == "created"
    assert {w.path.split("/")[3] for w in fake.writes()} == {"v1beta1"}
    # the upgrade to 1.36 serves the same object as v1: nothing to change
    fake.admission_versions = ("v1", "v1beta1")
    assert ensure_admission(fake_api, "present", check_mode=False)["changed"] is False
