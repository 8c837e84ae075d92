"""Kernel arguments derived from the plan, and the boot loader files that hold them.

Pure text in, text out: ``bootloader.py`` does the reading, writing and
running of commands.

cpupools owns the kernel arguments in ``OWNED``: four CPU lists
(``isolcpus``, ``nohz_full``, ``rcu_nocbs``, ``irqaffinity``) and the boot
reservation of hugepages (``default_hugepagesz``, ``hugepagesz``,
``hugepages``). Every other argument on a command line belongs to the
operator and is carried through byte for byte.

* ``derive_kernel_args``: the plan -> the owned arguments (compressed cpulists,
  and the hugepage arguments of ``plan["hugepages"]["boot"]``).
* ``validate_kernel_args`` / ``check_cmdline_length``: refuse what the kernel
  would reject or silently ignore, with the numbers.
* ``pending_args``: which owned arguments the running kernel does not have yet
  (``/proc/cmdline``), so a reboot is required.
* Backends: the GRUB drop-in (``evaluate_grub_files``, ``render_grub_dropin``,
  ``read_grub_dropin``), ``grubby --info=ALL`` output (``parse_grubby_info``,
  ``grubby_update_argv``) and ``/etc/kernel/cmdline`` (``edit_cmdline``).
* What the boot loader will actually boot: the ``linux`` lines of a generated
  ``grub.cfg`` (``grub_cfg_cmdlines``), BLS entries (``bls_entry``), compared
  with the configuration by ``boot_differences``.

The I/O around them (reading under the root, writing, running the boot loader
tools) is in ``bootloader.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.cpulist import (
    ISOLCPUS_FLAGS,
    cmdline_spans,
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
DROPIN_MARKER = "# cpupools: kernel arguments derived from the CPU pool plan"
GRUB_VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")


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


def _normal(key: str, value: str | None) -> object:
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


def _merged(key: str, values: Sequence[str | None]) -> str | None:
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
    iso_value = _merged("isolcpus", running.get("isolcpus", []))
    if isolated is not None and iso_value is not None and _normal("isolcpus", iso_value) != ("unparsable", iso_value):
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
    nohz_value = _merged("nohz_full", running.get("nohz_full", []))
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
        have = _merged(key, running.get(key, []))
        if _normal(key, want) != _normal(key, have):
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


# Command line editing (/etc/kernel/cmdline, projections) --------------------------


def edit_cmdline(text: str, changes: Mapping[str, str | None]) -> str:
    """Set (value) or remove (``None``) owned arguments in command line text.

    Every other byte is kept: a changed argument is replaced where it stands,
    a new one is appended after the last argument (before a trailing
    newline), a removed one takes one separating space with it. Removing an
    argument this function appended gives back the original text exactly.
    """
    spans = cmdline_spans(text)
    out = text
    pending = dict(changes)
    # Work from the end so earlier offsets stay valid.
    last_of = {key: i for i, (_, _, key, _) in enumerate(spans) if key in pending}
    for index in range(len(spans) - 1, -1, -1):
        start, end, key, _ = spans[index]
        if key not in pending:
            continue
        value = pending[key]
        if value is not None and index == last_of[key]:
            out = out[:start] + f"{key}={value}" + out[end:]
        else:
            if start > 0 and out[start - 1] in " \t":
                start -= 1
            elif end < len(out) and out[end] in " \t":
                end += 1
            out = out[:start] + out[end:]
    added = [f"{key}={value}" for key, value in changes.items() if value is not None and key not in last_of]
    if added:
        body = out.rstrip("\n")
        tail = out[len(body) :]
        sep = " " if body else ""
        out = body + sep + " ".join(added) + tail
    return out


def project_cmdline(cmdline: str, args: Mapping[str, str]) -> str:
    """``cmdline`` with every owned argument dropped and ``args`` appended (for length checks)."""
    kept = [cmdline[s:e] for s, e, key, _ in cmdline_spans(cmdline) if key not in OWNED]
    return " ".join([*kept, render_args(args)]).strip()


# GRUB ---------------------------------------------------------------------------

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_OPEN = re.compile(r"^(if|case|for|while|until|select)\b|\{\s*$")
_CLOSE = re.compile(r"^(fi|esac|done)\b|^\}")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class _Unsupported(Exception):
    pass


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Join lines while a quote is open or a line ends in a backslash."""
    buf: list[str] = []
    first = 0
    quote = ""
    for number, line in enumerate(text.split("\n"), start=1):
        if not buf:
            first = number
        buf.append(line)
        i = 0
        while i < len(line):
            c = line[i]
            if quote == "'":
                if c == "'":
                    quote = ""
            elif c == "\\":
                i += 1
            elif quote == '"':
                if c == '"':
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "#" and (i == 0 or line[i - 1].isspace()):
                break
            i += 1
        if quote or (line.endswith("\\") and not line.endswith("\\\\")):
            continue
        yield first, "\n".join(buf)
        buf = []
    if buf:
        raise _Unsupported(f"line {first}: a quote is never closed")


