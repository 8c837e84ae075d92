"""The HTML page: its model (every value it shows, computed here) and its rendering; the JSON beside it.

The page is the Jinja2 template roles/cpupools_report/templates/cpupools-report.html.j2
(its CSS in cpupools-report.css beside it). Python computes every value the
page shows (``page_model``); the template only lays them out. ``render_page``
imports jinja2, on the controller only. Both files are byte-identical for the
same inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from ..core.errors import ReportError
from ..core.names import ENI, EXCLUSIVE, INFRA, SHARED
from . import report_store, report_verify
from .analysis import (
    CPU_CLASSES,
    MODE_WORDS,
    NOT_COLLECTED,
    OFFLINE,
    PENDING_ISOLATE,
    PENDING_RELEASE,
    STRANDED,
    UNPLANNED,
    HostView,
    analyse,
    fleet_summary,
)

#: The template the report module renders, relative to the role's templates/.
TEMPLATE = "cpupools-report.html.j2"

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


#: The legend's marks: (key, CSS classes of the swatch, text).
MARKS = (
    (PENDING_ISOLATE, f"t c-{INFRA} p-{PENDING_ISOLATE}", "hatched, orange frame: isolated at next boot"),
    (
        PENDING_RELEASE,
        f"t c-{EXCLUSIVE} p-{PENDING_RELEASE}",
        "dashed orange frame: isolated now, released at next boot",
    ),
    ("busy", f"t c-{EXCLUSIVE} busy", "dot: held by a live task"),
    ("noisy", f"t c-{EXCLUSIVE} noisy", "!: not quiet at the last verify (something ran on or interrupted it)"),
)


def shown(views: Sequence[HostView]) -> set[str]:
    """The CPU classes and marks the pictures of ``views`` use (a legend lists only those)."""
    found: set[str] = set()
    for view in views:
        if view.offline:
            found.add(OFFLINE)
        for sock in view.sockets:
            for node in sock.numa:
                for core in node.cores:
                    for thread in core.threads:
                        found.add(thread.pool)
                        if thread.pending:
                            found.add(thread.pending)
                        if thread.busy:
                            found.add("busy")
                        if thread.quiet is False:
                            found.add("noisy")
                        if thread.latency is not None:
                            found.add("latency")
    return found


def legend(views: Sequence[HostView] | None = None) -> list[dict[str, str]]:
    """The legend: one swatch per CPU class, then the marks; with ``views``, only those their pictures show."""
    present = None if views is None else shown(views)
    items = [
        {"classes": f"t c-{name}", "text": DESCRIPTIONS[name]}
        for name in CPU_CLASSES
        if present is None or name in present
    ]
    items += [{"classes": classes, "text": text} for key, classes, text in MARKS if present is None or key in present]
    return items


#: What the modes mean, under the legend of every page whose hosts have a plan.
def modes_line(views: Sequence[HostView]) -> str:
    if not any(view.mode for view in views):
        return ""
    return "Modes: " + "; ".join(f"{mode}: {words}" for mode, words in MODE_WORDS.items()) + "."


def page_model(
    views: Sequence[HostView],
    failed: Sequence[str] = (),
    title: str = "cpupools report",
    generated: str | None = None,
    fleet: report_store.Fleet | None = None,
) -> dict:
    """Everything the HTML template shows, computed; the template adds only markup."""
    store = None
    if fleet is not None:
        store = {
            "summary": report_store.summary(fleet, ages=False),
            "rows": report_store.rows(fleet),
            "missing": fleet.missing,
            "unreadable": [{"name": name, "why": why} for name, why in fleet.unreadable],
            "outside": [
                {"host": r.host, "taken": report_store.timestamp(r.taken), "run": r.run} for r in fleet.outside
            ],
        }
    return {
        "store": store,
        "title": title,
        "generated": generated or "",
        "fleet": fleet_summary(views, failed),
        "legend": legend(views),
        "modes": modes_line(views),
        "colours": [{"name": name, "bg": bg, "fg": fg} for name, (bg, fg) in COLOURS.items()],
        "latency_colours": [
            {"bucket": i, "bg": bg, "fg": fg, "text": text}
            for i, (_, bg, fg, text) in enumerate(report_verify.LATENCY_SCALE)
        ],
        "latency_scale": "latency" in shown(views),
        "not_collected": NOT_COLLECTED,
        "offline": OFFLINE,
        "hosts": list(views),
    }


def render_page(model: Mapping, template: str) -> str:
    """Render ``page_model`` output with the template file ``template``.

    Runs on the controller only (the report module is delegated to localhost
    with the controller's Python), the one place of module_utils that needs a
    package beyond the standard library: jinja2, which Ansible itself needs.
    Every value is escaped (autoescape); undefined names are errors.
    """
    try:
        import jinja2  # controller only: the node agent never renders HTML
    except ImportError:
        raise ReportError("rendering the HTML page needs the jinja2 package (run on the controller's Python)") from None
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.dirname(os.path.abspath(template))),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    try:
        return env.get_template(os.path.basename(template)).render(model)
    except jinja2.TemplateNotFound as exc:
        raise ReportError(f"HTML template {exc.name} not found beside {template}", None) from None
    except jinja2.TemplateError as exc:
        raise ReportError(f"HTML template {template}: {exc}", None) from None


def render_html(
    hosts: Sequence[Mapping],
    template: str,
    failed: Sequence[str] = (),
    title: str = "cpupools report",
    generated: str | None = None,
) -> str:
    """One self-contained HTML page: inline CSS, no script, no external asset."""
    return render_page(page_model(analyse(hosts), failed, title, generated), template)


def json_path(html_path: str) -> str:
    """The JSON beside the page: ``report.html`` -> ``report.json`` (another name gets ``.json`` appended)."""
    root, ext = os.path.splitext(html_path)
    return (root if ext.lower() in (".html", ".htm") else html_path) + ".json"


#: The version of the JSON beside the page; a consumer checks it.
JSON_FORMAT = 1


def report_json(
    views: Sequence[HostView],
    failed: Sequence[str] = (),
    generated: str | None = None,
    fleet: report_store.Fleet | None = None,
) -> dict:
    """The machine-readable report: per host its status, drift, warnings, plan summary and last verify result."""
    data: dict = {
        "format": JSON_FORMAT,
        "generated": generated or None,
        "fleet": fleet_summary(views, failed),
        "failed_hosts": list(failed),
        "hosts": [
            {
                "host": v.host,
                "status": v.status,
                "drift": v.drift,
                "warnings": v.warnings,
                "reboot_required": v.reboot_required,
                "plan": v.plan_summary,
                "verify": v.verify_result,
            }
            for v in views
        ],
    }
    if fleet is not None:
        data["store"] = {
            "path": fleet.store,
            "taken": {r.host: {"at": report_store.timestamp(r.taken), "run": r.run} for r in fleet.records},
            "missing": fleet.missing,
            "unreadable": [name for name, _ in fleet.unreadable],
            "outside": [r.host for r in fleet.outside],
        }
    return data


def render_json(
    views: Sequence[HostView],
    failed: Sequence[str] = (),
    generated: str | None = None,
    fleet: report_store.Fleet | None = None,
) -> str:
    """``report_json`` as text: sorted keys, two-space indent, a final newline (byte-identical on a re-run)."""
    return json.dumps(report_json(views, failed, generated, fleet), indent=2, sort_keys=True, default=str) + "\n"
