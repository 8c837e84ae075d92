"""The report store (module_utils/cpupools/report/report_store.py) and the report over it, without a playbook.

What a fleet run in slices meets: a host no run reported, a host removed from
the inventory, a stale file, a file cut short or not cpupools', a host name
that is not a file name, and two runs writing at once.
"""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest
from cpupools.core.errors import ReportError
from cpupools.report import report_store
from cpupools.report.report import report

NOW = 1_800_000_000.0


def entry(host: str) -> dict:
    return {"host": host}  # every part but the name is optional: shown as unplanned


def run(store, hosts, inventory, now=NOW, check_mode=False, **extra):
    params = {"hosts": [entry(h) for h in hosts], "store": str(store), "inventory_hosts": inventory}
    params.update(now=now, run=extra.pop("run", "test run"), **extra)
    return report(params, check_mode)


def test_slices_add_up_and_the_report_names_the_hosts_no_run_reported(tmp_path):
    store = tmp_path / "store"
    inventory = ["a", "b", "c"]
    first = run(store, ["a"], inventory, run="slice 1")
    assert first["store"]["reported"] == ["a"] and first["store"]["missing"] == ["b", "c"]
    second = run(store, ["b"], inventory, now=NOW + 90, run="slice 2")
    assert second["store"]["reported"] == ["a", "b"] and second["store"]["missing"] == ["c"]
    assert "2 of 3 host(s) in the inventory reported, by 2 run(s)" in second["text"]
    assert "oldest 1m (a)" in second["text"]
    assert "  not reported by any run: c" in second["lines"]
    row = next(line for line in second["lines"] if line.startswith("  a "))
    assert "2027-01-15T08:00:00Z" in row and "1m" in row and "slice 1" in row
    assert list(second["hosts"]) == ["a", "b"]


def test_a_corrupt_file_is_left_out_and_named_and_the_rest_is_reported(tmp_path):
    store = tmp_path / "store"
    run(store, ["a", "b", "c"], ["a", "b", "c"])
    path = store / "b.json"
    path.write_bytes(path.read_bytes()[:20])  # cut short
    malformed = {"format": 1, "host": "c", "taken_epoch": NOW, "report": {"host": "c", "plan": 7}}
    (store / "c.json").write_text(json.dumps(malformed))
    (store / ".a.json.x1.tmp").write_text("a writer's temporary file")
    (store / "notes.txt").write_text("not a store file")
    result = run(store, [], ["a", "b", "c"])
    assert result["store"]["reported"] == ["a"]
    assert result["store"]["unreadable"] == ["b.json", "c.json"]
    text = result["text"]
    assert "left out, unreadable: b.json: not JSON" in text
    assert "left out, unreadable: c.json: its report data is malformed" in text
    assert "2 file(s) left out, unreadable" in text


def test_a_host_removed_from_the_inventory_is_left_out_and_named(tmp_path):
    store = tmp_path / "store"
    run(store, ["a", "old"], ["a", "old"], run="last week")
    result = run(store, ["a"], ["a"], now=NOW + 7 * 86400)
    assert result["store"]["reported"] == ["a"] and result["store"]["outside"] == ["old"]
    assert (
        "left out, not in this inventory: old (since 2027-01-15T08:00:00Z, reported 7d 0h ago, last week)"
        in result["text"]
    )
    assert list(result["hosts"]) == ["a"]


def test_data_older_than_the_maximum_age_is_flagged(tmp_path):
    store = tmp_path / "store"
    run(store, ["a"], ["a", "b"])
    result = run(store, ["b"], ["a", "b"], now=NOW + 7200, store_max_age=3600)
    assert result["store"]["stale"] == ["a"]
    assert "1 older than 1h 0m (a)" in result["text"]
    assert next(line for line in result["lines"] if line.startswith("  a ")).endswith("too old")


def test_check_mode_writes_nothing_and_reports_as_if_written(tmp_path):
    store = tmp_path / "store"
    result = run(store, ["a"], ["a", "b"], check_mode=True)
    assert result["store"]["reported"] == ["a"] and not store.exists()


@pytest.mark.parametrize("host", ["node-1.example.com", "..", ".hidden", "a/b", "ünï", "x y"])
def test_any_host_name_is_one_file_of_the_store(tmp_path, host):
    name = report_store.file_name(host)
    assert "/" not in name and not name.startswith(".") and name.endswith(".json")
    assert report_store.host_of(name) == host
    result = run(tmp_path, [host], [host])
    assert result["store"]["reported"] == [host]
    assert sorted(os.listdir(tmp_path)) == [name]


def test_a_store_that_cannot_be_written_is_refused_by_name(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match="cannot create the report store"):
        run(blocker / "store", ["a"], ["a"])


def _writer(store: str, host: str, rounds: int, tag: str) -> None:
    for i in range(rounds):
        data = {"host": host, "padding": tag * 20000, "i": i}
        report_store.write(store, [report_store.Record(host, NOW + i, tag, data)])


def test_two_runs_writing_the_same_host_at_once_leave_one_whole_file(tmp_path):
    store = str(tmp_path / "store")
    os.makedirs(store)
    procs = [multiprocessing.Process(target=_writer, args=(store, "a", 20, tag)) for tag in "xy"]
    for proc in procs:
        proc.start()
    seen = 0
    while any(p.is_alive() for p in procs):
        records, unreadable = report_store.read(store)
        assert unreadable == []  # never a part of a file
        seen += len(records)
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    records, unreadable = report_store.read(store)
    assert unreadable == [] and records["a"].run in ("x", "y") and seen > 0
    assert os.listdir(store) == ["a.json"]  # no temporary file left behind
