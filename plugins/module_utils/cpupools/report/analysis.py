"""The analysis of each host's inputs, and of the fleet: what each node has, what is pending, what has drifted.

Pure and deterministic: the same inputs give the same views, hence byte-identical
text and HTML (no clock, no randomness; a timestamp appears only when the caller
passes one).

Input: one dict per host (``analyse_host`` documents every key)::

    {"host": "node-1",
     "topology": ansible_facts.cpupools,          # Topology.to_facts(), or None
     "plan": cpupools_plan,                        # plan_pools() output, or None
     "kernel": {"reboot_required": bool,           # cpupools_kernel_status, or None
                "pending": ["isolcpus", ...],
                "desired_cmdline_args": {"isolcpus": "...", ...},
                "warnings": ["...", ...]},              # shown with the plan's warnings
     "state": {"present": bool,                    # cpupools_agent_status, or None
               "pools": {pool: {socket: [cpulist, ...]}},
               "tasks": {pool: {cpulist: [pid, ...]}}},
     "k8s": {"enabled": bool,                      # cpupools_k8s_status, or None
             "advertised": {resource: n},
             "expected": {resource: n},
             "skipped_reason": str},
     "hugepages": [{"size": "1G", "count": 16, "numa_node": 0}, ...]}  # cpupools_hugepages, or None

Every part but ``host`` is optional: an absent part (``None`` or missing) is
shown as "not collected" and never counts as drift.

Drift is any difference between what is live on the node and its plan:

* kernel: the CPUs the running kernel isolates (``/sys/devices/system/cpu/isolated``,
  fact ``kernel.isolated``, or the CPUs of an ``isolcpus`` without the ``domain``
  flag, which that file does not show) differ from the plan's ``isolated_cpus``. When the
  kernel status says a reboot is already pending, this is shown as *pending*
  (a reboot will fix it), not as drift;
* state: the pool state directory lists pools or cpulists the plan does not
  have (or lacks some the plan has), or tasks run on cpulists the plan does
  not have;
* k8s: an advertised extended resource differs from the expected count;
* plan: the plan names CPUs that are not online any more (the topology moved
  under the plan);
* hugepages: a node holds another number of pages of a size than planned,
  and the kernel status says no reboot is pending.

The result is a ``HostView`` per host, which holds every value the text
(text.py) and the page (page.py) show; ``fleet_summary`` is the fleet's
line in both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpupoolsError, PlanError, ReportError, plural
from ..core.names import ENI, EXCLUSIVE, EXCLUSIVE_POOLS, INFRA, POOL_ORDER, SHARED
from ..hardware.topology import Topology
from ..node.hugepages import parse_size, size_label
from . import report_verify

#: Classes a thread of the node picture can have, in legend order.
STRANDED = "stranded"
OFFLINE = "offline"
UNPLANNED = "unplanned"
CPU_CLASSES = (EXCLUSIVE, ENI, SHARED, INFRA, STRANDED, OFFLINE, UNPLANNED)
#: Pending isolation changes of a thread (running kernel vs plan).
PENDING_ISOLATE = "isolate"
PENDING_RELEASE = "release"

#: Extended resources CMK advertised, by the pool they count.
RESOURCES = {EXCLUSIVE: "cmk.intel.com/exclusive-cores", ENI: "cmk.intel.com/exclusive-non-isolcpus-cores"}

NOT_COLLECTED = "not collected"


@dataclass
class Thread:
    cpu: int
    pool: str
    pending: str | None = None  # PENDING_ISOLATE / PENDING_RELEASE
    busy: bool = False
    numa: int | None = None
    l3: int | None = None
    #: From the last verify: the latency scale's bucket of the measured max (None: not measured),
    #: whether the CPU was quiet (None: not verified), and both in words.
    latency: int | None = None
    quiet: bool | None = None
    verified: str = ""

    @property
    def classes(self) -> str:
        """CSS classes of the cell: ``t``, the pool colour, the latency colour, the pending mark, the marks."""
        classes = ["t", f"c-{self.pool}"]
        if self.latency is not None:
            classes += ["lat", f"lat-{self.latency}"]
        if self.pending:
            classes.append(f"p-{self.pending}")
        if self.busy:
            classes.append("busy")
        if self.quiet is False:
            classes.append("noisy")
        return " ".join(classes)

    @property
    def title(self) -> str:
        """The cell in words (hover text): pool, place, pending change, live task."""
        words = [f"CPU {self.cpu}: {self.pool}"]
        if self.numa is not None:
            words.append(f"NUMA node {self.numa}")
        if self.l3 is not None:
            words.append(f"L3 {self.l3}")
        if self.pending:
            words.append(
                "will be isolated at next boot"
                if self.pending == PENDING_ISOLATE
                else "isolated now, released at next boot"
            )
        if self.busy:
            words.append("held by a live task")
        if self.verified:
            words.append(self.verified)
        return "; ".join(words)


@dataclass
class CoreView:
    label: str  # compressed cpulist of the core
    threads: list[Thread]


@dataclass
class L3Group:
    """Cores of one NUMA node that share an L3 cache (``l3`` None: unknown)."""

    l3: int | None
    label: str
    boxed: bool  # drawn as a box of its own: its NUMA node holds several L3 domains
    cores: list[CoreView]

    @property
    def cols(self) -> int:
        return max(1, min(8, len(self.cores)))


@dataclass
class NumaView:
    node: int
    label: str
    boxed: bool  # drawn as a box of its own: its socket has several NUMA nodes
    groups: list[L3Group]

    @property
    def cores(self) -> list[CoreView]:
        return [core for group in self.groups for core in group.cores]


@dataclass
class SocketView:
    socket: int
    label: str
    numa: list[NumaView]  # in node order


@dataclass
class NumaRow:
    node: int
    sockets: str
    cores: int
    cpus: int
    cpulist: str
    l3: str  # compressed list of its L3 domain ids, "" when unknown
    pools: dict[str, int]  # pool -> physical cores of the pool on this node
    distances: str  # "10 21", "" when unknown
    housekeeping: str = ""  # the node's housekeeping (reserved) CPUs, "-" when the plan does not say


@dataclass
class L3Row:
    l3: int
    numa: str  # compressed list of the NUMA nodes it spans
    cores: int
    cpus: int
    cpulist: str
    pools: str  # "exclusive 3, infra 1" (physical cores)


@dataclass
class HugepageRow:
    node: str  # NUMA node id, or "all" for a count not tied to one node
    size: str  # canonical: 1G, 2M, 64K
    planned: str  # "-" when not planned
    total: str  # "-" when not collected
    free: str
    verdict: str  # ok, short by N, N more than planned, pending reboot, not collected, not planned
    drift: bool = False


@dataclass
class PoolRow:
    pool: str
    socket: str
    cores: str
    cpus: int
    cpulist: str
    in_use: str


@dataclass
class HostView:
    """Everything the renderers show about one host, computed once."""

    host: str
    summary: str = ""
    mode: str | None = None
    #: How the pools were laid out over sockets and NUMA nodes (the plan's request), in words.
    layout: str = ""
    runtime: str | None = None
    #: What the runtime gives workloads, in its terms (the kubelet: allocatable CPUs, reservedSystemCPUs).
    workloads: str = ""
    housekeeping: str = ""
    core_types: str = ""  # "P 0-11 (6 cores), E 12-19 (8 cores)" on a hybrid node
    cpu_states: str = ""  # offline, present and possible CPUs where they differ from online
    notes: list[str] = field(default_factory=list)
    sockets: list[SocketView] = field(default_factory=list)
    offline: list[int] = field(default_factory=list)
    pools: list[PoolRow] = field(default_factory=list)
    isolated_active: str | None = None
    isolated_planned: str | None = None
    to_isolate: str = ""
    to_release: str = ""
    kernel: str = NOT_COLLECTED
    reboot_required: bool | None = None
    numa: list[NumaRow] = field(default_factory=list)
    numa_pools: list[str] = field(default_factory=list)  # pool columns of the NUMA table
    l3: list[L3Row] = field(default_factory=list)
    hugepages: list[HugepageRow] = field(default_factory=list)
    resources: list[tuple[str, str, str, str]] = field(default_factory=list)  # name, expected, advertised, verdict
    resources_note: str = ""
    tasks: list[str] = field(default_factory=list)
    tasks_note: str = NOT_COLLECTED
    stranded: str | None = None
    drift: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    has_topology: bool = False
    has_plan: bool = False
    kernel_unknown: bool = False
    #: The last cpupools_verify result (as given, for the JSON) and the report's view of it; None: never verified.
    verify_result: dict | None = None
    verify: report_verify.VerifyView | None = None
    #: The plan in a few keys, for the JSON beside the page.
    plan_summary: dict | None = None

    @property
    def subtitle(self) -> str:
        return "; ".join(self.details)

    @property
    def details(self) -> list[str]:
        mode = f"mode {self.mode} ({MODE_WORDS.get(self.mode, self.mode)})" if self.mode else ""
        runtime = f"runtime {self.runtime}" if self.runtime else ""
        return [d for d in (self.summary, mode, runtime) if d]

    @property
    def mode_words(self) -> str:
        """The plan's mode in an operator's words, and the pools' layout (the HTML report's Mode row)."""
        if not self.mode:
            return ""
        return "; ".join(w for w in (f"{self.mode}: {MODE_WORDS.get(self.mode, self.mode)}", self.layout) if w)

    @property
    def pending(self) -> bool:
        return bool(self.reboot_required) or (bool(self.to_isolate or self.to_release) and not self.drift_kernel)

    @property
    def drift_kernel(self) -> bool:
        return any(d.startswith("kernel:") for d in self.drift)

    @property
    def status(self) -> str:
        """One word: ``drift``, ``pending``, ``ok`` or ``unplanned``."""
        if self.drift:
            return "drift"
        if self.pending:
            return "pending"
        return "ok" if self.has_plan else "unplanned"


def _cpus(value: object, what: str, field_name: str | None) -> list[int]:
    try:
        return parse_cpulist(value if value is not None else "", what)  # type: ignore[arg-type]
    except CpupoolsError as exc:
        raise ReportError(str(exc), field_name) from None  # the parser's message names ``what`` and the value


def _mapping(value: object, field_name: str) -> Mapping | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReportError(f"expected a dict, got {type(value).__name__}", field_name)
    return value


def _int(value: object, what: str, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ReportError(f"{what}: {value!r} is not a number", field_name)
    try:
        return int(value)
    except ValueError:
        raise ReportError(f"{what}: {value!r} is not a number", field_name) from None


def _plan_cpulists(plan: Mapping) -> dict[str, dict[str, list[str]]]:
    pools = plan.get("pools")
    if not isinstance(pools, Mapping):
        raise ReportError("has no 'pools' dict; is it the output of cpupools_plan?", "plan")
    return {str(p): {str(s): list(v or []) for s, v in (sockets or {}).items()} for p, sockets in pools.items()}


def _ordered_pools(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [p for p in POOL_ORDER if p in names] + sorted(names - set(POOL_ORDER))


def _read_facts(facts: Mapping) -> tuple[Topology, dict[int, int], dict[int, str]]:
    """The topology model of a host's facts, its CPUs' L3 domains and its distance rows; raises ``ReportError``."""
    _l3_of(facts, None)  # its own one-line message, and the distances', before the model's
    distances = _distances(facts)
    try:
        topo = Topology.from_facts(facts)
    except CpupoolsError as exc:
        raise ReportError(f"ansible_facts.cpupools: {exc}", None) from None
    return topo, _l3_of(facts, topo), distances


def analyse_host(entry: Mapping, known: dict | None = None) -> HostView:
    """Turn one host's inputs into a ``HostView``; raises ``ReportError``.

    ``known`` (a dict kept for one fleet) reads each topology object once:
    hosts whose input holds the same facts object (the report's action gives
    every host naming one stored topology the same one) share its model,
    which nothing here changes.

    ``entry`` keys (all but ``host`` optional, ``None`` = not collected):

    ``host``
        inventory name.
    ``topology``
        ``ansible_facts.cpupools`` (``Topology.to_facts()``).
    ``plan``
        the ``cpupools_plan`` fact (``plan_pools()`` output).
    ``kernel``
        ``reboot_required`` (bool: the boot configuration holds arguments the
        running kernel was not booted with), ``pending`` (list of argument
        names or ``key=value`` strings that differ), ``desired_cmdline_args``
        (dict argument -> value the plan wants).
    ``state``
        ``present`` (bool, default true: the state directory exists),
        ``pools`` (pool -> socket -> cpulists found on disk, optional),
        ``tasks`` (pool -> cpulist -> PIDs; every cpulist directory, ``[]``
        when free).
    ``k8s``
        ``enabled`` (bool), ``advertised`` and ``expected`` (resource name ->
        count), ``skipped_reason`` (why nothing was collected).
    ``hugepages``
        the planned hugepages (``cpupools_hugepages``): a list of ``size``
        (``1G``, ``2M``, ``2048kB``), ``count`` and optional ``numa_node``;
        when absent, the plan's ``hugepages`` list is used if it has one.

    Topology facts beyond ``Topology.from_facts`` are read when present and
    ignored when absent (older facts): per CPU ``l3`` (L3 cache domain id),
    ``l3_domains`` (id -> cpulist), ``numa_distances`` (node -> distances to
    nodes 0..n) and ``hugepages`` (node -> size -> ``total``/``free``).
    """
    if not isinstance(entry, Mapping) or not isinstance(entry.get("host"), str) or not entry.get("host"):
        raise ReportError("every report input needs a 'host' name", None)
    view = HostView(host=entry["host"])
    facts = _mapping(entry.get("topology"), "facts")
    plan = _mapping(entry.get("plan"), "plan")
    topo = None
    l3_of: dict[int, int] = {}
    distances: dict[int, str] = {}
    if facts:
        known = {} if known is None else known
        # the facts object is kept in the value: its id is not reused while the dict lives
        if id(facts) not in known:
            known[id(facts)] = (facts, *_read_facts(facts))
        _, topo, l3_of, distances = known[id(facts)]
        view.has_topology = True
    cpu_pool: dict[int, str] = {}
    planned_iso: list[int] | None = None
    if plan:
        view.has_plan = True
        view.mode = str(plan.get("mode", "generate"))
        view.layout = _layout_words(plan.get("request") or {})
        _plan_cpulists(plan)  # validates the shape early, before any rendering
        for pool, cpus in (plan.get("pool_cpus") or {}).items():
            for cpu in _cpus(cpus, f"pool_cpus of {pool}", "plan"):
                cpu_pool[cpu] = str(pool)
        planned_iso = _cpus(plan.get("isolated_cpus"), "isolated_cpus", "plan")
        stranded = _cpus(plan.get("stranded_cpus"), "stranded_cpus", "plan")
        for cpu in stranded:
            cpu_pool.setdefault(cpu, STRANDED)
        view.stranded = format_cpulist(stranded) or "none"
        view.isolated_planned = format_cpulist(planned_iso)
        view.warnings = [str(w) for w in plan.get("warnings") or []]
        view.notes = [str(n) for n in plan.get("notes") or []]
        _runtime(view, plan, len(cpu_pool))
    active_iso: list[int] | None = None
    if topo is not None:
        active_iso = list(topo.kernel.isolated_now)
        view.isolated_active = format_cpulist(active_iso)
        view.offline = list(topo.offline)
        view.core_types = _core_types(topo)
        view.cpu_states = _cpu_states(topo)
        view.summary = (
            f"{plural(len(topo.sockets), 'socket')}, {plural(len(topo.cores), 'core')}, "
            f"{plural(len(topo.cpus), 'CPU')} online ({topo.threads_per_core} per core)"
            + (f", {len(topo.offline)} offline" if topo.offline else "")
        )
        if plan:
            gone = sorted(set(cpu_pool) - set(topo.cpus))
            if gone:
                view.drift.append(
                    f"plan: names CPU(s) {format_cpulist(gone)} which are not online; re-run the plan stage"
                )
    to_isolate: set[int] = set()
    to_release: set[int] = set()
    if planned_iso is not None and active_iso is not None:
        to_isolate = set(planned_iso) - set(active_iso)
        to_release = set(active_iso) - set(planned_iso)
        view.to_isolate = format_cpulist(to_isolate)
        view.to_release = format_cpulist(to_release)
    kernel = _mapping(entry.get("kernel"), "kernel_status")
    _kernel(view, kernel, bool(to_isolate or to_release))
    for warning in (kernel or {}).get("warnings") or []:  # what the kernel stage warned about, once each
        if str(warning) not in view.warnings:
            view.warnings.append(str(warning))
    held = _state(view, _mapping(entry.get("state"), "agent_status"), plan)
    busy = {cpu for _, key in held for cpu in parse_cpulist(key)}
    _k8s(view, _mapping(entry.get("k8s"), "k8s_status"), plan)
    if plan:
        _pool_rows(view, plan, held, topo)
    if topo is not None and facts is not None:
        _picture(view, topo, cpu_pool if plan else {}, to_isolate, to_release, busy, l3_of)
        reserved = plan.get("reserved_cpus") if plan else None
        reserved_cpus = None if reserved is None else set(_cpus(reserved, "reserved_cpus", "plan"))
        _numa_rows(view, topo, cpu_pool if plan else {}, l3_of, distances, reserved_cpus)
        _l3_rows(view, topo, cpu_pool if plan else {}, l3_of)
    planned_pages = entry.get("hugepages")
    if planned_pages is None and plan:
        planned_pages = plan.get("hugepages")
    _hugepages(view, planned_pages, facts.get("hugepages") if facts else None)
    _verify(view, entry.get("verify"))
    if plan:
        view.plan_summary = plan_summary(plan)
    return view


def plan_summary(plan: Mapping) -> dict:
    """The plan's keys an operator's tooling reads (the JSON beside the page): mode, runtime, CPUs by role."""
    keys = ("mode", "runtime", "isolated_cpus", "reserved_cpus", "stranded_cpus", "pool_cpus", "exclusive_pools")
    return {key: plan[key] for key in keys if key in plan}


def _verify(view: HostView, result: object) -> None:
    """The host's last verify result: its view, and on each CPU of the picture its latency colour and quiet mark."""
    view.verify = report_verify.analyse(result)
    if view.verify is None:
        return
    view.verify_result = dict(result)  # type: ignore[call-overload]  # analyse checked it is a mapping
    for sock in view.sockets:
        for node in sock.numa:
            for core in node.cores:
                for thread in core.threads:
                    row = view.verify.row(thread.cpu)
                    if row is not None:
                        thread.latency = row.bucket
                        thread.quiet = row.quiet
                        thread.verified = row.words


