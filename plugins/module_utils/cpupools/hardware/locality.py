"""Where a CPU sits below its socket: its NUMA node and its L3 cache domain.

Kept apart from ``topology`` (and free of ``re`` and ``dataclasses``) because
``cmk isolate`` needs these answers for a handful of CPUs on every workload
start, where reading the whole topology of a 1,024-CPU node would cost tens of
milliseconds. ``topology.read_cpu_tree`` reads through the same functions, so
the facts and the agent can never disagree on a node or a domain.

Sysfs: ``node/nodeN/cpulist`` names the CPUs of NUMA node N;
``node/nodeN/distance`` is the row of the distance table for N (one number per
online node, ascending); ``cpu/cpuN/cache/indexI/level`` is ``3`` for the
last-level cache on x86 and most arm64 servers, with ``shared_cpu_list`` the
CPUs sharing it and ``id`` its number (absent on some kernels and
architectures: the domain is then numbered by its lowest CPU id, which is just
as stable).

``fewest_groups`` is the one rule for "take k of these, touching as few
groups as possible": the planner uses it for the cores of a pool within a
NUMA node (groups = L3 domains), ``cmk isolate`` for the cpulists it hands to
one workload (groups = NUMA nodes, then L3 domains). When one workload needs
several NUMA nodes, ``nearest_nodes`` picks which by the distance table.
"""

from __future__ import annotations

import os

from ..core.cpulist import parse_cpulist
from ..core.errors import CpupoolsError, TopologyError

# ``typing`` and ``collections.abc`` cost ``cmk isolate`` milliseconds at start-up: annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Hashable, Iterable, Sequence
    from typing import TypeVar

    T = TypeVar("T")

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"


