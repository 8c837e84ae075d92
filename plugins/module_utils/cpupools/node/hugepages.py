"""Hugepages per size and NUMA node: the facts, the checks and the plan.

* ``parse_size`` / ``size_label``: ``"1G"``, ``"2MB"``, ``"2048kB"`` <-> kB,
  and the one label every output uses (``1G``, ``2M``, ``64K``).
* ``parse_entries``: ``cpupools_hugepages`` (a YAML list, or ``-e`` text
  ``"1G:16:0,2M:1024"``) -> normalised entries; no node needed.
* ``read_hugepages``: the node's pages per NUMA node and size (free and total)
  and each node's MemTotal, from sysfs under a root.
* ``plan_hugepages``: the entries checked against those facts (sizes the
  node offers, NUMA nodes it has, memory it can hold) and split into what the
  kernel command line reserves at boot (one gigantic size, which only the
  boot allocator finds reliably: node-less, or per NUMA node when the kernel
  that boots reads ``hugepages=0:4,1:4``, 5.16 and later) and what the
  ``cpupools-hugepages`` unit writes to sysfs at boot (every other entry).

Errors are ``PlanError`` with field ``hugepages`` (or the variable named), so
the plan module reports ``host X: cpupools_hugepages: ...`` on one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..core.errors import PlanError

FIELD = "hugepages"
#: Pages of this size or larger are reserved on the kernel command line when
#: no NUMA node is given: the boot allocator finds them before memory fragments.
GIGANTIC_KB = 1024 * 1024
GLOBAL_DIR = "sys/kernel/mm/hugepages"
NODE_DIR = "sys/devices/system/node"
#: ``hugepages=<node>:<count>[,<node>:<count>...]`` after its ``hugepagesz=`` (mainline
#: b5389086ad7b, "hugetlbfs: extend the definition of hugepages parameter to support
#: node allocation", merged for 5.16; Documentation/admin-guide/kernel-parameters.txt,
#: mm/hugetlbpage.rst). An older kernel takes the leading node number for the count.
PER_NODE_BOOT_SINCE = (5, 16)
#: A bound on a page count, so no typed number stands for "all memory".
MAX_PAGES = 1 << 40
_SIZE_RE = re.compile(r"^\s*([0-9]{1,9})\s*(k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.IGNORECASE)
_DIR_RE = re.compile(r"^hugepages-([0-9]+)kB$")
_NODE_RE = re.compile(r"^node([0-9]+)$")
_MEMTOTAL_RE = re.compile(r"^(?:Node\s+[0-9]+\s+)?MemTotal:\s+([0-9]+)\s+kB\s*$", re.MULTILINE)
_INT_RE = re.compile(r"^\s*[0-9]{1,15}\s*$")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:55]}...{text[-2:]}"


# Sizes ------------------------------------------------------------------------------


def parse_size(raw: object, field: str = FIELD) -> int:
    """A page size in kB from ``1G``, ``1GB``, ``2M``, ``2MiB``, ``2048kB`` (case does not matter)."""
    match = _SIZE_RE.match(raw) if isinstance(raw, str) else None
    if match is None or int(match.group(1)) == 0:
        raise PlanError(f"size {_show(raw)} is not a page size (give e.g. 2M or 1G)", field)
    number, unit = int(match.group(1)), match.group(2)[0].lower()
    return number * {"k": 1, "m": 1024, "g": 1024 * 1024}[unit]


def size_label(kb: int) -> str:
    """The label of a size in kB: ``1G``, ``2M``, ``64K``."""
    for factor, unit in ((1024 * 1024, "G"), (1024, "M")):
        if kb % factor == 0:
            return f"{kb // factor}{unit}"
    return f"{kb}K"


def _mib(kb: int) -> str:
    return f"{kb // 1024} MiB" if kb % 1024 == 0 else f"{kb} kB"


# The variable -----------------------------------------------------------------------


def _count(raw: object, where: str, field: str) -> int:
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and _INT_RE.match(raw))):
        raise PlanError(f"{where}: count {_show(raw)} is not a number of pages", field)
    value = int(raw)
    if not 0 <= value <= MAX_PAGES:
        raise PlanError(f"{where}: count {value} is not between 0 and {MAX_PAGES}", field)
    return value


def _node(raw: object, where: str, field: str) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.strip() in ("", "any")):
        return None
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and _INT_RE.match(raw))):
        raise PlanError(f"{where}: numa_node {_show(raw)} is not a NUMA node number", field)
    value = int(raw)
    if not 0 <= value < 1 << 16:
        raise PlanError(f"{where}: numa_node {value} is not a NUMA node number", field)
    return value


def _items(raw: object, field: str) -> list[object]:
    """The entries of a YAML list, or of ``-e`` text: ``size:count[:node]`` joined by commas."""
    if isinstance(raw, (list, tuple)):
        return list(raw)
    if isinstance(raw, str):
        out: list[object] = []
        for part in (p.strip() for p in raw.split(",")):
            if not part:
                continue
            fields = [f.strip() for f in part.split(":")]
            if len(fields) not in (2, 3):
                raise PlanError(
                    f"{_show(part)} is not size:count or size:count:numa_node (e.g. '1G:16:0,2M:1024')", field
                )
            entry = {"size": fields[0], "count": fields[1]}
            if len(fields) == 3:
                entry["numa_node"] = fields[2]
            out.append(entry)
        return out
    raise PlanError(f"{_show(raw)} is not a list of {{size, count, numa_node}} entries", field)


def parse_entries(raw: object, field: str = FIELD) -> list[dict]:
    """``cpupools_hugepages`` normalised: ``[{"size", "size_kb", "count", "numa_node"}]``, sorted.

    ``numa_node`` is ``None`` for pages the kernel spreads over the nodes.
    Refused: unknown keys, a size or count that is not one, the same size and
    node twice, and one size given both with and without a node (the two
    would fight over the same pages).
    """
    entries: list[dict] = []
    seen: set[tuple[int, int | None]] = set()
    for index, item in enumerate(_items(raw, field)):
        where = f"entry {index + 1}"
        if not isinstance(item, Mapping):
            raise PlanError(f"{where}: {_show(item)} is not a mapping with size and count", field)
        # a key that is not printable (a stray "\r" from a Windows-edited file) is shown quoted: one line
        unknown = sorted(
            str(key) if str(key).isprintable() else _show(key)
            for key in item
            if key not in ("size", "count", "numa_node")
        )
        if unknown:
            raise PlanError(f"{where}: unknown key {', '.join(unknown)} (known: size, count, numa_node)", field)
        for key in ("size", "count"):
            if key not in item:
                raise PlanError(f"{where}: {key} is missing", field)
        size_kb = parse_size(item["size"], field)
        node = _node(item.get("numa_node"), where, field)
        key = (size_kb, node)
        if key in seen:
            on = "without a numa_node" if node is None else f"on NUMA node {node}"
            raise PlanError(f"{where}: size {size_label(size_kb)} {on} is given twice", field)
        seen.add(key)
        entries.append(
            {
                "size": size_label(size_kb),
                "size_kb": size_kb,
                "count": _count(item["count"], where, field),
                "numa_node": node,
            }
        )
    for size_kb in sorted({kb for kb, _ in seen}):
        if (size_kb, None) in seen and any(kb == size_kb and node is not None for kb, node in seen):
            raise PlanError(
                f"size {size_label(size_kb)} is given both without a numa_node and per NUMA node; "
                "give one or the other",
                field,
            )
    return sorted(entries, key=lambda e: (e["size_kb"], -1 if e["numa_node"] is None else e["numa_node"]))


# Facts --------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _number(text: str | None) -> int:
    return int(text.strip()) if text is not None and _INT_RE.match(text) else 0


def parse_memtotal(text: str) -> int | None:
    """MemTotal in kB from ``/proc/meminfo`` or ``/sys/devices/system/node/nodeN/meminfo`` text."""
    match = _MEMTOTAL_RE.search(text)
    return int(match.group(1)) if match else None


def _pages(directory: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in sorted(names, key=lambda n: int(_DIR_RE.match(n).group(1)) if _DIR_RE.match(n) else 0):
        match = _DIR_RE.match(name)
        if match is None:
            continue
        base = os.path.join(directory, name)
        out[size_label(int(match.group(1)))] = {
            "total": _number(_read(os.path.join(base, "nr_hugepages"))),
            "free": _number(_read(os.path.join(base, "free_hugepages"))),
        }
    return out


def read_hugepages(root: str = "/") -> dict:
    """The facts: ``hugepages`` (node -> size -> total/free), ``memory`` (node -> MemTotal kB),
    ``hugepage_sizes`` (the sizes the kernel offers, ascending) and ``hugepages_global``
    (size -> total/free over all nodes).

    A kernel without NUMA (no ``nodeN`` directories) is one node ``"0"``
    holding everything, with MemTotal from ``/proc/meminfo``. A kernel
    without hugetlbfs offers no size.
    """
    global_pages = _pages(os.path.join(root, GLOBAL_DIR))
    node_base = os.path.join(root, NODE_DIR)
    try:
        nodes = sorted(int(m.group(1)) for m in map(_NODE_RE.match, os.listdir(node_base)) if m)
    except OSError:
        nodes = []
    pages: dict[str, dict[str, dict[str, int]]] = {}
    memory: dict[str, int] = {}
    for node in nodes:
        base = os.path.join(node_base, f"node{node}")
        per_node = _pages(os.path.join(base, "hugepages"))
        pages[str(node)] = {size: per_node.get(size, {"total": 0, "free": 0}) for size in global_pages}
        memory[str(node)] = parse_memtotal(_read(os.path.join(base, "meminfo")) or "") or 0
    if not nodes:
        pages["0"] = {size: dict(value) for size, value in global_pages.items()}
        memory["0"] = parse_memtotal(_read(os.path.join(root, "proc/meminfo")) or "") or 0
    return {
        "hugepages": pages,
        "memory": memory,
        "hugepage_sizes": list(global_pages),
        "hugepages_global": global_pages,
    }


# The plan -----------------------------------------------------------------------------


def release_version(release: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a kernel release (``6.1.0-18-amd64`` -> ``(6, 1)``); ``None`` when it is not one."""
    match = re.match(r"^(\d+)\.(\d+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def per_node_hugepages(release: str | None) -> bool | None:
    """Whether kernel ``release`` reads per-node ``hugepages=`` counts; ``None`` when the release is unknown."""
    version = release_version(release)
    return None if version is None else version >= PER_NODE_BOOT_SINCE


def _path(size_kb: int, node: int | None) -> str:
    if node is None:
        return f"/{GLOBAL_DIR}/hugepages-{size_kb}kB/nr_hugepages"
    return f"/{NODE_DIR}/node{node}/hugepages/hugepages-{size_kb}kB/nr_hugepages"


def _boot_size(entries: Sequence[Mapping], kernel_release: str | None) -> tuple[int | None, list[str], list[str]]:
    """The gigantic size the command line reserves (kB, or ``None``), and the notes and warnings on that choice.

    A size without a node when there is one (only the boot allocator finds
    those reliably, and only the command line spreads them). Else, when the
    kernel that boots reads per-node counts (5.16+), the largest gigantic size
    with a per-node count. Else none: per-node counts go to the unit.
    """
    nodeless = [e for e in entries if e["numa_node"] is None and e["size_kb"] >= GIGANTIC_KB and e["count"]]
    if len(nodeless) > 1:
        sizes = ", ".join(e["size"] for e in nodeless)
        raise PlanError(
            f"sizes {sizes} without a numa_node would all be reserved on the kernel command line, which "
            "cpupools writes for one gigantic size only; give the others a numa_node",
            FIELD,
        )
    per_node = sorted(
        {e["size_kb"] for e in entries if e["numa_node"] is not None and e["size_kb"] >= GIGANTIC_KB and e["count"]}
    )
    if nodeless:
        chosen = nodeless[0]["size_kb"]
    elif not per_node:
        return None, [], []
    else:
        supported = per_node_hugepages(kernel_release)
        labels = "/".join(size_label(kb) for kb in per_node)
        if supported is None:
            why = (
                f"{labels} pages per NUMA node are reserved by cpupools-hugepages.service, not on the kernel "
                "command line: the kernel release is unknown (no proc/sys/kernel/osrelease under "
                "cpupools_facts_root; set cpupools_kernel_release to the kernel that boots)"
            )
            return None, [why], [why]
        if not supported:
            why = (
                f"{labels} pages per NUMA node are reserved by cpupools-hugepages.service: kernel "
                f"{kernel_release} reads no per-node hugepages= (5.16 and later do)"
            )
            return None, [why], []
        chosen = per_node[-1]
    others = [size_label(kb) for kb in per_node if kb != chosen]
    notes = []
    if others:
        notes.append(
            f"{', '.join(others)} pages per NUMA node are reserved by cpupools-hugepages.service: the kernel "
            f"command line holds one gigantic size, {size_label(chosen)}"
        )
    return chosen, notes, []


def plan_hugepages(
    entries: Sequence[Mapping],
    facts: Mapping,
    keep_free_mb: int = 1024,
    default_size: str = "",
    kernel_release: str | None = None,
) -> dict:
    """Check ``entries`` (``parse_entries`` output) against the node and split them.

    ``facts`` holds ``read_hugepages`` keys (the host's ``ansible_facts.cpupools``);
    ``kernel_release`` is the kernel that boots with the arguments (``None``:
    unknown). Returns ``{"requested", "boot", "runtime", "planned", "memory",
    "notes", "warnings"}``: ``boot`` the command-line reservation
    (``default_size``, ``size``, ``count``, and ``nodes``, node -> pages when
    the count is per node; ``size`` null when there is none), ``runtime`` one
    entry per sysfs file the unit writes (``size``, ``size_kb``,
    ``numa_node``, ``count``, ``path``), ``planned`` node (or ``"any"``) ->
    size -> pages, ``memory`` node -> ``asked_kb``/``available_kb``,
    ``notes`` why pages per node of a gigantic size go through the unit, and
    ``warnings`` the notes that ask for something (an unknown release).
    """
    offered = [str(s) for s in facts.get("hugepage_sizes") or []]
    memory = {str(node): int(kb) for node, kb in (facts.get("memory") or {}).items()}
    nodes_with_memory = sorted((n for n, kb in memory.items() if kb > 0), key=int)
    default = ""
    if default_size:
        default = size_label(parse_size(default_size, "hugepages_default_size"))
        if default not in offered:
            raise PlanError(
                f"{default} is not a page size this node offers ({', '.join(offered) or 'none: no hugetlbfs'})",
                "hugepages_default_size",
            )
    for entry in entries:
        if entry["size"] not in offered:
            raise PlanError(
                f"size {entry['size']} is not a page size this node offers "
                f"({', '.join(offered) or 'none: the kernel has no hugetlbfs'})",
                FIELD,
            )
        node = entry["numa_node"]
        if node is not None and str(node) not in memory:
            raise PlanError(
                f"size {entry['size']}: NUMA node {node} does not exist on this node "
                f"(it has {', '.join(sorted(memory, key=int)) or 'none'})",
                FIELD,
            )
        if node is not None and entry["count"] and memory[str(node)] == 0:
            raise PlanError(f"size {entry['size']}: NUMA node {node} has no memory of its own", FIELD)
    boot_kb, notes, warnings = _boot_size(entries, kernel_release)
    # What each node holds: its own entries, and its share of the node-less ones
    # (the kernel interleaves those over the nodes with memory, round-robin).
    asked = {node: 0 for node in memory}
    parts: dict[str, list[str]] = {node: [] for node in memory}
    for entry in entries:
        if not entry["count"]:
            continue
        if entry["numa_node"] is not None:
            targets = [(str(entry["numa_node"]), entry["count"])]
        elif nodes_with_memory:
            k = len(nodes_with_memory)
            targets = [(n, -(-entry["count"] // k)) for n in nodes_with_memory]
        else:
            raise PlanError(f"size {entry['size']}: no NUMA node reports its memory (MemTotal)", FIELD)
        for node, count in targets:
            asked[node] += count * entry["size_kb"]
            parts[node].append(f"{count} x {entry['size']}")
    keep_kb = keep_free_mb * 1024
    summary = {}
    for node in sorted(memory, key=int):
        available = max(memory[node] - keep_kb, 0)
        summary[node] = {"asked_kb": asked[node], "available_kb": available}
        if asked[node] > available:
            raise PlanError(
                f"NUMA node {node} cannot hold the hugepages asked: {' + '.join(parts[node])} = "
                f"{_mib(asked[node])} asked, {_mib(available)} available (MemTotal {_mib(memory[node])} "
                f"less cpupools_hugepages_keep_free_mb {keep_free_mb} MiB)",
                FIELD,
            )
    on_boot = [e for e in entries if e["size_kb"] == boot_kb]
    boot: dict = {"default_size": default or None, "size": None, "count": 0}
    if on_boot:
        boot.update(size=on_boot[0]["size"], count=sum(e["count"] for e in on_boot))
        if on_boot[0]["numa_node"] is not None:  # parse_entries refuses a size both with and without nodes
            boot["nodes"] = {str(e["numa_node"]): e["count"] for e in on_boot if e["count"]}
    planned: dict[str, dict[str, int]] = {}
    for entry in entries:
        key = "any" if entry["numa_node"] is None else str(entry["numa_node"])
        planned.setdefault(key, {})[entry["size"]] = entry["count"]
    return {
        "requested": [dict(e) for e in entries],
        "boot": boot,
        "runtime": [
            {**e, "path": _path(e["size_kb"], e["numa_node"])}
            for e in entries
            if e["size_kb"] != boot_kb and not (e["numa_node"] is None and e["size_kb"] >= GIGANTIC_KB)
        ],
        "planned": planned,
        "memory": summary,
        "notes": notes,
        "warnings": warnings,
    }
