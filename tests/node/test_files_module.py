"""cpupools_files: a stage's rendered files in one module run; check mode, diff, nothing rewritten twice."""

from __future__ import annotations

import os

from helpers import run_module

CONF = {"path": "/etc/cpupools/housekeep.conf", "content": "isolated=2-3\nhousekeeping=0\n", "mode": "0644"}
UNIT = {
    "path": "/etc/systemd/system/cpupools-housekeep.timer",
    "content": "[Timer]\n",
    "mode": "0644",
    "stage": "agent",
}


def test_writes_what_differs_once_check_mode_and_diff_say_it_first(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    args = {"root": str(root), "files": [CONF, UNIT]}
    checked = run_module("cpupools_files", {**args, "_ansible_check_mode": True, "_ansible_diff": True}, tmp_path)
    assert checked["changed"] and [f["changed"] for f in checked["files"]] == ["missing", "missing"]
    assert checked["diff"][0] == {
        "before_header": CONF["path"],
        "after_header": CONF["path"],
        "before": "",
        "after": CONF["content"],
    }
    assert os.listdir(root) == []  # check mode wrote nothing, not even a directory
    written = run_module("cpupools_files", args, tmp_path)
    assert written["changed"]
    conf = root / "etc/cpupools/housekeep.conf"
    assert conf.read_text() == CONF["content"] and oct(conf.stat().st_mode & 0o7777) == "0o644"
    assert oct((root / "etc/cpupools").stat().st_mode & 0o7777) == "0o755"
    mtime = conf.stat().st_mtime_ns
    again = run_module("cpupools_files", {**args, "_ansible_diff": True}, tmp_path)
    assert not again["changed"] and again["diff"] == [] and conf.stat().st_mtime_ns == mtime
    # A mode, then a content, changed by hand: each file is written back, and only that one.
    conf.chmod(0o600)
    (root / "etc/systemd/system/cpupools-housekeep.timer").write_text("[Timer]\nOnBootSec=1s\n")
    fixed = run_module("cpupools_files", args, tmp_path)
    assert [f["changed"] for f in fixed["files"]] == ["mode", "content"]
    assert oct(conf.stat().st_mode & 0o7777) == "0o644"
    assert (root / "etc/systemd/system/cpupools-housekeep.timer").read_text() == UNIT["content"]
    assert sorted(os.listdir(root / "etc/cpupools")) == ["housekeep.conf"]  # no temporary file left


def test_a_path_the_plan_cannot_mean_is_refused(tmp_path):
    relative = run_module("cpupools_files", {"root": str(tmp_path), "files": [{**CONF, "path": "etc/x"}]}, tmp_path)
    assert relative["failed"] and "'etc/x' is not an absolute path" in relative["msg"]
    unwanted = run_module("cpupools_files", {"root": str(tmp_path), "files": [{**CONF, "wanted": False}]}, tmp_path)
    assert unwanted["failed"] and "does not want this file written" in unwanted["msg"]
    mode = run_module("cpupools_files", {"root": str(tmp_path), "files": [{**CONF, "mode": "rw"}]}, tmp_path)
    assert mode["failed"] and "is not octal" in mode["msg"]


def test_remove_takes_files_links_and_trees_once_and_check_mode_says_it_first(tmp_path):
    root = tmp_path / "node"
    (root / "etc/cpupools").mkdir(parents=True)
    (root / "etc/cpupools/housekeep.conf").write_text("isolated=2-3\n")
    (root / "opt/bin").mkdir(parents=True)
    (root / "opt/bin/cmk.pyz").write_bytes(b"PK")
    kept = tmp_path / "kept"  # outside the root: a link to it goes, what it points to stays
    kept.write_text("mine\n")
    (root / "opt/bin/cmk").symlink_to(kept)
    gone = ["/etc/cpupools", "/opt/bin/cmk", "/opt/bin/cmk.pyz", "/opt/bin/cmk.pyz/below-a-file"]
    args = {"root": str(root), "files": [CONF], "remove": gone[1:]}
    checked = run_module("cpupools_files", {**args, "_ansible_check_mode": True, "_ansible_diff": True}, tmp_path)
    assert checked["changed"]
    assert [f["changed"] for f in checked["files"]] == ["content", "removed", "removed", None]
    assert checked["diff"][1] == {
        "before_header": "/opt/bin/cmk",
        "after_header": "/opt/bin/cmk",
        "before": "file",
        "after": "absent",
    }
    assert (root / "opt/bin/cmk").is_symlink() and (root / "opt/bin/cmk.pyz").exists()
    done = run_module("cpupools_files", {"root": str(root), "remove": gone}, tmp_path)
    assert done["changed"] and [f["changed"] for f in done["files"]] == ["removed", "removed", "removed", None]
    assert sorted(os.listdir(root / "etc")) == [] and os.listdir(root / "opt/bin") == []
    assert kept.read_text() == "mine\n"
    again = run_module("cpupools_files", {"root": str(root), "remove": gone}, tmp_path)
    assert not again["changed"] and [f["changed"] for f in again["files"]] == [None] * 4


def test_a_removal_the_plan_cannot_mean_is_refused_before_anything_is_written(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    (tmp_path / "outside").write_text("x\n")
    for path, said in (
        ("etc/cpupools", "'etc/cpupools' is not an absolute path"),
        ("/etc/../../outside", "climbs out with '..'"),
        ("/", "the node's root is never removed"),
        ("//", "the node's root is never removed"),
    ):
        res = run_module("cpupools_files", {"root": str(root), "files": [CONF], "remove": [path]}, tmp_path)
        assert res["failed"] and said in res["msg"], (path, res)
        assert os.listdir(root) == [], path  # the file to write was not written either
    assert (tmp_path / "outside").read_text() == "x\n"


#: Bytes that are not text (a zipapp's): a NUL, an invalid UTF-8 sequence.
PROGRAM = b"#!/bin/sh\nPK\x03\x04\x00\xff\xfe binary\n"


def test_bytes_are_written_as_they_are_and_the_diff_names_their_size_and_digest(tmp_path):
    import base64
    import hashlib

    root = tmp_path / "node"
    root.mkdir()
    program = {"path": "/opt/bin/cmk.pyz", "content_base64": base64.b64encode(PROGRAM).decode(), "mode": "0755"}
    args = {"root": str(root), "files": [program]}
    checked = run_module("cpupools_files", {**args, "_ansible_check_mode": True, "_ansible_diff": True}, tmp_path)
    assert checked["diff"][0]["after"] == f"({len(PROGRAM)} bytes, sha256 {hashlib.sha256(PROGRAM).hexdigest()})\n"
    assert os.listdir(root) == []
    assert run_module("cpupools_files", args, tmp_path)["changed"]
    written = root / "opt/bin/cmk.pyz"
    assert written.read_bytes() == PROGRAM and oct(written.stat().st_mode & 0o7777) == "0o755"
    assert not run_module("cpupools_files", args, tmp_path)["changed"]


def test_a_file_without_one_content_or_with_a_path_out_of_the_root_is_refused_before_anything_is_written(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    for bad, said in (
        ({"path": "/etc/../../outside"}, "climbs out with '..'"),
        ({"content_base64": "aGk="}, "give one of content, content_base64 and src (given: content, content_base64)"),
        ({"content": None}, "give one of content, content_base64 and src (given: none)"),
        ({"content": None, "content_base64": "not base64!"}, "content_base64 is not base64"),
        ({"content": None, "src": "/build/cmk.pyz"}, "call the module as cpupools.cpupools.cpupools_files"),
    ):
        res = run_module("cpupools_files", {"root": str(root), "files": [CONF, {**UNIT, **bad}]}, tmp_path)
        assert res["failed"] and said in res["msg"], (bad, res)
        assert os.listdir(root) == [], bad  # the good file before it was not written either


def test_src_is_read_on_the_controller_by_the_action_plugin(playbook, tmp_path):
    root, built = tmp_path / "node", tmp_path / "build"
    built.mkdir()
    (built / "cmk.pyz").write_bytes(PROGRAM)
    task = f"""
        - hosts: localhost
          gather_facts: false
          tasks:
            - cpupools.cpupools.cpupools_files:
                root: {root}
                files: [{{path: /opt/bin/cmk.pyz, src: "{built}/{{{{ name }}}}", mode: "0755"}}]
    """
    first = playbook(task, {"name": "cmk.pyz"})
    assert first.rc == 0 and first.changed() == 1, first.stdout[-2000:]
    assert (root / "opt/bin/cmk.pyz").read_bytes() == PROGRAM
    assert playbook(task, {"name": "cmk.pyz"}).changed() == 0
    missing = playbook(task, {"name": "gone.pyz"})
    assert missing.rc != 0
    assert f"cpupools_files: /opt/bin/cmk.pyz: src {built}/gone.pyz: No such file or directory" in missing.messages()
