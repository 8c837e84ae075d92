"""The Debian guest images the real-kernel scenarios boot (issues 28 and 38).

Built from Debian packages with mmdebstrap, no installer and no cloud image:
a minimal Debian with the stock kernel (linux-image-amd64), GRUB on its own
virtual disk, systemd-networkd (DHCP), OpenSSH with root login by a key made
for the test, python3 for Ansible and rt-tests (oslat) preinstalled, since the
guest has no route to the archive. A ``Recipe`` says what goes in: the
Debian 12 node of tests/guest/test_real_kernel.py (``BOOKWORM``) and the
Debian 13 kubelet node of tests/guest/test_real_kubelet.py
(``kubelet_guest.TRIXIE_KUBELET``: containerd, runc, the kubelet and two
container images made offline).

GRUB is installed by the guest itself: the first boot goes through qemu's
``-kernel``/``-initrd`` with a one-shot unit that runs ``grub-install
/dev/vda`` and ``update-grub`` (and what the recipe adds, such as importing
container images), then powers off. Every later boot goes through that GRUB,
so cpupools' kernel stage (a drop-in in /etc/default/grub.d and update-grub)
takes effect on the guest's reboot as on any Debian node.

The image is cached outside the checkout, in
``${XDG_CACHE_HOME:-~/.cache}/cpupools/guest/<recipe hash>/`` (the hash is the
recipe's values, the build steps' code and the recipe's inputs, such as the
kubelet binary: change any, get a new image). A build runs under a lock in a
directory of its own and is renamed into place only when complete, so a
concurrent build waits and a killed one leaves nothing a later run trusts.
Tests boot a qcow2 overlay on it; the base stays untouched.

    python tests/guest/guest_image.py [bookworm|trixie-kubelet]    build (or find) the image, print its directory
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
#: What every guest has: a kernel, GRUB, systemd, SSH and python3 for Ansible, oslat for verify.
BASE_PACKAGES = (
    "linux-image-amd64",
    "grub-pc",
    "initramfs-tools",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "e2fsprogs",
    "iproute2",
    "procps",
    "openssh-server",
    "python3",
    "rt-tests",  # oslat, for verify's latency check
)
#: How long the first boot (grub-install, update-grub, the recipe's steps, power off) may take under TCG:
#: the kubelet guest's took 175 s on a quiet machine and 440 s on one running three other jobs.
FIRSTBOOT_TIMEOUT = 1200
FIRSTBOOT_DONE = "cpupools-firstboot: done"

#: Files written into every root file system, path -> (mode, text).
BASE_FILES = {
    "etc/hostname": (0o644, "cpupools-guest\n"),
    "etc/hosts": (0o644, "127.0.0.1 localhost\n127.0.1.1 cpupools-guest\n"),
    "etc/fstab": (0o644, "/dev/vda1 / ext4 defaults,errors=remount-ro 0 1\n"),
    "etc/systemd/network/10-dhcp.network": (0o644, "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n"),
    # The serial console carries the boot log the tests show when a step fails;
    # no menu wait. cpupools' drop-in (grub.d/99-cpupools.cfg) appends to
    # GRUB_CMDLINE_LINUX. mitigations=off: under emulation the page-table
    # isolation (a CR3 switch, so a flush of qemu's software TLB, at each
    # system call) and the retpolines made every command in the guest about a
    # third slower (an Ansible task 6.5-7.2 s with them, 4.9-5.2 s without);
    # what cpupools checks does not depend on them.
    "etc/default/grub": (
        0o644,
        'GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\nGRUB_DISTRIBUTOR="Debian"\n'
        'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200 mitigations=off"\nGRUB_CMDLINE_LINUX=""\n'
        'GRUB_TERMINAL="serial"\nGRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"\n'
        "GRUB_DISABLE_OS_PROBER=true\n",
    ),
    "etc/ssh/sshd_config.d/cpupools-guest.conf": (0o644, "PermitRootLogin prohibit-password\nUseDNS no\n"),
    "etc/systemd/system/cpupools-firstboot.service": (
        0o644,
        "[Unit]\nDescription=Install GRUB on the guest's disk (cpupools test image, first boot)\n"
        "After=local-fs.target\n\n"
        "[Service]\nType=oneshot\nExecStart=/usr/local/sbin/cpupools-firstboot\n"
        "StandardOutput=journal+console\nStandardError=journal+console\n\n"
        "[Install]\nWantedBy=multi-user.target\n",
    ),
}
BASE_ENABLE = ("systemd-networkd.service", "ssh.service", "cpupools-firstboot.service")
#: Nothing that would wake up during a test and compete for the emulated CPUs.
BASE_MASK = ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer", "man-db.timer")


def firstboot_script(extra: str = "") -> str:
    """The first boot's script (by qemu -kernel): GRUB onto this disk, the recipe's own steps, then power off."""
    return (
        "#!/bin/sh\n"
        "# First boot only (by qemu -kernel): GRUB onto this disk, then power off.\n"
        "set -e\n"
        "grub-install --target=i386-pc /dev/vda\n"
        "update-grub\n"
        f"{extra}"
        "systemctl disable cpupools-firstboot.service\n"
        "rm -f /usr/local/sbin/cpupools-firstboot /etc/systemd/system/cpupools-firstboot.service\n"
        "sync\n"
        f"echo '{FIRSTBOOT_DONE}' >/dev/ttyS0\n"
        "systemctl poweroff\n"
    )


@dataclass(frozen=True)
class Recipe:
    """What one guest image is made of.

    ``payload(rootfs, work, log)`` runs on the unpacked root file system before
    it becomes a disk (the kubelet guest copies its kubelet and builds its
    container images there); ``inputs()`` names what the payload reads from
    outside the recipe (a digest of the kubelet binary), so a new kubelet makes
    a new image; ``firstboot`` is shell run at the first boot after GRUB.
    """

    name: str
    suite: str
    packages: tuple[str, ...] = BASE_PACKAGES
    files: tuple[tuple[str, int, str], ...] = ()
    enable: tuple[str, ...] = BASE_ENABLE
    mask: tuple[str, ...] = BASE_MASK
    #: The root file system's size; sparse, so the cache holds only what is written.
    disk_mb: int = 3072
    firstboot: str = ""
    payload: Callable[[Path, Path, object], None] | None = field(default=None, compare=False)
    inputs: Callable[[], str] | None = field(default=None, compare=False)

    def all_files(self) -> dict[str, tuple[int, str]]:
        files = {**BASE_FILES, "usr/local/sbin/cpupools-firstboot": (0o755, firstboot_script(self.firstboot))}
        files.update({rel: (mode, text) for rel, mode, text in self.files})
        return files


#: The Debian 12 node of the real-kernel scenario (tests/guest/test_real_kernel.py).
BOOKWORM = Recipe(name="bookworm", suite="bookworm")


def recipe_hash(recipe: Recipe = BOOKWORM) -> str:
    """What the image is made of: the recipe's values, its inputs and the build steps' code (not the prose)."""
    values = repr((recipe.suite, MIRROR, SECURITY, recipe.packages, recipe.disk_mb, recipe.all_files()))
    values += repr((recipe.enable, recipe.mask))
    steps = [_rootfs, _disk, _firstboot] + ([recipe.payload] if recipe.payload else [])
    code = "".join(inspect.getsource(step) for step in steps)
    extra = recipe.inputs() if recipe.inputs else ""
    return hashlib.sha256((values + code + extra).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cpupools" / "guest"


def missing_tools() -> list[str]:
    tools = ("mmdebstrap", "mkfs.ext4", "sfdisk", "ssh-keygen", "qemu-img", "qemu-system-x86_64")
    return [tool for tool in tools if shutil.which(tool) is None]


def _run(argv: list[str], log, **kw) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    subprocess.run(argv, check=True, stdout=log, stderr=subprocess.STDOUT, **kw)


def _rootfs(recipe: Recipe, work: Path, log) -> Path:
    rootfs = work / "rootfs"
    argv = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        "--aptopt=APT::Install-Recommends false",
        f"--include={','.join(recipe.packages)}",
        recipe.suite,
        str(rootfs),
        f"deb {MIRROR} {recipe.suite} main",
        f"deb {MIRROR} {recipe.suite}-updates main",
        f"deb {SECURITY} {recipe.suite}-security main",
    ]
    _run(argv, log)
    for rel, (mode, text) in recipe.all_files().items():
        path = rootfs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    ssh = rootfs / "root" / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text((work / "id_ed25519.pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    _run(["systemctl", f"--root={rootfs}", "enable", *recipe.enable], log)
    _run(["systemctl", f"--root={rootfs}", "mask", *recipe.mask], log)
    _run(["systemctl", f"--root={rootfs}", "set-default", "multi-user.target"], log)
    # Every overlay boots with a machine id of its own (systemd makes one on first boot).
    (rootfs / "etc" / "machine-id").write_text("")
    return rootfs


def _disk(rootfs: Path, work: Path, disk_mb: int, log) -> Path:
    """A raw disk: an MBR with one bootable ext4 partition from 1 MiB, no loop device needed."""
    part = work / "part.img"
    _run(["mkfs.ext4", "-q", "-F", "-L", "cpupools-root", "-d", str(rootfs), str(part), f"{disk_mb - 1}M"], log)
    disk = work / "disk.raw"
    with disk.open("wb") as f:
        f.truncate(disk_mb * 1024 * 1024)
    _run(["sfdisk", "--quiet", str(disk)], log, input=b"label: dos\nstart=2048, type=83, bootable\n")
    _run(["dd", f"if={part}", f"of={disk}", "bs=1M", "seek=1", "conv=notrunc,sparse", "status=none"], log)
    part.unlink()
    return disk


def _firstboot(rootfs: Path, disk: Path, work: Path, log) -> None:
    kernel = sorted((rootfs / "boot").glob("vmlinuz-*"))[-1]
    initrd = sorted((rootfs / "boot").glob("initrd.img-*"))[-1]
    console = work / "firstboot-console.log"
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg,thread=multi",
        "-m",
        "1024",
        "-smp",
        "2",
        "-cpu",
        "max",
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-drive",
        f"file={disk},if=virtio,format=raw",
        "-nic",
        "none",
        "-serial",
        f"file:{console}",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        "root=/dev/vda1 rw console=ttyS0,115200 mitigations=off",
    ]
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    try:
        subprocess.run(argv, check=True, stdout=log, stderr=subprocess.STDOUT, timeout=FIRSTBOOT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the first boot did not power off in {FIRSTBOOT_TIMEOUT} s; console: {console}") from None
    if FIRSTBOOT_DONE not in console.read_text(errors="replace"):
        raise RuntimeError(f"the first boot did not finish (GRUB, the recipe's steps); console: {console}")


def _remove(path: Path) -> None:
    """Remove a killed build's directory: first what a killed mmdebstrap left mounted in it (/proc, /sys, /dev)."""
    prefix = f"{path}/"
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False)
    if any(m.startswith(prefix) for m in Path("/proc/self/mountinfo").read_text().split()):
        raise RuntimeError(f"{path} still has file systems mounted in it; unmount them and remove it")
    shutil.rmtree(path, ignore_errors=True)


