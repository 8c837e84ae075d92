"""The pool planner: topology + sizes -> pool layout. Pure computation.

Two ways to decide which cores are isolated:

* ``generate`` (default): the plan decides, for the node as it boots.
  Housekeeping first: every NUMA node keeps cores for interrupts, RCU
  callbacks of the isolated CPUs, kernel threads and the node's own daemons
  (``infra_cores``: ``auto`` sizes them from the node, one thread per
  ``HOUSEKEEPING_SHARE`` of the node's threads, at least one core; a number
  per NUMA node; a mapping node -> number; or the CPUs themselves). Then
  ``exclusive-non-isolcpus`` (given as CPU ids), then the exclusive and
  shared pools: how many from each NUMA node in ``packed`` or ``spread``
  order (over sockets, then the NUMA nodes of a socket), and which cores on
  a node by what they share: shared cores go where housekeeping already is,
  exclusive cores into L3 domains (CCDs) and L2 modules that hold neither
  housekeeping nor shared cores while a clean one on the node is free, whole
  domains first. On hybrid parts exclusive cores are P cores and shared
  cores E cores first. Cores left over join infra (the ``kubelet`` runtime
  gives them to the kubelet instead: it hands out and shares every CPU but
  the housekeeping ones). Cores with an offline sibling are never isolated:
  the sibling comes back at the next boot.
* ``adopt``: a node whose ``isolcpus`` was set by hand (a CMK node being
  migrated). The pools are exactly those ``cmk init`` computes from that
  ``isolcpus`` and the sizes (CMK's intel/init.py), but the modern flag
  syntax is understood and what CMK did silently (stranded isolated cores,
  half-isolated cores) is reported in ``warnings``.

On a node whose NUMA nodes each hold one L3 (or none) and whose cores are
all alike (every shape CMK knew, and Intel's sub-NUMA clustering) there is
nothing to choose between, and each pool takes the first free cores of a
node, exclusive before shared, exactly as before.

The output is a JSON-safe dict (see ``plan_pools``); same input, same output.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ..core.cpulist import format_cmk_cpulist, format_cpulist
from ..core.errors import PlanError, plural, show
from ..core.names import (
    ENI,
    EXCLUSIVE,
    EXCLUSIVE_POOLS,
    INFRA,
    KUBELET,
    NRI_BALLOONS,
    NRI_TOPOLOGY_AWARE,
    POOL_ORDER,
    RUNTIMES,
    SHARED,
)
from ..hardware.locality import fewest_groups
from ..hardware.topology import EFFICIENCY, Core, Topology
from .inputs import (
    CORE_TYPE_CHOICES,
    ISOLATABLE_POOLS,
    MODES,
    SOURCES,
    to_bool,
    to_choice,
    to_count,
    to_cpus,
    to_infra,
    to_isolated_pools,
    to_sst_bf,
)

PLAN_VERSION = 2
#: The runtime whose reserved set is the housekeeping cores and nothing more,
#: and which hands out (and shares until then) every other CPU.
#: ``infra_cores: auto``: one housekeeping thread per this many threads of a NUMA
#: node, in whole cores, at least one core (48 threads: one SMT2 core; 192: three).
HOUSEKEEPING_SHARE = 32
#: Isolated CPUs per housekeeping CPU of a NUMA node above which the plan warns:
#: their interrupts, RCU callbacks and kernel threads all land on those few.
HOUSEKEEPING_WARN_RATIO = 64


@dataclass(frozen=True)
class PlanRequest:
    """Validated planner inputs (one per inventory variable, ``cpupools_`` + name)."""

    num_exclusive_cores: int = 4
    num_shared_cores: int = 1
    exclusive_mode: str = "packed"
    shared_mode: str = "packed"
    excl_non_isolcpus: tuple[int, ...] = ()
    #: ``auto``, cores per NUMA node, ``{node: cores or "auto"}``, or the infra cores' CPU ids.
    infra_cores: int | tuple[int, ...] | str | dict = "auto"
    isolcpus_source: str = "generate"
    sst_bf: str = "auto"
    #: Resolved from ``auto`` by ``make_request`` (it depends on the runtime).
    isolated_pools: tuple[str, ...] = (EXCLUSIVE, SHARED)
    #: Let an infra cpulist leave the core of CPU 0 to an isolated pool.
    isolate_cpu0: bool = False
    #: How exclusive CPUs reach workloads (``cpupools_runtime``): each reads the plan in its terms.
    runtime: str = "cmk"
    #: ``performance``: exclusive cores are P cores on a hybrid node; ``any``: E cores too.
    exclusive_core_type: str = "performance"


def default_isolated_pools(runtime: str) -> tuple[str, ...]:
    """``isolated_pools: auto``: exclusive and shared, but exclusive only where the runtime needs it.

    nri-topology-aware hands isolated CPUs out only exclusively (an isolated
    shared pool would stop being shared); nri-balloons finds the exclusive
    pool by the kernel's isolated CPUs, so they must be that pool and no
    other; the kubelet has no shared pool of ours (every CPU it has not
    handed out is shared).
    """
    return (EXCLUSIVE,) if runtime in (KUBELET, NRI_TOPOLOGY_AWARE, NRI_BALLOONS) else (EXCLUSIVE, SHARED)


def make_request(raw: Mapping[str, object]) -> PlanRequest:
    """Validate raw planner values into a ``PlanRequest`` (errors name the variable).

    Keys are the variable names without ``cpupools_``; a missing key or
    ``None`` takes the default (the plan play refuses ``None`` earlier, in
    ``inputs.validate_inputs``). Values are read by the converters of
    ``inputs``, so ``"2"`` from ``-e`` means what ``2`` means in YAML.
    """
    known = set(PlanRequest.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise PlanError(f"unknown planner option(s): {', '.join(unknown)}")
    defaults = PlanRequest()

    def get(key: str) -> object:
        value = raw.get(key)
        if value is None and key == "isolated_pools":
            return "auto"
        return getattr(defaults, key) if value is None else value

    excl = to_count(get("num_exclusive_cores"), "num_exclusive_cores")
    shared = to_count(get("num_shared_cores"), "num_shared_cores")
    if excl == -1 and shared == -1:
        raise PlanError(
            "num_exclusive_cores and num_shared_cores are both -1; only one pool can take all remaining cores",
            "num_exclusive_cores",
        )
    runtime = to_choice(get("runtime"), "runtime", RUNTIMES)
    pools = to_isolated_pools(get("isolated_pools"), "isolated_pools")
    if pools == "auto":
        pools = default_isolated_pools(runtime)
    return PlanRequest(
        num_exclusive_cores=excl,
        num_shared_cores=shared,
        exclusive_mode=to_choice(get("exclusive_mode"), "exclusive_mode", MODES),
        shared_mode=to_choice(get("shared_mode"), "shared_mode", MODES),
        excl_non_isolcpus=to_cpus(get("excl_non_isolcpus"), "excl_non_isolcpus"),
        infra_cores=to_infra(get("infra_cores"), "infra_cores"),
        isolcpus_source=to_choice(get("isolcpus_source"), "isolcpus_source", SOURCES),
        sst_bf=to_sst_bf(get("sst_bf"), "sst_bf"),
        isolated_pools=tuple(p for p in ISOLATABLE_POOLS if p in pools),
        isolate_cpu0=to_bool(get("isolate_cpu0"), "isolate_cpu0"),
        runtime=runtime,
        exclusive_core_type=to_choice(get("exclusive_core_type"), "exclusive_core_type", CORE_TYPE_CHOICES),
    )


# Core selection --------------------------------------------------------------


def _whole_cores(topo: Topology, cpus: Iterable[int], name: str) -> list[Core]:
    """The cores ``cpus`` name; every CPU online and every core whole."""
    cpus = sorted(set(cpus))
    known = set(topo.cpus) | set(topo.offline)
    unknown = [c for c in cpus if c not in known]
    if unknown:
        raise PlanError(
            f"CPU(s) {format_cpulist(unknown)} do not exist on this host (online: {format_cpulist(topo.cpus)})", name
        )
    offline = [c for c in cpus if c not in topo.cpus]
    if offline:
        raise PlanError(f"CPU(s) {format_cpulist(offline)} are offline", name)
    by_index: dict[int, Core] = {}
    wanted = set(cpus)
    for cpu in cpus:
        core = topo.core_of(cpu)
        by_index[core.index] = core
    cores = list(by_index.values())
    for core in cores:
        missing = [c for c in core.cpus if c not in wanted]
        if missing:
            raise PlanError(
                f"{format_cpulist(wanted & set(core.cpus))} splits core {format_cpulist(core.cpus)}: "
                f"add its sibling(s) {format_cpulist(missing)} (pools take whole physical cores)",
                name,
            )
    return sorted(cores, key=lambda c: c.first)


def _node_groups(cores: Sequence[Core], sockets: Sequence[int]) -> dict[tuple[int, int], list[Core]]:
    """``cores`` grouped by ``(socket, NUMA node)``: sockets in ``sockets`` order, nodes by lowest CPU."""
    groups: dict[tuple[int, int], list[Core]] = {}
    for socket in sockets:
        for core in sorted((c for c in cores if c.socket == socket), key=lambda c: c.first):
            groups.setdefault((socket, core.node), []).append(core)
    return groups


def _spread_sequence(free: Mapping[tuple[int, int], int], sockets: Sequence[int], count: int | None) -> list:
    """Spread: the node each successive core comes from.

    The socket with the fewest cores taken so far gives the next core (ties:
    socket order), and within it the NUMA node with the fewest so far (ties:
    the node with the lowest CPU). With one node per socket this is the
    round robin over sockets the planner has always done.
    """
    left = dict(free)
    keys = list(left)
    by_socket = {s: 0 for s in sockets}
    by_node = {k: 0 for k in keys}
    sequence: list[tuple[int, int]] = []
    while count is None or len(sequence) < count:
        live = [s for s in sockets if any(left[k] for k in keys if k[0] == s)]
        if not live:
            break
        socket = min(live, key=lambda s: (by_socket[s], sockets.index(s)))
        node = min((k for k in keys if k[0] == socket and left[k]), key=lambda k: (by_node[k], keys.index(k)))
        sequence.append(node)
        left[node] -= 1
        by_socket[socket] += 1
        by_node[node] += 1
    return sequence


def _pick_group(group: Sequence[Core], sockets: Sequence[int], mode: str, count: int | None) -> list[Core]:
    """``count`` cores (all when ``None``) of ``group``, in hand-out order.

    First how many come from each NUMA node (``packed``: node after node in
    socket order; ``spread``: ``_spread_sequence``); then, on each node, the
    cores that touch the fewest L3 cache domains (``locality.fewest_groups``:
    whole domains before split ones, a partly used domain before a whole one;
    without L3 information, the node's first free cores).
    """
    nodes = _node_groups(group, sockets)
    if mode == "spread":
        sequence = _spread_sequence({k: len(v) for k, v in nodes.items()}, sockets, count)
    else:
        sequence = []
        for key, cores in nodes.items():
            take = len(cores) if count is None else min(len(cores), count - len(sequence))
            sequence += [key] * take
    wanted: dict[tuple[int, int], int] = {}
    for key in sequence:
        wanted[key] = wanted.get(key, 0) + 1
    chosen = {key: iter(fewest_groups(nodes[key], lambda c: c.l3, n)) for key, n in wanted.items()}
    return [next(chosen[key]) for key in sequence]


def _pick(free: Sequence[Core], sockets: Sequence[int], mode: str, count: int | None, prefer: set[int]) -> list[Core]:
    """Take ``count`` cores (all when ``None``) from ``free`` in ``mode`` order.

    Cores in ``prefer`` (SST-BF high-priority cores) are taken before others.
    """
    picked: list[Core] = []
    for group in ([c for c in free if c.index in prefer], [c for c in free if c.index not in prefer]):
        remaining = None if count is None else count - len(picked)
        if remaining == 0:
            break
        picked += _pick_group(group, sockets, mode, remaining)
    return picked


def _cmk_order(topo: Topology, mode: str, keep: set[int]) -> list[Core]:
    """CMK's ``order(mode, filter)`` (CMK's intel/init.py): plain round robin for spread."""
    per_socket = [[c for c in topo.cores_on(s) if c.index in keep] for s in topo.sockets]
    if mode == "packed":
        return [c for cores in per_socket for c in cores]
    out: list[Core] = []
    depth = max((len(c) for c in per_socket), default=0)
    for i in range(depth):
        out += [cores[i] for cores in per_socket if i < len(cores)]
    return out


@dataclass
class _Layout:
    pools: dict[str, list[Core]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: What the operator should know but need not act on (shown in the report, not warned).
    notes: list[str] = field(default_factory=list)
    stranded: list[int] = field(default_factory=list)
    isolated: list[int] = field(default_factory=list)
    #: The housekeeping cores: kept for the host on each NUMA node, handed out by no runtime.
    reserved: list[Core] = field(default_factory=list)
    adopted: dict | None = None


def _sst_prefer(topo: Topology, req: PlanRequest) -> set[int]:
    cores = topo.sst_bf_cores()
    if req.sst_bf == "false":
        return set()
    if req.sst_bf == "true" and not cores:
        raise PlanError(
            "true, but no core of this host has a higher base frequency (no cpufreq/base_frequency or all equal)",
            "sst_bf",
        )
    return cores


# The node that boots ---------------------------------------------------------------


def _check_boot_topology(topo: Topology) -> set[int]:
    """Refuse a plan for a node whose SMT was switched off at runtime; return the half cores' indexes.

    With SMT switched off at runtime the siblings are offline CPUs whose
    cores the kernel no longer shows: the next boot brings them back, and a
    plan for the cores as they are now would isolate one thread of each.
    A core with one sibling offline (and the others online) is known, and is
    kept out of the isolated pools: the sibling comes back at the next boot.
    """
    if topo.smt_switched_off():
        raise PlanError(
            f"SMT was switched off at runtime (smt/control is {topo.smt_control!r}; CPUs "
            f"{format_cpulist(topo.offline)} are offline) and the kernel command line has no nosmt, so the next "
            "boot brings those CPUs back as siblings of the cores planned now and would leave half of each "
            "isolated core to the scheduler; switch SMT back on (echo on > /sys/devices/system/cpu/smt/control) "
            "and run again, or boot with nosmt first"
        )
    return {core.index for core in topo.half_cores()}


# Housekeeping --------------------------------------------------------------------


def _node_order(topo: Topology) -> list[int]:
    """NUMA nodes in socket order, a socket's nodes by their lowest CPU."""
    return [node for socket in topo.sockets for node in topo.nodes_on(socket)]


