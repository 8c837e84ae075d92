"""Container images for the kubelet guest, made offline: one layer from a directory, OCI archives for ``ctr import``.

No registry is reachable from the guest (nor, in CI, from the machine): the
pod sandbox (pause) image and the workload image are built here from a
directory of Debian's packages (``mmdebstrap --variant=extract``) and written as
OCI image-layout archives, which ``ctr -n k8s.io images import`` takes. The
image's name is the ``io.containerd.image.name`` annotation of its manifest in
``index.json``: a pod's ``image: local/tools:1`` is looked up as
``docker.io/local/tools:1``, so that is the name given.

This is what an air-gapped operator does with any image (docs/kubelet.md,
"Images without a registry"): ``ctr -n k8s.io images import`` an archive
that ``skopeo copy`` or ``docker save`` made where a registry was reachable.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Merged /usr, as Debian has it; the extracted packages carry only /usr.
SYMLINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
#: What a container needs that the extracted packages do not bring (base-files, base-passwd).
FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
#: Left out of the layer: documentation, translations, package-manager state.
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info", "var/cache", "var/lib/apt")


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer(root: Path, out: Path, links: dict[str, str] | None = None) -> Path:
    """An uncompressed layer of ``root``'s tree (sorted, owned by root, mtime 0), with ``links`` as symlinks.

    ``links`` maps a path in the layer to its target (busybox's applets, ``/bin/sh``).
    """
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, target in sorted({**SYMLINKS, **(links or {})}.items()):
            info = _reset(tarfile.TarInfo(name))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, text in sorted(FILES.items()):
            data = text.encode()
            info = _reset(tarfile.TarInfo(name))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in PRUNE)
            for name in [*dirnames, *sorted(filenames)]:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if rel in FILES or rel in (links or {}) or rel in SYMLINKS:
                    continue
                tar.add(os.path.join(dirpath, name), arcname=rel, recursive=False, filter=_reset)
    return out


def _blob(blobs: dict[str, bytes | Path], data: bytes | Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    if isinstance(data, Path):
        with data.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        size = data.stat().st_size
    else:
        sha.update(data)
        size = len(data)
    digest = f"sha256:{sha.hexdigest()}"
    blobs[digest] = data
    return digest, size


def archive(out: Path, name: str, layer_tar: Path, entrypoint: list[str] | None, cmd: list[str] | None) -> Path:
    """An OCI image-layout archive of one image ``name`` (``docker.io/local/x:1``) of one layer."""
    blobs: dict[str, bytes | Path] = {}
    layer_digest, layer_size = _blob(blobs, layer_tar)
    settings: dict[str, object] = {"Env": [f"PATH={PATH}"], "WorkingDir": "/"}
    if entrypoint:
        settings["Entrypoint"] = entrypoint
    if cmd:
        settings["Cmd"] = cmd
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": settings,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_size = _blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size}],
    }
    manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST_TYPE,
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
            }
        ],
    }
    with tarfile.open(out, "w") as tar:
        for rel, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index, sort_keys=True).encode()),
        ):
            info = _reset(tarfile.TarInfo(rel))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for digest, data in blobs.items():
            rel = "blobs/sha256/" + digest.split(":", 1)[1]
            if isinstance(data, Path):
                tar.add(data, arcname=rel, filter=_reset)
            else:
                info = _reset(tarfile.TarInfo(rel))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out