#: The plan's modes in an operator's words.
MODE_WORDS = {
    "generate": "cpupools chose the isolated CPUs",
    "adopt": "kept the isolcpus set by hand, pools as CMK computed them",
}


#: The pools' layout modes (cpupools_exclusive_mode, cpupools_shared_mode) in an operator's words.
LAYOUT_WORDS = {"packed": "packed (socket 0 first)", "spread": "spread over the sockets and NUMA nodes"}


def _layout_words(request: Mapping) -> str:
    """``exclusive cores spread over ...; shared cores packed ...`` for the pools the request sizes."""
    words = []
    for pool, key in ((EXCLUSIVE, "exclusive_mode"), (SHARED, "shared_mode")):
        count = request.get(f"num_{pool}_cores")
        mode = request.get(key)
        if mode and count not in (None, 0):
            words.append(f"{pool} cores {LAYOUT_WORDS.get(str(mode), str(mode))}")
    return ", ".join(words)


def _runtime(view: HostView, plan: Mapping, planned: int) -> None:
    """The runtime, what it gives workloads and keeps for housekeeping (plans before issue 25 have no runtime)."""
    runtime = plan.get("runtime")
    if runtime is None:
        return
    view.runtime = str(runtime)
    reserved = _cpus(plan.get("reserved_cpus"), "reserved_cpus", "plan")
    view.housekeeping = f"{format_cpulist(reserved) or 'none'} ({plural(len(reserved), 'CPU')})"
    allocatable = plan.get("allocatable_cpus")
    if view.runtime == "kubelet":
        kubelet = plan.get("kubelet") if isinstance(plan.get("kubelet"), Mapping) else {}
        config = kubelet.get("config") if isinstance(kubelet.get("config"), Mapping) else {}
        options = ", ".join(sorted(config.get("cpuManagerPolicyOptions") or {})) or "none"
        version = kubelet.get("version")
        view.workloads = (
            f"pods can use {allocatable} of {planned} CPUs: reservedSystemCPUs is the housekeeping CPUs, the kubelet "
            f"hands out every other CPU whole to Guaranteed pods and shares the rest; options {options}"
            + (f" (kubelet {version}{'' if kubelet.get('version_known') else ', assumed'})" if version else "")
        )
    elif view.runtime == "cmk":
        view.workloads = f"cmk isolate hands out the exclusive pools; {allocatable} CPUs outside housekeeping"
    else:
        view.workloads = f"{view.runtime} reserves the housekeeping CPUs; {allocatable} CPUs are its to give out"


