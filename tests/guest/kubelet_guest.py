"""The Debian 13 kubelet node of tests/guest/test_real_kubelet.py: its image recipe and how it joins a cluster.

The image (``TRIXIE_KUBELET``) is the Debian 13 guest of guest_image.py plus
Debian's containerd 1.7, runc and CNI plugins, the real kubelet v1.36 of
``../shared/k8s/bin`` as ``/usr/bin/kubelet`` (where Debian's and the upstream
packages put it; ``cpupools_kubelet_version: auto`` asks it), and two
container images built offline (oci_image.py) and imported into containerd at
the first boot: ``docker.io/local/pause:1`` (the pod sandbox: busybox's shell
waiting for SIGTERM) and ``docker.io/local/tools:1`` (busybox and Python 3.13
from Debian's packages: what a pod needs to print its CPUs or run ``cmk``).

The kubelet is set up as kubeadm sets one up: a systemd unit running
``kubelet --config /etc/kubernetes/kubelet.yaml --config-dir
/etc/kubernetes/kubelet.conf.d --kubeconfig /etc/kubernetes/kubelet.conf``,
the systemd cgroup driver (cgroup v2) in both the kubelet and containerd,
``Restart=always``. It starts once the test has written its kubeconfig: the
node's own client certificate (``system:node:cpupools-guest``) for the
control plane the test runs on the machine's loopback, which the guest
reaches as 10.0.2.2 through qemu's user network.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import guest_image as image
import oci_image

#: The node's name: the guest's hostname, as the kubelet registers it.
NODE = "cpupools-guest"
#: The machine's loopback as the guest sees it on qemu's user network.
HOST_FROM_GUEST = "10.0.2.2"
KUBELET_CONFIG = """\
# The guest's main kubelet configuration, as kubeadm would write it; cpupools'
# drop-in goes into /etc/kubernetes/kubelet.conf.d (--config-dir).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: AlwaysAllow}
# No DNS for pods (no cluster DNS here), no swap on the guest.
resolvConf: ""
failSwapOn: false
# The images were imported, not pulled: never collect them, and never evict
# for a small disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
"""
KUBELET_UNIT = """\
[Unit]
Description=kubelet: the Kubernetes node agent (cpupools guest)
Wants=containerd.service
After=containerd.service
# Until the test has written the node's credentials there is nothing to join.
ConditionPathExists=/etc/kubernetes/kubelet.conf

[Service]
ExecStart=/usr/bin/kubelet --config=/etc/kubernetes/kubelet.yaml --config-dir=/etc/kubernetes/kubelet.conf.d \
--kubeconfig=/etc/kubernetes/kubelet.conf
Restart=always
RestartSec=5
StartLimitIntervalSec=0

[Install]
WantedBy=multi-user.target
"""
CONTAINERD_CONFIG = """\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/local/pause:1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""
#: The pods of the scenario use the host's network; a CNI configuration only lets the node report its network ready.
SUBNET = "10.88.0.0/16"
CNI_CONFIG = json.dumps(
    {
        "cniVersion": "1.0.0",
        "name": "cpupools-guest",
        "plugins": [{"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": SUBNET}}],
    },
    indent=1,
)
IMAGES_DIR = "var/lib/cpupools-images"
#: The first boot imports the images into the CRI's namespace of containerd.
FIRSTBOOT = f"""\
systemctl start containerd
for i in $(seq 120); do ctr version >/dev/null 2>&1 && break; sleep 1; done
for f in /{IMAGES_DIR}/*.tar; do ctr -n k8s.io images import "$f"; done
rm -rf /{IMAGES_DIR}
ctr -n k8s.io images ls -q
"""
#: The pod sandbox: a shell that ends at SIGTERM (a stand-in that ignored it would make every pod stop wait out
#: its grace period).
PAUSE = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def assets_dir() -> Path | None:
    """Where the kubelet is: ``CPUPOOLS_K8S_ASSETS`` or ``KUBEBUILDER_ASSETS`` (as tests/k8s_real.py finds them)."""
    for name in ("CPUPOOLS_K8S_ASSETS", "KUBEBUILDER_ASSETS"):
        value = os.environ.get(name)
        if value and os.access(Path(value) / "kubelet", os.X_OK):
            return Path(value)
    beside = Path(__file__).resolve().parents[3] / "shared" / "k8s" / "bin"
    return beside if os.access(beside / "kubelet", os.X_OK) else None


