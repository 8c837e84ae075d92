"""Fixtures of the Kubernetes tests: the real API server (per test: its own names), the fake, kubeconfigs, plans."""

from __future__ import annotations

import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpupools.cluster.k8s_advertise import Credentials, stdlib_transport
from cpupools.cluster.k8s_apply import Api
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools
from k8s_fake import FakeKube, make_pki, write_kubeconfig
from k8s_real import PRODUCT_USER, RealKube
from k8s_support import TOKEN

#: What the first node of each test carries before cpupools touches it (a label and a taint of someone else's).
NODE_LABELS = {"team": "blue"}
NODE_TAINTS = [{"key": "dedicated", "value": "rt", "effect": "NoExecute"}]


@dataclass
class Cluster:
    """One test's view of the shared real server: its own node and namespace names, and what it sent."""

    real: RealKube
    tmp_path: Path
    node: str
    mark: int
    names: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.real.url

    def add_node(self, stem: str = "node", **kw) -> str:
        name = self.real.unique(stem)
        self.real.add_node(name, **kw)
        self.names.append(name)
        return name

    def kubeconfig(self, name: str = "kubeconfig", **kw) -> Path:
        """A kubeconfig for the product (an admin: ``cpupools-admin``), or as ``real.kubeconfig`` says."""
        if not kw:
            kw = {"token": self.real.product_token}
        return self.real.kubeconfig(self.tmp_path / name, **kw)

    def api(self, node: str | None = None, token: str | None = None) -> Api:
        """``k8s_apply.Api`` over the agent's stdlib transport, as the product (or ``token``'s user), for ``node``."""
        context = ssl.create_default_context(cafile=str(self.real.pki.ca))
        transport = stdlib_transport(Credentials(self.url, context, token or self.real.product_token))
        return Api(transport, self.url, node if node is not None else self.node)

    def writes(self, user: str | None = PRODUCT_USER) -> list[dict]:
        """The write requests the product sent in this test so far (audit events; ``user=None``: anyone's)."""
        return self.real.audit_writes(self.mark, user)

    def events(self, user: str | None = PRODUCT_USER) -> list[dict]:
        """Every request the product sent in this test so far."""
        return self.real.audit(self.mark, user)


@pytest.fixture
def cluster(real_kube, tmp_path):
    """The real API server with a fresh node (``cluster.node``, label team=blue, taint dedicated=rt:NoExecute)."""
    node = real_kube.unique("node")
    real_kube.add_node(node, labels=dict(NODE_LABELS), taints=[dict(t) for t in NODE_TAINTS])
    cluster = Cluster(real_kube, tmp_path, node, real_kube.audit_mark(), [node])
    yield cluster
    for name in cluster.names:  # Nodes are cluster-wide: what selects by node label must not see these again
        real_kube.delete_node(name)


@pytest.fixture
def nri_crds(real_kube):
    """The two nri-plugins policy CRDs (tests/fixtures/crds/nri-plugins.yaml), removed again after the test."""
    from runtime_rules import nri_crd

    kinds = ("BalloonsPolicy", "TopologyAwarePolicy")
    for kind in kinds:
        real_kube.ensure_crd(nri_crd(kind))
    yield
    for kind in kinds:
        real_kube.delete_crd(nri_crd(kind)["metadata"]["name"])


ADMISSION = "/apis/admissionregistration.k8s.io/v1"
LAYOUT_CRD = "cpupoollayouts.cpupools.io"


@pytest.fixture
def no_layout_crd(real_kube):
    """The layout CRD is cluster-wide: this test starts without it (so the run creates it)."""
    real_kube.delete_crd(LAYOUT_CRD)


@pytest.fixture
def no_admission(real_kube):
    """Neither the cluster-wide pod injection policy nor its binding, before and after the test."""

    def remove():
        for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
            real_kube.request("DELETE", f"{ADMISSION}/{plural}/cpupools-cmk-inject")

    remove()
    yield
    remove()


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