def _build(recipe: Recipe, work: Path, log) -> dict:
    timings = {}
    start = time.monotonic()
    key = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cpupools-guest-test", "-f"]
    _run([*key, str(work / "id_ed25519")], log)
    rootfs = _rootfs(recipe, work, log)
    timings["rootfs_s"] = round(time.monotonic() - start, 1)
    if recipe.payload:
        mark = time.monotonic()
        recipe.payload(rootfs, work, log)
        timings["payload_s"] = round(time.monotonic() - mark, 1)
    mark = time.monotonic()
    disk = _disk(rootfs, work, recipe.disk_mb, log)
    timings["disk_s"] = round(time.monotonic() - mark, 1)
    mark = time.monotonic()
    _firstboot(rootfs, disk, work, log)
    timings["firstboot_s"] = round(time.monotonic() - mark, 1)
    shutil.rmtree(rootfs)
    _run(["qemu-img", "convert", "-O", "qcow2", str(disk), str(work / "base.qcow2")], log)
    disk.unlink()
    timings["total_s"] = round(time.monotonic() - start, 1)
    return timings


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"--- {path.name}, last {lines} lines:\n" + "\n".join(text) + "\n"


def build(recipe: Recipe = BOOKWORM, log=None) -> Path:
    """The cached image's directory (base.qcow2, id_ed25519, timings), built if missing."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / recipe_hash(recipe)
    if (final / "base.qcow2").is_file():
        return final
    with (root / "build.lock").open("w") as lock, contextlib.ExitStack() as stack:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build finishes first; then it is found below
        if (final / "base.qcow2").is_file():
            return final
        for stale in root.glob("*.building-*"):  # a killed build's directory
            _remove(stale)
        work = root / f"{final.name}.building-{os.getpid()}"
        work.mkdir()
        stack.callback(lambda: work.exists() and _remove(work))  # gone once renamed into place
        if log is None:
            log = stack.enter_context((work / "build.log").open("w"))
        try:
            timings = _build(recipe, work, log)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            log.flush()
            tails = _tail(work / "build.log") + _tail(work / "firstboot-console.log")
            raise RuntimeError(f"building the guest image {recipe.name} in {work} failed: {exc}\n{tails}") from exc
        (work / "timings").write_text("".join(f"{k} {v}\n" for k, v in timings.items()))
        (work / "base.qcow2").chmod(0o444)  # tests boot overlays; nothing writes the base
        os.rename(work, final)  # atomic: the directory appears complete or not at all
    return final


def recipes() -> dict[str, Recipe]:
    """Every recipe by name (the kubelet guest's lives with its scenario's helpers)."""
    import kubelet_guest

    return {BOOKWORM.name: BOOKWORM, kubelet_guest.TRIXIE_KUBELET.name: kubelet_guest.TRIXIE_KUBELET}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(build(recipes()[sys.argv[1] if len(sys.argv) > 1 else BOOKWORM.name], log=sys.stderr))