def _auto_housekeeping(cores: Sequence[Core]) -> int:
    """``infra_cores: auto`` for one NUMA node: cores (in pick order) holding ``ceil(threads / 32)`` threads."""
    want = math.ceil(sum(len(c.cpus) for c in cores) / HOUSEKEEPING_SHARE)
    count = have = 0
    for core in cores:
        if have >= want and count:
            break
        count += 1
        have += len(core.cpus)
    return max(count, 1)


def _housekeeping_order(topo: Topology, cores: Sequence[Core], half: set[int]) -> list[Core]:
    """A NUMA node's cores in the order housekeeping takes them.

    The core of CPU 0 (the kernel keeps work there that cannot move), then
    cores with an offline sibling (they cannot be isolated anyway), then E
    cores of a hybrid, then cores of the first one's L3 domain, so that
    housekeeping dirties as few domains as it can; ties by core order.
    """
    if not cores:
        return []
    first = min(cores, key=lambda c: (0 not in c.cpus, c.index not in half, c.core_type != EFFICIENCY, c.first))
    return sorted(
        cores,
        key=lambda c: (
            0 not in c.cpus,
            c.index not in half,
            topo.hybrid and c.core_type != EFFICIENCY,
            c.l3 != first.l3,
            c.l2 != first.l2,
            c.first,
        ),
    )


