"""The report store: each run's report data per host, in a directory, for one report of a fleet run in slices.

A fleet split into ``--limit`` shards or AWX/AAP job slices is many runs; each
leaves, for each of its hosts, the report input of ``report.analyse_host``
in one file of a directory the operator names (``cpupools_report_store``),
with the time it was first taken so and the run that took it. A report then
renders the whole inventory from the directory: the hosts no run reported,
how long ago a run last reported each, and the files it left out
(unreadable, or of a host no longer in the inventory).

A file is rewritten only when the host's data changes (``carry`` keeps the
time and run of data that did not): a run that finds the same sets only the
file's modification time, to when it reported the host (``Record.seen``,
what the staleness check reads). So a converged run rewrites no file of the
store, and the page shows no time that every run changes.

One file per host, ``<host>.json`` (the name percent-encoded when it is not
a plain file name), written to a temporary file beside it and renamed over
it: a reader sees the old file or the new one, never a part; two runs
writing at once write different files, or the same host's file whole, the
last rename winning. A crashed writer leaves a ``.*.tmp`` file that readers
skip. Standard library only; the I/O is here, the rendering in text.py and page.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from ..core.errors import ReportError, show
from ..core.files import replace_file

#: The version of a store file; a file of another version is left out, saying so.
FORMAT = 1
SUFFIX = ".json"
#: A store file larger than this is left out unread (a host's data is tens of kB).
MAX_BYTES = 16 * 1024 * 1024


def file_name(host: str) -> str:
    """The store file of ``host``: its name when it is a plain file name, else percent-encoded."""
    name = quote(host, safe="-_.@+=,~")
    if name.startswith("."):
        name = "%2E" + name[1:]  # never a hidden file, nor "." or ".."
    return name + SUFFIX


def host_of(name: str) -> str:
    """The host whose store file is ``name`` (the inverse of ``file_name``)."""
    return unquote(name[: -len(SUFFIX)])


def timestamp(epoch: float) -> str:
    """UTC, to the second: ``2026-11-26T16:41:20Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def age_text(seconds: float) -> str:
    """``42s``, ``5m``, ``3h 2m``, ``2d 4h``: how old a host's data is."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


@dataclass
class Record:
    """One host's report data as a run left it."""

    host: str
    taken: float  # seconds since the epoch: when the data was first taken so
    run: str  # the run that took it: "awx job 12", "ansible-playbook on ctl-1, --limit shard-2"
    entry: dict  # report.analyse_host input
    seen: float = 0.0  # when a run last reported the host (its file's mtime); at least ``taken``

    @property
    def reported(self) -> float:
        return max(self.seen, self.taken)


def _canonical(entry: Mapping) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)


def carry(record: Record, stored: Record | None) -> None:
    """Give ``record`` the time and run of ``stored`` when its data is the same: nothing of the file changes."""
    if stored is not None and _canonical(record.entry) == _canonical(stored.entry):
        record.taken, record.run = stored.taken, stored.run


def encode(record: Record) -> bytes:
    """The store file of ``record`` (canonical JSON, one line)."""
    data = {
        "format": FORMAT,
        "host": record.host,
        "taken": timestamp(record.taken),
        "taken_epoch": record.taken,
        "run": record.run,
        "report": record.entry,
    }
    return (json.dumps(data, sort_keys=True, separators=(",", ":"), default=str) + "\n").encode("utf-8")


def decode(content: bytes, host: str, seen: float = 0.0) -> Record:
    """The record in ``content``, the store file of ``host`` (last modified at ``seen``); ``ReportError``
    saying what is wrong with it."""
    try:
        data = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"not JSON ({str(exc).splitlines()[0][:80]}): cut short or not written by cpupools") from None
    if not isinstance(data, dict):
        raise ReportError("not a cpupools report store file (not a JSON object)")
    if data.get("format") != FORMAT:
        raise ReportError(f"format {show(data.get('format'))}, this cpupools reads format {FORMAT}")
    if data.get("host") != host:
        raise ReportError(f"holds host {show(data.get('host'))}, not {show(host)}")
    taken = data.get("taken_epoch")
    if isinstance(taken, bool) or not isinstance(taken, (int, float)) or taken < 0:
        raise ReportError(f"taken_epoch {show(taken)} is not a time")
    entry = data.get("report")
    if not isinstance(entry, dict) or entry.get("host") != host:
        raise ReportError("its report data is missing or names another host")
    run = data.get("run")
    return Record(host, float(taken), run if isinstance(run, str) else show(run), entry, seen)


