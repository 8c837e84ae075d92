"""``cpupools.k8s_admission`` against the fake API server: discovery, publish, compare, remove, and the fake's rules."""

from __future__ import annotations

import copy
import json
import urllib.request

import pytest
from cpupools.errors import K8sError
from cpupools.k8s_admission import (
    BINDING_PLURAL,
    NAME,
    POLICY_PLURAL,
    desired_binding,
    desired_policy,
    ensure_admission,
    served_version,
)
from cpupools.k8s_advertise import Credentials, stdlib_transport
from cpupools.k8s_apply import Api, ApiStatus
from k8s_support import TOKEN

V1 = "/apis/admissionregistration.k8s.io/v1"
POLICY = f"{V1}/{POLICY_PLURAL}/{NAME}"
BINDING = f"{V1}/{BINDING_PLURAL}/{NAME}"


@pytest.fixture
def api(fake):
    return Api(stdlib_transport(Credentials(fake.url, None, TOKEN)), fake.url, "")


def send(fake, method: str, path: str, body: object = None, query: str = "") -> tuple[int, dict]:
    """A raw request, to pin what the fake accepts and refuses."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{fake.url}{path}{query}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"message": raw.decode()}


@pytest.mark.parametrize(
    ("versions", "server", "expected"),
    [(("v1",), "v1.36.1", "v1"), (("v1beta1",), "v1.35.2", "v1beta1"), ((), "v1.33.4", None)],
)
def test_the_served_version_is_found_by_discovery(fake, api, versions, server, expected):
    fake.admission_versions, fake.version = versions, server
    assert served_version(api) == expected


def test_first_run_creates_second_sends_no_write(fake, api):
    first = ensure_admission(api, "present", check_mode=False)
    assert (first["changed"], first["policy"], first["binding"]) == (True, "created", "created")
    assert first["api_version"] == "admissionregistration.k8s.io/v1" and first["server_version"] == "v1.36.1"
    stored = fake.admission[(POLICY_PLURAL, NAME)]
    assert stored["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"  # a server default
    assert fake.admission[(BINDING_PLURAL, NAME)]["spec"] == {"policyName": NAME}
    assert all(w.query.get("fieldValidation") == ["Strict"] for w in fake.writes())
    writes = len(fake.writes())
    second = ensure_admission(api, "present", check_mode=False)
    assert (second["changed"], second["policy"], second["binding"]) == (False, "unchanged", "unchanged")
    assert second["diff"]["before"] == second["diff"]["after"]
    assert len(fake.writes()) == writes


def test_check_mode_predicts_and_sends_only_reads(fake, api):
    predicted = ensure_admission(api, "present", check_mode=True)
    assert (predicted["changed"], predicted["policy"], predicted["binding"]) == (True, "created", "created")
    assert fake.writes() == [] and fake.admission == {}


def test_an_edited_policy_is_put_back_keeping_others_labels(fake, api):
    ensure_admission(api, "present", check_mode=False)
    _, current = send(fake, "GET", POLICY)
    edited = copy.deepcopy(current)
    edited["metadata"]["labels"]["team"] = "platform"
    edited["spec"]["failurePolicy"] = "Ignore"
    assert send(fake, "PUT", POLICY, edited)[0] == 200
    predicted = ensure_admission(api, "present", check_mode=True)
    assert predicted["policy"] == "updated" and predicted["binding"] == "unchanged"
    assert predicted["diff"]["before"]["policy"]["spec"]["failurePolicy"] == "Ignore"
    result = ensure_admission(api, "present", check_mode=False)
    assert result["policy"] == "updated"
    stored = fake.admission[(POLICY_PLURAL, NAME)]
    assert stored["spec"]["failurePolicy"] == "Fail" and stored["metadata"]["labels"]["team"] == "platform"
    assert stored["metadata"]["generation"] == 3


def test_a_concurrent_writer_is_read_again_not_overwritten(fake, api):
    ensure_admission(api, "present", check_mode=False)
    fake.admission[(POLICY_PLURAL, NAME)]["spec"]["failurePolicy"] = "Ignore"

    def touch():
        fake.admission[(POLICY_PLURAL, NAME)]["metadata"]["resourceVersion"] = "999999"

    fake.before("PUT", f"{POLICY_PLURAL}/{NAME}$", touch)
    result = ensure_admission(api, "present", check_mode=False)
    assert result["policy"] == "updated"
    assert [w.method for w in fake.writes()][-2:] == ["PUT", "PUT"]
    assert fake.admission[(POLICY_PLURAL, NAME)]["spec"]["failurePolicy"] == "Fail"


def test_a_server_without_the_api_gets_a_warning_naming_its_version_and_no_write(fake, api):
    fake.admission_versions, fake.version = (), "v1.33.4"
    result = ensure_admission(api, "present", check_mode=False)
    assert (result["changed"], result["policy"], result["api_version"]) == (False, "unsupported", None)
    (warning,) = result["warnings"]
    assert f"API server {fake.url} (v1.33.4) serves no MutatingAdmissionPolicy" in warning
    assert "README.md" in warning
    assert fake.writes() == []


def test_a_beta_server_gets_the_same_objects_as_v1beta1(fake, api):
    fake.admission_versions, fake.version = ("v1beta1",), "v1.35.0"
    result = ensure_admission(api, "present", check_mode=False)
    assert result["api_version"] == "admissionregistration.k8s.io/v1beta1" and result["policy"] == "created"
    assert {w.path.split("/")[3] for w in fake.writes()} == {"v1beta1"}
    # the upgrade to 1.36 serves the same object as v1: nothing to change
    fake.admission_versions = ("v1", "v1beta1")
    assert ensure_admission(api, "present", check_mode=False)["changed"] is False


def test_absent_keeps_the_policy_while_other_nodes_are_cpupools_nodes(fake, api):
    ensure_admission(api, "present", check_mode=False)
    fake.add_node("node-2", labels={"cmk.intel.com/cmk-node": "true"})
    fake.nodes["node-1"]["metadata"]["labels"]["cmk.intel.com/cmk-node"] = "true"
    kept = ensure_admission(api, "absent", check_mode=False, departing=["node-1"])
    assert (kept["changed"], kept["policy"], kept["kept_for"]) == (False, "kept", ["node-2"])
    predicted = ensure_admission(api, "absent", check_mode=True, departing=["node-1", "node-2"])
    assert (predicted["policy"], predicted["binding"]) == ("deleted", "deleted")
    assert len(fake.admission) == 2
    gone = ensure_admission(api, "absent", check_mode=False, departing=["node-1", "node-2"])
    assert (gone["changed"], gone["policy"], gone["binding"]) == (True, "deleted", "deleted")
    assert fake.admission == {}
    deletes = [w.path for w in fake.writes() if w.method == "DELETE"]
    assert deletes == [BINDING, POLICY]
    again = ensure_admission(api, "absent", check_mode=False, departing=["node-1", "node-2"])
    assert (again["changed"], again["policy"]) == (False, "absent")


def test_forbidden_names_the_server_and_the_permissions(fake, api):
    fake.fail("POST", f"{POLICY_PLURAL}$", 403, 'mutatingadmissionpolicies is forbidden: User "ops" cannot create')
    with pytest.raises(ApiStatus) as exc:
        ensure_admission(api, "present", check_mode=False)
    assert str(exc.value).startswith(f"API server {fake.url}: POST {V1}/{POLICY_PLURAL} is forbidden (403): ")
    assert "get/create/update/delete" in str(exc.value)


def test_bad_options_are_refused_before_any_request(fake, api):
    with pytest.raises(K8sError, match="opt-in label"):
        ensure_admission(api, "present", check_mode=False, opt_in="not a label")
    assert fake.requests == []


# The fake's rules: what a v1.36 server refuses ---------------------------------------------


def test_the_fake_refuses_unknown_fields_under_strict_validation_and_drops_them_otherwise(fake):
    policy = desired_policy("v1")
    policy["spec"]["mutation"] = []  # a typo of "mutations"
    code, body = send(fake, "POST", f"{V1}/{POLICY_PLURAL}", policy, "?fieldValidation=Strict")
    assert code == 400 and body["message"] == 'strict decoding error: unknown field "spec.mutation"'
    code, body = send(fake, "POST", f"{V1}/{POLICY_PLURAL}", policy)
    assert code == 201 and "mutation" not in body["spec"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("mutations"), "spec.mutations: Required value"),
        (lambda s: s.pop("reinvocationPolicy"), "spec.reinvocationPolicy: Required value"),
        (lambda s: s.pop("matchConstraints"), "spec.matchConstraints: Required value"),
        (
            lambda s: s["matchConstraints"]["resourceRules"][0].update(operations=["DELETE"]),
            'spec.matchConstraints.resourceRules[0].operations[0]: Unsupported value: "DELETE"',
        ),
        (lambda s: s["mutations"][0].update(patchType="Merge"), "spec.mutations[0].patchType: Unsupported value"),
        (
            lambda s: s["mutations"][1].update(jsonPatch={"expression": "[]"}),
            "spec.mutations[1].jsonPatch: Forbidden",
        ),
        (
            lambda s: s["matchConditions"][0].update(expression="object.spec.containers.exists(c,"),
            "spec.matchConditions[0].expression: Invalid value: compilation failed",
        ),
        (lambda s: s.update(failurePolicy="fail"), 'spec.failurePolicy: Unsupported value: "fail"'),
    ],
)
def test_the_fake_refuses_what_v1_36_refuses(fake, edit, message):
    policy = desired_policy("v1")
    edit(policy["spec"])
    code, body = send(fake, "POST", f"{V1}/{POLICY_PLURAL}", policy, "?fieldValidation=Strict")
    assert code == 422, body
    assert message in body["message"]
    assert body["message"].startswith(f'{POLICY_PLURAL}.admissionregistration.k8s.io "{NAME}" is invalid: [')


def test_the_fake_refuses_a_binding_without_its_policy_name_and_serves_only_enabled_versions(fake):
    binding = desired_binding("v1")
    binding["spec"] = {}
    code, body = send(fake, "POST", f"{V1}/{BINDING_PLURAL}", binding)
    assert code == 422 and "spec.policyName: Required value" in body["message"]
    code, _ = send(fake, "GET", f"/apis/admissionregistration.k8s.io/v1beta1/{BINDING_PLURAL}")
    assert code == 404
    fake.admission_versions = ()
    code, body = send(fake, "GET", f"{V1}/{BINDING_PLURAL}")
    assert code == 404 and body["message"] == "the server could not find the requested resource"
