"""The ``cpupools_report`` module's work, for the module and its action: analyse, render, write the page.

``report()`` takes the module's validated options (``ARGUMENT_SPEC``) and
returns its result. Its files (the page, the JSON beside it, the report
store) are rewritten only when what they show changes: no time that every
run changes is in them (a verify result keeps the time it was first found
so, a store record the time its data was first taken so). The rest of the package does the work, each module
importing only those before it: analysis.py (each host's inputs -> a
``HostView``), text.py (the text report), page.py (the HTML page's model and
rendering, the JSON beside it), report_store.py (each host's last data across
runs), report_verify.py (the last verify result in the report).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping

from ..core.errors import ReportError
from ..core.files import replace_file
from . import report_store
from .analysis import HostView, analyse, analyse_host, fleet_summary
from .page import JSON_FORMAT, json_path, page_model, render_json, render_page
from .report_verify import keep_taken
from .text import text_lines

#: The options of the ``cpupools_report`` module; its action checks a task's arguments against the same spec.
ARGUMENT_SPEC = {
    "hosts": {"type": "list", "elements": "dict", "required": True},
    "failed_hosts": {"type": "list", "elements": "str", "default": []},
    "html_path": {"type": "path"},
    "template": {"type": "path"},
    "title": {"type": "str", "default": "cpupools report"},
    "generated": {"type": "str"},
    "store": {"type": "path"},
    "inventory_hosts": {"type": "list", "elements": "str"},
    "run": {"type": "str", "default": ""},
    "now": {"type": "float"},
    "store_max_age": {"type": "int", "default": 0},
}


def _describe(content: bytes | None) -> str:
    if content is None:
        return "(absent)\n"
    return f"{len(content)} bytes, sha1 {hashlib.sha1(content).hexdigest()}\n"


def _from_store(params: Mapping, check_mode: bool) -> tuple[list[HostView], report_store.Fleet, list[str]]:
    """The views of every inventory host with data in the store (this run's first), what the store adds, and
    the store files this run writes (in check mode: would write).

    This run's hosts are written first, each only when its data changed
    (``report_store.carry``; not in check mode, where they are laid over the
    store in memory), then the whole store is read: a host another run wrote
    meanwhile is shown as that run left it. A host whose stored data the
    report cannot read is left out and named, not fatal.
    """
    now = params.get("now")
    now = time.time() if now is None else float(now)
    run = params.get("run") or ""
    store = params["store"]
    fresh = []
    for entry in params["hosts"]:
        host = entry.get("host") if isinstance(entry, Mapping) else None
        if not isinstance(host, str) or not host:
            raise ReportError("every entry of hosts needs a host name", None)
        # A part the host lacks is left out, not stored as null: the same data whatever says "none"
        data = {key: value for key, value in entry.items() if value is not None}
        record = report_store.Record(host, now, run, data, now)
        stored_record = report_store.read_one(store, host)
        report_store.keep_verify(record, stored_record, keep_taken)
        report_store.carry(record, stored_record)
        fresh.append(record)
    written = report_store.write(store, fresh, now=now, check_mode=check_mode)
    stored, unreadable = report_store.read(store)
    inventory = params.get("inventory_hosts")
    if inventory is None:
        inventory = [record.host for record in fresh]
    fleet = report_store.merge(
        store, inventory, stored, [] if not check_mode else fresh, unreadable, now, params.get("store_max_age") or 0
    )
    views = []
    kept = []
    for record in fleet.records:
        try:
            views.append(analyse_host(record.entry))
        except ReportError as exc:
            why = f"its report data is malformed: {exc.describe(None)}"
            fleet.unreadable.append((report_store.file_name(record.host), why))
            continue
        kept.append(record)
    fleet.records = kept
    return views, fleet, written


def _verify_shown(path: str) -> dict[str, object]:
    """Host -> the verify result the JSON beside the page shows (none when it is missing or not ours)."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT or not isinstance(data.get("hosts"), list):
        return {}
    return {h["host"]: h.get("verify") for h in data["hosts"] if isinstance(h, dict) and isinstance(h.get("host"), str)}


def _keep_verify_time(entry: object, earlier: Mapping[str, object]) -> object:
    """A host's report input with the time of the verify result the page shows, when the new one is the same."""
    if not isinstance(entry, Mapping) or entry.get("verify") is None or entry.get("host") not in earlier:
        return entry
    return {**entry, "verify": keep_taken(entry["verify"], earlier[entry["host"]])}


def _store_result(fleet: report_store.Fleet) -> dict:
    return {
        "path": fleet.store,
        "summary": report_store.summary(fleet),
        "reported": [r.host for r in fleet.records],
        "missing": fleet.missing,
        "unreadable": [name for name, _ in fleet.unreadable],
        "outside": [r.host for r in fleet.outside],
        "stale": [r.host for r in fleet.stale()],
    }


def report(params: Mapping, check_mode: bool = False, move: Callable[[str, str], object] = os.replace) -> dict:
    """The ``cpupools_report`` result for its validated options: render, and write the page when it changed.

    The module and its action (which runs it on the controller, in the
    worker, with no module process) both call this. ``move`` replaces the
    page with the written temporary file (the module passes
    ``AnsibleModule.atomic_move``). Raises ``ReportError`` (a ``CpupoolsError``)
    with a one-line message.
    """
    if params.get("html_path") and not params.get("template"):
        raise ReportError("html_path is set but template is not (the role passes its own)")
    failed = params.get("failed_hosts") or []
    fleet = None
    written: list[str] = []
    if params.get("store"):
        views, fleet, written = _from_store(params, check_mode)
    elif params.get("html_path"):
        earlier = _verify_shown(json_path(params["html_path"]))
        views = analyse([_keep_verify_time(entry, earlier) for entry in params["hosts"]])
    else:
        views = analyse(params["hosts"])
    lines = text_lines(views, failed, params.get("generated"))
    if fleet is not None:
        lines += report_store.lines(fleet)
    result: dict = {
        "changed": False,
        "text": "\n".join(lines) + "\n",
        "lines": lines,
        "summary": fleet_summary(views, failed),
        "hosts": {
            v.host: {
                "status": v.status,
                "drift": v.drift,
                "warnings": v.warnings,
                "verify": None if v.verify is None else v.verify.verdict,
            }
            for v in views
        },
        "html_path": None,
        "json_path": None,
    }
    if fleet is not None:
        result["store"] = _store_result(fleet)
        result["store"]["written"] = written
        result["changed"] = bool(written)
    path = params.get("html_path")
    if not path:
        return result
    model = page_model(views, failed, params.get("title") or "cpupools report", params.get("generated"), fleet)
    files = [
        (path, render_page(model, params["template"]).encode("utf-8")),
        (json_path(path), render_json(views, failed, params.get("generated"), fleet).encode("utf-8")),
    ]
    result["html_path"] = path
    result["json_path"] = files[1][0]
    diffs = []
    for target, content in files:
        try:
            with open(target, "rb") as handle:
                current: bytes | None = handle.read()
        except FileNotFoundError:
            current = None
        except OSError as exc:
            raise ReportError(f"cannot read {target}: {exc.strerror}") from None
        if current == content:
            continue
        result["changed"] = True
        diffs.append(
            {"before_header": target, "after_header": target, "before": _describe(current), "after": _describe(content)}
        )
        if not check_mode:
            try:
                replace_file(target, content, move=move, prefix=".cpupools-report-")
            except OSError as exc:
                raise ReportError(f"cannot write {target}: {exc.strerror}") from None
    if diffs:
        result["diff"] = diffs if len(diffs) > 1 else diffs[0]
    return result
