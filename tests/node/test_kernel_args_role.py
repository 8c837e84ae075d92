"""The kernel_args role end to end on a GRUB fixture root, and a real grub-mkconfig run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
from cpupools.hardware.topology import gather_topology
from cpupools.node import bootfiles, kargs
from cpupools.planning.plan import make_request, plan_pools
from helpers import REPO, plan_play_files, tree_snapshot
from test_kernel_args_module import FAKES, RELEASE, USER_GRUB, commands, contents, make_backend_root

pytestmark = pytest.mark.slow

ROLE_PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: cpupools_kernel
  post_tasks:
    - name: Show exports
      ansible.builtin.debug:
        msg:
          reboot_required: "{{ cpupools_reboot_required }}"
          pending: "{{ cpupools_pending_kernel_args | map(attribute='arg') | list }}"
"""


def role_vars(root: Path, log: Path, **extra) -> dict:
    plan = plan_pools(gather_topology(str(root)), make_request({"num_exclusive_cores": 2, "num_shared_cores": 1}))
    variables = {
        "cpupools_root": str(root),
        "cpupools_plan": plan,
        "cpupools_kernel_args_backend": "grub",
        "cpupools_command_wrapper": [str(FAKES / "record-command"), str(log)],
        "cpupools_kernel_release": RELEASE,
        "cpupools_systemd_cpuaffinity": True,
        "cpupools_irqbalance_banned": True,
        "cpupools_kubelet_dropin": True,
        **extra,
    }
    return {**variables, "cpupools_plan_result": plan_play_files(variables)}


def test_role_check_converge_idempotence_absent(make_root, playbook, tmp_path):
    root = make_backend_root(make_root, "grub")
    log = tmp_path / "commands.log"
    variables = role_vars(root, log)
    plan = variables["cpupools_plan"]
    original = tree_snapshot(root)

    res = playbook(ROLE_PLAYBOOK, variables, "--check", "--diff")
    assert res.rc == 0, res.stdout
    assert res.changed() >= 4
    assert tree_snapshot(root) == original
    assert "update-grub" not in "".join(commands(log))

    res = playbook(ROLE_PLAYBOOK, variables)
    assert res.rc == 0, res.stdout
    assert res.result("Show exports")["msg"] == {
        "reboot_required": True,
        "pending": ["isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity"],
    }
    # The handler regenerated grub.cfg exactly once, after the drop-in was written.
    assert [c for c in commands(log) if "update-grub" in c] == [f"{root}/usr/sbin/update-grub"]
    hk = plan["housekeeping_cpus"]
    affinity = (root / "etc/systemd/system.conf.d/50-cpupools.conf").read_text()
    assert f"CPUAffinity={hk.replace(',', ' ')}\n" in affinity and affinity.startswith("#")
    irq = (root / "etc/systemd/system/irqbalance.service.d/50-cpupools.conf").read_text()
    assert f"Environment=IRQBALANCE_BANNED_CPULIST={plan['isolated_cpus']}\n" in irq
    kubelet = (root / "etc/kubernetes/kubelet.conf.d/50-cpupools.conf").read_text()
    assert f'reservedSystemCPUs: "{plan["isolated_cpus"]}"' in kubelet and "kind: KubeletConfiguration" in kubelet
    written = tree_snapshot(root)

    res = playbook(ROLE_PLAYBOOK, variables)
    assert res.rc == 0 and res.changed() == 0, res.stdout
    assert tree_snapshot(root) == written

    res = playbook(ROLE_PLAYBOOK, {**variables, "cpupools_kubelet_reservation": "systemReserved"})
    kubelet = (root / "etc/kubernetes/kubelet.conf.d/50-cpupools.conf").read_text()
    assert 'systemReserved:\n  cpu: "6"\n' in kubelet and "reservedSystemCPUs" not in kubelet

    res = playbook(ROLE_PLAYBOOK, {**variables, "cpupools_state": "absent"})
    assert res.rc == 0, res.stdout
    assert contents(tree_snapshot(root)) == contents(original)
    assert commands(log)[-1] == f"{root}/usr/sbin/update-grub"