def _core_types(topo: Topology) -> str:
    types = topo.core_types
    if len(types) < 2:
        return ""
    short = {"performance": "P", "efficiency": "E"}
    parts = []
    for kind, cpus in types.items():
        cores = len({topo.core_of(c).index for c in cpus})
        parts.append(f"{short.get(kind, kind)} {format_cpulist(cpus)} ({plural(cores, 'core')})")
    return ", ".join(parts)


def _cpu_states(topo: Topology) -> str:
    """Offline, present and possible CPUs, said only where they differ from the online ones."""
    online = set(topo.cpus)
    parts = []
    if topo.offline:
        parts.append(f"offline {format_cpulist(topo.offline)}")
    if set(topo.present) != online | set(topo.offline):
        parts.append(f"present {format_cpulist(topo.present)}")
    if set(topo.possible) - set(topo.present):
        parts.append(f"possible {format_cpulist(topo.possible)} ({len(set(topo.possible) - set(topo.present))} absent)")
    if topo.smt_control and topo.smt_control not in ("on", "notsupported", "notimplemented"):
        parts.append(
            f"SMT {topo.smt_control}" + (" at runtime (back at the next boot)" if topo.smt_switched_off() else "")
        )
    return "; ".join(parts)


def _kernel(view: HostView, kernel: Mapping | None, differs: bool) -> None:
    if kernel is None:
        view.kernel = NOT_COLLECTED
        if differs:
            # Without the kernel status nobody knows whether the boot configuration
            # already holds the change: shown as pending, with the doubt spelt out.
            view.kernel = (
                f"{NOT_COLLECTED}: the running kernel differs from the plan; "
                "cannot tell whether the boot configuration already has the change"
            )
            view.reboot_required = None
            view.kernel_unknown = True
        return
    view.reboot_required = bool(kernel.get("reboot_required"))
    pending = [str(p) for p in kernel.get("pending") or []]
    if view.reboot_required:
        view.kernel = "reboot required" + (f" (pending: {', '.join(pending)})" if pending else "")
    else:
        view.kernel = "running kernel matches the boot configuration"
    if differs and not view.reboot_required:
        view.drift.append(
            f"kernel: the running kernel isolates {view.isolated_active or 'no CPU'}, the plan "
            f"{view.isolated_planned or 'no CPU'}, and the boot configuration has no pending change"
        )