def _expand(text: str, env: Mapping[str, str | None]) -> str:
    if "$(" in text or "`" in text:
        raise _Unsupported("command substitution")
    if re.search(r"\$\{[^}]*[^A-Za-z0-9_}]", text):
        raise _Unsupported("parameter expansion other than ${NAME}")

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        value = env.get(name, "")
        if value is None:
            raise _Unsupported(f"${name} was set in a way cpupools cannot follow")
        return value

    return _VAR.sub(sub, text)


def _shell_value(text: str, env: Mapping[str, str | None]) -> str:
    """The value of ``NAME=<text>`` as a POSIX shell assigns it (the common forms only)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            rest = text[i:].strip()
            if rest and not rest.startswith("#"):
                raise _Unsupported("a command after the assignment")
            break
        if c == "'":
            j = text.find("'", i + 1)
            out.append(text[i + 1 : j])
            i = j + 1
        elif c == '"':
            j = i + 1
            part: list[str] = []
            while text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                    if text[j + 1] != "\n":
                        part.append("\x00" if text[j + 1] == "$" else text[j + 1])
                    j += 2
                    continue
                part.append(text[j])
                j += 1
            out.append(_expand("".join(part), env).replace("\x00", "$"))
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(text[i + 1] if text[i + 1] != "\n" else "")
            i += 2
        elif c in ";&|<>()`":
            raise _Unsupported(f"the shell operator {c!r}")
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "'\"\\;&|<>()`":
                j += 1
            out.append(_expand(text[i:j], env))
            i = j
    return "".join(out)


def evaluate_grub_files(files: Sequence[tuple[str, str]], env: Mapping[str, str | None] | None = None) -> dict:
    """Follow GRUB_CMDLINE_LINUX(_DEFAULT) through shell files sourced in order.

    ``files`` is ``[(path, text), ...]`` in the order grub-mkconfig sources
    them (``/etc/default/grub``, then ``/etc/default/grub.d/*.cfg`` sorted).
    Returns ``{"GRUB_CMDLINE_LINUX": ..., "GRUB_CMDLINE_LINUX_DEFAULT": ...,
    "origin": {var: path}}``. Assignments of other variables are followed too
    (a value they cannot be read from poisons them). A form cpupools cannot
    follow for one of the two variables (command substitution, a conditional
    assignment, a command using them) is an error: guessing could drop or
    duplicate an argument.
    """
    state: dict[str, str | None] = dict(env or {})
    for var in GRUB_VARS:
        state.setdefault(var, "")
    origin: dict[str, str] = {}
    for path, text in files:
        depth = 0
        try:
            lines = list(_logical_lines(text))
        except _Unsupported as exc:
            raise KernelArgsError(f"cannot parse {path}: {exc}; nothing was written", "kernel_args_backend") from None
        for number, raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = _ASSIGN.match(line)
            if _OPEN.search(line):
                depth += 1
            if match is None:
                if _CLOSE.search(line):
                    depth = max(depth - 1, 0)
                elif any(re.search(rf"\b{var}\b", line) for var in GRUB_VARS):
                    raise KernelArgsError(
                        f"cannot parse {path} line {number}: {line!r} changes the kernel command line in a way "
                        "cpupools cannot follow; nothing was written",
                        "kernel_args_backend",
                    )
                continue
            name, value = match.group(1), match.group(2)
            try:
                if name in GRUB_VARS and depth:
                    raise _Unsupported("a conditional assignment")
                state[name] = _shell_value(value, state)
                if name in GRUB_VARS:
                    origin[name] = path
            except (_Unsupported, IndexError, ValueError) as exc:
                if name in GRUB_VARS:
                    reason = exc if isinstance(exc, _Unsupported) else "an unbalanced quote"
                    raise KernelArgsError(
                        f"cannot parse {path} line {number}: {name} uses {reason}; nothing was written",
                        "kernel_args_backend",
                    ) from None
                state[name] = None
    return {
        "GRUB_CMDLINE_LINUX": state["GRUB_CMDLINE_LINUX"] or "",
        "GRUB_CMDLINE_LINUX_DEFAULT": state["GRUB_CMDLINE_LINUX_DEFAULT"] or "",
        "origin": origin,
    }


def grub_cmdline(evaluated: Mapping[str, str]) -> str:
    """The arguments GRUB's 10_linux puts on a normal entry's ``linux`` line."""
    return " ".join(
        part
        for part in (evaluated["GRUB_CMDLINE_LINUX"].strip(), evaluated["GRUB_CMDLINE_LINUX_DEFAULT"].strip())
        if part
    )


def render_grub_dropin(args: Mapping[str, str]) -> str:
    """Our ``/etc/default/grub.d/<name>.cfg``: appends the owned arguments to GRUB_CMDLINE_LINUX."""
    return (
        f"{DROPIN_MARKER}\n"
        "# Written by the cpupools_kernel_args module; edits are overwritten on the next run.\n"
        "# It appends to GRUB_CMDLINE_LINUX (every boot entry, recovery included) and keeps\n"
        "# what /etc/default/grub sets. Remove it with state=absent, then run update-grub.\n"
        f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {render_args(args)}"\n'
    )


def read_grub_dropin(text: str, path: str) -> dict[str, str]:
    """The owned arguments our drop-in appends; refuses a file cpupools did not write."""
    if DROPIN_MARKER not in text:
        raise KernelArgsError(
            f"{path} exists and was not written by cpupools; choose another cpupools_grub_dropin_name "
            "or remove the file. Nothing was written",
            "grub_dropin_name",
        )
    evaluated = evaluate_grub_files([(path, text)], {"GRUB_CMDLINE_LINUX": ""})
    return {
        key: value
        for key, value in split_cmdline(evaluated["GRUB_CMDLINE_LINUX"])
        if key in OWNED and value is not None
    }


def grub_user_args(evaluated: Mapping) -> dict[str, tuple[str | None, str]]:
    """Owned arguments the operator's own GRUB files set: ``key -> (value, file)``."""
    found: dict[str, tuple[str | None, str]] = {}
    for var in GRUB_VARS:
        for key, values in owned_values(evaluated[var]).items():
            found[key] = (_merged(key, values), evaluated["origin"].get(var, "/etc/default/grub"))
    return found


# grubby ---------------------------------------------------------------------------


def parse_grubby_info(text: str) -> list[dict]:
    """Entries of ``grubby --info=ALL``: ``[{"index": 0, "kernel": ..., "args": ...}, ...]``.

    Entries grubby reports as ``non linux entry`` are left out.
    """
    entries: list[dict] = []
    current: dict | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line == "non linux entry":
            if current is not None:
                current["linux"] = False
            continue
        key, eq, value = line.partition("=")
        if not eq or not re.match(r"^[a-z_]+$", key):
            raise KernelArgsError(
                f"cannot parse grubby --info=ALL output line {number}: {raw!r}; nothing was written",
                "kernel_args_backend",
            )
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key == "index":
            if not value.isdigit():
                raise KernelArgsError(
                    f"cannot parse grubby --info=ALL output line {number}: {raw!r}", "kernel_args_backend"
                )
            current = {"index": int(value), "linux": True}
            entries.append(current)
        elif current is None:
            raise KernelArgsError(
                f"cannot parse grubby --info=ALL output line {number}: {raw!r} comes before any index=",
                "kernel_args_backend",
            )
        else:
            current[key] = value
    linux = [e for e in entries if e.get("linux") and "kernel" in e]
    for entry in linux:
        entry.setdefault("args", "")
    if not linux:
        raise KernelArgsError("grubby --info=ALL lists no Linux boot entry; nothing was written", "kernel_args_backend")
    return linux


def grubby_update_argv(entries: Sequence[Mapping], desired: Mapping[str, str | None]) -> list[str] | None:
    """The one ``grubby --update-kernel=ALL`` call that brings every entry to ``desired``.

    ``desired`` maps owned keys to a value or ``None`` (remove). Keys already
    right in every entry are left out; ``None`` when nothing differs.
    """
    remove: list[str] = []
    add: list[str] = []
    for key, value in desired.items():
        per_entry = [owned_values(e["args"]).get(key, []) for e in entries]
        if value is None:
            if any(per_entry):
                remove.append(key)
        elif any(values != [value] for values in per_entry):
            if any(per_entry):
                remove.append(key)
            add.append(f"{key}={value}")
    if not remove and not add:
        return None
    argv = ["--update-kernel=ALL"]
    if remove:
        argv.append("--remove-args=" + " ".join(remove))
    if add:
        argv.append("--args=" + " ".join(add))
    return argv


# What the boot loader will boot (generated grub.cfg, BLS entries) ----------------

_LINUX_CMDS = ("linux", "linux16", "linuxefi")


def grub_cfg_cmdlines(text: str) -> list[str]:
    """The arguments of every ``linux`` line of a generated ``grub.cfg`` (kernel path left out)."""
    out = []
    for raw in text.splitlines():
        words = raw.strip().split(None, 2)
        if len(words) >= 2 and words[0] in _LINUX_CMDS:
            out.append(words[2] if len(words) == 3 else "")
    return out


def bls_entry(text: str) -> dict[str, str]:
    """The keys of a Boot Loader Specification entry (``version``, ``options``, ...); first value wins."""
    entry: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        entry.setdefault(key, value.strip())
    return entry


def boot_differences(where: str, booted: Sequence[str], expected: Sequence[str]) -> list[dict]:
    """Owned arguments on which a boot entry disagrees with the configuration.

    ``booted``: the argument string of each generated boot entry; ``expected``:
    the command lines one entry may rightly have (GRUB gives normal entries
    ``GRUB_CMDLINE_LINUX_DEFAULT`` too, recovery entries not). One item per
    owned key and entry that matches none of them, compared by meaning.
    """
    wants = [{key: _merged(key, owned_values(line).get(key, [])) for key in OWNED} for line in expected]
    out = []
    for number, line in enumerate(booted, start=1):
        have = {key: _merged(key, owned_values(line).get(key, [])) for key in OWNED}
        if any(all(_normal(k, have[k]) == _normal(k, want[k]) for k in OWNED) for want in wants):
            continue
        want = wants[0]
        for key in OWNED:
            if _normal(key, have[key]) != _normal(key, want[key]):
                out.append({"file": where, "entry": number, "arg": key, "boots": have[key], "configured": want[key]})
    return out


def describe_differences(differences: Sequence[Mapping]) -> str:
    """One line for a person: ``/boot/grub/grub.cfg entry 1 boots isolcpus=(none), configured isolcpus=1-3``."""
    parts = []
    for item in differences[:4]:
        boots = "(none)" if item["boots"] is None else item["boots"]
        configured = "(none)" if item["configured"] is None else item["configured"]
        parts.append(
            f"{item['file']} entry {item['entry']} boots {item['arg']}={boots}, configured {item['arg']}={configured}"
        )
    if len(differences) > 4:
        parts.append(f"and {len(differences) - 4} more")
    return "; ".join(parts)


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
