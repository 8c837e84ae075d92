"""Pure tests of module_utils/cpupools/node/kargs.py: derivation, validation, parsers, editing."""

from __future__ import annotations

import pytest
from cpupools.core.errors import KernelArgsError
from cpupools.hardware.topology import gather_topology
from cpupools.node import bootfiles, kargs
from cpupools.planning.plan import make_request, plan_pools
from sysfs import Spec


def plan_for(root, **request):
    return plan_pools(gather_topology(str(root)), make_request(request))


@pytest.fixture
def plan_2s(make_root):
    # 2 sockets x 22 cores SMT2: 6 exclusive spread, 2 shared packed.
    return plan_for(make_root("2s22c-smt2"), num_exclusive_cores=6, num_shared_cores=2, exclusive_mode="spread")


def test_generate_derives_every_argument_from_the_plan(plan_2s):
    args, notes = kargs.derive_kernel_args(plan_2s, kargs.KargsOptions())
    assert args == {
        "isolcpus": "managed_irq,domain," + plan_2s["isolated_cpus"],
        "nohz_full": plan_2s["pool_cpus"]["exclusive"],
        "rcu_nocbs": plan_2s["pool_cpus"]["exclusive"],
        "irqaffinity": plan_2s["housekeeping_cpus"],
    }
    assert notes == []
    # compressed cpulists, exactly the plan's
    assert args["nohz_full"] == "1-3,23-25,45-47,67-69"


def test_the_kubelet_node_isolates_everything_but_housekeeping(make_root):
    # 2s8c-2numa: NUMA nodes of 4 cores (CPU n+16 the sibling of n), housekeeping their first cores
    # 0, 4, 8, 12. Under the kubelet every other CPU may be handed out exclusively: isolated (without
    # the domain flag: it also runs the pods it has not handed CPUs to), no tick, RCU callbacks
    # offloaded; interrupts, RCU offload threads and systemd on the housekeeping CPUs of every node.
    plan = plan_for(make_root("2s8c-2numa"), num_exclusive_cores=-1, num_shared_cores=0, runtime="kubelet")
    opts = kargs.make_options({"isolcpus_flags": "auto", "plan": plan})
    args, notes = kargs.derive_kernel_args(plan, opts)
    rest = "1-3,5-7,9-11,13-15,17-19,21-23,25-27,29-31"
    assert args == {
        "isolcpus": "managed_irq," + rest,
        "nohz_full": rest,
        "rcu_nocbs": rest,
        "irqaffinity": "0,4,8,12,16,20,24,28",
    }
    assert notes == []
    assert kargs.housekeeping_outputs(plan)["cpu_affinity"] == "0 4 8 12 16 20 24 28"
    # The same plan for cmk keeps the domain flag.
    cmk = plan_for(make_root("2s8c-2numa"), num_exclusive_cores=-1, num_shared_cores=0)
    args, _ = kargs.derive_kernel_args(cmk, kargs.make_options({"isolcpus_flags": "auto", "plan": cmk}))
    assert args["isolcpus"] == "managed_irq,domain," + rest


def test_switches_and_isolated_pools(make_root):
    root = make_root("1s8c-smt2")
    plan = plan_for(root, num_exclusive_cores=2, num_shared_cores=1, isolated_pools=["exclusive"])
    opts = kargs.make_options({"nohz_full": False, "irqaffinity": False, "isolcpus_flags": "domain"})
    args, _ = kargs.derive_kernel_args(plan, opts)
    assert args == {"isolcpus": "domain," + plan["pool_cpus"]["exclusive"], "rcu_nocbs": plan["pool_cpus"]["exclusive"]}
    none = plan_for(root, num_exclusive_cores=0, num_shared_cores=1, isolated_pools=[])
    args, notes = kargs.derive_kernel_args(none, kargs.KargsOptions())
    assert set(args) == {"irqaffinity"}
    assert any("isolcpus= is not set" in n for n in notes) and any("exclusive pool is empty" in n for n in notes)