def _housekeeping(topo: Topology, req: PlanRequest, half: set[int]) -> tuple[list[Core], str]:
    """The housekeeping cores, and how the refusals name them (``1 infra core per NUMA node``)."""
    spec = req.infra_cores
    if isinstance(spec, tuple):
        cores = _whole_cores(topo, spec, "infra_cores")
        return cores, f"{plural(len(cores), 'infra core')} (cpupools_infra_cores)"
    mapping = spec if isinstance(spec, dict) else {}
    nodes = _node_order(topo)
    unknown = sorted(set(mapping) - set(nodes))
    if unknown:
        raise PlanError(
            f"NUMA node(s) {', '.join(map(str, unknown))} do not exist on this host "
            f"(it has {', '.join(map(str, sorted(nodes)))})",
            "infra_cores",
        )
    default = spec if isinstance(spec, int) else "auto"
    chosen: list[Core] = []
    counts = set()
    for node in nodes:
        on_node = [c for c in topo.cores if c.node == node]
        order = _housekeeping_order(topo, on_node, half)
        want = mapping.get(node, default)
        count = _auto_housekeeping(order) if want == "auto" else int(want)  # type: ignore[call-overload]
        if count > len(on_node):
            raise PlanError(
                f"{show(count)} infra cores requested on NUMA node {node}, "
                f"which has only {plural(len(on_node), 'core')}",
                "infra_cores",
            )
        chosen += order[:count]
        counts.add(count)
    if not chosen:
        raise PlanError("no NUMA node keeps an infra core; the host and Kubernetes need at least one", "infra_cores")
    if isinstance(spec, int):
        note = f"{plural(spec, 'infra core')} per NUMA node"
    elif mapping:
        note = f"{plural(len(chosen), 'infra core')} (cpupools_infra_cores per NUMA node)"
    elif len(counts) == 1:
        note = f"{plural(counts.pop(), 'infra core')} per NUMA node (auto)"
    else:
        note = f"{plural(len(chosen), 'infra core')} (auto, per NUMA node)"
    return sorted(chosen, key=lambda c: c.first), note


