"""The boot-loader backends of module_utils/cpupools/node/bootloader.py, called directly.

Fixture roots as in test_kernel_args_module.py; the commands are the fixture
tools (update-grub, kernel-install, grubby), run as real processes through
the same seam (Host's run_command), without Ansible in between.
"""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import pytest
from cpupools.core.errors import KernelArgsError
from cpupools.hardware.topology import gather_topology
from cpupools.node import bootloader
from cpupools.planning.plan import make_request, plan_pools
from helpers import tree_snapshot
from test_kernel_args_module import RELEASE, make_backend_root

GRUB_CFG = "boot/grub/grub.cfg"
DROPIN = "etc/default/grub.d/99-cpupools.cfg"


class Runner:
    """``run_command`` of the seam: runs argv as a real process, remembers each one."""

    def __init__(self, env: dict | None = None) -> None:
        self.ran: list[list[str]] = []
        self.env = env or {}

    def __call__(self, argv, environ_update=None):
        self.ran.append(list(argv))
        proc = subprocess.run(
            argv, capture_output=True, text=True, check=False, env={**os.environ, **(environ_update or {}), **self.env}
        )
        return proc.returncode, proc.stdout, proc.stderr


def params(root: Path, backend: str, **extra) -> dict:
    plan = plan_pools(gather_topology(str(root)), make_request({"num_exclusive_cores": 2, "num_shared_cores": 1}))
    return {
        "state": "present",
        "plan": plan,
        "backend": backend,
        "name": "99-cpupools",
        "isolcpus_flags": ["managed_irq", "domain"],
        "keep_adopted": True,
        "nohz_full": True,
        "rcu_nocbs": True,
        "irqaffinity": True,
        "command_line_size": 2048,
        "update": "auto",
        "kernel_release": RELEASE,
        "record": "/var/lib/cpupools/kernel-args.json",
        **extra,
    }


def write_boot_config(root: Path, p: dict, check: bool = False, runner: Runner | None = None, facts_root=None) -> dict:
    host = bootloader.Host(str(root), runner or Runner(), wrapper=[], check_mode=check, facts_root=facts_root)
    return bootloader.write_boot_config(host, p)


@pytest.mark.parametrize("backend", ["grub", "grubby", "kernel-install"])
def test_check_mode_records_exactly_the_actions_of_the_real_run_and_does_none(make_root, backend):
    root = make_backend_root(make_root, backend)
    p = params(root, backend)
    before = tree_snapshot(root)
    runner = Runner()
    predicted = write_boot_config(root, p, check=True, runner=runner)
    assert tree_snapshot(root) == before
    assert all("--info=ALL" in " ".join(argv) for argv in runner.ran), runner.ran  # reads only
    real = write_boot_config(root, p)
    assert predicted["actions"] == real["actions"] and real["changed"] is True
    assert tree_snapshot(root) != before
    again = write_boot_config(root, p)
    assert again["actions"] == [] and again["changed"] is False


def test_grub_cfg_that_missed_the_update_is_regenerated_and_the_difference_reported(make_root):
    root = make_backend_root(make_root, "grub")
    p = params(root, "grub")
    # The update failed once: the drop-in is written, grub.cfg is the old one.
    assert write_boot_config(root, {**p, "update": "never"})["actions"][0] == f"write /{DROPIN}"  # the role's task
    with pytest.raises(KernelArgsError, match="update-grub failed \\(exit 1\\)"):  # its handler
        write_boot_config(root, {**p, "update": "only"}, runner=Runner({"FAKE_UPDATE_GRUB_FAIL": "1"}))
    assert (root / DROPIN).exists() and "isolcpus" not in (root / GRUB_CFG).read_text()

    stale = write_boot_config(root, {**p, "update": "never"})
    assert stale["changed"] is True and stale["update_needed"] is True
    assert stale["actions"] == [f"regenerate the boot configuration ({root}/usr/sbin/update-grub)"]
    diffs = stale["boot_config"]["differences"]
    assert stale["boot_config"]["path"] == "/boot/grub/grub.cfg"
    assert {d["arg"] for d in diffs} == {"isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity"}
    assert {d["entry"] for d in diffs} == {1, 2}  # the normal and the recovery entry
    assert all(d["boots"] is None and d["configured"] for d in diffs)
    assert any("disagrees with the kernel arguments" in w for w in stale["warnings"])

    repaired = write_boot_config(root, {**p, "update": "only"})
    assert repaired["actions"] == [f"run {root}/usr/sbin/update-grub"]
    assert "isolcpus=managed_irq,domain," in (root / GRUB_CFG).read_text()
    settled = write_boot_config(root, {**p, "update": "never"})
    assert settled["changed"] is False and settled["boot_config"]["differences"] == []