def _state(view: HostView, state: Mapping | None, plan: Mapping | None) -> dict[tuple[str, str], int]:
    """Fill live tasks and state drift; return ``(pool, cpulist) -> number of live tasks``."""
    busy: dict[tuple[str, str], int] = {}
    if state is None:
        view.tasks_note = NOT_COLLECTED
        return busy
    runtime = str((plan or {}).get("runtime") or "cmk")
    if runtime != "cmk":
        # Only cmk isolate keeps CMK's pool state; the agent stage removes it on other runtimes.
        view.tasks_note = f"none kept by cpupools (runtime {runtime})"
        return busy
    if state.get("present") is False:
        view.tasks_note = "state directory not written yet"
        if plan:
            view.drift.append("state: the pool state directory does not exist yet")
        return busy
    tasks = _mapping(state.get("tasks") or {}, "agent_status") or {}
    planned = _plan_cpulists(plan) if plan else None
    on_disk: dict[str, set[str]] = {}
    count = 0
    for pool in _ordered_pools(str(p) for p in tasks):
        lists = _mapping(tasks[pool] or {}, "agent_status") or {}
        on_disk[pool] = set()
        for cpulist in sorted(lists, key=lambda c: (_cpus(c, f"{pool} state cpulist", "agent_status"), c)):
            pids = [_int(p, f"task of {pool} {cpulist}", "agent_status") for p in lists[cpulist] or []]
            key = format_cpulist(_cpus(cpulist, f"{pool} state cpulist", "agent_status"))
            on_disk[pool].add(key)
            if pids:
                count += len(pids)
                busy[(pool, key)] = len(pids)
                view.tasks.append(f"{pool} {key}: {', '.join(str(p) for p in sorted(pids))}")
                if planned is not None and key not in _norm_lists(planned.get(pool, {})):
                    view.drift.append(
                        f"state: task(s) {', '.join(str(p) for p in sorted(pids))} hold {pool} cpulist {key}, "
                        "which the plan does not have"
                    )
    if state.get("pools") is not None:
        pools = _mapping(state.get("pools"), "agent_status") or {}
        on_disk = {
            str(p): _norm_lists({str(s): list(v or []) for s, v in (sockets or {}).items()})
            for p, sockets in pools.items()
        }
    view.tasks_note = f"{plural(count, 'task')} on {plural(len(view.tasks), 'cpulist')}" if count else "no live task"
    if planned is not None:
        for pool in _ordered_pools(set(on_disk) | set(planned)):
            want = _norm_lists(planned.get(pool, {}))
            have = on_disk.get(pool)
            if have is None:
                view.drift.append(f"state: pool {pool} is planned but not in the state directory")
                continue
            if pool not in planned:
                view.drift.append(f"state: pool {pool} is in the state directory but not in the plan")
                continue
            extra, missing = sorted(have - want, key=_first), sorted(want - have, key=_first)
            if extra or missing:
                parts = []
                if missing:
                    parts.append(f"missing {'; '.join(missing)}")
                if extra:
                    parts.append(f"not planned {'; '.join(extra)}")
                view.drift.append(f"state: pool {pool} cpulists differ from the plan ({', '.join(parts)})")
    return busy