# Which cores on a node -------------------------------------------------------------


def _flat(topo: Topology) -> bool:
    """Nothing to choose between on any NUMA node: one L3 (or none) per node, no L2 modules, one core type."""
    if topo.hybrid or topo.l2_modules:
        return False
    per_node: dict[int, set] = {}
    for core in topo.cores:
        per_node.setdefault(core.node, set()).add(core.l3)
    return all(len(l3s) == 1 for l3s in per_node.values())


def _grouped(cores: Sequence[Core], count: int, levels: Sequence[Callable[[Core], Hashable]]) -> list[Core]:
    """``count`` of ``cores`` from as few groups as possible at each level in turn (L3 domains, then L2 modules)."""
    if count >= len(cores):
        return list(cores)
    if not levels:
        return list(cores[:count])
    key = levels[0]
    picked = fewest_groups(cores, key, count)
    per_group = Counter(key(c) for c in picked)
    out: list[Core] = []
    for group in dict.fromkeys(key(c) for c in picked):
        out += _grouped([c for c in cores if key(c) == group], per_group[group], levels[1:])
    return out


_LEVELS: tuple[Callable[[Core], Hashable], ...] = (lambda c: c.l3, lambda c: c.l2)


def _tiered(cores: Sequence[Core], count: int, tier: Callable[[Core], tuple]) -> list[Core]:
    """``count`` of ``cores``: the best tier first, each tier from as few L3 domains and L2 modules as can be."""
    chosen: list[Core] = []
    for rank in sorted({tier(c) for c in cores}):
        left = count - len(chosen)
        if left <= 0:
            break
        chosen += _grouped([c for c in cores if tier(c) == rank], left, _LEVELS)
    return sorted(chosen, key=lambda c: c.first)


@dataclass
class _Dirt:
    """The L3 domains and L2 modules that hold housekeeping (and, for exclusive, shared) cores."""

    l3: set = field(default_factory=set)
    l2: set = field(default_factory=set)

    def add(self, cores: Iterable[Core]) -> None:
        for core in cores:
            if core.l3 is not None:
                self.l3.add(core.l3)
            if core.l2 is not None:
                self.l2.add(core.l2)

    def of(self, core: Core) -> tuple[bool, bool]:
        return (core.l3 is not None and core.l3 in self.l3, core.l2 is not None and core.l2 in self.l2)


def _exclusive_tier(topo: Topology, dirt: _Dirt, prefer: set[int]) -> Callable[[Core], tuple]:
    """Exclusive: P cores, SST-BF cores, then clean L3 domains, then clean L2 modules."""
    return lambda c: (topo.hybrid and c.core_type == EFFICIENCY, c.index not in prefer, *dirt.of(c))


def _shared_tier(topo: Topology, dirt: _Dirt) -> Callable[[Core], tuple]:
    """Shared: E cores, then domains and modules housekeeping already uses (a clean one stays clean)."""
    return lambda c: (
        topo.hybrid and c.core_type != EFFICIENCY,
        *(not d for d in dirt.of(c)),
    )


# How many from each NUMA node ---------------------------------------------------------


def _sequence(free: Mapping[tuple[int, int], int], sockets: Sequence[int], mode: str, count: int) -> list:
    """The NUMA node (``(socket, node)``) each successive core of a pool comes from."""
    if mode == "spread":
        return _spread_sequence(free, sockets, count)
    sequence: list[tuple[int, int]] = []
    for key, n in free.items():
        sequence += [key] * min(n, count - len(sequence))
    return sequence


def _by_node(cores: Sequence[Core], sockets: Sequence[int]) -> dict[tuple[int, int], list[Core]]:
    return _node_groups(cores, sockets)


def _place(
    topo: Topology,
    req: PlanRequest,
    free_excl: list[Core],
    free_shared: list[Core],
    excl: int,
    shared: int,
    hk: list[Core],
    prefer: set[int],
) -> tuple[list[Core], list[Core]]:
    """Exclusive (in hand-out order) and shared cores on a node with L3 domains, L2 modules or core types.

    Counts per NUMA node come first (``packed``/``spread``, the pool with a
    fixed size before a ``-1`` one); then, node by node, shared cores are
    chosen where housekeeping already is and exclusive cores where neither
    is, so an exclusive core shares an L3 or L2 with housekeeping or shared
    cores only when the node has no clean one left.
    """
    sockets = topo.sockets
    keys = list(_by_node(topo.cores, sockets))
    excl_nodes = _by_node(free_excl, sockets)
    shared_nodes = _by_node(free_shared, sockets)
    excl_free = {k: len(excl_nodes.get(k, [])) for k in keys}
    shared_free = {k: len(shared_nodes.get(k, [])) for k in keys}
    e_seq: list[tuple[int, int]] = []
    s_count: dict[tuple[int, int], int] = {}
    if req.num_exclusive_cores == -1:
        # shared (fixed) first, then exclusive takes every eligible core left
        s_count = Counter(_sequence(shared_free, sockets, req.shared_mode, shared))
    else:
        e_seq = _sequence(excl_free, sockets, req.exclusive_mode, excl)
        e_count = Counter(e_seq)
        # exclusive cores are shared-eligible too: what is left for shared per node
        left = {k: shared_free[k] - e_count.get(k, 0) for k in keys}
        s_count = Counter(_sequence(left, sockets, req.shared_mode, shared))
    dirt = _Dirt()
    dirt.add(hk)
    shared_cores: list[Core] = []
    exclusive_by_node: dict[tuple[int, int], list[Core]] = {}
    e_count = Counter(e_seq)
    for key in keys:
        candidates = shared_nodes.get(key, [])
        if req.num_shared_cores == -1:
            # everything exclusive does not take: exclusive is chosen against housekeeping alone
            mine = _tiered(excl_nodes.get(key, []), e_count.get(key, 0), _exclusive_tier(topo, dirt, prefer))
            exclusive_by_node[key] = mine
            taken = {c.index for c in mine}
            shared_cores += [c for c in candidates if c.index not in taken]
            continue
        tier = _shared_tier(topo, dirt)
        mine_shared = _tiered(candidates, s_count.get(key, 0), tier)
        taken = {c.index for c in mine_shared}
        rest = [c for c in excl_nodes.get(key, []) if c.index not in taken]
        want = len(rest) if req.num_exclusive_cores == -1 else e_count.get(key, 0)
        if len(rest) < want:
            # Shared took cores only exclusive can use (a node with half cores, whose sibling is
            # offline, or E cores the exclusive pool may not take): cores exclusive cannot use first.
            eligible = {c.index for c in excl_nodes.get(key, [])}
            mine_shared = _tiered(candidates, s_count.get(key, 0), lambda c, e=eligible, t=tier: (c.index in e, *t(c)))
            taken = {c.index for c in mine_shared}
            rest = [c for c in excl_nodes.get(key, []) if c.index not in taken]
        shared_cores += mine_shared
        node_dirt = _Dirt(set(dirt.l3), set(dirt.l2))
        node_dirt.add(mine_shared)
        exclusive_by_node[key] = _tiered(rest, want, _exclusive_tier(topo, node_dirt, prefer))
    if req.num_exclusive_cores == -1:
        # hand-out order: node after node (packed) or the spread sequence over what each node got
        got = {k: len(v) for k, v in exclusive_by_node.items()}
        e_seq = _sequence(got, sockets, req.exclusive_mode, sum(got.values()))
    chosen = {k: iter(v) for k, v in exclusive_by_node.items()}
    exclusive = [next(chosen[k]) for k in e_seq]
    return exclusive, sorted(shared_cores, key=lambda c: c.first)


