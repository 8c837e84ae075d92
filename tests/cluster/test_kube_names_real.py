"""The extended resource names core/kube_names.py accepts are ones the real API server accepts in a pod.

The server also takes a name with ``kubernetes.io/`` in it in a pod's limits, as
one of Kubernetes' own (prefixed native) resources, not as an extended one: a
device plugin may not register such a name, and the domain is Kubernetes'. We
refuse those; every other name we and the server judge alike.
"""

from __future__ import annotations

from cpupools.core.kube_names import extended_resource_fault

#: The hard cases of tests/core/test_kube_names.py, asked of the server.
NAMES = (
    "example.com/a_b.c",
    "requests/x",
    "limits/x",
    "kubernetes.io/x",
    "node.kubernetes.io/x",
    "notkubernetes.io/x",
    "requests.example.com/x",
    "a" * 244 + "/x",
    "a" * 245 + "/x",
)


def test_the_server_takes_exactly_the_extended_resource_names_we_take(real_kube):
    namespace = real_kube.namespace(real_kube.unique("names"))
    verdicts = {}
    for name in NAMES:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "names-"},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [
                    {"name": "app", "image": "registry.example/app:1", "resources": {"limits": {name: "1"}}}
                ],
            },
        }
        resp = real_kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body, query={"dryRun": "All"})
        assert resp.status in (201, 422), (name, resp.status, resp.body)
        verdicts[name] = resp.status == 201
    ours = {name: extended_resource_fault(name) is None for name in NAMES}
    assert {name: ok for name, ok in verdicts.items() if "kubernetes.io/" not in name} == {
        name: ok for name, ok in ours.items() if "kubernetes.io/" not in name
    }
    assert [name for name in NAMES if "kubernetes.io/" in name and ours[name]] == []
