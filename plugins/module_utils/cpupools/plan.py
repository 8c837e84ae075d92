"""The pool planner: topology + sizes -> pool layout. Pure computation.

Two ways to decide which cores are isolated:

* ``generate`` (default): the plan decides. Infra cores (housekeeping) are
  taken first, then ``exclusive-non-isolcpus`` (given as CPU ids), then the
  exclusive and shared pools in ``packed`` or ``spread`` order (over
  sockets, then the NUMA nodes of a socket; on each node the cores that
  touch the fewest L3 domains); every core
  left over joins infra, so the pools cover every online CPU. The isolated
  CPUs are those of ``isolated_pools`` (exclusive and shared by default).
* ``adopt``: a node whose ``isolcpus`` was set by hand (a CMK node being
  migrated). The pools are exactly those ``cmk init`` computes from that
  ``isolcpus`` and the sizes (reference §2.3-§2.5), but the modern flag
  syntax is understood and what CMK did silently (stranded isolated cores,
  half-isolated cores) is reported in ``warnings``.

The output is a JSON-safe dict (see ``plan_pools``); same input, same output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .cpulist import format_cmk_cpulist, format_cpulist
from .errors import PlanError
from .inputs import (
    ISOLATABLE_POOLS,
    MODES,
    SOURCES,
    to_bool,
    to_choice,
    to_choices,
    to_count,
    to_cpus,
    to_infra,
    to_sst_bf,
)
from .locality import fewest_groups
from .topology import Core, Topology

EXCLUSIVE = "exclusive"
SHARED = "shared"
INFRA = "infra"
ENI = "exclusive-non-isolcpus"
#: Pools in the order CMK creates them (reference §2.7).
POOL_ORDER = (EXCLUSIVE, SHARED, ENI, INFRA)
#: Pools whose cpulists are handed out whole to one process.
EXCLUSIVE_POOLS = (EXCLUSIVE, ENI)
PLAN_VERSION = 1


@dataclass(frozen=True)
class PlanRequest:
    """Validated planner inputs (one per inventory variable, ``cpupools_`` + name)."""

    num_exclusive_cores: int = 4
    num_shared_cores: int = 1
    exclusive_mode: str = "packed"
    shared_mode: str = "packed"
    excl_non_isolcpus: tuple[int, ...] = ()
    infra_cores: int | tuple[int, ...] = 1
    isolcpus_source: str = "generate"
    sst_bf: str = "auto"
    isolated_pools: tuple[str, ...] = (EXCLUSIVE, SHARED)
    #: Let an infra cpulist leave the core of CPU 0 to an isolated pool.
    isolate_cpu0: bool = False


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
        return getattr(defaults, key) if value is None else value

    excl = to_count(get("num_exclusive_cores"), "num_exclusive_cores")
    shared = to_count(get("num_shared_cores"), "num_shared_cores")
    if excl == -1 and shared == -1:
        raise PlanError(
            "num_exclusive_cores and num_shared_cores are both -1; only one pool can take all remaining cores",
            "num_exclusive_cores",
        )
    pools = to_choices(get("isolated_pools"), "isolated_pools", ISOLATABLE_POOLS)
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
    )


# Core selection --------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
    """CMK's ``order(mode, filter)`` (reference §2.1): plain round robin for spread."""
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
    stranded: list[int] = field(default_factory=list)
    isolated: list[int] = field(default_factory=list)
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


def _resolve_counts(req: PlanRequest, available: int, infra_note: str, eni: int) -> tuple[int, int]:
    excl, shared = req.num_exclusive_cores, req.num_shared_cores
    fixed = max(excl, 0) + max(shared, 0)
    asked = f"{_plural(excl, 'exclusive core') if excl >= 0 else 'all remaining exclusive cores'} + " + (
        f"{_plural(shared, 'shared core')}" if shared >= 0 else "all remaining shared cores"
    )
    if eni:
        asked += f" + {_plural(eni, 'exclusive-non-isolcpus core')}"
    field_name = "num_exclusive_cores" if excl != 0 or shared == 0 else "num_shared_cores"
    if fixed > available or (fixed == available and -1 in (excl, shared)):
        raise PlanError(f"{asked} requested, {available} available after {infra_note}", field_name)
    if excl == -1:
        excl = available - fixed
    if shared == -1:
        shared = available - fixed
    return excl, shared