def _first(cpulist: str) -> tuple[int, ...]:
    return tuple(parse_cpulist(cpulist))


def _norm_lists(per_socket: Mapping[str, Sequence[str]]) -> set[str]:
    return {format_cpulist(parse_cpulist(c)) for lists in per_socket.values() for c in lists if c}


def _expected_from_plan(plan: Mapping | None) -> dict[str, int]:
    if not plan:
        return {}
    out = {}
    for pool, resource in RESOURCES.items():
        if pool in (plan.get("handout_order") or {}):
            out[resource] = len(plan["handout_order"][pool])
    return out


def _k8s(view: HostView, k8s: Mapping | None, plan: Mapping | None) -> None:
    derived = _expected_from_plan(plan)
    if k8s is None or not k8s.get("enabled", True):
        reason = NOT_COLLECTED if k8s is None else f"skipped: {k8s.get('skipped_reason') or 'Kubernetes disabled'}"
        view.resources_note = reason
        view.resources = [(name, str(n), "-", "") for name, n in sorted(derived.items())]
        return
    expected = {
        str(k): _int(v, f"expected {k}", "k8s_status")
        for k, v in (derived if k8s.get("expected") is None else k8s["expected"]).items()
    }
    advertised = {str(k): _int(v, f"advertised {k}", "k8s_status") for k, v in (k8s.get("advertised") or {}).items()}
    for name in sorted(set(expected) | set(advertised)):
        want, have = expected.get(name), advertised.get(name)
        verdict = "ok" if want == have else "DRIFT"
        view.resources.append((name, "-" if want is None else str(want), "-" if have is None else str(have), verdict))
        if want != have:
            view.drift.append(
                f"k8s: {name} advertised {'nothing' if have is None else have}, "
                f"expected {'nothing' if want is None else want}"
            )