def test_switching_a_drop_in_off_removes_it_and_only_then_runs_a_removal(make_root, playbook, tmp_path):
    root = make_backend_root(make_root, "grub")
    log = tmp_path / "commands.log"
    on = role_vars(root, log)
    assert playbook(ROLE_PLAYBOOK, on).rc == 0
    dropins = {
        "cpuaffinity": root / "etc/systemd/system.conf.d/50-cpupools.conf",
        "irqbalance": root / "etc/systemd/system/irqbalance.service.d/50-cpupools.conf",
        "kubelet": root / "etc/kubernetes/kubelet.conf.d/50-cpupools.conf",
    }
    assert all(p.exists() for p in dropins.values())
    off = role_vars(root, log, cpupools_systemd_cpuaffinity=False, cpupools_kubelet_dropin=False)
    res = playbook(ROLE_PLAYBOOK, off)
    assert res.rc == 0, res.stdout
    assert not dropins["cpuaffinity"].exists() and not dropins["kubelet"].exists()
    assert dropins["irqbalance"].exists()
    assert res.result("Remove the systemd CPUAffinity drop-in")["changed"] is True
    # Nothing left to remove: the removal tasks are skipped, not run to find nothing.
    again = playbook(ROLE_PLAYBOOK, off)
    assert again.rc == 0 and again.changed() == 0
    assert again.result("Remove the systemd CPUAffinity drop-in").get("skipped") is True
    # The kubelet drop-in's module reads and finds nothing to do (one task for writing and removing).
    kubelet = again.result("Write the kubelet drop-in, or leave it for the kubelet restart")
    assert kubelet["changed"] is False and kubelet["actions"] == []


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("cpupools_plan", "cpupools_plan: no plan"),
        (
            "cpupools_plan_result",
            "host localhost: cpupools_plan_result: the plan play did not render this stage's files",
        ),
    ],
)
def test_role_refuses_a_missing_plan_in_one_clear_message(make_root, playbook, tmp_path, missing, message):
    """No plan at all, or a plan without the plan play's rendered files: refused, nothing written."""
    root = make_backend_root(make_root, "grub")
    variables = role_vars(root, tmp_path / "commands.log")
    del variables[missing]
    original = tree_snapshot(root)
    res = playbook(ROLE_PLAYBOOK, variables)
    assert res.rc != 0 and message in res.messages()
    assert tree_snapshot(root) == original


GRUB_MKCONFIG = shutil.which("grub-mkconfig") or (
    "/usr/sbin/grub-mkconfig" if os.path.exists("/usr/sbin/grub-mkconfig") else None
)


