"""The Linux cpulist syntax: the one parser and formatter of the project.

Accepted (as the kernel's ``bitmap_parselist`` accepts it): single ids ``5``,
inclusive ranges ``0-7``, the stride form ``0-31:2/8`` (in each group of 8
CPUs starting at 0, use the first 2), and ``N`` for the last CPU when the
number of CPUs is known. Items are separated by commas; surrounding
whitespace (as in sysfs files) is ignored; the empty string is the empty set.

Two output forms:

* ``format_cpulist``: canonical compressed form, ``0-3,8,10-11``; used for
  kernel arguments, facts and reports.
* ``format_cmk_cpulist``: CMK's form, ascending ids joined by commas and no
  ranges, ``0,1,2,3``; used for pool state directory names and the
  ``CMK_CPUS_*`` environment, because workloads written for CMK split those
  values on commas.
"""

from __future__ import annotations

from .errors import CpulistError, show

# collections.abc costs ~3 ms to import; the node agent starts on every
# ``cmk isolate``, so the name is only needed by type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# The flags the kernel accepts in front of the cpulist in isolcpus=
# (kernel-parameters.txt: "isolcpus= [flag-list,]<cpu-list>").
ISOLCPUS_FLAGS = ("nohz", "domain", "managed_irq")

#: No CPU id at or above this is accepted anywhere, whatever the caller knows
#: about the host: Linux's NR_CPUS is at most 8192 today, and the cap keeps a
#: typed ``0-4000000000`` from expanding billions of ids in memory.
MAX_CPUS = 65536
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdef")


def _parse_int(text: str) -> int:
    # str.isdigit() is true for "²" and other Unicode digits that int() refuses.
    if not text or not set(text) <= _DIGITS or len(text) > 12:
        raise CpulistError(f"{show(text)} is not a CPU number")
    return int(text)


def _parse_item(item: str, nr_cpus: int | None, limit: int) -> Iterable[int]:
    """Expand one comma-separated item; errors say only what is wrong with it."""

    def cpu(text: str) -> int:
        if text == "N":
            if nr_cpus is None:
                raise CpulistError("'N' needs the number of CPUs")
            return nr_cpus - 1
        value = _parse_int(text)
        if value >= limit:
            raise CpulistError(f"CPU {value} is beyond the last possible CPU {limit - 1}")
        return value

    stride = None
    body = item
    if ":" in item:
        body, _, stride_text = item.partition(":")
        used, slash, group = stride_text.partition("/")
        if not slash:
            raise CpulistError("stride must be <used>/<group>")
        stride = (_parse_int(used), _parse_int(group))
        if stride[0] == 0 or stride[1] == 0 or stride[0] > stride[1]:
            raise CpulistError(f"stride {stride[0]}/{stride[1]} needs 0 < used <= group")
    if "-" in body:
        first_text, _, last_text = body.partition("-")
        first, last = cpu(first_text), cpu(last_text)
        if first > last:
            raise CpulistError(f"range {first}-{last} runs backwards")
    else:
        if stride is not None:
            raise CpulistError("a stride needs a range")
        first = last = cpu(body)
    if stride is None:
        return range(first, last + 1)
    used, group = stride
    return (c for c in range(first, last + 1) if (c - first) % group < used)


def parse_cpulist(
    text: str | Iterable[int], what: str = "cpulist", nr_cpus: int | None = None, limit: int | None = None
) -> list[int]:
    """Parse cpulist text into sorted unique CPU ids.

    ``what`` names the value in error messages (``"isolcpus"``, ``"infra_cores"``).
    A list or tuple of ints (as YAML may give) is accepted and normalised.
    ``limit`` is the number of possible CPUs of the host when the caller knows
    it; no id at or above it (nor above ``MAX_CPUS``) is accepted, so parsing
    never builds more than that many ids.
    """
    limit = min(limit, MAX_CPUS) if limit is not None and limit > 0 else MAX_CPUS
    if isinstance(text, bool) or not isinstance(text, (str, int, list, tuple, set, frozenset, range)):
        raise CpulistError(f"malformed {what}: {show(text)} is not a cpulist")
    if isinstance(text, int):
        text = [text]
    if not isinstance(text, str):
        cpus = set()
        for value in text:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                # Strings inside a list ("0-3") are parsed too.
                if isinstance(value, str):
                    cpus.update(parse_cpulist(value, what, nr_cpus, limit))
                    continue
                raise CpulistError(f"malformed {what}: {show(value)} is not a CPU number")
            if value >= limit:
                raise CpulistError(f"malformed {what}: CPU {value} is beyond the last possible CPU {limit - 1}")
            cpus.add(value)
        return sorted(cpus)
    stripped = text.strip()
    if not stripped:
        return []
    cpus = set()
    for position, raw in enumerate(stripped.split(","), start=1):
        item = raw.strip()
        if not item:
            raise CpulistError(f"malformed {what} {show(stripped)}: item {position} is empty")
        try:
            cpus.update(_parse_item(item, nr_cpus, limit))
        except CpulistError as exc:
            raise CpulistError(f"malformed {what} {show(stripped)}: item {position} {show(item)}: {exc}") from None
    return sorted(cpus)