def test_an_update_that_does_not_take_is_an_error_and_the_dropin_is_rolled_back(make_root):
    root = make_backend_root(make_root, "grub")
    tool = root / "usr/sbin/update-grub"
    # An update-grub that succeeds but regenerates from a stale copy (the arguments never reach grub.cfg).
    tool.write_text("#!/bin/sh\nexit 0\n")
    before = tree_snapshot(root)
    with pytest.raises(KernelArgsError) as err:
        write_boot_config(root, params(root, "grub"))
    msg = str(err.value)
    assert msg.startswith(f"{tool} ran, but the boot configuration still disagrees with the kernel arguments: ")
    assert "/boot/grub/grub.cfg entry 1 boots isolcpus=(none), configured isolcpus=managed_irq,domain," in msg
    assert err.value.field == "kernel_args_backend"
    assert tree_snapshot(root) == before, "the drop-in is put back: it must match what will boot"


def test_kernel_install_entry_that_missed_the_update_is_regenerated(make_root):
    root = make_backend_root(make_root, "kernel-install")
    p = params(root, "kernel-install")
    write_boot_config(root, {**p, "update": "never"})
    entry = root / f"boot/loader/entries/fixture-{RELEASE}.conf"
    assert "isolcpus" not in entry.read_text()
    stale = write_boot_config(root, {**p, "update": "never"})
    assert stale["update_needed"] is True
    assert stale["boot_config"]["path"] == "/boot/loader/entries"
    assert {d["arg"] for d in stale["boot_config"]["differences"]} == {
        "isolcpus",
        "nohz_full",
        "rcu_nocbs",
        "irqaffinity",
    }
    fixed = write_boot_config(root, p)
    assert fixed["actions"] == [
        f"run {root}/usr/sbin/kernel-install add {RELEASE} {root}/usr/lib/modules/{RELEASE}/vmlinuz"
    ]
    assert "isolcpus=managed_irq,domain," in entry.read_text()
    assert write_boot_config(root, p)["changed"] is False


def test_without_an_update_tool_nothing_is_verified_or_predicted(make_root):
    root = make_backend_root(make_root, "grub")
    (root / "usr/sbin/update-grub").unlink()
    p = params(root, "grub")
    first = write_boot_config(root, {**p, "update": "never"})
    assert first["actions"] == [f"write /{DROPIN}"] and first["update_needed"] is False
    # The handler's call: no tool, so nothing to do, in check mode as in a real run.
    assert write_boot_config(root, {**p, "update": "only"}, check=True)["changed"] is False
    assert write_boot_config(root, {**p, "update": "only"})["changed"] is False