# Counts ------------------------------------------------------------------------------


def _resolve_counts(
    req: PlanRequest, free_excl: int, free_any: int, infra_note: str, eni: int, why: str, unusable: str = ""
) -> tuple[int, int]:
    """The two pool sizes (``-1`` resolved), or the refusal with the numbers.

    ``free_excl``: free cores an exclusive pool may take (P cores of a
    hybrid, no core with an offline sibling); ``free_any``: free cores either
    pool may take. Shared takes E cores first, so exclusive keeps the P cores.
    """
    excl, shared = req.num_exclusive_cores, req.num_shared_cores
    fixed = max(excl, 0) + max(shared, 0)
    asked = f"{plural(excl, 'exclusive core') if excl >= 0 else 'all remaining exclusive cores'} + " + (
        f"{plural(shared, 'shared core')}" if shared >= 0 else "all remaining shared cores"
    )
    if eni:
        asked += f" + {plural(eni, 'exclusive-non-isolcpus core')}"
    field_name = "num_exclusive_cores" if excl != 0 or shared == 0 else "num_shared_cores"
    others = free_any - free_excl  # cores only shared may take
    too_many = fixed > free_any or (fixed == free_any and -1 in (excl, shared)) or max(excl, 0) > free_excl
    if excl == -1 and not too_many:
        too_many = free_excl - max(0, shared - others) <= 0
    if too_many:
        fits = f"{free_any} available after {infra_note}{unusable}"
        if free_excl != free_any:
            fits += f", of which {free_excl} can be exclusive{why}"
        raise PlanError(f"{asked} requested, {fits}", field_name)
    if excl == -1:
        excl = free_excl - max(0, shared - others)
    if shared == -1:
        shared = free_any - excl
    return excl, shared


# Generate ------------------------------------------------------------------------------


def _generate(topo: Topology, req: PlanRequest) -> _Layout:
    layout = _Layout()
    half = _check_boot_topology(topo)
    prefer = _sst_prefer(topo, req)
    infra, infra_note = _housekeeping(topo, req, half)
    eni = _whole_cores(topo, req.excl_non_isolcpus, "excl_non_isolcpus") if req.excl_non_isolcpus else []
    infra_index = {c.index for c in infra}
    overlap = [c for c in eni if c.index in infra_index]
    if overlap:
        raise PlanError(
            f"CPU(s) {format_cpulist(c for core in overlap for c in core.cpus)} are infra cores "
            f"({infra_note}); the exclusive-non-isolcpus pool cannot take them",
            "excl_non_isolcpus",
        )
    layout.reserved = list(infra)
    taken = infra_index | {c.index for c in eni}
    free = [c for c in topo.cores if c.index not in taken]
    if half:
        names = ", ".join(format_cpulist(c.cpus) for c in topo.cores if c.index in half)
        layout.warnings.append(
            f"{plural(len(half), 'core')} ({names}) "
            f"have an offline sibling (offline: {format_cpulist(topo.offline)}): the sibling comes back at the next "
            "boot, so these cores stay out of the isolated pools"
        )
    elif topo.offline and (topo.smt_control or "").strip() in ("off", "forceoff"):
        # booted with nosmt (smt_switched_off refused the other case): the siblings stay off
        layout.notes.append(
            f"SMT is off (nosmt on the kernel command line): CPUs {format_cpulist(topo.offline)} stay offline at boot"
        )
    elif topo.offline:
        layout.warnings.append(
            f"CPUs {format_cpulist(topo.offline)} are offline: the plan is for the CPUs online now, and offline CPUs "
            "that come back at a boot join no pool (no isolation, no interrupts)"
        )
    if req.runtime == KUBELET:
        _kubelet_layout(topo, req, layout, free, eni, half, infra_note)
    else:
        _pools_layout(topo, req, layout, free, eni, half, infra_note, prefer)
    layout.isolated = sorted(c for pool in req.isolated_pools for core in layout.pools[pool] for c in core.cpus)
    if 0 in layout.isolated:
        cpu0 = format_cpulist(topo.core_of(0).cpus)
        if not req.isolate_cpu0:
            named = req.infra_cores if isinstance(req.infra_cores, (int, str)) else format_cpulist(req.infra_cores)
            if isinstance(req.infra_cores, dict):
                named = f"{req.infra_cores.get(topo.cpus[0].node, 'auto')} on NUMA node {topo.cpus[0].node}"
            raise PlanError(
                f"{named} leaves the core of CPU 0 ({cpu0}) to an isolated pool; the "
                "kernel keeps housekeeping work there that cannot be moved: add it to the infra cores, or set "
                "cpupools_isolate_cpu0: true to isolate it anyway",
                "infra_cores",
            )
        layout.warnings.append(f"the core of CPU 0 ({cpu0}) is isolated, as cpupools_isolate_cpu0 asks")
    return layout