def test_adopt_keeps_the_running_arguments_verbatim(make_root):
    cmdline = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 isolcpus=1,2,3,9,10,11 quiet"
    root = make_root(Spec(sockets=1, cores_per_socket=8, threads=2, cmdline=cmdline, isolated="1-3,9-11"))
    plan = plan_for(root, num_exclusive_cores=2, num_shared_cores=1, isolcpus_source="adopt")
    args, notes = kargs.derive_kernel_args(plan, kargs.KargsOptions(), cmdline)
    assert args == {"isolcpus": "1,2,3,9,10,11"}  # no reboot: byte-identical to what runs
    assert len(notes) == 3 and all("adopt mode" in n for n in notes)
    pending, _ = kargs.pending_args(args, cmdline, "1-3,9-11", "(null)")
    assert pending == []
    # told otherwise: derive from the plan
    args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions(keep_adopted=False), cmdline)
    assert args["isolcpus"] == "managed_irq,domain,1-3,9-11" and "nohz_full" in args


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"isolcpus_flags": ["domain", "nohz_ful"]}, "unknown isolcpus flag 'nohz_ful'"),
        ({"isolcpus_flags": "managed-irq"}, "unknown isolcpus flag 'managed-irq'"),
        ({"command_line_size": 12}, "COMMAND_LINE_SIZE"),
        ({"nohz_full": "yes"}, "not true or false"),
    ],
)
def test_bad_options_are_refused(raw, message):
    with pytest.raises(KernelArgsError, match=message) as err:
        kargs.make_options(raw)
    assert err.value.describe("node1").startswith("host node1: cpupools_")


CONFIG = "CONFIG_NO_HZ_FULL=y\nCONFIG_RCU_NOCB_CPU=y\n"


def test_validation_follows_the_kernel():
    good = {"isolcpus": "managed_irq,domain,1-5", "nohz_full": "1-3", "rcu_nocbs": "1-3", "irqaffinity": "0"}
    assert kargs.validate_kernel_args(good, "6.1.0-18-amd64", CONFIG) == []
    # the nohz flag makes isolcpus= and nohz_full= share the tick mask: they must match
    with pytest.raises(KernelArgsError, match=r"nohz_full= unless both name the same CPUs \(isolcpus= names 1-5"):
        kargs.validate_kernel_args({**good, "isolcpus": "nohz,domain,1-5"}, "6.1.0", CONFIG)
    # before 5.17 one housekeeping mask: any mismatch makes the kernel drop nohz_full=
    with pytest.raises(KernelArgsError, match=r"kernel 4\.18\.0-513\.el8\.x86_64 \(before 5\.17\)"):
        kargs.validate_kernel_args(good, "4.18.0-513.el8.x86_64", CONFIG)
    assert kargs.validate_kernel_args({**good, "nohz_full": "1-5"}, "4.18.0", CONFIG) == []
    with pytest.raises(KernelArgsError, match="CONFIG_NO_HZ_FULL"):
        kargs.validate_kernel_args(good, "6.1.0", "CONFIG_RCU_NOCB_CPU=y\n# CONFIG_NO_HZ_FULL is not set\n")
    with pytest.raises(KernelArgsError, match="CONFIG_RCU_NOCB_CPU"):
        kargs.validate_kernel_args(good, "6.1.0", "CONFIG_NO_HZ_FULL=y\n")
    with pytest.raises(KernelArgsError, match="empty CPU list"):
        kargs.validate_kernel_args({"nohz_full": ""}, "6.1.0", CONFIG)
    with pytest.raises(KernelArgsError, match="no CPU list"):
        kargs.validate_kernel_args({"isolcpus": "domain,"}, "6.1.0", CONFIG)
    # unknown release/config: warnings, not silence
    assert len(kargs.validate_kernel_args(good, None, None)) == 2


def test_command_line_length_is_refused_with_the_numbers(make_root):
    plan = plan_for(make_root("2s8c-nosmt"), num_exclusive_cores=6, num_shared_cores=2, exclusive_mode="spread")
    args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions())
    ours = kargs.render_args(args)
    line = bootfiles.project_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro isolcpus=9", args)
    assert line == "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro " + ours
    kargs.check_cmdline_length(line, len(line) + 1, ours, "x")  # the NUL still fits
    with pytest.raises(
        KernelArgsError, match=rf"would be {len(line)} bytes, .* are {len(ours)}; .* at most {len(line) - 1}"
    ):
        kargs.check_cmdline_length(line, len(line), ours, "at the next boot")


