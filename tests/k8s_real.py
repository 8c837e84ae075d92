"""A real Kubernetes control plane for tests: etcd and kube-apiserver on loopback (never part of the product).

``RealKube.start(bin_dir, work_dir)`` starts the two programs, static builds of
kube-apiserver v1.36 and etcd 3.6 (docs/kubernetes.md), found in the directory
named by ``CPUPOOLS_K8S_ASSETS`` or ``KUBEBUILDER_ASSETS`` (envtest's
convention), and makes for them, in ``work_dir``:

- a CA, a serving certificate for ``IP:127.0.0.1`` and ``DNS:localhost``, a
  key pair for service-account tokens;
- ``tokens.csv``: two admins (``system:masters``), one for the tests' own
  setup and one (``cpupools-admin``) for the product's requests, so the audit
  log tells them apart; and a ``cpupools`` user with no rights of its own
  (tests bind docs/kubernetes.md's ClusterRole to it);
- per node, on demand, a kubelet's client certificate
  (``CN=system:node:<name>, O=system:nodes``) signed by the CA;
- an audit log of every request (``Request`` level, with the body, for
  writes; ``Metadata`` for the rest) that tests read to prove what was sent.

The server runs with ``--authorization-mode=Node,RBAC`` and the
``NodeRestriction`` admission plugin, as a kubeadm cluster does. There is no
controller manager, scheduler or kubelet: a test that needs what they would
do (a service account ``default``, a pod's status, a pod's final deletion)
does it itself, as admin.

The servers run in process groups of their own, watched by a reaper
(``REAPER``) that ends them when the process that started them ends,
however it ends: a killed pytest worker leaves no server behind
(tests/test_k8s_real.py kills one).

Tests share one server per pytest process and keep out of each other's way
by names: every test gets its own node names and namespaces
(``RealKube.unique``); the few cluster-wide objects with fixed names (the
layout CRD, the pod injection policy, CMK's RBAC) are reset by the tests that
use them.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

from helpers import wait_for

ASSET_VARIABLES = ("CPUPOOLS_K8S_ASSETS", "KUBEBUILDER_ASSETS")
PROGRAMS = ("etcd", "kube-apiserver")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ADMIN_USER = "kube-admin"
#: The admin the product's requests run as in tests (so the audit log tells them from the tests' own setup).
PRODUCT_USER = "cpupools-admin"
#: A user with no rights of its own: tests bind docs/kubernetes.md's ClusterRole to it.
CONTROLLER_USER = "cpupools"
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
"""
NOT_READY = "node.kubernetes.io/not-ready"
#: The reaper of a ``RealKube``'s servers: a process of its own session (a Ctrl-C of the run does not
#: reach it) that reads the servers' process groups from a pipe whose write end only the process that
#: started them holds. At the end of the pipe, when that process ends however it ends (SIGKILL
#: included, where no ``finally`` and no fixture teardown runs), it ends the groups: SIGTERM, and
#: SIGKILL for what is left after 10 s.
REAPER = """
import os, signal, sys, time
for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(number, signal.SIG_IGN)
fd, data = int(sys.argv[1]), b""
while chunk := os.read(fd, 4096):
    data += chunk
groups = [int(word) for word in data.split()]
def alive():
    out = []
    for group in groups:
        try:
            os.killpg(group, 0)
            out.append(group)
        except ProcessLookupError:
            pass
    return out
for number, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
    for group in alive():
        try:
            os.killpg(group, number)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def assets_dir() -> tuple[Path | None, str]:
    """The directory holding etcd and kube-apiserver, or ``None`` and why not (one line)."""
    for name in ASSET_VARIABLES:
        value = os.environ.get(name)
        if value:
            path = Path(value)
            missing = [p for p in PROGRAMS if not os.access(path / p, os.X_OK)]
            if missing:
                return None, f"{name}={value} has no executable {', '.join(missing)}"
            return path, ""
    return None, (
        "no real API server: set KUBEBUILDER_ASSETS (or CPUPOOLS_K8S_ASSETS) to a directory with etcd and "
        "kube-apiserver, e.g. ../shared/k8s/bin"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Certificates -----------------------------------------------------------------


@dataclass
class Pki:
    directory: Path
    ca_cert: object = None
    ca_key: object = None

    def __post_init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        self.directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "cpupools-test-ca")])
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key()), critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.write("ca.crt", self._pem(self.ca_cert))

    @staticmethod
    def _pem(cert) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return cert.public_bytes(serialization.Encoding.PEM)

    @staticmethod
    def _key_pem(key) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def write(self, name: str, data: bytes, private: bool = False) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        if private:
            path.chmod(0o600)
        return path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def leaf(
        self, stem: str, common_name: str, org: str | None, server: bool, extra_ips: tuple[str, ...] = ()
    ) -> tuple[Path, Path]:
        """A certificate signed by the CA and its key: ``stem.crt``, ``stem.key``.

        A serving certificate is for ``localhost``, ``127.0.0.1`` and ``extra_ips``.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False)
        )
        if server:
            san = [x509.DNSName("localhost")]
            san += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", *extra_ips)]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return self.write(f"{stem}.crt", self._pem(cert)), self.write(f"{stem}.key", self._key_pem(key), True)

    def service_account_keys(self) -> tuple[Path, Path]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return self.write("sa.pub", public), self.write("sa.key", self._key_pem(key), True)