def _pool_rows(view: HostView, plan: Mapping, held: Mapping[tuple[str, str], int], topo: Topology | None) -> None:
    cpulists = _plan_cpulists(plan)
    for pool in _ordered_pools(cpulists):
        sockets = sorted(cpulists[pool], key=lambda s: (len(s), s))
        # A socket without CPUs of the pool gets no row (an 8-socket node would
        # get 7 empty rows per packed pool); an empty pool gets one row.
        filled = [s for s in sockets if any(cpulists[pool][s])]
        for socket in filled or ["-"]:
            lists = [parse_cpulist(c) for c in cpulists[pool].get(socket, []) if c]
            cpus = sorted(c for lst in lists for c in lst)
            if pool in EXCLUSIVE_POOLS:
                cores = str(len(lists))
                used = sum(1 for lst in lists if (pool, format_cpulist(lst)) in held)
                in_use = f"{used}/{len(lists)}" if lists else ""
            else:
                # Shared and infra have one cpulist per socket: count its physical cores.
                online = [c for c in cpus if topo is not None and c in topo.cpus]
                cores = str(len({topo.core_of(c).index for c in online})) if topo is not None else "-"
                tasks = sum(n for (p, key), n in held.items() if p == pool and set(parse_cpulist(key)) & set(cpus))
                in_use = plural(tasks, "task") if tasks else ""
            view.pools.append(PoolRow(pool, socket, cores, len(cpus), format_cpulist(cpus) or "-", in_use))


def _facts_error(message: str) -> ReportError:
    return ReportError(f"ansible_facts.cpupools: {message}", None)


def _fact_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _facts_error(f"{what}: {value!r} is not a number")
    try:
        return int(value)
    except ValueError:
        raise _facts_error(f"{what}: {value!r} is not a number") from None


def _l3_of(facts: Mapping, topo: Topology | None) -> dict[int, int]:
    """Online CPU -> its L3 domain id; empty when the facts do not say (older facts).

    Per-CPU ``l3`` wins; ``l3_domains`` (id -> cpulist) fills CPUs without one.
    """
    out: dict[int, int] = {}
    for item in facts.get("cpus") or []:
        if isinstance(item, Mapping) and item.get("l3") is not None:
            cpu = _fact_int(item.get("id"), "id of a CPU")
            out[cpu] = _fact_int(item["l3"], f"l3 of cpu{cpu}")
    domains = facts.get("l3_domains")
    if domains is not None:
        if not isinstance(domains, Mapping):
            raise _facts_error(f"l3_domains: expected a dict of id -> cpulist, got {type(domains).__name__}")
        for key, cpus in sorted(domains.items(), key=lambda kv: _fact_int(kv[0], "l3_domains id")):
            l3 = _fact_int(key, "l3_domains id")
            try:
                members = parse_cpulist(cpus if cpus is not None else "", f"l3_domains {l3}")
            except CpupoolsError as exc:
                raise _facts_error(str(exc)) from None
            for cpu in members:
                out.setdefault(cpu, l3)
    return out if topo is None else {cpu: l3 for cpu, l3 in out.items() if cpu in topo.cpus}


def _distances(facts: Mapping) -> dict[int, str]:
    """NUMA node -> its row of the distance table as text (``10 21``); empty when unknown."""
    table = facts.get("numa_distances")
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise _facts_error(f"numa_distances: expected a dict of node -> list, got {type(table).__name__}")
    out = {}
    for key, row in table.items():
        node = _fact_int(key, "numa_distances node")
        if not isinstance(row, Sequence) or isinstance(row, (str, bytes)):
            raise _facts_error(f"numa_distances {node}: expected a list of distances, got {row!r}")
        out[node] = " ".join(str(_fact_int(d, f"numa_distances {node}")) for d in row)
    return out


def _ids(values: Iterable[int]) -> str:
    return format_cpulist(values)


