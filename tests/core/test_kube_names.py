"""One vocabulary of Kubernetes' names: the inventory's check and the API side accept and refuse the same."""

from __future__ import annotations

import pytest
from cpupools.cluster.k8s import check_extended_resource, check_qualified_name
from cpupools.core.errors import CpupoolsError
from cpupools.core.kube_names import extended_resource_fault
from cpupools.planning.inputs import to_label_key, to_resource

#: name -> whether the API server takes it as an extended resource (its IsExtendedResourceName).
RESOURCES = {
    "cmk.intel.com/exclusive-cores": True,
    "example.com/a_b.c": True,
    "requests/x": True,  # a domain named "requests" is not the quota prefix "requests."
    "limits/x": True,
    "kubernetes.io/x": False,
    "node.kubernetes.io/x": False,
    "notkubernetes.io/x": False,  # "kubernetes.io/" is in it: Kubernetes counts it as its own
    "requests.example.com/x": False,
    "exclusive-cores": False,
    "Example.com/x": False,
    "example.com/-x": False,
    "example.com/" + "x" * 63: True,
    "example.com/" + "x" * 64: False,
    "a" * 244 + "/x": True,  # requests.<244 characters> is the longest prefix a quota can name
    "a" * 245 + "/x": False,
    "example.com/x\n": False,  # a regular expression's $ would take the newline
}


@pytest.mark.parametrize(("name", "valid"), RESOURCES.items(), ids=lambda v: str(v)[:40])
def test_the_inputs_and_the_api_side_agree_on_an_extended_resource_name(name, valid):
    assert (extended_resource_fault(name) is None) == valid
    for check in (lambda: to_resource(name, "k8s_exclusive_resource"), lambda: check_extended_resource(name, "x")):
        if valid:
            assert check() == name
        else:
            with pytest.raises(CpupoolsError):
                check()


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("example.com/inject", True),
        ("inject", False),
        ("EXAMPLE.com/x", False),
        ("example.com/x-", False),
        ("example.com\n/x", False),
    ],
)
def test_the_inputs_and_the_api_side_agree_on_a_label_key_with_a_domain(key, valid):
    for check in (lambda: to_label_key(key, "k8s_admission_opt_in"), lambda: check_qualified_name(key, "k", "x", True)):
        if valid:
            assert check() == key
        else:
            with pytest.raises(CpupoolsError):
                check()