def kubelet_binary() -> Path:
    found = assets_dir()
    if found is None:
        raise RuntimeError("no kubelet: set KUBEBUILDER_ASSETS to a directory with kubelet (../shared/k8s/bin)")
    return found / "kubelet"


def _kubelet_digest() -> str:
    sha = hashlib.sha256()
    with kubelet_binary().open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def _payload(rootfs: Path, work: Path, log) -> None:
    """The kubelet binary, the directories the kubelet reads, and the two container images to import."""
    target = rootfs / "usr" / "bin" / "kubelet"
    shutil.copyfile(kubelet_binary(), target)
    target.chmod(0o755)
    for rel in ("etc/kubernetes/kubelet.conf.d", "etc/kubernetes/pki", IMAGES_DIR):
        (rootfs / rel).mkdir(parents=True, exist_ok=True)
    # Busybox and Python 3.13 from Debian's packages, unpacked (no maintainer scripts): the images' one layer.
    tree = work / "image-root"
    argv = [
        "mmdebstrap",
        "--quiet",
        "--variant=extract",
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        "--aptopt=APT::Install-Recommends false",
        "--include=busybox-static,python3",
        TRIXIE_KUBELET.suite,
        str(tree),
        f"deb {image.MIRROR} {TRIXIE_KUBELET.suite} main",
    ]
    image._run(argv, log)
    applets = subprocess.run(
        [str(tree / "usr" / "bin" / "busybox"), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = {
        f"usr/bin/{name}": "busybox"
        for name in applets
        if not (tree / "usr" / "bin" / name).exists() and not (tree / "usr" / "sbin" / name).exists()
    }
    layer = oci_image.layer(tree, work / "layer.tar", links)
    shutil.rmtree(tree)
    out = rootfs / IMAGES_DIR
    oci_image.archive(out / "pause.tar", "docker.io/local/pause:1", layer, PAUSE, None)
    oci_image.archive(out / "tools.tar", "docker.io/local/tools:1", layer, None, ["/bin/sh"])
    layer.unlink()


TRIXIE_KUBELET = image.Recipe(
    name="trixie-kubelet",
    suite="trixie",
    packages=(*image.BASE_PACKAGES, "containerd", "runc", "containernetworking-plugins"),
    files=(
        ("etc/kubernetes/kubelet.yaml", 0o644, KUBELET_CONFIG),
        ("etc/systemd/system/kubelet.service", 0o644, KUBELET_UNIT),
        ("etc/containerd/config.toml", 0o644, CONTAINERD_CONFIG),
        ("etc/cni/net.d/10-cpupools-guest.conflist", 0o644, CNI_CONFIG + "\n"),
    ),
    enable=(*image.BASE_ENABLE, "kubelet.service"),
    # Room for containerd's content store and snapshots of the imported images beside the system.
    disk_mb=4096,
    firstboot=FIRSTBOOT,
    payload=_payload,
    inputs=_kubelet_digest,
)


# Joining the cluster ----------------------------------------------------------------


def kubeconfig_text(server: str, ca: bytes, cert: bytes, key: bytes) -> str:
    """A kubelet's kubeconfig (kubeadm's kubelet.conf form) with everything inline."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- cluster:\n    certificate-authority-data: {b64(ca)}\n    server: {server}\n  name: cluster\n"
        f"contexts:\n- context:\n    cluster: cluster\n    user: system:node:{NODE}\n  name: node\n"
        "current-context: node\n"
        f"users:\n- name: system:node:{NODE}\n  user:\n"
        f"    client-certificate-data: {b64(cert)}\n    client-key-data: {b64(key)}\n"
    )


def join(guest, kube, timeout: float = 600) -> float:
    """Give the guest's kubelet its credentials for ``kube`` (tests/k8s_real.RealKube), start it, wait for Ready.

    Returns the seconds until the Node was Ready.
    """
    start = time.monotonic()
    creds = kube.node_credentials(NODE)
    port = kube.url.rsplit(":", 1)[1]
    text = kubeconfig_text(
        f"https://{HOST_FROM_GUEST}:{port}", kube.pki.ca.read_bytes(), creds.cert.read_bytes(), creds.key.read_bytes()
    )
    ca = base64.b64encode(kube.pki.ca.read_bytes()).decode()
    conf = base64.b64encode(text.encode()).decode()
    guest.ssh(
        "set -e; umask 077; "
        f"echo {ca} | base64 -d >/etc/kubernetes/pki/ca.crt; "
        f"echo {conf} | base64 -d >/etc/kubernetes/kubelet.conf; "
        "systemctl start kubelet"
    )
    wait_ready(kube, timeout, since=None, guest=guest)
    return time.monotonic() - start


def ready_heartbeat(node: dict | None) -> str:
    """The ``lastHeartbeatTime`` of the Node's ``Ready`` condition ("" without one)."""
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return next((c.get("lastHeartbeatTime", "") for c in conditions if c.get("type") == "Ready"), "")


def node_ready(node: dict | None) -> bool:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_ready(kube, timeout: float, since: str | None = None, guest=None) -> dict:
    """The Node once Ready (with ``since``: a Ready heartbeat newer than that one, from a kubelet started since)."""
    deadline = time.monotonic() + timeout
    node = None
    while time.monotonic() < deadline:
        node = kube.get(f"/api/v1/nodes/{NODE}")
        if node_ready(node) and (since is None or ready_heartbeat(node) > since):
            return node
        time.sleep(2)
    journal = guest.ssh("journalctl -u kubelet -n 40 --no-pager -o cat || true") if guest else ""
    raise AssertionError(f"node {NODE} not Ready in {timeout:.0f} s: {json.dumps(node)[:3000]}\n{journal}")


# Pods ---------------------------------------------------------------------------------
#
# There is no scheduler and no controller manager: a pod names its node
# (spec.nodeName), and a ReplicaSet object stands as its owner so that a drain
# evicts it as it evicts a managed pod (nothing recreates it: the test does,
# where a controller would).

TOOLS = "local/tools:1"
#: What every container of the scenario prints first: the CPUs it may run on, seen from inside.
SHOW_CPUS = "grep Cpus_allowed_list /proc/self/status"


def owner(kube, namespace: str, name: str) -> dict:
    """A ReplicaSet to own the scenario's pods (``ownerReferences``), as a Deployment's would."""
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": TOOLS}]},
            },
        },
    }
    found = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}")
    rs = found or kube.ok("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", body)
    uid = rs["metadata"]["uid"]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": True}


