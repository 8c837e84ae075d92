"""Fixtures of the Kubernetes tests: the wire-level fake, kubeconfigs, plans."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpupools.plan import make_request, plan_pools
from cpupools.topology import gather_topology
from k8s_fake import FakeKube, make_pki, write_kubeconfig
from k8s_support import TOKEN


@pytest.fixture
def fake():
    """The fake API server over plain HTTP, bearer token required, one node ``node-1``."""
    with FakeKube(token=TOKEN) as kube:
        kube.add_node(
            "node-1", labels={"team": "blue"}, taints=[{"key": "dedicated", "value": "rt", "effect": "NoExecute"}]
        )
        yield kube


@pytest.fixture
def kubeconfig(tmp_path, fake):
    return write_kubeconfig(tmp_path / "kubeconfig", fake.url, token=TOKEN)


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), node="node-1")


@pytest.fixture(scope="session")
def make_plan(corpus_root):
    def make(name: str = "2s22c-smt2", **request) -> dict:
        raw = {"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"}
        raw.update(request)
        return plan_pools(gather_topology(str(corpus_root[name])), make_request(raw))

    return make
