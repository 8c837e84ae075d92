"""What a converged host's plan result names by digest, its topology, plan and exports: plugin_utils/digest_store.py.

The whole path (a converged re-run's result names it, the report reads it) is
tests/playbook/test_site.py; these are the store's own cases.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import digest_store as store

FACTS = {"online": "0-3", "kernel": {"isolcpus": {"cpus": "2-3"}}, "numa": {"0": "0-3"}}


def test_stored_once_read_back_and_shared_by_identical_nodes(tmp_path):
    text, digest = store.encode(FACTS)
    assert store.store(str(tmp_path), text, digest)
    path = tmp_path / "build" / "topology" / f"{digest}.json"
    first = path.stat()
    # the same topology from another node: the same file, not written again
    again_text, again = store.encode(json.loads(json.dumps(FACTS)))
    assert (again_text, again) == (text, digest)
    assert store.store(str(tmp_path), again_text, again)
    assert path.stat().st_mtime_ns == first.st_mtime_ns
    assert store.load(str(tmp_path), digest) == FACTS
    assert sorted(os.listdir(path.parent)) == [f"{digest}.json"]  # no temporary file left


def test_the_reader_prefers_the_fact_and_says_none_when_there_is_neither(tmp_path):
    text, digest = store.encode(FACTS)
    store.store(str(tmp_path), text, digest)
    result = {"topology_digest": digest, "work_dir": str(tmp_path)}
    assert store.topology(result, {}) == FACTS
    assert store.topology(result, {"cpupools": {"online": "0"}}) == {"online": "0"}
    assert store.topology(None, None) is None
    assert store.topology({"work_dir": str(tmp_path)}, {}) is None
    # deleted between two runs, or never written: None, not an exception
    assert store.topology({"topology_digest": "0" * 64, "work_dir": str(tmp_path)}, {}) is None


def test_a_file_that_is_not_what_its_name_says_is_not_read(tmp_path):
    text, digest = store.encode(FACTS)
    store.store(str(tmp_path), text, digest)
    path = tmp_path / "build" / "topology" / f"{digest}.json"
    path.write_text(text.replace("0-3", "0-7"))
    assert store.load(str(tmp_path), digest) is None


def test_check_mode_writes_nothing_and_names_only_what_a_run_stored(tmp_path):
    text, digest = store.encode(FACTS)
    missing = tmp_path / "not-yet"
    assert not store.store(str(missing), text, digest, write=False)
    assert not missing.exists()
    assert not store.store(str(tmp_path), text, digest, write=False)
    assert not (tmp_path / "build").exists()
    assert store.store(str(tmp_path), text, digest)
    assert store.store(str(tmp_path), text, digest, write=False)


def test_an_unwritable_work_directory_is_no_error(tmp_path):
    text, digest = store.encode(FACTS)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the work directory should be")
    assert not store.store(str(blocked), text, digest)


def test_writers_racing_on_one_digest_leave_one_whole_file(tmp_path):
    text, digest = store.encode({"online": "0-1023", "cpus": list(range(1024))})
    threads = [threading.Thread(target=store.store, args=(str(tmp_path), text, digest)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.load(str(tmp_path), digest)["online"] == "0-1023"
    assert os.listdir(tmp_path / "build" / "topology") == [f"{digest}.json"]


PLANNED = {"plan": {"pool_cpus": {"exclusive": "2-3"}}, "exports": {"cpupools_reboot_required": True}}


def test_the_plan_and_exports_are_read_from_the_result_or_from_where_it_names_them(tmp_path):
    text, digest = store.encode(PLANNED)
    assert store.store(str(tmp_path), text, digest, kind="plan")
    assert (tmp_path / "build" / "plan" / f"{digest}.json").is_file()
    assert not (tmp_path / "build" / "topology").exists()  # each kind in its own directory
    assert store.planned({"plan_digest": digest, "work_dir": str(tmp_path)}) == PLANNED
    # a whole result carries them: read from it, whatever it names
    whole = {"plan": {"pool_cpus": {}}, "exports": {}, "plan_digest": digest, "work_dir": str(tmp_path)}
    assert store.planned(whole) == {"plan": {"pool_cpus": {}}, "exports": {}}
    # neither (a failed host, no result, a record deleted since): both None, no exception
    nothing = {"plan": None, "exports": None}
    assert store.planned(None) == nothing
    assert store.planned({"failed": True}) == nothing
    assert store.planned({"plan_digest": "0" * 64, "work_dir": str(tmp_path)}) == nothing
    # a topology is not a plan, even under the same digest
    assert store.load(str(tmp_path), digest) is None


def test_a_cache_reads_each_digest_once_and_gives_every_host_the_same_object(tmp_path):
    text, digest = store.encode(FACTS)
    store.store(str(tmp_path), text, digest)
    planned_text, planned_digest = store.encode(PLANNED)
    store.store(str(tmp_path), planned_text, planned_digest, kind="plan")
    cache = {}
    result = {"topology_digest": digest, "plan_digest": planned_digest, "work_dir": str(tmp_path)}
    first = store.topology(result, {}, cache)
    (tmp_path / "build" / "topology" / f"{digest}.json").unlink()  # read once: the second host does not look
    assert store.topology(dict(result), {}, cache) is first == FACTS
    planned = store.planned(result, cache)
    (tmp_path / "build" / "plan" / f"{planned_digest}.json").unlink()
    assert store.planned(dict(result), cache) is planned == PLANNED
    # a digest that is not there is remembered as not there, and a host's own fact still wins
    missing = {"topology_digest": "0" * 64, "work_dir": str(tmp_path)}
    assert store.topology(missing, {}, cache) is None and (str(tmp_path), "0" * 64, "topology") in cache
    assert store.topology(result, {"cpupools": {"online": "0"}}, cache) == {"online": "0"}
    # without a cache, every call reads: the file is gone
    assert store.topology(result, {}) is None


def test_a_value_with_integer_keys_has_the_digest_of_the_json_the_controller_reads():
    # the module encodes its own objects, the controller what came through JSON: the same digest
    node_side = {"distances": {10: [10, 21], 9: [21, 10]}, "cpus": (0, 1)}
    assert store.encode(node_side) == store.encode(json.loads(json.dumps(node_side)))


def test_a_hosts_names_are_kept_and_given_back_while_what_they_name_is_stored(tmp_path):
    work = str(tmp_path)
    topology_text, topology = store.encode(FACTS)
    plan_text, plan = store.encode({"plan": {"pools": 2}, "exports": {}})
    store.store(work, topology_text, topology)
    store.store(work, plan_text, plan, kind="plan")
    names = {"topology": topology, "plan": plan}
    assert store.named(work, "node/1") == {}
    store.remember(work, "node/1", names, write=False)  # check mode
    assert not (tmp_path / "build" / "hosts").exists()
    store.remember(work, "node/1", {"topology": topology})  # a result that names one of them: nothing kept
    assert not (tmp_path / "build" / "hosts").exists()
    store.remember(work, "node/1", names)
    assert store.named(work, "node/1") == names
    assert store.named(work, "node/2") == {}
    kept = next((tmp_path / "build" / "hosts").iterdir())
    before = kept.stat().st_mtime_ns
    store.remember(work, "node/1", names, known=names)  # the same names: not written again
    assert kept.stat().st_mtime_ns == before
    # a stored file deleted since (the directory is safe to delete between runs): not named
    (tmp_path / "build" / "plan" / f"{plan}.json").unlink()
    assert store.named(work, "node/1") == {"topology": topology}


def test_a_hosts_names_that_cannot_be_read_name_nothing(tmp_path):
    work = str(tmp_path)
    text, digest = store.encode(FACTS)
    store.store(work, text, digest)
    store.remember(work, "n1", {"topology": digest, "plan": digest})
    kept = next((tmp_path / "build" / "hosts").iterdir())
    # a value that is no digest names no file, even one that is there (build/<name>.json, outside the store)
    (tmp_path / "build" / f"{digest[3:]}.json").write_text(text)
    outside = json.dumps({"host": "n1", "topology": "../" + digest[3:]})
    for garbage in ("", "[1]", "{", json.dumps({"host": "other", "topology": digest}), outside):
        kept.write_text(garbage)
        assert store.named(work, "n1") == {}, garbage
    assert store.named(str(tmp_path / "absent"), "n1") == {}