@dataclass(frozen=True)
class NodeCredentials:
    """A kubelet's client certificate: ``cert`` and ``key``, and ``pem`` (both, like kubelet-client-current.pem)."""

    name: str
    cert: Path
    key: Path
    pem: Path


# The server -------------------------------------------------------------------


@dataclass
class ApiResponse:
    status: int
    body: object
    headers: dict = field(default_factory=dict)


@dataclass
class RealKube:
    """A running etcd + kube-apiserver; ``url``, ``ca``, ``token`` (admin) and helpers for tests."""

    work: Path
    url: str
    pki: Pki
    token: str
    product_token: str
    controller_token: str
    audit_log: Path
    processes: list = field(default_factory=list)
    started_in: float = 0.0
    #: The reaper (``REAPER``) and the write end of its pipe.
    _reaper: subprocess.Popen | None = None
    _reaper_pipe: int | None = None
    _counter: int = 0
    _ssl: ssl.SSLContext | None = None
    #: Each ``deny``'s dry-run create, by policy name: ``undeny`` waits until it passes again.
    _probes: dict = field(default_factory=dict)

    # -- lifecycle
    @classmethod
    def start(cls, bin_dir: Path, work: Path, timeout: float = 60.0, server_ips: tuple[str, ...] = ()) -> RealKube:
        """Start etcd and kube-apiserver; ``server_ips``: more addresses the serving certificate is for.

        The server listens on 127.0.0.1 only; a qemu guest reaches it there as
        its user network's 10.0.2.2, which the certificate must then name.
        """
        began = time.monotonic()
        work.mkdir(parents=True, exist_ok=True)
        pki = Pki(work / "pki")
        serving_cert, serving_key = pki.leaf("apiserver", "kube-apiserver", None, server=True, extra_ips=server_ips)
        sa_pub, sa_key = pki.service_account_keys()
        token, product_token, controller_token = (secrets.token_hex(16) for _ in range(3))
        tokens = work / "tokens.csv"
        tokens.write_text(
            f'{token},{ADMIN_USER},uid-admin,"system:masters"\n'
            f'{product_token},{PRODUCT_USER},uid-product,"system:masters"\n'
            f"{controller_token},{CONTROLLER_USER},uid-cpupools,\n"
        )
        tokens.chmod(0o600)
        policy = work / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit_log = work / "audit.log"
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        logs = work / "logs"
        logs.mkdir(exist_ok=True)
        kube = cls(work, f"https://127.0.0.1:{api_port}", pki, token, product_token, controller_token, audit_log)
        try:
            kube._start_reaper()
            kube._spawn(
                "etcd",
                [
                    str(bin_dir / "etcd"),
                    f"--data-dir={work / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync=true",
                ],
                logs,
            )
            kube._wait(lambda: _etcd_healthy(etcd_port), began + timeout, "etcd", logs)
            kube._spawn(
                "kube-apiserver",
                [
                    str(bin_dir / "kube-apiserver"),
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    f"--tls-cert-file={serving_cert}",
                    f"--tls-private-key-file={serving_key}",
                    f"--client-ca-file={pki.ca}",
                    f"--token-auth-file={tokens}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={sa_pub}",
                    f"--service-account-signing-key-file={sa_key}",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    "--endpoint-reconciler-type=none",
                    f"--cert-dir={work / 'certs'}",
                    f"--audit-policy-file={policy}",
                    f"--audit-log-path={audit_log}",
                    "--audit-log-format=json",
                    "--audit-log-mode=blocking",
                ],
                logs,
            )
            kube._wait(kube._ready, began + timeout, "kube-apiserver", logs)
        except BaseException:
            kube.stop()
            raise
        kube.started_in = time.monotonic() - began
        return kube

    def _start_reaper(self) -> None:
        """Start ``REAPER``; the write end of its pipe is not inherited by any program this process starts."""
        read_end, self._reaper_pipe = os.pipe()
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", REAPER, str(read_end)],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_end)

    def _spawn(self, name: str, argv: list[str], logs: Path) -> None:
        """Start a server in a process group of its own, and name that group to the reaper."""
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append((name, proc))
        os.write(self._reaper_pipe, f"{proc.pid}\n".encode())

    def _wait(self, ready, deadline: float, name: str, logs: Path) -> None:
        while True:
            for prog, proc in self.processes:
                if proc.poll() is not None:
                    tail = (logs / f"{prog}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{prog} exited with {proc.returncode}:\n{tail}")
            if ready():
                return
            if time.monotonic() > deadline:
                tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} was not ready in time:\n{tail}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            return self.request("GET", "/readyz").status == 200
        except OSError:
            return False

    def stop(self) -> None:
        for _, proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.processes.clear()
        if self._reaper_pipe is not None:
            os.close(self._reaper_pipe)  # the reaper finds its groups gone and ends
            self._reaper_pipe = None
        if self._reaper is not None:
            self._reaper.wait(timeout=30)
            self._reaper = None

    # -- requests
    @property
    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.pki.ca))
        return self._ssl

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
        query: dict | None = None,
        token: str | None = None,
        node: str | None = None,
    ) -> ApiResponse:
        """One request as admin (or with ``token``, or with ``node``'s kubelet certificate)."""
        data = json.dumps(body).encode() if body is not None else None
        url = self.url + path + (("?" + urlencode(query)) if query else "")
        req = urllib.request.Request(url, data=data, method=method)
        context = self.ssl_context
        if node is not None:
            creds = self.node_credentials(node)
            context = ssl.create_default_context(cafile=str(self.pki.ca))
            context.load_cert_chain(str(creds.cert), str(creds.key))
        else:
            req.add_header("Authorization", f"Bearer {token or self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=context) as resp:
                status, raw, headers = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            status, raw, headers = exc.code, exc.read(), dict(exc.headers)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return ApiResponse(status, parsed, headers)

    def ok(self, method: str, path: str, body: object = None, **kw) -> dict:
        """A request that must succeed; its body."""
        resp = self.request(method, path, body, **kw)
        assert 200 <= resp.status < 300, f"{method} {path}: {resp.status} {resp.body}"
        return resp.body

    def bind_cluster_role(self, name: str, role: dict, user: str) -> None:
        """Create ``role`` as the ClusterRole ``name`` and bind it to ``user`` with a ClusterRoleBinding ``name``."""
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self.ok("POST", f"{rbac}/clusterroles", dict(role, metadata={"name": name}))
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        self.ok("POST", f"{rbac}/clusterrolebindings", binding)
        # The authorizer reads RBAC from its informer's copy, as admission reads its policies (``undeny``):
        # wait until it grants the role's first rule, so the next request does not race the binding.
        rule = role["rules"][0]
        resource = rule["resources"][0].partition("/")
        attributes = {"verb": rule["verbs"][0], "group": rule["apiGroups"][0], "resource": resource[0]}
        if resource[2]:
            attributes["subresource"] = resource[2]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": attributes},
        }
        sar = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        wait_for(
            lambda: self.ok("POST", sar, review)["status"].get("allowed"),
            f"the ClusterRoleBinding {name} did not take effect",
        )

    def get(self, path: str) -> dict | None:
        """The object at ``path``, or ``None`` when there is none (404)."""
        resp = self.request("GET", path)
        if resp.status == 404:
            return None
        assert resp.status == 200, f"GET {path}: {resp.status} {resp.body}"
        return resp.body

    # -- names and credentials
    def unique(self, stem: str) -> str:
        """A name no other test of this run uses (DNS-label safe)."""
        self._counter += 1
        return f"{stem}-{os.getpid() % 10000}-{self._counter}"

    def node_credentials(self, name: str) -> NodeCredentials:
        stem = f"node-{name}"
        cert, key = self.pki.directory / f"{stem}.crt", self.pki.directory / f"{stem}.key"
        if not cert.exists():
            cert, key = self.pki.leaf(stem, f"system:node:{name}", "system:nodes", server=False)
        pem = self.pki.directory / f"{stem}.pem"
        if not pem.exists():
            pem.write_bytes(cert.read_bytes() + key.read_bytes())
            pem.chmod(0o600)
        return NodeCredentials(name, cert, key, pem)

    def kubeconfig(
        self,
        path: Path,
        token: str | None = None,
        node: str | None = None,
        inline_ca: bool = False,
        separate_key: bool = False,
        ca: Path | None = None,
    ) -> Path:
        """A kubeconfig for the admin (default), a token's user, or ``node``'s kubelet (kubeadm's kubelet.conf form).

        ``separate_key``: the node's certificate and key in two files rather than one PEM;
        ``ca``: trust this CA instead of the server's.
        """
        import base64

        ca = ca or self.pki.ca
        if inline_ca:
            cluster = f"    certificate-authority-data: {base64.b64encode(ca.read_bytes()).decode()}\n"
        else:
            cluster = f"    certificate-authority: {ca}\n"
        if node is not None:
            creds = self.node_credentials(node)
            cert, key = (creds.cert, creds.key) if separate_key else (creds.pem, creds.pem)
            user = f"    client-certificate: {cert}\n    client-key: {key}\n"
        else:
            user = f"    token: {token or self.token}\n"
        path.write_text(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
            f"{cluster}    server: {self.url}\n  name: real\n"
            "contexts:\n- context:\n    cluster: real\n    user: real-user\n  name: real\n"
            "current-context: real\npreferences: {}\n"
            f"users:\n- name: real-user\n  user:\n{user}"
        )
        path.chmod(0o600)
        return path

    # -- objects tests need
    def add_node(
        self,
        name: str,
        labels: dict | None = None,
        taints: list | None = None,
        capacity: dict | None = None,
        with_capacity: bool = True,
        ready: bool = True,
    ) -> dict:
        """Register a Node as its kubelet would, and (``ready``) clear the not-ready taint as the node controller would.

        Without a kubelet the Node has only what this writes: ``kubernetes.io/hostname``,
        ``labels``, ``taints``, with ``with_capacity`` a capacity (and allocatable) of
        cpu, memory, pods and ``capacity``, and with ``ready`` the kubelet's ``Ready`` condition.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": list(taints or [])} if taints else {},
        }
        node = self.ok("POST", "/api/v1/nodes", body)
        status: dict = {}
        if with_capacity:
            base = {"cpu": "8", "memory": "32Gi", "pods": "110", **(capacity or {})}
            status = {"capacity": base, "allocatable": base}
        if ready:
            status["conditions"] = [ready_condition()]
        if status:
            patch = {"status": status}
            node = self.ok("PATCH", f"/api/v1/nodes/{name}/status", patch, content_type="application/merge-patch+json")
        if ready:
            kept = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != NOT_READY]
            if kept != ((node.get("spec") or {}).get("taints") or []):
                patch = {"spec": {"taints": kept or None}}
                node = self.ok("PATCH", f"/api/v1/nodes/{name}", patch, content_type="application/merge-patch+json")
        return node

    def node(self, name: str) -> dict:
        return self.ok("GET", f"/api/v1/nodes/{quote(name, safe='')}")

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{quote(name, safe='')}")

    def namespace(self, name: str) -> str:
        """Create namespace ``name`` with its ``default`` service account (the controller manager's job)."""
        if self.get(f"/api/v1/namespaces/{name}") is None:
            self.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default") is None:
            self.ok(
                "POST",
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            )
        return name

    def wait_crd(self, name: str, timeout: float = 30.0) -> dict:
        """The CRD once Established."""
        seen: dict = {}

        def established() -> dict | None:
            crd = self.ok("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            seen.clear()
            seen.update((c["type"], c["status"]) for c in (crd.get("status") or {}).get("conditions") or [])
            return crd if seen.get("Established") == "True" else None

        return wait_for(established, lambda: f"CRD {name} not Established: {seen}", timeout)

    def ensure_crd(self, crd: dict) -> dict:
        """Create ``crd`` unless a CRD of that name exists; return it Established and its resource served."""
        name = crd["metadata"]["name"]
        if self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is None:
            self.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        crd = self.wait_crd(name)
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
        plural = crd["spec"]["names"]["plural"]
        wait_for(  # the resource's storage (re)initializing
            lambda: self.request("GET", f"/apis/{crd['spec']['group']}/{version}/{plural}").status == 200,
            f"{name} Established but not served",
        )
        return crd

    def delete_crd(self, name: str, timeout: float = 30.0) -> None:
        """Delete a CRD and wait until it is gone (its objects are deleted first, by the server)."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        self.request("DELETE", path)
        wait_for(lambda: self.get(path) is None, f"CRD {name} still there after {timeout}s", timeout)

    def deny(self, name: str, resource: str, namespace: str, message: str, group: str = "", version: str = "v1"):
        """Make the server refuse (403) every create of ``resource`` in ``namespace``, with ``message``.

        A ValidatingAdmissionPolicy and its binding, as an operator's policy
        would; returns once a dry-run create is refused. ``undeny(name)`` lifts it.
        """
        admission = "/apis/admissionregistration.k8s.io/v1"
        rule = {"apiGroups": [group], "apiVersions": [version], "operations": ["CREATE"], "resources": [resource]}
        self.ok(
            "POST",
            f"{admission}/validatingadmissionpolicies",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [rule]},
                    "validations": [{"expression": "false", "message": message, "reason": "Forbidden"}],
                },
            },
        )
        selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        self.ok(
            "POST",
            f"{admission}/validatingadmissionpolicybindings",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": selector},
                },
            },
        )
        base = f"/apis/{group}/{version}" if group else "/api/v1"
        probe = {"apiVersion": f"{group}/{version}" if group else version, "metadata": {"generateName": "probe-"}}
        self._probes[name] = (f"{base}/namespaces/{namespace}/{resource}", probe)
        self._wait_denied(name, True)

    def undeny(self, name: str) -> None:
        """Lift ``deny(name)``; returns once a dry-run create passes the admission again.

        The server enforces a policy from its own informer's copy: a create sent
        right after the DELETE can still be refused for a moment.
        """
        admission = "/apis/admissionregistration.k8s.io/v1"
        self.request("DELETE", f"{admission}/validatingadmissionpolicybindings/{name}")
        self.request("DELETE", f"{admission}/validatingadmissionpolicies/{name}")
        self._wait_denied(name, False)
        del self._probes[name]

    def _wait_denied(self, name: str, denied: bool, timeout: float = 30.0) -> None:
        path, probe = self._probes[name]
        wait_for(
            lambda: (self.request("POST", path, probe, query={"dryRun": "All"}).status == 403) == denied,
            f"the policy {name} did not {'take effect' if denied else 'lift'}",
            timeout,
            interval=0.1,
        )

    # -- the audit log
    def audit_mark(self) -> int:
        """Where the audit log ends now: pass it to ``audit`` to see only what came after."""
        self._flush_audit()
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def _flush_audit(self) -> None:
        """Wait until every request answered so far is in the audit log.

        The server writes a request's event once it has answered it; a
        marker request read back from the log proves the earlier ones are there.
        """
        marker = f"/api/v1/namespaces/audit-marker-{secrets.token_hex(6)}"
        self.request("GET", marker)
        wait_for(
            lambda: self.audit_log.exists() and marker.encode() in self.audit_log.read_bytes()[-200_000:],
            "the audit log did not record a marker request",
            10,
            interval=0.02,
        )

    def audit(self, since: int = 0, user: str | None = None) -> list[dict]:
        """The audit events after ``since`` (a mark), without the marker requests; ``user``: only that user's."""
        self._flush_audit()
        with open(self.audit_log, "rb") as handle:
            handle.seek(since)
            lines = handle.read().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [
            e
            for e in events
            if "/audit-marker-" not in e.get("requestURI", "")
            and (user is None or e.get("user", {}).get("username") == user)
        ]

    def audit_writes(self, since: int = 0, user: str | None = None) -> list[dict]:
        """The write requests (create, update, patch, delete) after ``since``, dry runs included."""
        return [e for e in self.audit(since, user) if e.get("verb") in WRITE_VERBS]


def ready_condition() -> dict:
    """The ``Ready`` condition a kubelet posts, with its heartbeat now."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def _etcd_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def describe(event: dict) -> str:
    """``VERB uri -> code (user)`` of an audit event, for assertion messages."""
    code = (event.get("responseStatus") or {}).get("code")
    return f"{event.get('verb')} {event.get('requestURI')} -> {code} ({event.get('user', {}).get('username')})"
