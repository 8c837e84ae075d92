"""The fleet report: what each node has, what is pending, what has drifted.

Pure and deterministic: the same inputs give byte-identical text and HTML
(no clock, no randomness; a timestamp appears only when the caller passes one).

Input: one dict per host (``analyse_host`` documents every key)::

    {"host": "node-1",
     "topology": ansible_facts.cpupools,          # Topology.to_facts(), or None
     "plan": cpupools_plan,                        # plan_pools() output, or None
     "kernel": {"reboot_required": bool,           # cpupools_kernel_status, or None
                "pending": ["isolcpus", ...],
                "desired_cmdline_args": {"isolcpus": "...", ...}},
     "state": {"present": bool,                    # cpupools_agent_status, or None
               "pools": {pool: {socket: [cpulist, ...]}},
               "tasks": {pool: {cpulist: [pid, ...]}}},
     "k8s": {"enabled": bool,                      # cpupools_k8s_status, or None
             "advertised": {resource: n},
             "expected": {resource: n},
             "skipped_reason": str}}

Every part but ``host`` is optional: an absent part (``None`` or missing) is
shown as "not collected" and never counts as drift.

Drift is any difference between what is live on the node and its plan:

* kernel: the CPUs the running kernel isolates (``/sys/devices/system/cpu/isolated``,
  fact ``kernel.isolated``) differ from the plan's ``isolated_cpus``. When the
  kernel status says a reboot is already pending, this is shown as *pending*
  (a reboot will fix it), not as drift;
* state: the pool state directory lists pools or cpulists the plan does not
  have (or lacks some the plan has), or tasks run on cpulists the plan does
  not have;
* k8s: an advertised extended resource differs from the expected count;
* plan: the plan names CPUs that are not online any more (the topology moved
  under the plan).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .cpulist import format_cpulist, parse_cpulist
from .errors import CpupoolsError, ReportError
from .plan import ENI, EXCLUSIVE, EXCLUSIVE_POOLS, INFRA, POOL_ORDER, SHARED
from .topology import Topology

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

#: Colours of the node picture (Okabe-Ito palette: distinguishable with the
#: common colour-vision deficiencies), and the text colour on each.
COLOURS = {
    EXCLUSIVE: ("#0072b2", "#ffffff"),
    ENI: ("#cc79a7", "#000000"),
    SHARED: ("#009e73", "#ffffff"),
    INFRA: ("#d9d9d9", "#000000"),
    STRANDED: ("#d55e00", "#ffffff"),
    OFFLINE: ("#595959", "#ffffff"),
    UNPLANNED: ("#ffffff", "#000000"),
}
PENDING_COLOUR = "#e69f00"

DESCRIPTIONS = {
    EXCLUSIVE: "exclusive: whole cores handed to one process at a time, isolated",
    ENI: "exclusive-non-isolcpus: whole cores handed out, not isolated",
    SHARED: "shared: cores shared by the processes of the shared pool, isolated",
    INFRA: "infra: the host, Kubernetes and everything else",
    STRANDED: "stranded: isolated by the kernel but in no pool (wasted)",
    OFFLINE: "offline: CPU switched off",
    UNPLANNED: "unplanned: no plan for this host",
}

NOT_COLLECTED = "not collected"


@dataclass
class Thread:
    cpu: int
    pool: str
    pending: str | None = None  # PENDING_ISOLATE / PENDING_RELEASE
    busy: bool = False


@dataclass
class CoreView:
    label: str  # compressed cpulist of the core
    threads: list[Thread]


@dataclass
class SocketView:
    socket: int
    numa: list[tuple[int, list[CoreView]]]  # NUMA node -> its cores, in core order


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
    sockets: list[SocketView] = field(default_factory=list)
    offline: list[int] = field(default_factory=list)
    pools: list[PoolRow] = field(default_factory=list)
    isolated_active: str | None = None
    isolated_planned: str | None = None
    to_isolate: str = ""
    to_release: str = ""
    kernel: str = NOT_COLLECTED
    reboot_required: bool | None = None
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


# Analysis ----------------------------------------------------------------------


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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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


def analyse_host(entry: Mapping) -> HostView:
    """Turn one host's inputs into a ``HostView``; raises ``ReportError``.

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
    """
    if not isinstance(entry, Mapping) or not isinstance(entry.get("host"), str) or not entry.get("host"):
        raise ReportError("every report input needs a 'host' name", None)
    view = HostView(host=entry["host"])
    facts = _mapping(entry.get("topology"), "facts")
    plan = _mapping(entry.get("plan"), "plan")
    topo = None
    if facts:
        try:
            topo = Topology.from_facts(facts)
        except CpupoolsError as exc:
            raise ReportError(f"ansible_facts.cpupools: {exc}", None) from None
        view.has_topology = True
    cpu_pool: dict[int, str] = {}
    planned_iso: list[int] | None = None
    if plan:
        view.has_plan = True
        view.mode = str(plan.get("mode", "generate"))
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
    active_iso: list[int] | None = None
    if topo is not None:
        active_iso = list(topo.kernel.isolated_active)
        view.isolated_active = format_cpulist(active_iso)
        view.offline = list(topo.offline)
        view.summary = (
            f"{_plural(len(topo.sockets), 'socket')}, {_plural(len(topo.cores), 'core')}, "
            f"{_plural(len(topo.cpus), 'CPU')} online ({topo.threads_per_core} per core)"
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
    _kernel(view, _mapping(entry.get("kernel"), "kernel_status"), bool(to_isolate or to_release))
    held = _state(view, _mapping(entry.get("state"), "agent_status"), plan)
    busy = {cpu for _, key in held for cpu in parse_cpulist(key)}
    _k8s(view, _mapping(entry.get("k8s"), "k8s_status"), plan)
    if plan:
        _pool_rows(view, plan, held, topo)
    if topo is not None:
        _picture(view, topo, cpu_pool if plan else {}, to_isolate, to_release, busy)
    return view


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
    view.tasks_note = f"{_plural(count, 'task')} on {_plural(len(view.tasks), 'cpulist')}" if count else "no live task"
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
                in_use = _plural(tasks, "task") if tasks else ""
            view.pools.append(PoolRow(pool, socket, cores, len(cpus), format_cpulist(cpus) or "-", in_use))


def _picture(
    view: HostView,
    topo: Topology,
    cpu_pool: Mapping[int, str],
    to_isolate: set[int],
    to_release: set[int],
    busy: set[int],
) -> None:
    for socket in topo.sockets:
        numa: dict[int, list[CoreView]] = {}
        for core in topo.cores_on(socket):
            threads = [
                Thread(
                    cpu=cpu,
                    pool=cpu_pool.get(cpu, UNPLANNED),
                    pending=PENDING_ISOLATE if cpu in to_isolate else PENDING_RELEASE if cpu in to_release else None,
                    busy=cpu in busy,
                )
                for cpu in core.cpus
            ]
            numa.setdefault(core.node, []).append(CoreView(format_cpulist(core.cpus), threads))
        view.sockets.append(SocketView(socket, sorted(numa.items())))


def analyse(hosts: Sequence[Mapping]) -> list[HostView]:
    """Analyse every host, in inventory order; a host named twice is an error."""
    if not isinstance(hosts, Sequence) or isinstance(hosts, (str, bytes)):
        raise ReportError("hosts must be a list of per-host dicts", None)
    views = []
    seen = set()
    for entry in hosts:
        host = entry.get("host") if isinstance(entry, Mapping) else None
        try:
            view = analyse_host(entry)
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
    parts = [f"fleet: {_plural(len(views), 'host')}"]
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
    parts.append(f"{_plural(exclusive, 'exclusive core')}")
    if failed:
        parts.append(f"{len(failed)} failed earlier and not reported ({', '.join(failed)})")
    return "; ".join(parts)


# Text --------------------------------------------------------------------------


def _table(rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    right = set(right)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


def host_lines(view: HostView) -> list[str]:
    """The text block of one host."""
    head = f"== {view.host} [{view.status}]"
    details = [d for d in (view.summary, f"mode {view.mode}" if view.mode else "") if d]
    lines = [head + (": " + "; ".join(details) if details else "")]
    if view.pools:
        rows = [("pool", "socket", "cores", "cpus", "cpulist", "in use")]
        rows += [(r.pool, r.socket, r.cores, str(r.cpus), r.cpulist, r.in_use) for r in view.pools]
        lines += ["  " + line for line in _table(rows, right=(2, 3))]
    else:
        lines.append(f"  pools: {'no plan' if not view.has_plan else 'none'} ({NOT_COLLECTED})")
    label = lambda name: f"  {name:<15} "  # noqa: E731
    iso = f"active {view.isolated_active or 'none'}" if view.isolated_active is not None else f"active {NOT_COLLECTED}"
    iso += f"; planned {view.isolated_planned or 'none'}" if view.isolated_planned is not None else ""
    changes = []
    if view.to_isolate:
        changes.append(f"+{view.to_isolate} to isolate")
    if view.to_release:
        changes.append(f"-{view.to_release} to release")
    if changes:
        iso += f" ({', '.join(changes)} at next boot)" if view.reboot_required else f" ({', '.join(changes)})"
    lines.append(label("isolated CPUs") + iso)
    lines.append(label("kernel") + view.kernel)
    if view.resources:
        for i, (name, want, have, verdict) in enumerate(view.resources):
            text = f"{name}: expected {want}, advertised {have}"
            text += f" {verdict}" if verdict else f" ({view.resources_note})"
            lines.append(label("resources" if i == 0 else "") + text)
    else:
        lines.append(label("resources") + (view.resources_note or "none expected"))
    lines.append(label("live tasks") + view.tasks_note)
    lines += [label("") + t for t in view.tasks]
    lines.append(label("stranded CPUs") + (view.stranded if view.stranded is not None else NOT_COLLECTED))
    for title, items in (("drift", view.drift), ("warnings", view.warnings)):
        if not items:
            lines.append(label(title) + "none")
        for i, item in enumerate(items):
            lines.append(label(title if i == 0 else "") + item)
    return lines


def render_text_lines(hosts: Sequence[Mapping], failed: Sequence[str] = (), generated: str | None = None) -> list[str]:
    """The text report as a list of lines (for ``ansible.builtin.debug``)."""
    return text_lines(analyse(hosts), failed, generated)


def text_lines(views: Sequence[HostView], failed: Sequence[str] = (), generated: str | None = None) -> list[str]:
    """``render_text_lines`` from views already analysed."""
    lines: list[str] = []
    if generated:
        lines.append(f"cpupools report, {generated}")
    for view in views:
        lines += [*host_lines(view), ""]
    lines.append(fleet_summary(views, failed))
    return lines


def render_text(hosts: Sequence[Mapping], failed: Sequence[str] = (), generated: str | None = None) -> str:
    return "\n".join(render_text_lines(hosts, failed, generated)) + "\n"


# HTML --------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1a1a1a;
background:#fff;margin:24px;max-width:1340px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0 0 6px}
.fleet{margin:0 0 12px;font-weight:600}.generated{color:#555;margin:0 0 8px}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:0 0 20px;padding:8px 12px;border:1px solid #ccc;
border-radius:6px;background:#fafafa}
.legend span{display:inline-flex;align-items:center;gap:6px}
.legend .t{width:22px;height:16px;font-size:0}
.host{border:1px solid #bbb;border-radius:8px;padding:14px 16px;margin:0 0 24px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;margin-left:8px;
vertical-align:middle}
.b-ok{background:#e3f2e8;color:#0b5d2a}.b-pending{background:#fff1d6;color:#7a4b00}
.b-drift{background:#fde2d6;color:#8a2a00}.b-unplanned{background:#eee;color:#444}
.sub{color:#444;margin:0 0 10px}
.node{display:flex;flex-wrap:wrap;gap:12px;margin:0 0 14px}
.socket{border:2px solid #555;border-radius:8px;padding:6px 8px 8px}
.socket>.name,.numa>.name{font-size:12px;font-weight:600;color:#333;margin:0 0 4px}
.numa{border:1px dashed #999;border-radius:6px;padding:4px 6px 6px;margin:4px 0 0}
.cores{display:grid;grid-template-columns:repeat(var(--cols),max-content);gap:4px}
.core{display:flex;gap:2px;padding:2px;border:1px solid #888;border-radius:4px;background:#fff}
.t{position:relative;box-sizing:border-box;width:30px;height:24px;border-radius:3px;font-size:11px;
line-height:24px;text-align:center;font-variant-numeric:tabular-nums}
.p-isolate{outline:3px solid #e69f00;outline-offset:-3px;
background-image:repeating-linear-gradient(45deg,rgba(0,0,0,0) 0 5px,rgba(255,255,255,.45) 5px 7px);
text-shadow:0 0 2px rgba(0,0,0,.8)}
.p-isolate.c-infra,.p-isolate.c-unplanned{text-shadow:0 0 2px #fff}
.p-release{outline:3px dashed #e69f00;outline-offset:-3px}
.busy::after{content:"";position:absolute;top:2px;right:2px;width:6px;height:6px;border-radius:50%;
background:#111;border:1px solid #fff}
.offline{margin:4px 0 12px}
table{border-collapse:collapse;margin:0 0 10px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right}
.facts th{width:140px}
.drift{color:#8a2a00}.warn{color:#7a4b00}
code{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _thread_css() -> str:
    return "".join(f".c-{name}{{background-color:{bg};color:{fg}}}" for name, (bg, fg) in COLOURS.items()) + (
        f".c-{UNPLANNED}{{border:1px solid #888}}.c-{OFFLINE}{{font-size:10px}}"
    )


def _thread_html(t: Thread) -> str:
    classes = [f"t c-{t.pool}"]
    title = [f"CPU {t.cpu}: {t.pool}"]
    if t.pending:
        classes.append(f"p-{t.pending}")
        title.append(
            "will be isolated at next boot" if t.pending == PENDING_ISOLATE else "isolated now, released at next boot"
        )
    if t.busy:
        classes.append("busy")
        title.append("held by a live task")
    return f'<div class="{_esc(" ".join(classes))}" title="{_esc("; ".join(title))}">{t.cpu}</div>'


def _legend() -> str:
    items = [f'<span><span class="t c-{name}"></span>{_esc(DESCRIPTIONS[name])}</span>' for name in CPU_CLASSES]
    items.append(
        f'<span><span class="t c-{INFRA} p-{PENDING_ISOLATE}"></span>'
        "hatched, orange frame: isolated at next boot</span>"
    )
    items.append(
        f'<span><span class="t c-{EXCLUSIVE} p-{PENDING_RELEASE}"></span>dashed orange frame: '
        "isolated now, released at next boot</span>"
    )
    items.append(f'<span><span class="t c-{EXCLUSIVE} busy"></span>dot: held by a live task</span>')
    return '<div class="legend" id="legend">' + "".join(items) + "</div>"


def _picture_html(view: HostView) -> str:
    if not view.sockets:
        return f'<p class="sub">Node picture: topology {NOT_COLLECTED}.</p>'
    parts = ['<div class="node">']
    for sock in view.sockets:
        cores = sum(len(c) for _, c in sock.numa)
        cols = max(1, min(8, cores if len(sock.numa) == 1 else max(len(c) for _, c in sock.numa)))
        nodes = ", ".join(str(n) for n, _ in sock.numa)
        parts.append(
            f'<div class="socket" data-socket="{sock.socket}"><div class="name">socket {sock.socket} · '
            f"{_plural(cores, 'core')} · NUMA node{'s' if len(sock.numa) > 1 else ''} {nodes}</div>"
        )
        for node, node_cores in sock.numa:
            inner = "".join(
                f'<div class="core" title="core {_esc(core.label)}">'
                + "".join(_thread_html(t) for t in core.threads)
                + "</div>"
                for core in node_cores
            )
            grid = f'<div class="cores" style="--cols:{min(cols, len(node_cores))}">{inner}</div>'
            if len(sock.numa) > 1:
                parts.append(f'<div class="numa"><div class="name">NUMA node {node}</div>{grid}</div>')
            else:
                parts.append(grid)
        parts.append("</div>")
    parts.append("</div>")
    if view.offline:
        cells = "".join(f'<div class="t c-{OFFLINE}" title="CPU {c}: offline">{c}</div>' for c in view.offline)
        parts.append(
            f'<div class="offline"><div class="sub">Offline CPUs (no topology while offline):</div>'
            f'<div class="core" style="display:inline-flex">{cells}</div></div>'
        )
    return "".join(parts)


def _facts_html(view: HostView) -> str:
    rows: list[tuple[str, str]] = []
    iso = _esc(view.isolated_active or "none") if view.isolated_active is not None else NOT_COLLECTED
    iso = f"active <code>{iso}</code>"
    if view.isolated_planned is not None:
        iso += f"; planned <code>{_esc(view.isolated_planned or 'none')}</code>"
    if view.to_isolate:
        iso += f"; to isolate <code>{_esc(view.to_isolate)}</code>"
    if view.to_release:
        iso += f"; to release <code>{_esc(view.to_release)}</code>"
    rows.append(("Isolated CPUs", iso))
    rows.append(("Kernel", _esc(view.kernel)))
    if view.resources:
        res = "<br>".join(
            f"<code>{_esc(n)}</code>: expected {_esc(w)}, advertised {_esc(h)} "
            + (f"<b>{_esc(v)}</b>" if v else f"({_esc(view.resources_note)})")
            for n, w, h, v in view.resources
        )
    else:
        res = _esc(view.resources_note or "none expected")
    rows.append(("Extended resources", res))
    tasks = _esc(view.tasks_note)
    if view.tasks:
        tasks += "<br>" + "<br>".join(f"<code>{_esc(t)}</code>" for t in view.tasks)
    rows.append(("Live tasks", tasks))
    rows.append(("Stranded CPUs", _esc(view.stranded) if view.stranded is not None else NOT_COLLECTED))
    drift = "<br>".join(f'<span class="drift">{_esc(d)}</span>' for d in view.drift) or "none"
    warn = "<br>".join(f'<span class="warn">{_esc(w)}</span>' for w in view.warnings) or "none"
    rows.append(("Drift", drift))
    rows.append(("Warnings", warn))
    return '<table class="facts">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _pools_html(view: HostView) -> str:
    if not view.pools:
        return f'<p class="sub">Pools: {"no plan" if not view.has_plan else "none"} ({NOT_COLLECTED}).</p>'
    head = "<tr><th>pool</th><th>socket</th><th>cores</th><th>CPUs</th><th>cpulist</th><th>in use</th></tr>"
    body = "".join(
        f'<tr><td><span class="t c-{_esc(r.pool)}" style="display:inline-block;width:12px;height:12px;'
        f'vertical-align:middle;margin-right:6px"></span>{_esc(r.pool)}</td><td class="n">{_esc(r.socket)}</td>'
        f'<td class="n">{_esc(r.cores)}</td><td class="n">{r.cpus}</td><td><code>{_esc(r.cpulist)}</code></td>'
        f"<td>{_esc(r.in_use)}</td></tr>"
        for r in view.pools
    )
    return f'<table class="pools">{head}{body}</table>'


def _host_html(view: HostView) -> str:
    sub = "; ".join(d for d in (view.summary, f"mode {view.mode}" if view.mode else "") if d)
    return (
        f'<section class="host" id="host-{_esc(view.host)}" data-status="{view.status}">'
        f'<h2>{_esc(view.host)}<span class="badge b-{view.status}">{view.status}</span></h2>'
        + (f'<p class="sub">{_esc(sub)}</p>' if sub else "")
        + _picture_html(view)
        + _pools_html(view)
        + _facts_html(view)
        + "</section>"
    )


def render_html(
    hosts: Sequence[Mapping],
    failed: Sequence[str] = (),
    title: str = "cpupools report",
    generated: str | None = None,
) -> str:
    """One self-contained HTML page: inline CSS, no script, no external asset."""
    return html_page(analyse(hosts), failed, title, generated)


def html_page(
    views: Sequence[HostView],
    failed: Sequence[str] = (),
    title: str = "cpupools report",
    generated: str | None = None,
) -> str:
    """``render_html`` from views already analysed."""
    body = [
        f"<h1>{_esc(title)}</h1>",
        f'<p class="generated">{_esc(generated)}</p>' if generated else "",
        f'<p class="fleet" id="fleet">{_esc(fleet_summary(views, failed))}</p>',
        _legend(),
        *(_host_html(v) for v in views),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS.strip()}{_thread_css()}</style></head>"
        "<body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n"
    )