def _runs(cpus: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], cpu)
        else:
            runs.append((cpu, cpu))
    return runs


def format_cpulist(cpus: Iterable[int]) -> str:
    """Canonical compressed form: ``0-3,8,10-11``; ``""`` for no CPU."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in _runs(cpus))


def format_cmk_cpulist(cpus: Iterable[int]) -> str:
    """CMK's form: ascending ids joined by commas, no ranges: ``0,1,2,3``."""
    return ",".join(str(cpu) for cpu in sorted(set(cpus)))


def format_cpumask(cpus: Iterable[int]) -> str:
    """Bitmask of ``cpus`` as uppercase hex without ``0x`` (``CMK_CPUS_ASSIGNED_MASK``)."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return f"{mask:X}"


def format_sysfs_cpumask(cpus: Iterable[int]) -> str:
    """Bitmask of ``cpus`` as sysfs prints and takes it: lowercase hex, a comma between 32-bit words
    (``ff,ffffffff``); the kernel refuses a word of more than 32 bits."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    words = []
    while True:
        words.append(mask & 0xFFFFFFFF)
        mask >>= 32
        if not mask:
            break
    words.reverse()
    return ",".join([f"{words[0]:x}", *(f"{word:08x}" for word in words[1:])])


def parse_cpumask(text: str, what: str = "cpumask") -> list[int]:
    """CPUs of a hex bitmask as sysfs prints it (``cpumask``, ``smp_affinity``).

    The kernel's ``%*pb`` form: hex digits, in comma-separated 32-bit groups
    with the highest group first (``00000000,000000f0``); an optional ``0x``
    is accepted. Inverse of ``format_cpumask`` up to the grouping.
    """
    digits = text.strip().lower().removeprefix("0x").replace(",", "")
    if not digits:
        return []
    if len(digits) > MAX_CPUS // 4 or not set(digits) <= _HEX:
        raise CpulistError(f"malformed {what} {show(text.strip())}: not a hex CPU mask")
    mask = int(digits, 16)
    return [cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1]


def cmdline_spans(text: str) -> list[tuple[int, int, str, str | None]]:
    """Tokenise a kernel command line: ``(start, end, key, value)`` per parameter.

    Follows the kernel's ``next_arg``: whitespace separates parameters, double
    quotes protect spaces, a parameter without ``=`` has value ``None``.
    ``text[start:end]`` is the parameter exactly as written, so callers can
    replace or remove one parameter and keep every other byte.
    """
    params: list[tuple[int, int, str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        start, in_quote = i, False
        while i < n and (in_quote or not text[i].isspace()):
            if text[i] == '"':
                in_quote = not in_quote
            i += 1
        token = text[start:i]
        key, eq, value = token.partition("=")
        key = key.replace('"', "")
        if not eq:
            params.append((start, i, key, None))
        else:
            if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
                value = value[1:-1]
            params.append((start, i, key, value))
    return params


def split_cmdline(text: str) -> list[tuple[str, str | None]]:
    """Split a kernel command line into ``(key, value)`` pairs in order (see ``cmdline_spans``)."""
    return [(key, value) for _, _, key, value in cmdline_spans(text)]


def parse_isolcpus(value: str, nr_cpus: int | None = None, what: str = "isolcpus") -> tuple[list[str], list[int]]:
    """Parse the value of ``isolcpus=`` into ``(flags, cpus)``.

    Understands the flag syntax CMK crashed on (``managed_irq,domain,2-5``),
    the old plain syntax (``2-5``) and stride ranges. Unknown flags are an
    error, as the kernel ignores the whole parameter when it meets one.
    """
    items = value.strip().split(",")
    flags: list[str] = []
    while items and items[0] and not items[0][0].isdigit() and items[0] != "N":
        flag = items.pop(0)
        if flag not in ISOLCPUS_FLAGS:
            raise CpulistError(
                f"malformed {what} {show(value)}: unknown flag {show(flag)} "
                f"(the kernel knows {', '.join(ISOLCPUS_FLAGS)})"
            )
        if flag not in flags:
            flags.append(flag)
    rest = ",".join(items)
    if not rest.strip():
        raise CpulistError(f"malformed {what} {show(value)}: no CPU list")
    try:
        return flags, parse_cpulist(rest, what, nr_cpus)
    except CpulistError as exc:
        # Name the whole value, flags included, as the operator wrote it.
        raise CpulistError(str(exc).replace(f"{what} {show(rest)}", f"{what} {show(value.strip())}", 1)) from None


def format_isolcpus(flags: Iterable[str], cpus: Iterable[int]) -> str:
    """Render an ``isolcpus=`` value: ``managed_irq,domain,2-5``."""
    flags = list(flags)
    for flag in flags:
        if flag not in ISOLCPUS_FLAGS:
            raise CpulistError(
                f"unknown isolcpus flag {show(flag)} (the kernel knows {', '.join(ISOLCPUS_FLAGS)})",
                field="isolcpus_flags",
            )
    return ",".join([*flags, format_cpulist(cpus)])