def test_pending_compares_meaning_and_reads_sysfs():
    configured = {"isolcpus": "managed_irq,domain,1-5", "nohz_full": "1-3", "rcu_nocbs": None, "irqaffinity": None}
    pending, warnings = kargs.pending_args(configured, "root=/dev/sda isolcpus=1,2,3,4,5 quiet", "1-5", "(null)")
    assert [p["arg"] for p in pending] == ["isolcpus", "nohz_full"]  # managed_irq flag missing; nohz_full missing
    pending, warnings = kargs.pending_args(
        configured, "isolcpus=domain,managed_irq,1-5 nohz_full=1,2,3 rcu_nocbs=7", "1-5", "1-3"
    )
    assert pending == [{"arg": "rcu_nocbs", "configured": None, "running": "7", "now": None}]
    _, warnings = kargs.pending_args(configured, "isolcpus=managed_irq,domain,1-5 nohz_full=1-3", "", "(null)")
    assert len(warnings) == 2 and "did not apply" in warnings[0]


def test_pending_says_what_a_kernel_with_isolated_partitions_could_take_now():
    configured = {"isolcpus": "managed_irq,domain,2-3,6-7", "nohz_full": "2-3,6-7", "rcu_nocbs": "2-3,6-7"}
    running = "root=/dev/vda1 isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3"
    # Without cpuset.cpus.isolated (before Linux 6.7, cgroup v1): everything waits for the reboot.
    pending, _ = kargs.pending_args(configured, running, "2-3", "2-3")
    assert [(p["arg"], p["now"]) for p in pending] == [("isolcpus", None), ("nohz_full", None), ("rcu_nocbs", None)]
    # With them (the file's text, empty while no partition is made): only isolcpus's domain half could apply now.
    pending, _ = kargs.pending_args(configured, running, "2-3", "2-3", partitions="\n")
    now = {p["arg"]: p["now"] for p in pending}
    assert now["nohz_full"] is None and now["rcu_nocbs"] is None
    assert now["isolcpus"].startswith("the scheduler-domain isolation of CPUs 2-3,6-7 (load balancing"), now
    # Only a flag changed (managed_irq is the IRQ subsystem's, at boot): nothing could apply now.
    pending, _ = kargs.pending_args(
        {"isolcpus": "managed_irq,domain,2-3"}, "isolcpus=domain,2-3", "2-3", "", partitions=""
    )
    assert [(p["arg"], p["now"]) for p in pending] == [("isolcpus", None)]
    # isolcpus without domain (nohz,managed_irq only) takes nothing out of the scheduler domains: the same.
    assert kargs.runtime_part({"arg": "isolcpus", "configured": "nohz,2-3", "running": None}, "") is None
    # No flag means domain; dropping the isolation is a change too.
    said = kargs.runtime_part({"arg": "isolcpus", "configured": None, "running": "2-3"}, "")
    assert said.startswith("the scheduler-domain isolation of CPUs (none)"), said


def test_edit_cmdline_keeps_every_other_byte():
    original = 'root=UUID=ab ro  quiet isolcpus=2-5 splash "acpi_osi=Linux Foo"\n'
    edited = bootfiles.edit_cmdline(original, {"isolcpus": "domain,1-3", "nohz_full": "1-3"})
    assert edited == 'root=UUID=ab ro  quiet isolcpus=domain,1-3 splash "acpi_osi=Linux Foo" nohz_full=1-3\n'
    assert bootfiles.edit_cmdline(edited, {"isolcpus": "2-5", "nohz_full": None}) == original
    assert bootfiles.edit_cmdline("", {"irqaffinity": "0"}) == "irqaffinity=0"
    assert bootfiles.edit_cmdline("a isolcpus=1 b isolcpus=2", {"isolcpus": "3"}) == "a b isolcpus=3"


