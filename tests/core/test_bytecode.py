"""The bytecode cache of a module's payload (plugins/module_utils/cpupools/core/bytecode.py).

Each test imports the real package from a zip laid out as Ansible's payload lays it out, in a
Python process of its own (the cache acts at import), and counts the calls of ``compile``
that compile the package's files: zipimport's own two per module, one without a usable cache,
none from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "plugins" / "module_utils" / "cpupools"
IN_ZIP = "ansible_collections/cpupools/cpupools/plugins/module_utils/cpupools"
NAME = IN_ZIP.replace("/", ".")
#: What the probe imports: a module with a deep closure (the converged check's).
TARGET = f"{NAME}.node.stage_check"

PROBE = r"""
import builtins, json, sys, traceback
zip_path, target, call = sys.argv[1:4]
counted = []
real = builtins.compile
def compile(source, filename, *args, **kwargs):
    if "/cpupools/cpupools/plugins/module_utils/cpupools/" in str(filename):
        counted.append(str(filename).split("/module_utils/cpupools/")[1])
    return real(source, filename, *args, **kwargs)
builtins.compile = compile
sys.path.insert(0, zip_path)
module = __import__(target, fromlist=["_"])
out = {"compiled": counted, "file": module.__file__, "loader": type(module.__spec__.loader).__name__}
if call:
    try:
        getattr(module, call)("not a cpulist")
    except Exception:
        out["traceback"] = traceback.format_exc()
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core import cpulist
out["parsed"] = cpulist.parse_cpulist("0-3,8")
print(json.dumps(out))
"""


def payload(path: Path, edit: dict[str, str] | None = None) -> Path:
    """The package in a zip at ``path``, as Ansible's payload holds it (``edit``: relative path -> new text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        parts = IN_ZIP.split("/")
        for depth in range(1, len(parts)):
            out.writestr("/".join(parts[:depth]) + "/__init__.py", "")
        for source in sorted(PACKAGE.rglob("*.py")):
            relative = source.relative_to(PACKAGE).as_posix()
            text = (edit or {}).get(relative, source.read_text())
            out.writestr(f"{IN_ZIP}/{relative}", text)
    return path


def probe(zip_path: Path, env: dict[str, str], target: str = TARGET, call: str = "") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(zip_path), target, call],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "home" / ".cache"
    directory.mkdir(parents=True, mode=0o700)
    return {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(directory)}, directory / "cpupools" / "bytecode"


