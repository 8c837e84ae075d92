"""Kernel arguments derived from the plan: derived, validated, and compared with the running kernel.

Pure text in, text out. cpupools owns the kernel arguments in ``OWNED``: four
CPU lists (``isolcpus``, ``nohz_full``, ``rcu_nocbs``, ``irqaffinity``) and the
boot reservation of hugepages (``default_hugepagesz``, ``hugepagesz``,
``hugepages``). Every other argument on a command line belongs to the
operator and is carried through byte for byte.

* ``derive_kernel_args``: the plan -> the owned arguments (compressed cpulists,
  and the hugepage arguments of ``plan["hugepages"]["boot"]``).
* ``validate_kernel_args`` / ``check_cmdline_length``: refuse what the kernel
  would reject or silently ignore, with the numbers.
* ``pending_args``: which owned arguments the running kernel does not have yet
  (``/proc/cmdline``), so a reboot is required.

The boot loaders' files that carry them (the GRUB drop-in, ``grubby``'s
entries, ``/etc/kernel/cmdline``, a generated ``grub.cfg``, BLS entries) are
parsed and rendered in ``bootfiles.py``; reading, writing and running the boot
loader tools is ``bootloader.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.cpulist import (
    ISOLCPUS_FLAGS,
    format_cpulist,
    format_isolcpus,
    parse_cpulist,
    parse_isolcpus,
    split_cmdline,
)
from ..core.errors import CpulistError, KernelArgsError
from .hugepages import per_node_hugepages, release_version

#: The kernel arguments this project owns, in the order they are written
#: (``hugepages=`` counts pages of the ``hugepagesz=`` before it, so that order matters).
CPU_ARGS = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity")
HUGEPAGE_ARGS = ("default_hugepagesz", "hugepagesz", "hugepages")
OWNED = CPU_ARGS + HUGEPAGE_ARGS
DEFAULT_ISOLCPUS_FLAGS = ("managed_irq", "domain")
#: x86's COMMAND_LINE_SIZE (arch/x86/include/asm/setup.h): the buffer holds the
#: command line and its terminating NUL, so 2047 bytes of arguments fit.
COMMAND_LINE_SIZE = 2048
#: Kernels before 5.17 keep one housekeeping mask for isolcpus= and nohz_full=
#: and ignore the second of the two when their CPUs differ.
SPLIT_HOUSEKEEPING_SINCE = (5, 17)


# Options ---------------------------------------------------------------------


@dataclass(frozen=True)
class KargsOptions:
    """What to derive (one field per inventory variable, ``cpupools_`` + name)."""

    isolcpus_flags: tuple[str, ...] = DEFAULT_ISOLCPUS_FLAGS
    nohz_full: bool = True
    rcu_nocbs: bool = True
    irqaffinity: bool = True
    keep_adopted: bool = True
    command_line_size: int = COMMAND_LINE_SIZE


#: ``cpupools_isolcpus_flags: auto`` per runtime: the kubelet runs every pod it has
#: not handed CPUs to on its isolated CPUs, so they keep the scheduler's load
#: balancing (``managed_irq`` only, as OpenShift's PerformanceProfile does).
RUNTIME_ISOLCPUS_FLAGS = {"kubelet": ("managed_irq",)}


def resolve_isolcpus_flags(raw: object, runtime: str | None) -> tuple[str, ...]:
    """``cpupools_isolcpus_flags`` with ``auto`` (or nothing) resolved for the node's runtime."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() == "auto"):
        return RUNTIME_ISOLCPUS_FLAGS.get(runtime or "cmk", DEFAULT_ISOLCPUS_FLAGS)
    return parse_flags(raw)