def _pools_layout(
    topo: Topology,
    req: PlanRequest,
    layout: _Layout,
    free: list[Core],
    eni: list[Core],
    half: set[int],
    infra_note: str,
    prefer: set[int],
) -> None:
    """Exclusive and shared pools for cmk, CPU-Pooler and the nri-plugins: left-over cores join infra."""
    e_only = topo.hybrid and req.exclusive_core_type == "performance"
    free_excl = [c for c in free if c.index not in half and not (e_only and c.core_type == EFFICIENCY)]
    shared_isolated = SHARED in req.isolated_pools
    free_shared = [c for c in free if not (shared_isolated and c.index in half)]
    why = ""
    if e_only and any(c.core_type == EFFICIENCY for c in free):
        why = " (P cores; set cpupools_exclusive_core_type: any to hand out E cores too)"
    elif half:
        why = " (not the cores with an offline sibling)"
    lost = len([c for c in free if c.index in half])
    unusable = (
        f" and {plural(lost, 'core')} with an offline sibling, never isolated" if lost and shared_isolated else ""
    )
    excl, shared = _resolve_counts(req, len(free_excl), len(free_shared), infra_note, len(eni), why, unusable)
    if _flat(topo):
        # One L3 (or none) per NUMA node and cores all alike: the first free cores, as always.
        order = [(EXCLUSIVE, excl, req.exclusive_mode), (SHARED, shared, req.shared_mode)]
        if req.num_exclusive_cores == -1:
            order.reverse()
        for pool, count, mode in order:
            eligible = free_excl if pool == EXCLUSIVE else free_shared
            chosen = _pick(eligible, topo.sockets, mode, count, prefer if pool == EXCLUSIVE else set())
            layout.pools[pool] = chosen
            gone = {c.index for c in chosen}
            free_excl = [c for c in free_excl if c.index not in gone]
            free_shared = [c for c in free_shared if c.index not in gone]
    else:
        layout.pools[EXCLUSIVE], layout.pools[SHARED] = _place(
            topo, req, free_excl, free_shared, excl, shared, layout.reserved, prefer
        )
    used = {c.index for pool in (EXCLUSIVE, SHARED) for c in layout.pools[pool]}
    layout.pools[ENI] = eni
    layout.pools[INFRA] = sorted(layout.reserved + [c for c in free if c.index not in used], key=lambda c: c.first)


def _kubelet_layout(
    topo: Topology,
    req: PlanRequest,
    layout: _Layout,
    free: list[Core],
    eni: list[Core],
    half: set[int],
    infra_note: str,
) -> None:
    """The kubelet's terms: ``reservedSystemCPUs`` is housekeeping, every other CPU the kubelet's.

    The kubelet hands out whole cores to Guaranteed pods from every CPU it
    does not reserve, and runs every other pod on those it has not handed
    out; so those CPUs are one pool (``exclusive``), all isolated (as
    OpenShift's PerformanceProfile isolates every CPU but the reserved ones).
    The kubelet cannot tell core types apart, so on a hybrid the E cores are
    reserved too (unless ``exclusive_core_type: any``); cores with an offline
    sibling are reserved (they cannot be isolated).
    """
    keep = []
    if half:
        keep += [c for c in free if c.index in half]
    e_cores = [c for c in free if topo.hybrid and c.core_type == EFFICIENCY and c.index not in half]
    if e_cores and req.exclusive_core_type == "performance":
        keep += e_cores
        layout.notes.append(
            f"the kubelet cannot tell P cores from E cores: the E cores "
            f"({format_cpulist(c for core in e_cores for c in core.cpus)}) are reserved with the housekeeping "
            "cores, so pods get P cores only (cpupools_exclusive_core_type: any gives them to the kubelet)"
        )
    kept = {c.index for c in keep}
    mine = [c for c in free if c.index not in kept]
    wanted = req.num_exclusive_cores
    if wanted > len(mine) or not mine:
        fits = f"the kubelet can hand out {plural(len(mine), 'core')} after {infra_note}"
        if keep:
            fits += f" and {plural(len(keep), 'reserved core')} it cannot use"
        raise PlanError(
            f"{plural(max(wanted, 1), 'exclusive core')} requested, {fits}",
            "num_exclusive_cores",
        )
    if req.num_shared_cores:
        layout.notes.append(
            "the kubelet shares every CPU it has not handed out to a Guaranteed pod: "
            f"cpupools_num_shared_cores ({show(req.num_shared_cores)}) makes no pool of its own"
        )
    if topo.hybrid:
        layout.notes.append(
            f"the kubelet counts {len(topo.cpus) // len(topo.cores)} CPU(s) per core on this node "
            f"({len(topo.cpus)} CPUs / {len(topo.cores)} cores), so full-pcpus-only does not keep a P core's "
            "threads together: ask for CPUs in pairs"
        )
    layout.reserved = sorted(layout.reserved + keep, key=lambda c: c.first)
    layout.pools[EXCLUSIVE] = mine
    layout.pools[SHARED] = []
    layout.pools[ENI] = eni
    layout.pools[INFRA] = list(layout.reserved)