def write(
    directory: str,
    records: Iterable[Record],
    move: Callable[[str, str], object] = os.replace,
    now: float | None = None,
    check_mode: bool = False,
) -> list[str]:
    """Write each record to its file in ``directory`` (created), atomically, when it differs; the paths written.

    A file that holds the record already is not rewritten: its modification
    time is set to ``now`` (the run reported the host). Every file this run
    reports gets ``now`` as its modification time. In check mode nothing is
    touched, and the paths that would be written are returned. Raises
    ``ReportError`` naming the store when it cannot be written.
    """
    records = list(records)
    changed = []
    for record in records:
        path = os.path.join(directory, file_name(record.host))
        try:
            with open(path, "rb") as handle:
                same = handle.read(MAX_BYTES + 1) == encode(record)
        except OSError:
            same = False
        if same:
            if not check_mode and now is not None:
                try:
                    os.utime(path, (now, now))
                except OSError as exc:
                    raise ReportError(f"cannot write {path}: {exc.strerror}", "report_store") from None
        else:
            changed.append((record, path))
    if check_mode or not changed:
        return [path for _record, path in changed]
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create the report store {directory}: {exc.strerror}", "report_store") from None
    written = []
    for record, path in changed:
        try:
            replace_file(
                path, encode(record), move=move, mtime=now, prefix=f".{file_name(record.host)}.", suffix=".tmp"
            )
        except OSError as exc:
            raise ReportError(f"cannot write {path}: {exc.strerror}", "report_store") from None
        written.append(path)
    return written


def read(directory: str) -> tuple[dict[str, Record], list[tuple[str, str]]]:
    """Every record in ``directory`` by host, and ``(file, why)`` for each file left out.

    A missing directory is an empty store. Files whose name starts with a dot
    (a writer's temporary file) or that do not end in ``.json`` are not store
    files and are skipped silently.
    """
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        raise ReportError(f"cannot read the report store {directory}: {exc.strerror}", "report_store") from None
    records: dict[str, Record] = {}
    unreadable: list[tuple[str, str]] = []
    for name in names:
        if name.startswith(".") or not name.endswith(SUFFIX) or name == SUFFIX:
            continue
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue  # a directory or a device: not a store file
        try:
            with open(path, "rb") as handle:
                content = handle.read(MAX_BYTES + 1)
                seen = os.fstat(handle.fileno()).st_mtime
        except OSError as exc:
            unreadable.append((name, f"cannot be read: {exc.strerror}"))
            continue
        if len(content) > MAX_BYTES:
            unreadable.append((name, f"larger than {MAX_BYTES // (1024 * 1024)} MiB"))
            continue
        host = host_of(name)
        try:
            records[host] = decode(content, host, seen)
        except ReportError as exc:
            unreadable.append((name, str(exc)))
    return records, unreadable


def read_one(directory: str, host: str) -> Record | None:
    """The record of ``host`` in ``directory``; None when there is none or it cannot be read (``read`` says why)."""
    path = os.path.join(directory, file_name(host))
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as handle:
            content = handle.read(MAX_BYTES + 1)
            seen = os.fstat(handle.fileno()).st_mtime
    except OSError:
        return None
    if len(content) > MAX_BYTES:
        return None
    try:
        return decode(content, host, seen)
    except ReportError:
        return None


def keep_verify(record: Record, stored: Record | None, same: Callable[[object, object], object]) -> None:
    """Give ``record`` the verify result of ``stored`` when it has none, or that result's time when it is the same.

    A run that does not verify (site.yml) leaves a host's last verify result
    in the store, so the report still shows it, with its own time; a verify
    that finds the same keeps the time it was first found (``same``:
    ``report_verify.keep_taken``).
    """
    if stored is None or stored.entry.get("verify") is None:
        return
    if record.entry.get("verify") is None:
        record.entry["verify"] = stored.entry["verify"]
    else:
        record.entry["verify"] = same(record.entry["verify"], stored.entry["verify"])