def pod(
    name: str,
    resources: dict,
    owned_by: dict | None = None,
    command: list[str] | None = None,
    annotations: dict | None = None,
) -> dict:
    """A pod on the guest: the tools image, the host's network, no service account token, a quick stop."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": (owned_by or {}).get("name", name)},
            **({"ownerReferences": [owned_by]} if owned_by else {}),
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": {
            "nodeName": NODE,
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "app",
                    "image": TOOLS,
                    "imagePullPolicy": "Never",
                    "command": command or ["sh", "-c", f"{SHOW_CPUS}; exec sleep 1000000"],
                    "resources": resources,
                }
            ],
        },
    }


def guaranteed(cpus: int) -> dict:
    return {"requests": {"cpu": str(cpus), "memory": "32Mi"}, "limits": {"cpu": str(cpus), "memory": "32Mi"}}


def burstable() -> dict:
    return {"requests": {"cpu": "100m", "memory": "16Mi"}}


def create(kube, namespace: str, body: dict) -> dict:
    return kube.ok("POST", f"/api/v1/namespaces/{namespace}/pods", body)


def wait_running(kube, namespace: str, name: str, guest, timeout: float = 600) -> dict:
    """The pod once its container runs; fails with the pod's status and the kubelet's log."""
    deadline = time.monotonic() + timeout
    found = None
    while time.monotonic() < deadline:
        found = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        statuses = ((found or {}).get("status") or {}).get("containerStatuses") or []
        if statuses and all("running" in (s.get("state") or {}) for s in statuses):
            return found
        time.sleep(2)
    journal = guest.ssh("journalctl -u kubelet -n 30 --no-pager -o cat | cut -c1-400 || true")
    shown = json.dumps(found)[:3000]
    raise AssertionError(f"pod {namespace}/{name} not running in {timeout:.0f} s: {shown}\n{journal}")


def wait_gone(kube, namespace: str, name: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}") is not None:
        assert time.monotonic() < deadline, f"pod {namespace}/{name} still there after {timeout:.0f} s"
        time.sleep(2)


def container_log(guest, namespace: str, name: str, uid: str, timeout: float = 120) -> str:
    """What the pod's container printed (the kubelet's CRI log on the node, without its timestamps).

    The log of the container's latest attempt: the kubelet names each ``<restartCount>.log``. Under
    emulation's load containerd's shim can time out on a start (a CI run saw ``runc create failed``
    after ``context deadline exceeded``); the kubelet starts the container again as attempt 1, whose
    output is in ``1.log`` while ``0.log`` stays empty. An earlier attempt that printed anything ran
    and ended: that fails here, so a workload that crashed once is not hidden by its restart.
    """
    path = f"/var/log/pods/{namespace}_{name}_{uid}/app"
    show = (
        f"cd {path} 2>/dev/null && for f in $(ls | grep -E '^[0-9]+[.]log$' | sort -n); do echo \"== $f\"; cat $f; done"
    )
    deadline = time.monotonic() + timeout
    while True:
        attempts: dict[str, list[str]] = {}
        lines: list[str] = []  # the latest attempt's, so far
        for line in guest.ssh(f"{show} || true").splitlines():
            if line.startswith("== "):
                lines = attempts[line[3:]] = []
            elif line.count(" ") >= 3:
                lines.append(line.split(" ", 3)[3])
        earlier = {log: printed for log, printed in list(attempts.items())[:-1] if printed}
        assert not earlier, f"{path}: an earlier attempt of the container ran and ended: {earlier}"
        if lines:
            return "\n".join(lines) + "\n"
        assert time.monotonic() < deadline, f"{path}: every attempt's log stays empty ({sorted(attempts)})"
        time.sleep(2)


def cpus_inside(guest, namespace: str, name: str, uid: str) -> str:
    """``Cpus_allowed_list`` as the container's first process read it from ``/proc/self/status``."""
    for line in container_log(guest, namespace, name, uid).splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{namespace}/{name} printed no Cpus_allowed_list")


def cpu_manager_state(guest) -> dict:
    return json.loads(guest.ssh("cat /var/lib/kubelet/cpu_manager_state"))


#: Every process on the node: pid, comm, Cpus_allowed_list and cgroup (one line each, ``|``-separated).
#: One Python process on the guest: a shell loop forks three times per process, minutes under emulation.
PROCESSES = r"""python3 - <<'PY'
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cgroup = open(f"/proc/{pid}/cgroup").read().strip()
        comm = open(f"/proc/{pid}/comm").read().strip()
        status = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        continue
    allowed = next((line.split()[1] for line in status if line.startswith("Cpus_allowed_list:")), "")
    print(f"{pid}|{comm}|{allowed}|{cgroup.removeprefix('0::')}")
PY
"""


def processes(guest) -> list[dict]:
    out = []
    for line in guest.ssh(PROCESSES).splitlines():
        pid, comm, allowed, cgroup = [*line.split("|", 3), "", "", ""][:4]
        if pid.isdigit():
            out.append({"pid": int(pid), "comm": comm, "allowed": allowed, "cgroup": cgroup})
    return out