def _picture(
    view: HostView,
    topo: Topology,
    cpu_pool: Mapping[int, str],
    to_isolate: set[int],
    to_release: set[int],
    busy: set[int],
    l3_of: Mapping[int, int],
) -> None:
    """Sockets -> NUMA nodes -> L3 domains -> cores -> threads, ascending.

    A NUMA node gets a box of its own when its socket has several; an L3
    domain when its NUMA node holds several. Otherwise the ids go into the
    label of the enclosing box, so every level is named somewhere.
    """
    spans: dict[int, set[int]] = {}
    for cpu, l3 in l3_of.items():
        spans.setdefault(l3, set()).add(topo.cpus[cpu].node)
    for socket in topo.sockets:
        by_node: dict[int, dict[int | None, list[CoreView]]] = {}
        for core in topo.cores_on(socket):
            l3 = l3_of.get(core.first)
            threads = [
                Thread(
                    cpu=cpu,
                    pool=cpu_pool.get(cpu, UNPLANNED),
                    pending=PENDING_ISOLATE if cpu in to_isolate else PENDING_RELEASE if cpu in to_release else None,
                    busy=cpu in busy,
                    numa=core.node,
                    l3=l3_of.get(cpu),
                )
                for cpu in core.cpus
            ]
            by_node.setdefault(core.node, {}).setdefault(l3, []).append(CoreView(format_cpulist(core.cpus), threads))
        socket_cores = sum(len(c) for groups in by_node.values() for c in groups.values())
        socket_l3 = sorted({g for groups in by_node.values() for g in groups if g is not None})
        label = f"socket {socket} · {plural(socket_cores, 'core')} · NUMA node{'s' if len(by_node) > 1 else ''} "
        label += _ids(by_node)
        if socket_l3:
            label += f" · L3 domain{'s' if len(socket_l3) > 1 else ''} {_ids(socket_l3)}"
        nodes = []
        for node in sorted(by_node):
            groups = by_node[node]
            known = sorted(g for g in groups if g is not None)
            boxed = len(groups) > 1
            cores = sum(len(c) for c in groups.values())
            node_label = f"NUMA node {node} · {plural(cores, 'core')}"
            if known:
                node_label += f" · L3 {_ids(known)}"
            l3_groups = []
            for l3 in sorted(groups, key=lambda g: (g is None, g or 0)):
                if l3 is None:
                    group_label = f"L3 unknown · {plural(len(groups[l3]), 'core')}"
                else:
                    group_label = f"L3 {l3} · {plural(len(groups[l3]), 'core')}"
                    if len(spans.get(l3, ())) > 1:
                        group_label += f" · shared by NUMA nodes {_ids(spans[l3])}"
                l3_groups.append(L3Group(l3, group_label, boxed, groups[l3]))
            nodes.append(NumaView(node, node_label, len(by_node) > 1, l3_groups))
        view.sockets.append(SocketView(socket, label, nodes))


def _cores_per_pool(topo: Topology, cpus: Iterable[int], cpu_pool: Mapping[int, str]) -> dict[str, int]:
    cores: dict[str, set[int]] = {}
    for cpu in cpus:
        if cpu in cpu_pool:
            cores.setdefault(cpu_pool[cpu], set()).add(topo.core_of(cpu).index)
    return {pool: len(cores[pool]) for pool in _ordered_pools(cores)}


def _numa_rows(
    view: HostView,
    topo: Topology,
    cpu_pool: Mapping[int, str],
    l3_of: Mapping[int, int],
    distances: Mapping[int, str],
    reserved: set[int] | None = None,
) -> None:
    """One row per NUMA node: where it is, what it holds (its housekeeping CPUs too), how far the others are."""
    view.numa_pools = _ordered_pools(set(cpu_pool.values()))
    for node, cpus in sorted(topo.numa_nodes.items()):
        view.numa.append(
            NumaRow(
                node=node,
                sockets=_ids({topo.cpus[c].socket for c in cpus}),
                cores=len({topo.core_of(c).index for c in cpus}),
                cpus=len(cpus),
                cpulist=format_cpulist(cpus),
                l3=_ids({l3_of[c] for c in cpus if c in l3_of}),
                pools=_cores_per_pool(topo, cpus, cpu_pool),
                distances=distances.get(node, ""),
                housekeeping="-" if reserved is None else (format_cpulist(set(cpus) & reserved) or "none"),
            )
        )


def _l3_rows(view: HostView, topo: Topology, cpu_pool: Mapping[int, str], l3_of: Mapping[int, int]) -> None:
    """One row per L3 domain, when the facts name them."""
    members: dict[int, list[int]] = {}
    for cpu in sorted(l3_of):
        members.setdefault(l3_of[cpu], []).append(cpu)
    for l3, cpus in sorted(members.items()):
        pools = _cores_per_pool(topo, cpus, cpu_pool)
        view.l3.append(
            L3Row(
                l3=l3,
                numa=_ids({topo.cpus[c].node for c in cpus}),
                cores=len({topo.core_of(c).index for c in cpus}),
                cpus=len(cpus),
                cpulist=format_cpulist(cpus),
                pools=", ".join(f"{pool} {n}" for pool, n in pools.items()),
            )
        )


def _page_kb(value: object, what: str, field_name: str | None) -> int:
    """A hugepage size (``1G``, ``2M``, ``2048kB``, sysfs' ``hugepages-2048kB``, bare kB) in kB."""
    text = f"{value}kB" if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(text, str):
        text = text.strip().removeprefix("hugepages-")
    try:
        return parse_size(text)
    except PlanError:
        message = f"{what}: {value!r} is not a hugepage size (1G, 2M, 2048kB)"
        raise ReportError(message, field_name) if field_name else _facts_error(message) from None


