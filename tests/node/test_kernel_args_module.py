"""The cpupools_kernel_args module against fixture roots, one per backend, through real ansible-playbook.

Commands go through the seam (command_wrapper = tests/fixtures/kargs/record-command),
which logs each argv; grubby is a fake that keeps its entries in a file under the root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools
from helpers import REPO, tree_snapshot

pytestmark = pytest.mark.slow

FAKES = REPO / "tests" / "fixtures" / "kargs"
RELEASE = "6.1.0-test"
USER_GRUB = (
    "# /etc/default/grub of the operator\n"
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=5\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
    'GRUB_CMDLINE_LINUX="console=ttyS0,115200 mitigations=off"\n'
)
USER_CMDLINE = "root=UUID=1234 ro console=ttyS0,115200  mitigations=off\n"
USER_GRUBBY_ARGS = "ro crashkernel=1G-4G:192M rhgb quiet mitigations=off"

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write kernel args
      cpupools_kernel_args:
        state: "{{ state | default('present') }}"
        plan: "{{ plan if state | default('present') == 'present' else omit }}"
        root: "{{ root }}"
        backend: "{{ backend }}"
        command_wrapper: "{{ wrapper }}"
        kernel_release: "{{ release }}"
        isolcpus_flags: "{{ flags | default(['managed_irq', 'domain']) }}"
      register: out
"""


def install(root: Path, fake: str, name: str) -> None:
    dest = root / "usr" / "sbin" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FAKES / fake, dest)


def make_backend_root(make_root, backend: str) -> Path:
    root = make_root("1s8c-smt2")
    (root / "boot").mkdir()
    (root / "boot" / f"config-{RELEASE}").write_text("CONFIG_NO_HZ_FULL=y\nCONFIG_RCU_NOCB_CPU=y\n")
    if backend == "grub":
        (root / "etc" / "default" / "grub.d").mkdir(parents=True)
        (root / "etc" / "default" / "grub").write_text(USER_GRUB)
        (root / "etc" / "default" / "grub.d" / "init-select.cfg").write_text("# does nothing\n")
        install(root, "fake-update-grub", "update-grub")
    elif backend == "grubby":
        install(root, "fake-grubby", "grubby")
        state = root / "var" / "lib" / "fake-grubby.json"
        state.parent.mkdir(parents=True)
        entries = [
            {"kernel": f"/boot/vmlinuz-{RELEASE}", "args": USER_GRUBBY_ARGS},
            {"kernel": "/boot/vmlinuz-0-rescue", "args": USER_GRUBBY_ARGS},
        ]
        state.write_text(json.dumps(entries, indent=1))
    else:
        (root / "etc" / "kernel").mkdir(parents=True)
        (root / "etc" / "kernel" / "cmdline").write_text(USER_CMDLINE)
        install(root, "fake-kernel-install", "kernel-install")
        image = root / "usr" / "lib" / "modules" / RELEASE / "vmlinuz"
        image.parent.mkdir(parents=True)
        image.write_bytes(b"")
    boot_tool(root, backend)
    return root


def boot_tool(root: Path, backend: str) -> None:
    """Generate the boot configuration as the node's tool would (a node always has one: grub.cfg, BLS entries)."""
    if backend == "grub":
        subprocess.run([str(root / "usr/sbin/update-grub")], check=True)
    elif backend == "kernel-install":
        image = root / "usr" / "lib" / "modules" / RELEASE / "vmlinuz"
        subprocess.run([str(root / "usr/sbin/kernel-install"), "add", RELEASE, str(image)], check=True)


def configured_args(root: Path, backend: str) -> str:
    """The command line the boot loader would use, read back from the fixture."""
    if backend == "grub":
        text = (root / "etc" / "default" / "grub.d" / "99-cpupools.cfg").read_text()
        return text.rsplit("$GRUB_CMDLINE_LINUX ", 1)[1].rstrip('"\n')
    if backend == "grubby":
        entries = json.loads((root / "var" / "lib" / "fake-grubby.json").read_text())
        assert len({e["args"] for e in entries}) == 1, "every entry gets the same arguments"
        return entries[0]["args"]
    return (root / "etc" / "kernel" / "cmdline").read_text()


def contents(snapshot: dict) -> dict:
    return {path: data for path, (data, _) in snapshot.items()}


@pytest.fixture
def env(tmp_path):
    def make(root: Path, backend: str, **extra):
        log = tmp_path / "commands.log"
        plan = plan_pools(gather_topology(str(root)), make_request({"num_exclusive_cores": 2, "num_shared_cores": 1}))
        return {
            "root": str(root),
            "backend": backend,
            "wrapper": [str(FAKES / "record-command"), str(log)],
            "release": RELEASE,
            "plan": plan,
            **extra,
        }, log

    return make