def parse_flags(raw: object) -> tuple[str, ...]:
    """Validate ``cpupools_isolcpus_flags`` (a list, or a comma-separated string)."""
    if raw is None:
        return DEFAULT_ISOLCPUS_FLAGS
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)):
        raise KernelArgsError(f"{raw!r} is not a list of flags", "isolcpus_flags")
    flags: list[str] = []
    for item in items:
        flag = str(item).strip()
        if not flag:
            continue
        if flag not in ISOLCPUS_FLAGS:
            raise KernelArgsError(
                f"unknown isolcpus flag {flag!r}; the kernel knows {', '.join(ISOLCPUS_FLAGS)} "
                "(it skips an unknown flag, and ignores the whole isolcpus= when a flag has other characters)",
                "isolcpus_flags",
            )
        if flag not in flags:
            flags.append(flag)
    return tuple(flags)


def make_options(raw: Mapping[str, object]) -> KargsOptions:
    """Validate raw option values into ``KargsOptions`` (errors name the variable)."""
    size = raw.get("command_line_size", COMMAND_LINE_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size < 256:
        raise KernelArgsError(
            f"{size!r} is not a plausible COMMAND_LINE_SIZE (a number of bytes >= 256)", "command_line_size"
        )

    def flag(name: str) -> bool:
        value = raw.get(name, True)
        if not isinstance(value, bool):
            raise KernelArgsError(f"{value!r} is not true or false", name)
        return value

    plan = raw.get("plan")
    runtime = plan.get("runtime") if isinstance(plan, Mapping) else None
    flags = raw.get("isolcpus_flags")
    if isinstance(flags, (list, tuple)) and [str(f).strip().lower() for f in flags] == ["auto"]:
        flags = "auto"  # a list-typed module option makes ["auto"] of auto
    return KargsOptions(
        isolcpus_flags=resolve_isolcpus_flags(flags, runtime),
        nohz_full=flag("nohz_full"),
        rcu_nocbs=flag("rcu_nocbs"),
        irqaffinity=flag("irqaffinity"),
        keep_adopted=flag("keep_adopted"),
        command_line_size=size,
    )


# Derivation ------------------------------------------------------------------


def owned_values(cmdline: str) -> dict[str, list[str | None]]:
    """Every value of each owned argument on ``cmdline``, in order."""
    found: dict[str, list[str | None]] = {}
    for key, value in split_cmdline(cmdline):
        if key in OWNED:
            found.setdefault(key, []).append(value)
    return found


def render_args(args: Mapping[str, str]) -> str:
    """``isolcpus=... nohz_full=...`` in ``OWNED`` order."""
    return " ".join(f"{key}={args[key]}" for key in OWNED if key in args)


def _cpus(text: str, what: str) -> list[int]:
    try:
        return parse_cpulist(text, what)
    except CpulistError as exc:
        raise KernelArgsError(f"the plan is malformed: {exc}", "plan") from None


def hugepage_args(plan: Mapping) -> dict[str, str]:
    """``default_hugepagesz=``, ``hugepagesz=`` and ``hugepages=`` of ``plan["hugepages"]["boot"]``.

    The boot reservation is one size: a count the kernel spreads over the
    NUMA nodes, or with ``boot["nodes"]`` a count per node in the kernel's
    node format (``hugepages=0:4,1:4``, nodes ascending, 5.16 and later;
    ``hugepages.plan_hugepages`` decides which).
    """
    boot = (plan.get("hugepages") or {}).get("boot") or {}
    args: dict[str, str] = {}
    if boot.get("default_size"):
        args["default_hugepagesz"] = str(boot["default_size"])
    if boot.get("size") and boot.get("count"):
        args["hugepagesz"] = str(boot["size"])
        nodes = boot.get("nodes")
        if nodes:
            pairs = sorted((int(n), int(c)) for n, c in nodes.items())
            args["hugepages"] = ",".join(f"{n}:{c}" for n, c in pairs)
        else:
            args["hugepages"] = str(int(boot["count"]))
    return args


def derive_kernel_args(
    plan: Mapping, options: KargsOptions, running_cmdline: str = ""
) -> tuple[dict[str, str], list[str]]:
    """The owned arguments the plan asks for, and notes on what was left out and why.

    The hugepage arguments come from ``hugepage_args`` in every mode.
    """
    args, notes = _derive_cpu_args(plan, options, running_cmdline)
    args.update(hugepage_args(plan))
    return args, notes


def _derive_cpu_args(
    plan: Mapping, options: KargsOptions, running_cmdline: str = ""
) -> tuple[dict[str, str], list[str]]:
    """The owned CPU-list arguments the plan asks for, and notes on what was left out and why.

    ``generate`` plans: ``isolcpus=<flags>,<isolated CPUs>``; ``nohz_full`` and
    ``rcu_nocbs`` on the exclusive pool; ``irqaffinity`` on the housekeeping
    CPUs. ``adopt`` plans with ``keep_adopted``: the running kernel's own
    values, so a migrated CMK node needs no reboot; arguments it does not
    have are not added (a note says so).
    """
    try:
        mode = plan["mode"]
        isolated = plan["isolated_cpus"]
        housekeeping = plan["housekeeping_cpus"]
        pool_cpus = plan["pool_cpus"]
    except (KeyError, TypeError):
        raise KernelArgsError(
            "the plan lacks mode/isolated_cpus/housekeeping_cpus/pool_cpus; run the cpupools_plan role first", "plan"
        ) from None
    args: dict[str, str] = {}
    notes: list[str] = []
    enabled = {"nohz_full": options.nohz_full, "rcu_nocbs": options.rcu_nocbs, "irqaffinity": options.irqaffinity}
    adopted = plan.get("adopted") if mode == "adopt" else None
    if adopted and options.keep_adopted:
        running = owned_values(running_cmdline)
        iso_values = running.get("isolcpus") or []
        if len(iso_values) == 1 and iso_values[0]:
            args["isolcpus"] = iso_values[0]
        else:
            args["isolcpus"] = format_isolcpus(
                adopted.get("isolcpus_flags") or (), _cpus(adopted.get("isolcpus", ""), "adopted isolcpus")
            )
        for key in ("nohz_full", "rcu_nocbs", "irqaffinity"):
            values = running.get(key)
            if values and values[-1]:
                args[key] = values[-1]
            elif enabled[key]:
                notes.append(
                    f"adopt mode keeps the running kernel's arguments and it has no {key}=; "
                    f"set cpupools_keep_adopted: false to derive {key}= from the plan (needs a reboot)"
                )
        return args, notes
    iso = _cpus(isolated, "isolated_cpus")
    if iso:
        args["isolcpus"] = format_isolcpus(options.isolcpus_flags, iso)
    else:
        notes.append("no CPU is isolated (cpupools_isolated_pools is empty or the pools are): isolcpus= is not set")
    exclusive = _cpus(pool_cpus.get("exclusive", ""), "exclusive pool")
    for key in ("nohz_full", "rcu_nocbs"):
        if not enabled[key]:
            continue
        if exclusive:
            args[key] = format_cpulist(exclusive)
        else:
            notes.append(f"the exclusive pool is empty: {key}= is not set")
    if options.irqaffinity:
        hk = _cpus(housekeeping, "housekeeping_cpus")
        if not hk:
            raise KernelArgsError("the plan has no housekeeping CPU, so irqaffinity= would be empty", "plan")
        args["irqaffinity"] = format_cpulist(hk)
    return args, notes


# Validation --------------------------------------------------------------------


def _config_enabled(config: str, option: str) -> bool:
    return re.search(rf"^{option}=[ym]\s*$", config, re.MULTILINE) is not None


def _field(key: str) -> str:
    return "isolcpus_flags" if key == "isolcpus" else key


def parse_value(key: str, value: str | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(flags, cpus)`` of one owned argument's value (flags only for isolcpus)."""
    if value is None:
        raise KernelArgsError(f"{key} has no value (expected {key}=<cpulist>)", _field(key))
    try:
        if key == "isolcpus":
            flags, cpus = parse_isolcpus(value)
            return tuple(flags), tuple(cpus)
        return (), tuple(parse_cpulist(value, key))
    except CpulistError as exc:
        raise KernelArgsError(str(exc), _field(key)) from None


def validate_kernel_args(
    args: Mapping[str, str], kernel_release: str | None = None, kernel_config: str | None = None
) -> list[str]:
    """Refuse arguments the kernel rejects or ignores; return warnings for what cannot be checked.

    The rules follow ``kernel/sched/isolation.c`` (``housekeeping_setup``,
    ``housekeeping_isolcpus_setup``): the ``nohz`` flag and ``nohz_full=``
    need CONFIG_NO_HZ_FULL; ``rcu_nocbs=`` needs CONFIG_RCU_NOCB_CPU; when
    isolcpus has ``nohz`` and ``nohz_full=`` is given too, both must name the
    same CPUs ("nohz_full= must match isolcpus="); before 5.17 that holds for
    any isolcpus= and nohz_full= pair; an empty cpulist isolates nothing.
    """
    warnings: list[str] = []
    if ":" in args.get("hugepages", "") and per_node_hugepages(kernel_release) is False:
        raise KernelArgsError(
            f"hugepages={args['hugepages']} gives pages per NUMA node, which kernel {kernel_release} does not read "
            "(before 5.16 it takes the first node number for the count); set cpupools_kernel_release to the kernel "
            "that boots",
            "hugepages",
        )
    parsed = {key: parse_value(key, value) for key, value in args.items() if key in CPU_ARGS}
    for key, (_, cpus) in parsed.items():
        if not cpus:
            raise KernelArgsError(
                f"{key}={args[key]} has an empty CPU list; the kernel would isolate nothing", _field(key)
            )
    iso_flags, iso_cpus = parsed.get("isolcpus", ((), ()))
    nohz = parsed.get("nohz_full")
    if kernel_config is not None:
        if ("nohz" in iso_flags or nohz) and not _config_enabled(kernel_config, "CONFIG_NO_HZ_FULL"):
            what = "the isolcpus flag nohz" if "nohz" in iso_flags else "nohz_full="
            raise KernelArgsError(
                f"{what} needs a kernel built with CONFIG_NO_HZ_FULL, and this kernel's config does not have it",
                "isolcpus_flags" if "nohz" in iso_flags else "nohz_full",
            )
        if "rcu_nocbs" in parsed and not _config_enabled(kernel_config, "CONFIG_RCU_NOCB_CPU"):
            raise KernelArgsError(
                "rcu_nocbs= needs a kernel built with CONFIG_RCU_NOCB_CPU, and this kernel's config does not have it",
                "rcu_nocbs",
            )
    elif "nohz" in iso_flags or nohz:
        warnings.append("the kernel config was not found: cannot check that it supports nohz_full (CONFIG_NO_HZ_FULL)")
    if nohz and iso_cpus and set(nohz[1]) != set(iso_cpus):
        numbers = f"isolcpus= names {format_cpulist(iso_cpus)}, nohz_full= names {format_cpulist(nohz[1])}"
        if "nohz" in iso_flags:
            raise KernelArgsError(
                "with the isolcpus flag nohz the kernel ignores nohz_full= unless both name the same CPUs "
                f"({numbers}); "
                "drop the nohz flag or set cpupools_nohz_full: false",
                "isolcpus_flags",
            )
        version = release_version(kernel_release)
        if version is not None and version < SPLIT_HOUSEKEEPING_SINCE:
            raise KernelArgsError(
                f"kernel {kernel_release} (before 5.17) keeps one housekeeping mask and ignores nohz_full= unless it "
                f"names the same CPUs as isolcpus= ({numbers}); set cpupools_isolated_pools to [exclusive] "
                "or cpupools_nohz_full: false",
                "nohz_full",
            )
        if version is None:
            warnings.append(
                "kernel release unknown: kernels before 5.17 ignore nohz_full= when it differs from isolcpus= "
                f"({numbers})"
            )
    return warnings


def check_cmdline_length(cmdline: str, size: int, ours: str, where: str) -> None:
    """Refuse a command line the kernel would truncate (COMMAND_LINE_SIZE includes the NUL)."""
    length = len(cmdline.encode())
    if length > size - 1:
        raise KernelArgsError(
            f"the kernel command line {where} would be {length} bytes, of which cpupools' arguments are "
            f"{len(ours.encode())}; the kernel keeps at most {size - 1} (COMMAND_LINE_SIZE {size}) and cuts the rest",
            "command_line_size",
        )


# Active or pending -------------------------------------------------------------


def normal_value(key: str, value: str | None) -> object:
    if value is None:
        return None
    if key in HUGEPAGE_ARGS:
        return value.strip().lower()
    try:
        flags, cpus = parse_value(key, value)
    except KernelArgsError:
        return ("unparsable", value)
    if key == "isolcpus":
        return (frozenset(flags or ("domain",)), frozenset(cpus))  # no flag means domain
    return frozenset(cpus)


def merged_value(key: str, values: Sequence[str | None]) -> str | None:
    """The value the kernel acts on: all isolcpus= unioned (as topology reads it), else the last."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    if key != "isolcpus" or len(values) == 1:
        return values[-1]
    flags: list[str] = []
    cpus: set[int] = set()
    for value in values:
        f, c = parse_value(key, value)
        flags += [x for x in f if x not in flags]
        cpus.update(c)
    return format_isolcpus(flags, cpus)


def _domain_cpus(value: str | None) -> frozenset[int]:
    """The CPUs an ``isolcpus=`` value takes out of the scheduler domains (no flag means ``domain``)."""
    if value is None:
        return frozenset()
    try:
        flags, cpus = parse_value("isolcpus", value)
    except KernelArgsError:
        return frozenset()
    return frozenset(cpus) if not flags or "domain" in flags else frozenset()


def unapplied_args(running_cmdline: str, isolated: str | None = None, nohz_full: str | None = None) -> list[dict]:
    """Owned arguments on the running command line that the kernel does not apply.

    According to ``/sys/devices/system/cpu/isolated`` (what ``isolcpus`` took
    out of the scheduler domains: its CPUs when it has the ``domain`` flag or
    no flag, else none) and ``/sys/devices/system/cpu/nohz_full``. Each entry:
    ``arg``, ``running`` (the value on the command line), ``active`` (what
    sysfs shows, compressed), ``message``. A reboot does not fix these.
    """
    running = owned_values(running_cmdline)
    out: list[dict] = []
    iso_value = merged_value("isolcpus", running.get("isolcpus", []))
    if (
        isolated is not None
        and iso_value is not None
        and normal_value("isolcpus", iso_value) != ("unparsable", iso_value)
    ):
        expect = set(_domain_cpus(iso_value))
        active = set(parse_cpulist(isolated.strip(), "/sys/devices/system/cpu/isolated"))
        if active != expect:
            out.append(
                {
                    "arg": "isolcpus",
                    "running": iso_value,
                    "active": format_cpulist(active),
                    "message": f"the running kernel was booted with isolcpus={iso_value} but "
                    f"/sys/devices/system/cpu/isolated shows {format_cpulist(active) or 'none'}: the kernel did "
                    "not apply it (see dmesg 'Housekeeping')",
                }
            )
    nohz_value = merged_value("nohz_full", running.get("nohz_full", []))
    if nohz_full is not None and nohz_value is not None:
        text = nohz_full.strip()
        active = set() if text == "(null)" else set(parse_cpulist(text, "/sys/devices/system/cpu/nohz_full"))
        if active != set(parse_value("nohz_full", nohz_value)[1]):
            out.append(
                {
                    "arg": "nohz_full",
                    "running": nohz_value,
                    "active": format_cpulist(active),
                    "message": f"the running kernel was booted with nohz_full={nohz_value} but "
                    f"/sys/devices/system/cpu/nohz_full shows {format_cpulist(active) or 'none'}: the kernel "
                    "did not apply it",
                }
            )
    return out


def pending_args(
    configured: Mapping[str, str | None],
    running_cmdline: str,
    isolated: str | None = None,
    nohz_full: str | None = None,
    partitions: str | None = None,
) -> tuple[list[dict], list[str]]:
    """Owned arguments whose boot-loader value differs from the running kernel's.

    ``configured`` maps each owned key to the value the next boot will have
    (``None``: not set). Compared by meaning (``isolcpus=1-3`` equals
    ``isolcpus=domain,1,2,3``). Returns ``(pending, warnings)``; the warnings
    are the messages of ``unapplied_args`` (arguments the running kernel has
    on its command line but does not apply; a reboot does not fix those).
    Each pending item's ``now`` is ``runtime_part``'s answer (``partitions``:
    the running kernel's ``cpuset.cpus.isolated`` text, None without it).
    """
    running = owned_values(running_cmdline)
    pending = []
    for key in OWNED:
        want = configured.get(key)
        have = merged_value(key, running.get(key, []))
        if normal_value(key, want) != normal_value(key, have):
            item = {"arg": key, "configured": want, "running": have}
            item["now"] = runtime_part(item, partitions)
            pending.append(item)
    return pending, [u["message"] for u in unapplied_args(running_cmdline, isolated, nohz_full)]


#: Where the running kernel says which CPUs its isolated cpuset partitions hold (cgroup v2, Linux 6.7+).
PARTITIONS_FILE = "sys/fs/cgroup/cpuset.cpus.isolated"


def runtime_part(item: Mapping, partitions: str | None) -> str | None:
    """What of one pending argument's change the running kernel could take now, without the reboot.

    Only the scheduler-domain half of ``isolcpus``, and only on a kernel with
    isolated cpuset partitions (``partitions``: the text of
    ``/sys/fs/cgroup/cpuset.cpus.isolated``; None where the kernel or its
    cgroup setup has none: before Linux 6.7, cgroup v1): a partition takes
    its CPUs out of the scheduler's load balancing and the unbound
    workqueues' mask, and every other cgroup's tasks off them, at once.
    ``nohz_full``, ``rcu_nocbs``, ``irqaffinity``, ``isolcpus``'s
    ``managed_irq`` and the boot hugepages act only from the command line.
    cpupools itself does not make partitions (docs/kernel-args.md,
    "Isolated cpuset partitions", says why); this says what a kernel could do.
    """
    if item.get("arg") != "isolcpus" or partitions is None:
        return None
    want, have = _domain_cpus(item.get("configured")), _domain_cpus(item.get("running"))
    if want == have:
        return None  # only the flags differ (managed_irq, nohz): the reboot's
    return (
        f"the scheduler-domain isolation of CPUs {format_cpulist(sorted(want)) or '(none)'} (load balancing, "
        "the unbound workqueues, every other cgroup's tasks) through an isolated cpuset partition, which "
        "this kernel has"
    )


# Host-side outputs -----------------------------------------------------------------


def housekeeping_outputs(plan: Mapping) -> dict:
    """Values for the optional systemd/irqbalance/kubelet drop-ins (rendered by templates)."""
    hk = _cpus(plan.get("housekeeping_cpus", ""), "housekeeping_cpus")
    pools = set()
    for cpus in (plan.get("pool_cpus") or {}).values():
        pools.update(_cpus(cpus, "pool_cpus"))
    reserved = sorted(pools - set(hk))
    return {
        "housekeeping_cpus": format_cpulist(hk),
        "isolated_cpus": format_cpulist(_cpus(plan.get("isolated_cpus", ""), "isolated_cpus")),
        # systemd's CPUAffinity= takes indexes and ranges separated by spaces.
        "cpu_affinity": format_cpulist(hk).replace(",", " "),
        "irqbalance_banned_cpulist": format_cpulist(reserved),
        "kubelet_reserved_system_cpus": format_cpulist(reserved),
        "kubelet_system_reserved_cpu": str(len(reserved)),
        # cpupools_power as planned (hardware/power.py plan_power): the housekeeper's configuration carries it
        "power": plan.get("power") or {},
    }