def _planned_pages(planned: object) -> dict[tuple[str, int], int]:
    """``(node or "all", size kB) -> count`` from ``cpupools_hugepages``."""
    if isinstance(planned, str):
        try:
            planned = json.loads(planned) if planned.strip() else []
        except ValueError:
            raise ReportError(f"{planned!r} is not a list of hugepage reservations", "hugepages") from None
    if not isinstance(planned, Sequence) or isinstance(planned, (str, bytes)):
        raise ReportError(f"expected a list of {{size, count, numa_node}}, got {type(planned).__name__}", "hugepages")
    out: dict[tuple[str, int], int] = {}
    for item in planned:
        if not isinstance(item, Mapping):
            raise ReportError(f"expected a dict with size and count, got {item!r}", "hugepages")
        kb = _page_kb(item.get("size"), "size", "hugepages")
        count = _int(item.get("count"), f"count of {item.get('size')}", "hugepages")
        if count < 0:
            raise ReportError(f"count of {item.get('size')}: {count} is negative", "hugepages")
        node = item.get("numa_node")
        key = "all" if node is None or node == "" else str(_int(node, "numa_node", "hugepages"))
        out[(key, kb)] = out.get((key, kb), 0) + count
    return out


def _present_pages(present: object) -> dict[tuple[str, int], tuple[int, int]]:
    """``(node, size kB) -> (total, free)`` from the ``hugepages`` facts."""
    if not isinstance(present, Mapping):
        raise _facts_error(f"hugepages: expected a dict of node -> size -> counts, got {type(present).__name__}")
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for node, sizes in present.items():
        key = str(_fact_int(node, "hugepages node"))
        if not isinstance(sizes, Mapping):
            raise _facts_error(f"hugepages {key}: expected a dict of size -> counts, got {sizes!r}")
        for size, counts in sizes.items():
            kb = _page_kb(size, f"hugepages {key} size", None)
            if not isinstance(counts, Mapping):
                raise _facts_error(f"hugepages {key} {size}: expected total and free, got {counts!r}")
            what = f"hugepages {key} {size}"
            out[(key, kb)] = (
                _fact_int(counts.get("total", 0), f"{what} total"),
                _fact_int(counts.get("free", 0), f"{what} free"),
            )
    return out


def _hugepages(view: HostView, planned: object, present: object) -> None:
    """Planned against present hugepages, per NUMA node and size."""
    want = _planned_pages(planned) if planned is not None else {}
    have = _present_pages(present) if present is not None else {}
    keys = set(want) | {k for k, (total, _) in have.items() if total}
    for node, kb in sorted(keys, key=lambda k: (k[0] == "all", int(k[0]) if k[0] != "all" else 0, k[1])):
        size = size_label(kb)
        count = want.get((node, kb))
        if node == "all":
            found = [v for (n, k), v in have.items() if k == kb]
            counts = (sum(t for t, _ in found), sum(f for _, f in found)) if found else None
        else:
            counts = have.get((node, kb))
        if present is None:
            total = free = "-"
        else:
            total, free = (str(counts[0]), str(counts[1])) if counts else ("0", "0")
        where = "all NUMA nodes" if node == "all" else f"NUMA node {node}"
        if count is None:
            verdict = "not planned"
        elif present is None:
            verdict = NOT_COLLECTED
        elif int(total) == count:
            verdict = "ok"
        elif view.reboot_required:
            verdict = "pending reboot"
        else:
            diff = int(total) - count
            verdict = f"short by {-diff}" if diff < 0 else f"{diff} more than planned"
            if view.reboot_required is None:
                # As for the kernel: without its status nobody knows whether a reboot is due.
                verdict += f" (kernel status {NOT_COLLECTED})"
            else:
                view.drift.append(f"hugepages: {where} holds {total} {size} pages, the plan {count}")
        planned_text = "-" if count is None else str(count)
        drifted = verdict.startswith("short") or verdict.endswith("than planned")
        view.hugepages.append(HugepageRow(node, size, planned_text, total, free, verdict, drifted))


def analyse(hosts: Sequence[Mapping]) -> list[HostView]:
    """Analyse every host, in inventory order; a host named twice is an error."""
    if not isinstance(hosts, Sequence) or isinstance(hosts, (str, bytes)):
        raise ReportError("hosts must be a list of per-host dicts", None)
    views = []
    seen = set()
    known: dict = {}
    for entry in hosts:
        host = entry.get("host") if isinstance(entry, Mapping) else None
        try:
            view = analyse_host(entry, known)
        except ReportError as exc:
            raise ReportError(exc.describe(host, prefix="cpupools_"), None) from None
        if view.host in seen:
            raise ReportError(f"host {view.host} appears twice in the report inputs", None)
        seen.add(view.host)
        views.append(view)
    return views


def fleet_summary(views: Sequence[HostView], failed: Sequence[str] = ()) -> str:
    """One line for the whole fleet."""
    by_status: dict[str, list[str]] = {}
    for v in views:
        by_status.setdefault(v.status, []).append(v.host)
    exclusive = sum(int(r.cores) for v in views for r in v.pools if r.pool == EXCLUSIVE)
    parts = [f"fleet: {plural(len(views), 'host')}"]
    for status, label in (
        ("ok", "as planned"),
        ("pending", "pending"),
        ("drift", "drifted"),
        ("unplanned", "unplanned"),
    ):
        hosts = by_status.get(status, [])
        if hosts:
            names = ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
            parts.append(f"{len(hosts)} {label}" + ("" if status == "ok" else f" ({names})"))
    warned = sum(1 for v in views if v.warnings)
    if warned:
        parts.append(f"{warned} with warnings")
    failed_verify = [v.host for v in views if v.verify is not None and not v.verify.ok]
    if failed_verify:
        names = ", ".join(failed_verify[:5]) + (f" and {len(failed_verify) - 5} more" if len(failed_verify) > 5 else "")
        parts.append(f"{len(failed_verify)} failed verify ({names})")
    parts.append(f"{plural(exclusive, 'exclusive core')}")
    if failed:
        parts.append(f"{len(failed)} failed earlier and not reported ({', '.join(failed)})")
    return "; ".join(parts)