def entries(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_a_payload_compiles_each_module_once_then_reads_every_one_from_the_cache(tmp_path, cache):
    env, directory = cache
    zip_path = payload(tmp_path / "run1" / "payload.zip")
    first = probe(zip_path, env)
    # Before the cache is installed: the package's __init__ and the cache's own module.
    before = {"__init__.py", "core/bytecode.py"}
    assert first["compiled"].count("core/bytecode.py") == 1, first["compiled"]  # the package compiles it, once
    through_cache = [name for name in first["compiled"] if name not in before]
    assert len(through_cache) == len(set(through_cache)) > 10, first["compiled"]  # once each, not zipimport's twice
    assert first["loader"] == "_Loader" and first["parsed"] == [0, 1, 2, 3, 8]
    stored = entries(directory)
    assert len(stored) == len(through_cache), sorted(stored)
    assert all(name.endswith(".bin") and f".{sys.implementation.cache_tag}." in name for name in stored)
    assert oct(directory.stat().st_mode & 0o777) == "0o700"

    # Another payload (Ansible's next run extracts the same sources elsewhere): nothing compiled, nothing rewritten.
    second = probe(payload(tmp_path / "run2" / "payload.zip"), env)
    assert [name for name in second["compiled"] if name not in before] == []
    assert second["file"].startswith(str(tmp_path / "run2")) and second["parsed"] == [0, 1, 2, 3, 8]
    assert entries(directory) == stored


def test_off_compiles_each_module_once_and_writes_nothing(tmp_path, cache):
    env, directory = cache
    out = probe(payload(tmp_path / "p.zip"), {**env, "CPUPOOLS_BYTECODE_CACHE": "off"})
    modules = [name for name in out["compiled"] if name not in {"__init__.py", "core/__init__.py", "core/bytecode.py"}]
    assert len(modules) == len(set(modules)) > 10
    assert not directory.parent.exists()


def test_without_the_cache_zipimport_compiles_every_module_twice(tmp_path, cache):
    """What the finder saves even when the cache is off: the baseline it is measured against."""
    env, _ = cache
    zip_path = payload(tmp_path / "p.zip", edit={"__init__.py": '"""No cache."""\n'})
    out = probe(zip_path, env, target=f"{NAME}.core.cpulist")
    assert out["loader"] == "zipimporter"
    assert sorted(out["compiled"]).count("core/cpulist.py") == 2, out["compiled"]


def test_a_changed_source_is_compiled_and_replaces_its_old_entry(tmp_path, cache):
    env, directory = cache
    probe(payload(tmp_path / "a.zip"), env)
    before = entries(directory)
    changed = (PACKAGE / "core" / "cpulist.py").read_text() + "\nCHANGED = True\n"
    out = probe(payload(tmp_path / "b.zip", edit={"core/cpulist.py": changed}), env)
    assert [n for n in out["compiled"] if n == "core/cpulist.py"] == ["core/cpulist.py"]
    after = entries(directory)
    old = [n for n in before if n.startswith("core.cpulist.")]
    new = [n for n in after if n.startswith("core.cpulist.")]
    assert len(old) == len(new) == 1 and old != new  # one entry per module: the old one is gone
    assert {n: v for n, v in after.items() if n not in new} == {n: v for n, v in before.items() if n not in old}


def test_a_damaged_or_foreign_entry_is_compiled_again_and_replaced(tmp_path, cache):
    env, directory = cache
    zip_path = payload(tmp_path / "p.zip")
    probe(zip_path, env)
    cpulist_entry = next(directory.glob("core.cpulist.*"))
    errors_entry = next(directory.glob("core.errors.*"))
    good = cpulist_entry.read_bytes()
    cpulist_entry.write_bytes(good[: len(good) // 2])  # cut short (the rename makes it unlikely, not impossible)
    errors_entry.write_bytes(b"cpupools-bytecode-1\n" + b"0" * 64 + b"\n" + b"\xff" * 40)  # another digest
    out = probe(zip_path, env)
    assert sorted(n for n in out["compiled"] if n.startswith("core/c") or n.startswith("core/e")) == [
        "core/cpulist.py",
        "core/errors.py",
    ]
    assert cpulist_entry.read_bytes() == good
    if os.geteuid() == 0:  # an entry of another owner is not read (anyone who can chown it can do worse)
        os.chown(cpulist_entry, 65534, 65534)
        out = probe(zip_path, env)
        assert "core/cpulist.py" in out["compiled"]
        assert cpulist_entry.stat().st_uid == 0


@pytest.mark.parametrize("unsafe", ["group-writable", "parent-world-writable", "symlink", "not-a-directory"])
def test_a_directory_others_could_write_is_not_used(tmp_path, cache, unsafe):
    env, directory = cache
    zip_path = payload(tmp_path / "p.zip")
    probe(zip_path, env)
    stored = entries(directory)
    if unsafe == "group-writable":
        directory.chmod(0o770)
    elif unsafe == "parent-world-writable":
        directory.parent.chmod(0o777)
    elif unsafe == "symlink":
        elsewhere = tmp_path / "elsewhere"
        directory.rename(elsewhere)
        directory.symlink_to(elsewhere)
    else:
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()
        directory.write_text("")
    out = probe(zip_path, env)
    # Every module compiled from the payload's source, and it works; the entries are not touched.
    assert "node/stage_check.py" in out["compiled"] and out["parsed"] == [0, 1, 2, 3, 8]
    if unsafe in ("group-writable", "parent-world-writable"):
        assert entries(directory) == stored


def test_a_traceback_names_the_payload_of_this_run(tmp_path, cache):
    env, _ = cache
    target = f"{NAME}.core.cpulist"
    probe(payload(tmp_path / "first" / "p.zip"), env, target=target, call="parse_cpulist")
    out = probe(payload(tmp_path / "second" / "p.zip"), env, target=target, call="parse_cpulist")
    assert "core/cpulist.py" not in out["compiled"]  # from the cache
    assert str(tmp_path / "second" / "p.zip") in out["traceback"], out["traceback"]
    assert str(tmp_path / "first") not in out["traceback"]


def test_a_module_run_by_ansible_fills_the_cache_and_gives_the_same_result(playbook, corpus_root, tmp_path):
    directory = tmp_path / "bytecode"
    pb = f"""
    - hosts: localhost
      gather_facts: false
      environment:
        CPUPOOLS_BYTECODE_CACHE: {directory}
      tasks:
        - name: Gather
          cpupools_facts:
            root: {corpus_root["2s8c-offline"]}
    """
    first = playbook(pb)
    assert first.rc == 0, first.stdout + first.stderr
    stored = entries(directory)
    assert any(name.startswith("hardware.topology.") for name in stored), sorted(stored)
    second = playbook(pb)
    assert second.rc == 0, second.stdout + second.stderr
    assert second.result("Gather")["ansible_facts"] == first.result("Gather")["ansible_facts"]
    assert entries(directory) == stored
