"""The ``cpupools_report`` module's work, for the module and its action: analyse, render, write the page.

``report()`` takes the module's validated options (``ARGUMENT_SPEC``) and
returns its result. The rest of the package does the work, each module
importing only those before it: analysis.py (each host's inputs -> a
``HostView``), text.py (the text report), page.py (the HTML page's model and
rendering, the JSON beside it), report_store.py (each host's last data across
runs), report_verify.py (the last verify result in the report).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping

from ..core.errors import ReportError
from . import report_store
from .analysis import HostView, analyse, analyse_host, fleet_summary
from .page import json_path, page_model, render_json, render_page
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


def _write_atomic(path: str, content: bytes, move: Callable[[str, str], object]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".cpupools-report-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _from_store(params: Mapping, check_mode: bool) -> tuple[list[HostView], report_store.Fleet]:
    """The views of every inventory host with data in the store (this run's first) and what the store adds.

    This run's hosts are written first (not in check mode, where they are
    laid over the store in memory), then the whole store is read: a host
    another run wrote meanwhile is shown as that run left it. A host whose
    stored data the report cannot read is left out and named, not fatal.
    """
    now = params.get("now")
    now = time.time() if now is None else float(now)
    run = params.get("run") or ""
    fresh = []
    for entry in params["hosts"]:
        host = entry.get("host") if isinstance(entry, Mapping) else None
        if not isinstance(host, str) or not host:
            raise ReportError("every entry of hosts needs a host name", None)
        fresh.append(report_store.Record(host, now, run, dict(entry)))
    store = params["store"]
    report_store.keep_verify(store, fresh)
    if not check_mode:
        report_store.write(store, fresh)
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
    return views, fleet


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
    if params.get("store"):
        views, fleet = _from_store(params, check_mode)
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
                _write_atomic(target, content, move)
            except OSError as exc:
                raise ReportError(f"cannot write {target}: {exc.strerror}") from None
    if diffs:
        result["diff"] = diffs if len(diffs) > 1 else diffs[0]
    return result