def commands(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("backend", ["grub", "grubby", "kernel-install"])
def test_backend_lifecycle(make_root, env, playbook, backend):
    root = make_backend_root(make_root, backend)
    variables, log = env(root, backend)
    plan = variables["plan"]
    original = tree_snapshot(root)

    # Check mode predicts and touches nothing (grubby --info is a read and runs).
    res = playbook(PLAYBOOK, variables, "--check", "--diff")
    assert res.rc == 0, res.stdout
    out = res.result("Write kernel args")
    assert out["changed"] is True
    assert tree_snapshot(root) == original
    assert all("--info=ALL" in line for line in commands(log))
    diff = out["diff"][0]
    assert "isolcpus=" not in diff["before"] and "isolcpus=managed_irq,domain," in diff["after"]
    predicted = out["args"]

    # First run: changed, our arguments written, the operator's kept.
    res = playbook(PLAYBOOK, variables)
    assert res.rc == 0, res.stdout
    out = res.result("Write kernel args")
    assert out["changed"] is True and out["backend"] == backend
    assert (
        out["args"]
        == predicted
        == {
            "isolcpus": "managed_irq,domain," + plan["isolated_cpus"],
            "nohz_full": plan["pool_cpus"]["exclusive"],
            "rcu_nocbs": plan["pool_cpus"]["exclusive"],
            "irqaffinity": plan["housekeeping_cpus"],
        }
    )
    line = configured_args(root, backend)
    for key, value in out["args"].items():
        assert f"{key}={value}" in line
    user = {"grub": "", "grubby": USER_GRUBBY_ARGS, "kernel-install": USER_CMDLINE.rstrip("\n")}[backend]
    assert line.startswith(user)
    assert out["reboot_required"] is True
    assert [p["arg"] for p in out["pending"]] == ["isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity"]
    ran = commands(log)
    if backend == "grub":
        assert ran[-1] == f"{root}/usr/sbin/update-grub"
        assert "console=ttyS0,115200 mitigations=off" in out["cmdline"]["configured"]
    elif backend == "grubby":
        assert ran[-1].startswith(f"{root}/usr/sbin/grubby --update-kernel=ALL --args=isolcpus=")
    else:
        assert ran[-1] == f"{root}/usr/sbin/kernel-install add {RELEASE} {root}/usr/lib/modules/{RELEASE}/vmlinuz"
    written = tree_snapshot(root)

    # Second run: nothing changes, same bytes and mtimes, no write command.
    before = len(commands(log))
    res = playbook(PLAYBOOK, variables)
    out = res.result("Write kernel args")
    assert res.rc == 0 and out["changed"] is False
    assert tree_snapshot(root) == written
    assert all("--update-kernel" not in c and "update-grub" not in c for c in commands(log)[before:])

    # absent: exactly ours go, the original comes back byte for byte.
    res = playbook(PLAYBOOK, {**variables, "state": "absent"})
    out = res.result("Write kernel args")
    assert res.rc == 0 and out["changed"] is True, res.stdout
    assert contents(tree_snapshot(root)) == contents(original)
    res = playbook(PLAYBOOK, {**variables, "state": "absent"})
    assert res.result("Write kernel args")["changed"] is False


def test_running_kernel_with_the_arguments_needs_no_reboot(make_root, env, playbook):
    root = make_backend_root(make_root, "kernel-install")
    variables, _ = env(root, "kernel-install")
    res = playbook(PLAYBOOK, variables)
    configured = res.result("Write kernel args")["cmdline"]["configured"]
    (root / "proc" / "cmdline").write_text(f"BOOT_IMAGE=/vmlinuz {configured}\n")
    plan = variables["plan"]
    (root / "sys/devices/system/cpu/isolated").write_text(plan["isolated_cpus"] + "\n")
    (root / "sys/devices/system/cpu/nohz_full").write_text(plan["pool_cpus"]["exclusive"] + "\n")
    out = playbook(PLAYBOOK, variables).result("Write kernel args")
    assert out["changed"] is False and out["reboot_required"] is False and out["pending"] == []


def test_user_value_of_an_owned_key_is_replaced_and_restored(make_root, env, playbook):
    root = make_backend_root(make_root, "kernel-install")
    text = "root=UUID=1234 isolcpus=7 ro\n"
    (root / "etc" / "kernel" / "cmdline").write_text(text)
    variables, _ = env(root, "kernel-install")
    assert playbook(PLAYBOOK, variables).rc == 0
    line = (root / "etc" / "kernel" / "cmdline").read_text()
    assert line.startswith("root=UUID=1234 isolcpus=managed_irq,domain,") and line.count("isolcpus=") == 1
    assert playbook(PLAYBOOK, {**variables, "state": "absent"}).rc == 0
    assert (root / "etc" / "kernel" / "cmdline").read_text() == text


def test_grub_value_already_set_by_the_operator_is_not_repeated(make_root, env, playbook):
    root = make_backend_root(make_root, "grub")
    variables, _ = env(root, "grub")
    iso = "managed_irq,domain," + variables["plan"]["isolated_cpus"]
    (root / "etc/default/grub").write_text(USER_GRUB + f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX isolcpus={iso}"\n')
    out = playbook(PLAYBOOK, variables).result("Write kernel args")
    dropin = (root / "etc/default/grub.d/99-cpupools.cfg").read_text()
    assert "isolcpus" not in dropin and "nohz_full=" in dropin
    assert out["cmdline"]["configured"].count("isolcpus=") == 1
    assert any("already set in /etc/default/grub" in n for n in out["notes"])


@pytest.mark.parametrize(
    ("backend", "setup", "extra", "message"),
    [
        ("grub", None, {"flags": ["domain", "nohz_ful"]}, "cpupools_isolcpus_flags: unknown isolcpus flag 'nohz_ful'"),
        ("grub", None, {"flags": ["nohz", "domain"]}, "cpupools_isolcpus_flags: with the isolcpus flag nohz"),
        ("grub", None, {"release": "4.18.0-513.el8.x86_64"}, "cpupools_nohz_full: kernel 4.18.0-513.el8.x86_64"),
        ("grubby", "no-grubby", {}, "cpupools_kernel_args_backend: backend grubby is forced but not installed"),
        ("grub", "bad-grub", {}, "cpupools_kernel_args_backend: cannot parse /etc/default/grub line 2"),
        ("grub", "conflict", {}, "cpupools_isolcpus_flags: /etc/default/grub sets isolcpus=3"),
        ("grub", "foreign-dropin", {}, "cpupools_grub_dropin_name: /etc/default/grub.d/99-cpupools.cfg exists"),
        ("grub", "late-dropin", {}, "cpupools_grub_dropin_name: /etc/default/grub.d/zz-cloud.cfg is read after"),
        ("grub", "update-fails", {}, "update-grub failed (exit 1): fake update-grub: failing on purpose"),
        ("grubby", "bad-grubby", {}, "cannot parse grubby --info=ALL output line 1"),
        ("kernel-install", "bad-cmdline", {}, "cannot parse /etc/kernel/cmdline"),
    ],
)
def test_bad_input_is_refused_and_nothing_written(make_root, env, playbook, backend, setup, extra, message):
    root = make_backend_root(make_root, backend)
    run_env = None
    if setup == "no-grubby":
        (root / "usr/sbin/grubby").unlink()
    elif setup == "bad-grub":
        (root / "etc/default/grub").write_text('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX="$(cat /etc/args)"\n')
    elif setup == "conflict":
        (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX="isolcpus=3"\n')
    elif setup == "foreign-dropin":
        (root / "etc/default/grub.d/99-cpupools.cfg").write_text('GRUB_CMDLINE_LINUX="x"\n')
    elif setup == "late-dropin":
        (root / "etc/default/grub.d/zz-cloud.cfg").write_text('GRUB_CMDLINE_LINUX="console=tty1"\n')
    elif setup == "update-fails":
        from helpers import ansible_env

        run_env = ansible_env(FAKE_UPDATE_GRUB_FAIL="1")
    elif setup == "bad-grubby":
        (root / "usr/sbin/grubby").write_text("#!/bin/sh\necho 'grubby: error reading /boot'\n")
    elif setup == "bad-cmdline":
        (root / "etc/kernel/cmdline").write_text('root=UUID=1 "unbalanced\n')
    variables, _ = env(root, backend, **extra)
    original = tree_snapshot(root)
    res = playbook(PLAYBOOK, variables, env=run_env)
    assert res.rc != 0
    msg = res.messages()
    assert msg.startswith("host ") and message in msg, msg
    assert "Traceback" not in res.stdout
    assert tree_snapshot(root) == original, "nothing is written when the input is refused"


def test_auto_detects_each_backend(make_root, env, playbook):
    for backend in ("grub", "grubby", "kernel-install"):
        root = make_backend_root(make_root, backend) if backend == "grub" else None
        if root is None:
            root = make_backend_root(lambda name, b=backend: make_root(name, name=b), backend)
        variables, _ = env(root, "auto")
        out = playbook(PLAYBOOK, variables, "--check").result("Write kernel args")
        assert out["backend"] == backend, out
    assert os.path.exists(root)


def test_grub_in_a_sandbox_without_update_grub_writes_the_dropin(make_root, env, playbook):
    root = make_backend_root(make_root, "grub")
    (root / "usr/sbin/update-grub").unlink()
    variables, log = env(root, "auto")
    out = playbook(PLAYBOOK, variables).result("Write kernel args")
    assert out["changed"] is True and out["backend"] == "grub"
    assert (root / "etc/default/grub.d/99-cpupools.cfg").exists()
    assert any("grub.cfg was not regenerated" in n for n in out["notes"]) and commands(log) == []