def _adopt(topo: Topology, req: PlanRequest) -> _Layout:
    """What ``cmk init`` computes from the current isolcpus (CMK's intel/init.py)."""
    kernel = topo.kernel
    if not kernel.isolcpus_set or not kernel.isolcpus:
        raise PlanError(
            "adopt needs isolcpus= on the running kernel's command line, and /proc/cmdline has none; "
            "use 'generate' to let the plan choose the isolated cores",
            "isolcpus_source",
        )
    layout = _Layout()
    iso = set(kernel.isolcpus)
    layout.adopted = {"isolcpus": format_cpulist(iso), "isolcpus_flags": list(kernel.isolcpus_flags)}
    isolated = {c.index for c in topo.cores if all(cpu in iso for cpu in c.cpus)}
    for core in topo.cores:
        part = [cpu for cpu in core.cpus if cpu in iso]
        if part and core.index not in isolated:
            layout.warnings.append(
                f"core {format_cpulist(core.cpus)} is partially isolated (isolcpus has "
                f"{format_cpulist(part)}); CMK treats it as not isolated"
            )
    sst = _sst_prefer(topo, req)
    all_cores = {c.index for c in topo.cores}
    excl, shared = req.num_exclusive_cores, req.num_shared_cores
    assigned: dict[int, str] = {}

    def assign(candidates: list[Core], pool: str, count: int | None) -> list[Core]:
        free = [c for c in candidates if c.index not in assigned]
        free.sort(key=lambda c: c.index not in sst)  # stable: SST-BF cores first
        if count == -1:
            count = len(free)
            if not free:
                raise PlanError(f"-1 leaves no free core for the {pool} pool", f"num_{pool}_cores")
        if count is not None and len(free) < count:
            raise PlanError(
                f"{show(count)} cores requested for {pool}, only {len(free)} available", f"num_{pool}_cores"
            )
        chosen = free if count is None else free[:count]
        for core in chosen:
            assigned[core.index] = pool
        return chosen

    if isolated:
        requested = max(excl, 0) + max(shared, 0) + (1 if -1 in (excl, shared) else 0)
        if len(isolated) < requested:
            raise PlanError(
                f"{plural(max(excl, 0), 'exclusive core')} + {plural(max(shared, 0), 'shared core')} requested, "
                f"{len(isolated)} fit: isolcpus ({format_cpulist(iso)}) fully isolates "
                f"{plural(len(isolated), 'core')}; lower the sizes or isolate more cores",
                "num_exclusive_cores",
            )
        sst_iso = isolated & sst
        excl_keep = sst_iso if sst_iso else isolated
        layout.pools[EXCLUSIVE] = assign(_cmk_order(topo, req.exclusive_mode, excl_keep), EXCLUSIVE, excl)
        layout.pools[SHARED] = assign(_cmk_order(topo, req.shared_mode, isolated), SHARED, shared)
        eni: list[Core] = []
        if req.excl_non_isolcpus:
            eni = _whole_cores(topo, req.excl_non_isolcpus, "excl_non_isolcpus")
            busy = [c for c in eni if c.index in assigned]
            if busy:
                raise PlanError(
                    f"core(s) {', '.join(format_cpulist(c.cpus) for c in busy)} are already in the "
                    f"{'/'.join(sorted({assigned[c.index] for c in busy}))} pool",
                    "excl_non_isolcpus",
                )
            iso_eni = [c for c in eni if c.index in isolated]
            if iso_eni:
                raise PlanError(
                    f"core(s) {', '.join(format_cpulist(c.cpus) for c in iso_eni)} are isolated and cannot "
                    "be in the exclusive-non-isolcpus pool",
                    "excl_non_isolcpus",
                )
            for core in eni:
                assigned[core.index] = ENI
        layout.pools[ENI] = eni
        infra_keep = all_cores - isolated
        layout.pools[INFRA] = assign(_cmk_order(topo, "packed", infra_keep), INFRA, None)
        stranded = sorted(isolated - set(assigned))
        if stranded:
            cpus = sorted(cpu for core in topo.cores if core.index in stranded for cpu in core.cpus)
            layout.stranded = cpus
            layout.warnings.append(
                f"{plural(len(stranded), 'isolated core')} ({format_cpulist(cpus)}) are in no pool: "
                f"{len(isolated)} isolated but only {len(isolated) - len(stranded)} used by exclusive and shared"
            )
    else:
        # CMK's branch D: only partially isolated cores; isolcpus is ignored.
        if req.excl_non_isolcpus:
            raise PlanError(
                "no core is fully isolated, so CMK would ignore the exclusive-non-isolcpus pool; "
                "refusing instead of dropping it silently",
                "excl_non_isolcpus",
            )
        layout.warnings.append("no core is fully isolated by isolcpus; pools are laid out over all cores as CMK does")
        layout.pools[EXCLUSIVE] = assign(_cmk_order(topo, req.exclusive_mode, all_cores), EXCLUSIVE, excl)
        layout.pools[SHARED] = assign(_cmk_order(topo, req.shared_mode, all_cores), SHARED, shared)
        layout.pools[ENI] = []
        layout.pools[INFRA] = assign(_cmk_order(topo, "packed", all_cores), INFRA, None)
    if not layout.pools[INFRA]:
        raise PlanError(
            "every core is isolated, so the infra pool would be empty; the host and Kubernetes need "
            "at least one non-isolated core",
            "isolcpus_source",
        )
    infra_iso = [cpu for core in layout.pools[INFRA] for cpu in core.cpus if cpu in iso]
    if infra_iso:
        layout.warnings.append(f"infra pool holds isolated CPU(s) {format_cpulist(infra_iso)}")
    layout.isolated = sorted(iso & set(topo.cpus))
    return layout


# Output ------------------------------------------------------------------------