@pytest.mark.skipif(
    GRUB_MKCONFIG is None, reason="grub-mkconfig is not installed (apt-get install grub2-common grub-pc-bin)"
)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_real_grub_mkconfig_renders_our_arguments_into_every_linux_line(make_root, tmp_path, request):
    """grub-mkconfig itself, in a private mount namespace over fixture /etc/default, /etc/grub.d and /boot."""
    for mountpoint in ("/etc/default", "/etc/grub.d", "/boot"):
        if not os.path.isdir(mountpoint):  # never create anything on the real host
            pytest.skip(f"{mountpoint} does not exist to bind-mount over")
    root = make_root("1s8c-smt2")
    plan = plan_pools(gather_topology(str(root)), make_request({"num_exclusive_cores": 2, "num_shared_cores": 1}))
    args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions())
    default = tmp_path / "default"
    (default / "grub.d").mkdir(parents=True)
    (default / "grub").write_text(USER_GRUB)
    (default / "grub.d" / "99-cpupools.cfg").write_text(bootfiles.render_grub_dropin(args))
    grubd = tmp_path / "grub.d"
    grubd.mkdir()
    for name in ("00_header", "10_linux"):  # 05_debian_theme left out: it probes the real /boot
        shutil.copy(f"/etc/grub.d/{name}", grubd / name)
    # /boot on a block device, as on a node: grub-probe resolves the device of /boot and cannot for a
    # tmpfs (where scripts/test.sh puts the tests' files).
    boot = Path(tempfile.mkdtemp(prefix="cpupools-boot-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(boot, ignore_errors=True))
    (boot / "grub").mkdir(parents=True)
    for name in (
        "vmlinuz-6.1.0-18-amd64",
        "initrd.img-6.1.0-18-amd64",
        "vmlinuz-6.1.0-17-amd64",
        "initrd.img-6.1.0-17-amd64",
    ):
        (boot / name).write_bytes(b"")
    out = tmp_path / "grub.cfg"
    script = textwrap.dedent(
        f"""
        set -e
        mount --make-rprivate /
        mount --bind {default} /etc/default
        mount --bind {grubd} /etc/grub.d
        mount --bind {boot} /boot
        {GRUB_MKCONFIG} -o {out}
        """
    )
    real = {p: tree_snapshot(Path(p)) if os.path.isdir(p) else None for p in ("/etc/default", "/boot")}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert {p: tree_snapshot(Path(p)) if os.path.isdir(p) else None for p in ("/etc/default", "/boot")} == real
    linux_lines = [line.strip() for line in out.read_text().splitlines() if line.strip().startswith("linux")]
    assert len(linux_lines) >= 4, out.read_text()  # two kernels, normal + recovery each
    ours = kargs.render_args(args)
    for line in linux_lines:
        assert f"console=ttyS0,115200 mitigations=off {ours}" in line, line
    assert any("quiet splash" in line for line in linux_lines)


def test_a_boot_loader_update_that_failed_once_is_repaired_by_the_next_run(make_root, playbook, tmp_path):
    from helpers import ansible_env

    root = make_backend_root(make_root, "grub")  # with the grub.cfg of the operator's arguments only
    log = tmp_path / "commands.log"
    variables = role_vars(root, log)
    grub_cfg = root / "boot/grub/grub.cfg"
    old_cfg = grub_cfg.read_text()

    failed = playbook(ROLE_PLAYBOOK, variables, env=ansible_env(FAKE_UPDATE_GRUB_FAIL="1"))
    assert failed.rc != 0
    assert "update-grub failed (exit 1): fake update-grub: failing on purpose" in failed.messages()
    assert (root / "etc/default/grub.d/99-cpupools.cfg").exists() and grub_cfg.read_text() == old_cfg

    repaired = playbook(ROLE_PLAYBOOK, variables)
    assert repaired.rc == 0, repaired.stdout
    assert repaired.changed() == 2, "the task sees grub.cfg disagree, its handler regenerates"
    task = repaired.result("Write the kernel arguments into the boot loader configuration")
    assert task["actions"] == [f"regenerate the boot configuration ({root}/usr/sbin/update-grub)"]
    # Every argument the plan sets (no hugepages asked here, so the four CPU lists) differs.
    assert {d["arg"] for d in task["boot_config"]["differences"]} == set(kargs.CPU_ARGS)
    assert any("disagrees with the kernel arguments" in w for w in task.get("warnings", []))
    assert repaired.result("Regenerate the boot loader configuration")["changed"] is True
    cfg = grub_cfg.read_text()
    for key, value in task["args"].items():
        assert cfg.count(f"{key}={value}") == 2, cfg  # normal and recovery entry

    settled = playbook(ROLE_PLAYBOOK, variables)
    assert settled.rc == 0 and settled.changed() == 0, settled.stdout
    assert grub_cfg.read_text() == cfg


def test_after_a_repair_run_a_converged_run_changes_nothing_not_even_the_report(make_root, playbook, tmp_path):
    """site.yml: update-grub fails once, the next run repairs; the run after that is converged, and so are the
    fleet report page, the JSON beside it and the report store (check mode says so first)."""
    from helpers import ansible_env

    root = make_backend_root(make_root, "grub")
    report, store = tmp_path / "report" / "fleet.html", tmp_path / "store"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    cpupools_nodes:\n      hosts:\n        localhost:\n"
        "          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        f"          cpupools_root: {root}\n"
        "          cpupools_num_exclusive_cores: 2\n          cpupools_num_shared_cores: 1\n"
        f"          cpupools_kernel_args_backend: grub\n          cpupools_kernel_release: {RELEASE}\n"
        f"          cpupools_report_html: {report}\n          cpupools_report_store: {store}\n"
    )
    site = REPO / "site.yml"
    failed = playbook(site, None, inventory=str(inventory), env=ansible_env(FAKE_UPDATE_GRUB_FAIL="1"))
    assert failed.rc != 0 and "update-grub failed (exit 1)" in failed.messages()
    repaired = playbook(site, None, inventory=str(inventory))
    assert repaired.rc == 0, repaired.stdout[-3000:]
    assert repaired.result("Regenerate the boot loader configuration")["changed"] is True

    def outputs():
        files = [report, report.with_suffix(".json"), *sorted(store.iterdir())]
        return {
            str(p): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns if p.parent != store else 0) for p in files
        }

    before = outputs()

    def changed(res):
        return [t["task"]["name"] for t in res.tasks() if t["hosts"].get("localhost", {}).get("changed")]

    check = playbook(site, None, "--check", inventory=str(inventory))
    assert check.rc == 0 and changed(check) == [], changed(check)
    again = playbook(site, None, inventory=str(inventory))
    assert again.rc == 0 and changed(again) == [], changed(again)
    assert outputs() == before  # not rewritten: the page and the JSON keep their mtime, the store files their inode