def test_grub_files_are_followed_like_the_shell():
    default = (
        "# comment\n"
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
        "GRUB_CMDLINE_LINUX='console=ttyS0'\n"
        'if [ -e /x ]; then\n  GRUB_TIMEOUT=1\nfi\nEXTRA="a=1"\n'
    )
    dropin = 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX ${EXTRA} isolcpus=2-3" # tail\n'
    ev = bootfiles.evaluate_grub_files([("/etc/default/grub", default), ("/etc/default/grub.d/10-x.cfg", dropin)])
    assert bootfiles.grub_cmdline(ev) == "console=ttyS0 a=1 isolcpus=2-3 quiet splash"
    assert bootfiles.grub_user_args(ev) == {"isolcpus": ("2-3", "/etc/default/grub.d/10-x.cfg")}
    multi = 'GRUB_CMDLINE_LINUX="a\n b"\n'
    assert bootfiles.evaluate_grub_files([("g", multi)])["GRUB_CMDLINE_LINUX"] == "a\n b"


@pytest.mark.parametrize(
    "text",
    [
        'GRUB_CMDLINE_LINUX="$(cat /etc/args)"\n',
        'if true; then\nGRUB_CMDLINE_LINUX="x"\nfi\n',
        'GRUB_CMDLINE_LINUX="unclosed\n',
        'GRUB_CMDLINE_LINUX="${A:-b}"\n',
        "sed -i s/x/y/ GRUB_CMDLINE_LINUX\n",
    ],
)
def test_grub_files_we_cannot_follow_are_refused(text):
    with pytest.raises(KernelArgsError, match="cannot parse /etc/default/grub"):
        bootfiles.evaluate_grub_files([("/etc/default/grub", text)])


def test_grub_dropin_round_trip():
    args = {"isolcpus": "managed_irq,domain,1-5", "irqaffinity": "0,6-7"}
    text = bootfiles.render_grub_dropin(args)
    assert bootfiles.read_grub_dropin(text, "p") == args
    assert 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX isolcpus=managed_irq,domain,1-5 irqaffinity=0,6-7"' in text
    with pytest.raises(KernelArgsError, match="not written by cpupools"):
        bootfiles.read_grub_dropin('GRUB_CMDLINE_LINUX="x"\n', "/etc/default/grub.d/99-cpupools.cfg")


GRUBBY_INFO = """index=0
kernel="/boot/vmlinuz-5.14.0-362.el9.x86_64"
args="ro crashkernel=1G-4G:192M rhgb quiet isolcpus=2-5"
root="UUID=7c1d"
initrd="/boot/initramfs-5.14.0-362.el9.x86_64.img $tuned_initrd"
title="Red Hat Enterprise Linux (5.14.0-362.el9.x86_64) 9.3 (Plow)"
id="abc-5.14.0-362.el9.x86_64"
index=1
kernel="/boot/vmlinuz-0-rescue-abc"
args="ro crashkernel=1G-4G:192M rhgb quiet"
root="UUID=7c1d"
index=2
non linux entry
"""


def test_grubby_info_and_update_argv():
    entries = bootfiles.parse_grubby_info(GRUBBY_INFO)
    assert [e["index"] for e in entries] == [0, 1]
    argv = bootfiles.grubby_update_argv(entries, {"isolcpus": "domain,1-3", "nohz_full": "1-3"})
    assert argv == [
        "--update-kernel=ALL",
        "--remove-args=isolcpus",
        "--args=isolcpus=domain,1-3 nohz_full=1-3",
    ]
    assert bootfiles.grubby_update_argv(entries[:1], {"isolcpus": "2-5"}) is None
    assert bootfiles.grubby_update_argv(entries, {"isolcpus": None}) == [
        "--update-kernel=ALL",
        "--remove-args=isolcpus",
    ]
    with pytest.raises(KernelArgsError, match="cannot parse grubby --info=ALL output line 1"):
        bootfiles.parse_grubby_info("grubby: fatal error\n")
    with pytest.raises(KernelArgsError, match="no Linux boot entry"):
        bootfiles.parse_grubby_info("index=0\nnon linux entry\n")