def plan_pools(topo: Topology, req: PlanRequest) -> dict:
    """Compute the plan: a JSON-safe dict, deterministic for the same input.

    Keys: ``pools`` (pool -> socket id string -> cpulists in CMK form;
    exclusive pools one cpulist per core in hand-out order, shared and infra
    one cpulist per socket), ``handout_order`` (exclusive pools: every cpulist
    in the order ``cmk isolate`` hands them out), ``pool_cpus`` (compressed
    cpulist per pool), ``isolated_cpus``, ``housekeeping_cpus``,
    ``stranded_cpus``, ``counts`` (cores per pool), ``cpu_counts``,
    ``sockets``, ``exclusive_pools``, ``warnings``, ``adopted`` and ``request``;
    ``runtime``; ``reserved_cpus`` (the housekeeping cores: no runtime hands
    them out; in adopt mode the infra pool), ``numa`` (NUMA node -> its
    ``cpus``, ``reserved``, ``housekeeping``, ``isolated`` and each pool's
    CPUs there), ``notes`` (what the operator should know, not act on) and
    ``allocatable_cpus`` (CPUs a runtime may give to pods: all but the
    reserved ones).
    """
    layout = _adopt(topo, req) if req.isolcpus_source == "adopt" else _generate(topo, req)
    preferred = _sst_prefer(topo, req)
    sockets = [str(s) for s in topo.sockets]
    pools: dict[str, dict[str, list[str]]] = {}
    handout: dict[str, list[str]] = {}
    for pool in POOL_ORDER:
        cores = layout.pools.get(pool, [])
        if pool == ENI and not cores:
            continue
        per_socket: dict[str, list[str]] = {s: [] for s in sockets}
        if pool in EXCLUSIVE_POOLS:
            for core in cores:  # already in hand-out order
                per_socket[str(core.socket)].append(format_cmk_cpulist(core.cpus))
            handout[pool] = [format_cmk_cpulist(core.cpus) for core in cores]
        else:
            for socket in topo.sockets:
                cpus = [cpu for core in cores if core.socket == socket for cpu in core.cpus]
                if cpus:
                    per_socket[str(socket)].append(format_cmk_cpulist(cpus))
        pools[pool] = per_socket
    pool_cpus = {
        pool: format_cpulist(cpu for core in layout.pools.get(pool, []) for cpu in core.cpus) for pool in pools
    }
    isolated = set(layout.isolated)
    housekeeping = [cpu for core in layout.pools[INFRA] for cpu in core.cpus if cpu not in isolated]
    if not housekeeping:
        raise PlanError("no housekeeping CPU is left: every infra CPU is isolated", "isolcpus_source")
    request = asdict(req)
    request["excl_non_isolcpus"] = format_cpulist(req.excl_non_isolcpus)
    if isinstance(req.infra_cores, tuple):
        request["infra_cores"] = format_cpulist(req.infra_cores)
    elif isinstance(req.infra_cores, dict):
        request["infra_cores"] = {str(node): count for node, count in sorted(req.infra_cores.items())}
    request["isolated_pools"] = list(req.isolated_pools)
    reserved = sorted(cpu for core in layout.reserved for cpu in core.cpus) if layout.reserved else sorted(housekeeping)
    numa = _numa_summary(topo, layout, isolated, set(housekeeping), set(reserved))
    layout.warnings += _housekeeping_warnings(numa)
    return {
        "version": PLAN_VERSION,
        "mode": req.isolcpus_source,
        "pools": pools,
        "handout_order": handout,
        "exclusive_pools": [p for p in EXCLUSIVE_POOLS if p in pools],
        "pool_cpus": pool_cpus,
        "isolated_cpus": format_cpulist(isolated),
        "housekeeping_cpus": format_cpulist(housekeeping),
        "stranded_cpus": format_cpulist(layout.stranded),
        "counts": {pool: len(layout.pools.get(pool, [])) for pool in pools},
        "cpu_counts": {pool: sum(len(c.cpus) for c in layout.pools.get(pool, [])) for pool in pools},
        "sockets": [int(s) for s in sockets],
        "sst_bf_cores": format_cpulist(cpu for core in topo.cores if core.index in preferred for cpu in core.cpus),
        "warnings": layout.warnings,
        "adopted": layout.adopted,
        "request": request,
        "runtime": req.runtime,
        "reserved_cpus": format_cpulist(reserved),
        "allocatable_cpus": len(topo.cpus) - len(reserved),
        "numa": {
            str(node): {k: v if isinstance(v, int) else format_cpulist(v) for k, v in row.items()}
            for node, row in numa.items()
        },
        "notes": layout.notes,
        "core_types": {kind: format_cpulist(cpus) for kind, cpus in topo.core_types.items()},
    }


def _numa_summary(
    topo: Topology, layout: _Layout, isolated: set[int], housekeeping: set[int], reserved: set[int]
) -> dict[int, dict]:
    """Per NUMA node: its CPUs, reserved, housekeeping and isolated CPUs, and each pool's CPUs there."""
    out: dict[int, dict] = {}
    for node, cpus in topo.numa_nodes.items():
        mine = set(cpus)
        row: dict[str, object] = {
            "cpus": sorted(mine),
            "reserved": sorted(mine & reserved),
            "housekeeping": sorted(mine & housekeeping),
            "isolated": sorted(mine & isolated),
        }
        for pool in POOL_ORDER:
            cores = layout.pools.get(pool) or []
            if cores or pool != ENI:
                row[pool] = sorted(c for core in cores for c in core.cpus if c in mine)
        out[node] = row
    return out


def _housekeeping_warnings(numa: Mapping[int, Mapping]) -> list[str]:
    """A NUMA node with isolated CPUs and no housekeeping, or few housekeeping CPUs for hundreds."""
    out = []
    for node, row in numa.items():
        hk, iso = len(row["housekeeping"]), len(row["isolated"])
        if iso and not hk:
            out.append(
                f"NUMA node {node} keeps no housekeeping CPU: the interrupts of its devices and the RCU callbacks "
                f"and kernel threads of its {plural(iso, 'isolated CPU')} are served from other NUMA nodes"
            )
        elif hk and iso / hk > HOUSEKEEPING_WARN_RATIO:
            out.append(
                f"NUMA node {node}: {plural(hk, 'housekeeping CPU')} carry the interrupts, RCU callbacks and "
                f"kernel threads of {iso} isolated CPUs ({iso // hk} each); give it more infra cores "
                f"(cpupools_infra_cores: auto keeps one thread per {HOUSEKEEPING_SHARE})"
            )
    return out
