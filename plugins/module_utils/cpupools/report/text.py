"""The text report: one block per host and the fleet's line, for the terminal and ``ansible.builtin.debug``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from . import report_verify
from .analysis import NOT_COLLECTED, HostView, analyse, fleet_summary


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
    details = view.details
    lines = [head + (": " + "; ".join(details) if details else "")]
    if view.pools:
        rows = [("pool", "socket", "cores", "cpus", "cpulist", "in use")]
        rows += [(r.pool, r.socket, r.cores, str(r.cpus), r.cpulist, r.in_use) for r in view.pools]
        lines += ["  " + line for line in _table(rows, right=(2, 3))]
    else:
        lines.append(f"  pools: {'no plan' if not view.has_plan else 'none'} ({NOT_COLLECTED})")
    lines += numa_lines(view)

    def label(name: str) -> str:
        return f"  {name:<15} "

    iso = f"active {view.isolated_active or 'none'}" if view.isolated_active is not None else f"active {NOT_COLLECTED}"
    iso += f"; planned {view.isolated_planned or 'none'}" if view.isolated_planned is not None else ""
    changes = []
    if view.to_isolate:
        changes.append(f"+{view.to_isolate} to isolate")
    if view.to_release:
        changes.append(f"-{view.to_release} to release")
    if changes:
        iso += f" ({', '.join(changes)} at next boot)" if view.reboot_required else f" ({', '.join(changes)})"
    for title, value in (
        ("housekeeping", view.housekeeping),
        ("workloads", view.workloads),
        ("core types", view.core_types),
        ("CPUs", view.cpu_states),
    ):
        if value:
            lines.append(label(title) + value)
    lines.append(label("isolated CPUs") + iso)
    lines.append(label("kernel") + view.kernel)
    if view.resources:
        for i, (name, want, have, verdict) in enumerate(view.resources):
            text = f"{name}: expected {want}, advertised {have}"
            text += f" {verdict}" if verdict else f" ({view.resources_note})"
            lines.append(label("resources" if i == 0 else "") + text)
    else:
        lines.append(label("resources") + (view.resources_note or "none expected"))
    for i, row in enumerate(view.hugepages):
        text = f"{'all NUMA nodes' if row.node == 'all' else 'NUMA node ' + row.node} {row.size}: "
        text += f"planned {row.planned}, total {row.total}, free {row.free}; {row.verdict}"
        lines.append(label("hugepages" if i == 0 else "") + text)
    lines.append(label("live tasks") + view.tasks_note)
    lines += [label("") + t for t in view.tasks]
    lines.append(label("stranded CPUs") + (view.stranded if view.stranded is not None else NOT_COLLECTED))
    lines += report_verify.lines(view.verify, label)
    for title, items in (("drift", view.drift), ("warnings", view.warnings)):
        if not items:
            lines.append(label(title) + "none")
        for i, item in enumerate(items):
            lines.append(label(title if i == 0 else "") + item)
    for i, item in enumerate(view.notes):
        lines.append(label("notes" if i == 0 else "") + item)
    return lines


def numa_lines(view: HostView) -> list[str]:
    """The NUMA table (pool columns count physical cores) and, when known, the L3 table."""
    if not view.numa:
        return []
    known_l3 = any(r.l3 for r in view.numa)
    known_dist = any(r.distances for r in view.numa)
    known_hk = any(r.housekeeping not in ("", "-") for r in view.numa)
    head = ["numa", "socket", "cores", "cpus", "cpulist"] + (["l3"] if known_l3 else [])
    head += (["housekeeping"] if known_hk else []) + view.numa_pools
    head += ["distances"] if known_dist else []
    rows = [head]
    for r in view.numa:
        row = [str(r.node), r.sockets, str(r.cores), str(r.cpus), r.cpulist] + ([r.l3 or "-"] if known_l3 else [])
        row += [r.housekeeping] if known_hk else []
        row += [str(r.pools.get(pool, 0)) for pool in view.numa_pools]
        row += [r.distances or "-"] if known_dist else []
        rows.append(row)
    first = 5 + known_l3 + known_hk
    counts = [2, 3, *range(first, first + len(view.numa_pools))]
    lines = ["  " + line for line in _table(rows, right=counts)]
    if view.l3:
        rows = [["l3", "numa", "cores", "cpus", "cpulist", "pools (cores)"]]
        rows += [[str(r.l3), r.numa, str(r.cores), str(r.cpus), r.cpulist, r.pools] for r in view.l3]
        lines += ["  " + line for line in _table(rows, right=(2, 3))]
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