def test_housekeeping_outputs(plan_2s):
    out = kargs.housekeeping_outputs(plan_2s)
    assert out["cpu_affinity"] == plan_2s["housekeeping_cpus"].replace(",", " ")
    assert out["irqbalance_banned_cpulist"] == plan_2s["isolated_cpus"]
    assert out["kubelet_system_reserved_cpu"] == "16"


GENERATED_GRUB_CFG = """\
menuentry 'Debian GNU/Linux' --class debian {
\tlinux\t/boot/vmlinuz-6.1.0-18-amd64 root=UUID=1 ro console=ttyS0 isolcpus=managed_irq,domain,1-3 quiet splash
}
submenu 'Advanced options' {
\tmenuentry 'Debian GNU/Linux, recovery mode' {
\t\tlinux16\t/boot/vmlinuz-6.1.0-18-amd64 root=UUID=1 ro single console=ttyS0 isolcpus=managed_irq,domain,1-3
\t}
}
"""


def test_grub_cfg_cmdlines_are_the_arguments_of_every_linux_line():
    lines = bootfiles.grub_cfg_cmdlines(GENERATED_GRUB_CFG)
    assert lines == [
        "root=UUID=1 ro console=ttyS0 isolcpus=managed_irq,domain,1-3 quiet splash",
        "root=UUID=1 ro single console=ttyS0 isolcpus=managed_irq,domain,1-3",
    ]
    assert bootfiles.grub_cfg_cmdlines("insmod blscfg\nblscfg\n") == []


def test_boot_differences_accept_normal_and_recovery_entries_and_compare_by_meaning():
    booted = bootfiles.grub_cfg_cmdlines(GENERATED_GRUB_CFG)
    # Compared by meaning: the same flags and CPUs written another way agree.
    same = ["isolcpus=domain,managed_irq,1,2,3 quiet splash", "isolcpus=managed_irq,domain,1-3"]
    assert bootfiles.boot_differences("/boot/grub/grub.cfg", booted, same) == []
    # A normal entry may carry GRUB_CMDLINE_LINUX_DEFAULT, a recovery entry not: either expectation will do.
    default_only = ["isolcpus=managed_irq,domain,1-3 nohz_full=1", "isolcpus=managed_irq,domain,1-3"]
    assert bootfiles.boot_differences("/boot/grub/grub.cfg", booted, default_only) == []
    assert bootfiles.boot_differences("/boot/grub/grub.cfg", booted, default_only[:1]) != []
    wanted = ["isolcpus=managed_irq,domain,1-5 nohz_full=1-3"]
    diffs = bootfiles.boot_differences("/boot/grub/grub.cfg", booted, wanted)
    assert diffs == [
        {"file": "/boot/grub/grub.cfg", "entry": n, "arg": arg, "boots": boots, "configured": configured}
        for n in (1, 2)
        for arg, boots, configured in (
            ("isolcpus", "managed_irq,domain,1-3", "managed_irq,domain,1-5"),
            ("nohz_full", None, "1-3"),
        )
    ]
    assert bootfiles.describe_differences(diffs) == (
        "/boot/grub/grub.cfg entry 1 boots isolcpus=managed_irq,domain,1-3, "
        "configured isolcpus=managed_irq,domain,1-5; "
        "/boot/grub/grub.cfg entry 1 boots nohz_full=(none), configured nohz_full=1-3; "
        "/boot/grub/grub.cfg entry 2 boots isolcpus=managed_irq,domain,1-3, "
        "configured isolcpus=managed_irq,domain,1-5; "
        "/boot/grub/grub.cfg entry 2 boots nohz_full=(none), configured nohz_full=1-3"
    )
    assert bootfiles.describe_differences(diffs + diffs).endswith("; and 4 more")


def test_bls_entry_keys():
    text = "# comment\ntitle Fedora Linux\nversion 6.8.5-301.fc40.x86_64\noptions root=UUID=1 ro isolcpus=2\n"
    entry = bootfiles.bls_entry(text)
    assert entry["version"] == "6.8.5-301.fc40.x86_64" and entry["options"] == "root=UUID=1 ro isolcpus=2"