@dataclass
class Fleet:
    """What a report over the store shows besides the hosts: who reported, how long ago, what was left out."""

    store: str
    now: float
    inventory: list[str]
    records: list[Record] = field(default_factory=list)  # in inventory order, each host once
    missing: list[str] = field(default_factory=list)  # inventory hosts no run reported
    outside: list[Record] = field(default_factory=list)  # in the store, not in this inventory
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (file or host, why)
    max_age: int = 0  # seconds; 0: no host's data is too old

    def stale(self) -> list[Record]:
        """The records no run has reported for longer than ``max_age``."""
        if not self.max_age:
            return []
        return [r for r in self.records if self.now - r.reported > self.max_age]


def merge(
    store: str,
    inventory: Sequence[str],
    stored: Mapping[str, Record],
    fresh: Sequence[Record],
    unreadable: Sequence[tuple[str, str]],
    now: float,
    max_age: int = 0,
) -> Fleet:
    """The fleet over ``inventory``: this run's ``fresh`` records over the ``stored`` ones."""
    latest = dict(stored)
    for record in fresh:
        latest[record.host] = record
    unread = {host_of(name): (name, why) for name, why in unreadable}
    fleet = Fleet(store, now, list(inventory), max_age=max_age)
    members = set(inventory)
    for host in inventory:
        if host in latest:
            fleet.records.append(latest[host])
        elif host in unread:
            fleet.unreadable.append(unread[host])
        else:
            fleet.missing.append(host)
    fleet.outside = [latest[h] for h in sorted(latest) if h not in members]
    fleet.unreadable += [unread[h] for h in sorted(unread) if h not in members]
    return fleet


def _names(hosts: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(hosts[:limit])
    return shown + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def summary(fleet: Fleet, ages: bool = True) -> str:
    """One line: how many inventory hosts reported, by how many runs, and (``ages``) the host reported longest ago.

    The page leaves the ages out (every run changes them); the text report has them.
    """
    runs = {r.run for r in fleet.records}
    parts = [
        f"report data: {len(fleet.records)} of {len(fleet.inventory)} host(s) in the inventory "
        f"reported, by {len(runs)} run(s) (store {fleet.store})"
    ]
    if fleet.records and ages:
        oldest = min(fleet.records, key=lambda r: r.reported)
        parts.append(f"oldest {age_text(fleet.now - oldest.reported)} ({oldest.host})")
    if fleet.missing:
        parts.append(f"{len(fleet.missing)} not reported by any run ({_names(fleet.missing)})")
    stale = fleet.stale()
    if stale:
        parts.append(f"{len(stale)} older than {age_text(fleet.max_age)} ({_names([r.host for r in stale])})")
    if fleet.unreadable:
        parts.append(f"{len(fleet.unreadable)} file(s) left out, unreadable")
    if fleet.outside:
        parts.append(f"{len(fleet.outside)} host(s) in the store but not in this inventory, left out")
    return "; ".join(parts)


def rows(fleet: Fleet) -> list[dict[str, str]]:
    """Per inventory host that reported: since when its data is so and which run took it, how long ago a run
    last reported it (``age``: the text report's only), and whether that is too long ago."""
    stale = {r.host for r in fleet.stale()}
    return [
        {
            "host": r.host,
            "taken": timestamp(r.taken),
            "age": age_text(fleet.now - r.reported),
            "run": r.run,
            "stale": "too old" if r.host in stale else "",
        }
        for r in fleet.records
    ]


def lines(fleet: Fleet) -> list[str]:
    """The report data section of the text report."""
    out = [summary(fleet)]
    table = [["host", "since", "reported", "run", ""]]
    table += [[r["host"], r["taken"], f"{r['age']} ago", r["run"], r["stale"]] for r in rows(fleet)]
    if len(table) > 1:
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    if fleet.missing:
        out.append("  not reported by any run: " + ", ".join(fleet.missing))
    for name, why in fleet.unreadable:
        out.append(f"  left out, unreadable: {name}: {why}")
    for record in fleet.outside:
        out.append(
            f"  left out, not in this inventory: {record.host} "
            f"(since {timestamp(record.taken)}, reported {age_text(fleet.now - record.reported)} ago, {record.run})"
        )
    return out