def test_running_kernel_is_read_under_the_facts_root(make_root, tmp_path):
    root = make_backend_root(make_root, "grub")
    p = params(root, "grub")
    written = write_boot_config(root, p)["cmdline"]["configured"]
    facts = make_root("1s8c-smt2", name="facts")
    (facts / "proc/cmdline").write_text(f"BOOT_IMAGE=/vmlinuz {written}\n")
    (facts / "proc/sys/kernel").mkdir(parents=True)
    (facts / "proc/sys/kernel/osrelease").write_text(RELEASE + "\n")
    plan = p["plan"]
    (facts / "sys/devices/system/cpu/isolated").write_text(plan["isolated_cpus"] + "\n")
    (facts / "sys/devices/system/cpu/nohz_full").write_text(plan["pool_cpus"]["exclusive"] + "\n")
    # The node root's own proc/cmdline (a sandbox copy) says nothing: the facts root is what counts.
    out = write_boot_config(root, {**p, "kernel_release": None}, facts_root=str(facts))
    assert out["reboot_required"] is False and out["pending"] == [] and out["kernel_release"] == RELEASE
    assert out["cmdline"]["running"].startswith("BOOT_IMAGE=/vmlinuz ")
    assert write_boot_config(root, p)["reboot_required"] is True  # without it, the node root's is read


def facts_with_config_gz(make_root, name: str, text: str | None, release: str = RELEASE) -> Path:
    """A facts root whose running kernel is ``release`` and ships its config only as proc/config.gz."""
    facts = make_root("1s8c-smt2", name=name)
    (facts / "proc/sys/kernel").mkdir(parents=True)
    (facts / "proc/sys/kernel/osrelease").write_text(release + "\n")
    if text is not None:
        (facts / "proc/config.gz").write_bytes(gzip.compress(text.encode()))
    return facts


def test_running_kernels_config_gz_is_read_when_boot_has_none(make_root):
    root = make_backend_root(make_root, "grub")
    (root / "boot" / f"config-{RELEASE}").unlink()
    p = {**params(root, "grub"), "kernel_release": None}
    unchecked = "the kernel config was not found"
    # Without either, the run warns that nothing was checked.
    bare = write_boot_config(root, p, check=True, facts_root=str(facts_with_config_gz(make_root, "bare", None)))
    assert any(unchecked in w for w in bare["warnings"]), bare["warnings"]
    # The running kernel's proc/config.gz is read: a kernel without NO_HZ_FULL is refused, nothing written ...
    before = tree_snapshot(root)
    without = facts_with_config_gz(make_root, "without", "CONFIG_RCU_NOCB_CPU=y\n# CONFIG_NO_HZ_FULL is not set\n")
    with pytest.raises(KernelArgsError, match="CONFIG_NO_HZ_FULL"):
        write_boot_config(root, p, facts_root=str(without))
    assert tree_snapshot(root) == before
    # ... and one with it is checked, without the warning.
    good = facts_with_config_gz(make_root, "good", "CONFIG_NO_HZ_FULL=y\nCONFIG_RCU_NOCB_CPU=y\n")
    out = write_boot_config(root, p, facts_root=str(good))
    assert out["changed"] is True and not any(unchecked in w for w in out["warnings"]), out["warnings"]


def test_config_gz_describes_only_the_running_kernel(make_root):
    root = make_backend_root(make_root, "grub")
    (root / "boot" / f"config-{RELEASE}").unlink()
    # The arguments are for another release than the one running: its config.gz says nothing about that one.
    facts = facts_with_config_gz(make_root, "facts", "# CONFIG_NO_HZ_FULL is not set\n", release="6.12.0-running")
    out = write_boot_config(root, params(root, "grub"), check=True, facts_root=str(facts))
    assert any("the kernel config was not found" in w for w in out["warnings"]), out["warnings"]
    # A config.gz that does not decompress is an error naming it, not a node taken as unchecked.
    (facts / "proc/sys/kernel/osrelease").write_text(RELEASE + "\n")
    (facts / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_NO_HZ_FULL=y\n")[:-6])
    with pytest.raises(KernelArgsError, match=r"cannot read /proc/config\.gz") as refused:
        write_boot_config(root, params(root, "grub", kernel_release=None), check=True, facts_root=str(facts))
    assert refused.value.field == "kernel_release"  # the variable that points the check at another kernel's config