def _generate(topo: Topology, req: PlanRequest) -> _Layout:
    layout = _Layout()
    prefer = _sst_prefer(topo, req)
    if isinstance(req.infra_cores, int):
        infra: list[Core] = []
        for socket in topo.sockets:
            cores = topo.cores_on(socket)
            if len(cores) < req.infra_cores:
                raise PlanError(
                    f"{req.infra_cores} infra cores per socket requested, socket {socket} has only "
                    f"{_plural(len(cores), 'core')}",
                    "infra_cores",
                )
            infra += cores[: req.infra_cores]
        infra_note = f"{_plural(req.infra_cores, 'infra core')} per socket"
    else:
        infra = _whole_cores(topo, req.infra_cores, "infra_cores")
        infra_note = f"{_plural(len(infra), 'infra core')} (cpupools_infra_cores)"
    eni = _whole_cores(topo, req.excl_non_isolcpus, "excl_non_isolcpus") if req.excl_non_isolcpus else []
    infra_index = {c.index for c in infra}
    overlap = [c for c in eni if c.index in infra_index]
    if overlap:
        raise PlanError(
            f"CPU(s) {format_cpulist(c for core in overlap for c in core.cpus)} are infra cores "
            f"({infra_note}); the exclusive-non-isolcpus pool cannot take them",
            "excl_non_isolcpus",
        )
    taken = {c.index for c in infra} | {c.index for c in eni}
    free = [c for c in topo.cores if c.index not in taken]
    excl, shared = _resolve_counts(req, len(free), infra_note, len(eni))
    # The pool with a fixed size is placed first; a -1 pool takes what is left.
    order = [(EXCLUSIVE, excl, req.exclusive_mode), (SHARED, shared, req.shared_mode)]
    if req.num_exclusive_cores == -1:
        order.reverse()
    for pool, count, mode in order:
        chosen = _pick(free, topo.sockets, mode, count, prefer if pool == EXCLUSIVE else set())
        layout.pools[pool] = chosen
        taken_now = {c.index for c in chosen}
        free = [c for c in free if c.index not in taken_now]
    layout.pools[ENI] = eni
    layout.pools[INFRA] = sorted(infra + free, key=lambda c: c.first)
    layout.isolated = sorted(c for pool in req.isolated_pools for core in layout.pools[pool] for c in core.cpus)
    if 0 in layout.isolated:
        cpu0 = format_cpulist(topo.core_of(0).cpus)
        if not req.isolate_cpu0:
            named = req.infra_cores if isinstance(req.infra_cores, int) else format_cpulist(req.infra_cores)
            raise PlanError(
                f"{named} leaves the core of CPU 0 ({cpu0}) to an isolated pool; the "
                "kernel keeps housekeeping work there that cannot be moved: add it to the infra cores, or set "
                "cpupools_isolate_cpu0: true to isolate it anyway",
                "infra_cores",
            )
        layout.warnings.append(f"the core of CPU 0 ({cpu0}) is isolated, as cpupools_isolate_cpu0 asks")
    return layout


def _adopt(topo: Topology, req: PlanRequest) -> _Layout:
    """What ``cmk init`` computes from the current isolcpus (reference §2.3-§2.5)."""
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
            raise PlanError(f"{count} cores requested for {pool}, only {len(free)} available", f"num_{pool}_cores")
        chosen = free if count is None else free[:count]
        for core in chosen:
            assigned[core.index] = pool
        return chosen

    if isolated:
        requested = max(excl, 0) + max(shared, 0) + (1 if -1 in (excl, shared) else 0)
        if len(isolated) < requested:
            raise PlanError(
                f"{len(isolated)} fully isolated cores in isolcpus ({format_cpulist(iso)}), "
                f"{_plural(max(excl, 0), 'exclusive core')} + {_plural(max(shared, 0), 'shared core')} requested",
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
                f"{_plural(len(stranded), 'isolated core')} ({format_cpulist(cpus)}) are in no pool: "
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
    ``sockets``, ``exclusive_pools``, ``warnings``, ``adopted`` and ``request``.
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
    if not isinstance(req.infra_cores, int):
        request["infra_cores"] = format_cpulist(req.infra_cores)
    request["isolated_pools"] = list(req.isolated_pools)
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
    }