def read_text(path: str) -> str | None:
    """The text of ``path``; ``None`` when it does not exist."""
    # os.open and os.read, not open(): the facts read ~10,000 of these on a 1,024-CPU node, and a
    # buffered file object cost a third of each.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise TopologyError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = os.read(fd, 65536)
        while data and len(data) % 4096 == 0:  # a sysfs attribute comes in one read; anything else to its end
            more = os.read(fd, 65536)
            if not more:
                break
            data += more
    except OSError as exc:
        raise TopologyError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    # What a text file in ASCII reads, newlines included; opening one imports the codec (0.2 ms of isolate).
    text = data.decode("ascii", "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def node_ids(root: str) -> list[int]:
    """NUMA node ids that have a ``nodeN`` directory, ascending (``[]`` without NUMA support)."""
    out = []
    for name in _listdir(os.path.join(root, NODE_DIR)):
        digits = name[4:]
        if name.startswith("node") and digits.isdigit() and digits.isascii():
            out.append(int(digits))
    return sorted(out)


def read_node_cpus(root: str) -> dict[int, str | None]:
    """``node id -> text of its cpulist`` for every node directory."""
    return {n: read_text(os.path.join(root, NODE_DIR, f"node{n}", "cpulist")) for n in node_ids(root)}


def node_of_cpus(node_cpus: dict[int, str | None]) -> dict[int, int]:
    """``cpu -> node`` from the texts ``read_node_cpus`` returned."""
    out: dict[int, int] = {}
    for node, text in sorted(node_cpus.items()):
        for cpu in parse_cpulist(text or "", f"{NODE_DIR}/node{node}/cpulist"):
            out[cpu] = node
    return out


def read_node_distances(root: str) -> dict[int, str | None]:
    """``node id -> text of its distance row`` for every node directory."""
    return {n: read_text(os.path.join(root, NODE_DIR, f"node{n}", "distance")) for n in node_ids(root)}


def parse_distance_row(node: int, text: str) -> tuple[int, ...]:
    """The numbers of one ``nodeN/distance`` row."""
    fields = text.split()
    if not all(f.isdigit() and f.isascii() for f in fields):
        raise TopologyError(f"{NODE_DIR}/node{node}/distance: {text.strip()!r} is not a list of numbers")
    return tuple(int(f) for f in fields)


def parse_distances(rows: dict[int, str | None]) -> dict[int, tuple[int, ...]]:
    """The NUMA distance table from the texts of ``nodeN/distance`` (nodes without the file left out).

    Every row must have one number per row, as the kernel writes them.
    """
    table = {node: parse_distance_row(node, text) for node, text in sorted(rows.items()) if text is not None}
    for node, row in table.items():
        if len(row) != len(table):
            raise TopologyError(f"{NODE_DIR}/node{node}/distance has {len(row)} entries for {len(table)} NUMA nodes")
    return table


def read_l3(root: str, cpu: int) -> tuple[str | None, str | None]:
    """``(shared_cpu_list text, id text)`` of the level-3 cache of ``cpu``; ``(None, None)`` when it has none.

    ``index3`` is the L3 on every current kernel and is tried first; the other
    ``index*`` directories are searched only when it is not.
    """
    cache = f"{root.rstrip('/')}/{CPU_DIR}/cpu{cpu}/cache"  # f-strings: read for every CPU of the node
    names = ["index3"]
    level = read_text(f"{cache}/index3/level")
    if level is None or level.strip() != "3":
        names = sorted(n for n in _listdir(cache) if n.startswith("index") and n != "index3")
    for name in names:
        path = f"{cache}/{name}"
        if name != "index3":
            level = read_text(f"{path}/level")
        if level is None or level.strip() != "3":
            continue
        if name != "index3" and (read_text(f"{path}/type") or "").strip() == "Instruction":
            continue
        return read_text(f"{path}/shared_cpu_list"), read_text(f"{path}/id")
    return None, None


def read_l2(root: str, cpu: int) -> tuple[str | None, str | None]:
    """``(shared_cpu_list text, id text)`` of the level-2 cache of ``cpu``; ``(None, None)`` when it has none.

    ``index2`` is the unified L2 on x86 and most arm64 servers (``index0`` and
    ``index1`` are the L1 data and instruction caches). Where the kernel shows
    no L2 cache, ``topology/cluster_cpus_list`` and ``cluster_id`` stand in: on
    x86 the kernel's cluster *is* the set of CPUs sharing an L2 (an E-core
    module of four cores).
    """
    here = f"{root.rstrip('/')}/{CPU_DIR}/cpu{cpu}"
    level = read_text(f"{here}/cache/index2/level")
    if level is not None and level.strip() == "2":
        return read_text(f"{here}/cache/index2/shared_cpu_list"), read_text(f"{here}/cache/index2/id")
    shared = read_text(f"{here}/topology/cluster_cpus_list")
    if shared is None:
        return None, None
    ident = read_text(f"{here}/topology/cluster_id")
    # cluster_id is -1 where firmware gives no cluster (and the list is then the CPU alone).
    return shared, None if ident is None or ident.strip().startswith("-") else ident


def l3_domain(cpu: int, shared: str | None, ident: str | None) -> tuple[int, tuple[int, ...]] | None:
    """``(domain id, its CPUs)`` from what ``read_l3`` returned for ``cpu``; ``None`` without an L3.

    The id is the cache's ``id`` file where the kernel has one, else the
    lowest CPU id sharing the cache.
    """
    return cache_domain(cpu, shared, ident, "L3")


def cache_domain(cpu: int, shared: str | None, ident: str | None, what: str) -> tuple[int, tuple[int, ...]] | None:
    """``(domain id, its CPUs)`` of one cache level (``what``: ``L3``, ``L2``) from its two texts."""
    if shared is None:
        return None
    where = f"{CPU_DIR}/cpu{cpu}/cache {what} shared_cpu_list"
    cpus = tuple(parse_cpulist(shared, where))
    if cpu not in cpus:
        cpus = tuple(sorted({*cpus, cpu}))
    if ident is not None and ident.strip():
        text = ident.strip()
        if not (text.isdigit() and text.isascii()):
            raise TopologyError(f"{CPU_DIR}/cpu{cpu}/cache {what} id: {text!r} is not a number")
        return int(text), cpus
    return cpus[0], cpus


def l3_of_cpus(root: str, cpus: Iterable[int]) -> dict[int, int]:
    """``cpu -> L3 domain id`` for ``cpus`` (CPUs without an L3 left out), reading one CPU per domain."""
    out: dict[int, int] = {}
    for cpu in sorted(set(cpus)):
        if cpu in out:
            continue
        found = l3_domain(cpu, *read_l3(root, cpu))
        if found is None:
            continue
        ident, members = found
        for member in members:
            out.setdefault(member, ident)
        out[cpu] = ident
    return out


def fewest_groups(items: Sequence[T], group_of: Callable[[T], Hashable], count: int) -> list[T]:
    """``count`` of ``items`` (in their order) from as few groups as possible.

    Whole groups are taken largest first while none holds what is still
    wanted; the rest comes from the smallest group that holds it (best fit),
    so partly used groups are filled before whole ones are broken. Ties go to
    the group whose first item comes first in ``items``; within a group the
    first items are taken. Returns the chosen items in the order of ``items``.
    """
    if count >= len(items):
        return list(items)
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(group_of(item), []).append(i)
    left = sorted(groups.values(), key=lambda idx: idx[0])  # group order: first item first
    chosen: list[int] = []
    remaining = count
    while remaining > 0:
        fits = [g for g in left if len(g) >= remaining]
        if fits:
            best = min(fits, key=lambda g: (len(g), g[0]))
            chosen += best[:remaining]
            break
        largest = max(left, key=lambda g: (len(g), -g[0]))
        chosen += largest
        remaining -= len(largest)
        left.remove(largest)
    return [items[i] for i in sorted(chosen)]


def groups_touched(items: Iterable[T], group_of: Callable[[T], Hashable]) -> int:
    return len({group_of(item) for item in items})


def choose_local(
    items: Sequence[T],
    count: int,
    node_of: Callable[[T], Hashable],
    l3_of: Callable[[T], Hashable],
    distance: Callable[[Hashable, Hashable], int | None] | None = None,
) -> list[T]:
    """``count`` of ``items`` for one workload: on one NUMA node, and on that node in as few L3 domains as can be.

    Among the nodes that hold ``count`` items, the one whose pick touches the
    fewest L3 domains wins; ties go to the node whose first item comes first
    in ``items`` (so one item is always the first of ``items``, the plan's
    hand-out order). When no node holds ``count``: as few nodes as possible,
    the nearest of such sets by ``distance`` (``nearest_nodes``; without
    distances, ``fewest_groups`` over the nodes), and on each node the fewest
    L3 domains. Returns the chosen items in the order of ``items``.
    """
    if count >= len(items) or count == 1:
        return list(items[:count])
    nodes: dict[Hashable, list[T]] = {}
    for item in items:
        nodes.setdefault(node_of(item), []).append(item)
    best: int | None = None
    chosen: list[T] = []
    # Nodes in the order of their first item, so the first node whose pick
    # fits one L3 domain wins outright: ``l3_of`` (which may read sysfs) is
    # asked about the other nodes only when it does not.
    for members in nodes.values():
        if len(members) < count:
            continue
        pick = fewest_groups(members, l3_of, count)
        cost = groups_touched(pick, l3_of)
        if best is None or cost < best:
            best, chosen = cost, pick
        if best == 1:
            break
    if best is None:
        near = None
        if distance is not None:
            near = nearest_nodes({node: len(members) for node, members in nodes.items()}, count, distance)
        pool = items if near is None else [item for node in near for item in nodes[node]]
        per_node: dict[Hashable, int] = {}
        for item in fewest_groups(pool, node_of, count):
            per_node[node_of(item)] = per_node.get(node_of(item), 0) + 1
        chosen = [item for node, n in per_node.items() for item in fewest_groups(nodes[node], l3_of, n)]
    rank = {id(item): i for i, item in enumerate(items)}
    return sorted(chosen, key=lambda item: rank[id(item)])


#: Above this many candidate sets of nodes, ``nearest_nodes`` grows sets from each node instead of trying them all.
EXACT_LIMIT = 2000


def nearest_nodes(
    sizes: dict[Hashable, int], count: int, distance: Callable[[Hashable, Hashable], int | None]
) -> list[Hashable] | None:
    """The NUMA nodes one workload's ``count`` items come from when no single node holds them.

    ``sizes``: free items per node, in the hand-out order of each node's first
    item. The fewest nodes that hold ``count``; of those sets, the one whose
    farthest pair is nearest, then the smallest sum of pairwise distances,
    then the set whose nodes come first in hand-out order. A pair's distance
    is the larger of its two table entries (the table may be asymmetric).
    Every set is tried while there are at most ``EXACT_LIMIT``; past that
    (dozens of nodes, a workload that needs half of them) each node in turn
    is grown by the nearest node that still leaves the set able to hold
    ``count`` in as few nodes, and the best grown set wins. ``None`` when a
    distance is unknown (no ``distance`` files): the caller falls back to
    ``fewest_groups``, as before distances were read. Returns the nodes in
    hand-out order.
    """
    order = list(sizes)
    rank = {node: i for i, node in enumerate(order)}
    need = held = 0
    for n in sorted(sizes.values(), reverse=True):
        need, held = need + 1, held + n
        if held >= count:
            break
    if need >= len(order):
        return order
    pairs: dict[tuple[Hashable, Hashable], int] = {}

    def far(a: Hashable, b: Hashable) -> int:
        key = (a, b) if rank[a] < rank[b] else (b, a)
        if key not in pairs:
            there, back = distance(a, b), distance(b, a)
            if there is None or back is None:
                raise LookupError
            pairs[key] = max(there, back)
        return pairs[key]

    def cost(chosen: Sequence[Hashable]) -> tuple[int, int, list[int]]:
        spans = [far(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
        return max(spans), sum(spans), sorted(rank[n] for n in chosen)

    try:
        if _binomial(len(order), need) <= EXACT_LIMIT:
            from itertools import combinations

            sets = [c for c in combinations(order, need) if sum(sizes[n] for n in c) >= count]
        else:
            grown = (_grow(seed, order, sizes, count, need, far) for seed in order)
            sets = [g for g in grown if g is not None]
        best = min(sets, key=cost)
    except LookupError:
        return None
    return sorted(best, key=rank.__getitem__)


def _binomial(n: int, k: int) -> int:
    out = 1
    for i in range(min(k, n - k)):
        out = out * (n - i) // (i + 1)
    return out


def _grow(
    seed: Hashable,
    order: list[Hashable],
    sizes: dict[Hashable, int],
    count: int,
    need: int,
    far: Callable[[Hashable, Hashable], int],
) -> list[Hashable] | None:
    """``need`` nodes holding ``count``, from ``seed`` adding the nearest node that keeps that possible."""
    chosen = [seed]
    held = sizes[seed]
    while len(chosen) < need:
        rest = [n for n in order if n not in chosen]
        room = need - len(chosen) - 1  # nodes still to add after this one
        fits = []
        for node in rest:
            others = sorted((sizes[n] for n in rest if n != node), reverse=True)[:room]
            if held + sizes[node] + sum(others) >= count:
                fits.append(node)
        if not fits:
            return None
        step = min(fits, key=lambda n: (max(far(n, c) for c in chosen), sum(far(n, c) for c in chosen)))
        chosen.append(step)
        held += sizes[step]
    return chosen if held >= count else None


class CpuLocality:
    """NUMA node, L3 domain and NUMA distances of a node's CPUs, read from sysfs under ``root`` on first use.

    What ``cmk isolate`` asks for: the node map costs one small read per NUMA
    node; an L3 is read once per domain, for the CPUs asked about only; a
    node's row of the distance table is read only when a workload needs more
    than one node (``distance``). Without ``node/`` in sysfs (a kernel without
    NUMA) every CPU is on node 0, as in the facts; with it, a CPU no
    ``nodeN/cpulist`` names is on no known node (``None``), and ``cmk
    isolate`` does not guess for it. A sysfs file that cannot be read or
    parsed makes what it would have told unknown too: locality is a
    preference, and a workload must still start (the facts module, which
    reads the same files, reports the error).
    """

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._nodes: dict[int, int] | None = None
        self._ids: list[int] = []
        self._rows: dict[int, tuple[int, ...] | None] = {}
        self._l3: dict[int, int] = {}
        self._asked: set[int] = set()

    def node(self, cpu: int) -> int | None:
        if self._nodes is None:
            try:
                texts = read_node_cpus(self.root)
                self._ids = list(texts)
                self._nodes = node_of_cpus(texts)
            except CpupoolsError:
                self._nodes = {-1: -1}  # not empty: every CPU on no known node
        if not self._nodes:
            return 0
        return self._nodes.get(cpu)

    def distance(self, a: int, b: int) -> int | None:
        """Entry ``b`` of node ``a``'s row (``node/nodeA/distance``); ``None`` when unknown.

        A row is read on first use. Its entries are for the node directories
        in ascending order (the kernel's online nodes); a row that is missing,
        garbled or not one entry per node directory is unknown.
        """
        if a not in self._rows:
            row = None
            if self._nodes is None:
                self.node(-1)
            try:
                text = read_text(os.path.join(self.root, NODE_DIR, f"node{a}", "distance"))
                if text is not None:
                    row = parse_distance_row(a, text)
            except CpupoolsError:
                pass
            self._rows[a] = row if row is not None and len(row) == len(self._ids) else None
        row = self._rows[a]
        if row is None or b not in self._ids:
            return None
        return row[self._ids.index(b)]

    def l3(self, cpu: int) -> int | None:
        if cpu not in self._asked:
            self.read_l3(cpu)
        return self._l3.get(cpu)

    def read_l3(self, *cpus: int) -> None:
        """Look up the L3 domains of ``cpus`` (one domain read covers all of its CPUs)."""
        todo = [c for c in cpus if c not in self._asked and c not in self._l3]
        for cpu in todo:
            if cpu in self._l3:  # read with the domain of an earlier one
                continue
            try:  # noqa: SIM105 - contextlib costs cmk isolate ~1 ms of start-up
                self._l3.update(l3_of_cpus(self.root, [cpu]))
            except CpupoolsError:  # this domain stays unknown; the others are still read
                pass
            self._asked.add(cpu)
