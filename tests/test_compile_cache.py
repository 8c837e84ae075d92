"""The tests' compile cache for modules imported from a zip (tests/bytecode/sitecustomize.py).

Every Ansible run of the tests loads it (tests/helpers.py), so what it must not
change is checked here, with real Python processes importing from a real zip:
the module runs the code of its own source, its tracebacks name its own zip,
and a cache file that is not code is compiled over, not trusted.
"""

from __future__ import annotations

import marshal
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import BYTECODE, ansible_env

PROBE = """
import sys, traceback, zipimport
print(zipimport._compile_source.__module__)
sys.path.insert(0, sys.argv[1])
import probe
print(probe.VALUE)
try:
    probe.fail()
except ValueError:
    print(traceback.extract_tb(sys.exc_info()[2])[-1].filename)
"""


def payload(path: Path, value: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("probe.py", f"VALUE = {value!r}\n\n\ndef fail():\n    raise ValueError(VALUE)\n")
    return path


def run(zip_path: Path, cache: Path | None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(BYTECODE)}
    if cache is not None:
        env["CPUPOOLS_TEST_BYTECODE"] = str(cache)
    res = subprocess.run([sys.executable, "-c", PROBE, str(zip_path)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_the_same_source_is_compiled_once_and_each_zip_keeps_its_own_name(tmp_path):
    cache = tmp_path / "cache"
    first = payload(tmp_path / "first.zip", "one")
    assert run(first, cache) == ["sitecustomize", "one", str(first / "probe.py")]
    kept = sorted(cache.iterdir())
    assert len(kept) == 1 and not kept[0].name.endswith(".tmp")
    # Another payload, the same source: read from the cache (nothing new), named after its own zip.
    second = payload(tmp_path / "second.zip", "one")
    kept[0].touch()
    before = kept[0].stat().st_mtime_ns
    assert run(second, cache) == ["sitecustomize", "one", str(second / "probe.py")]
    assert sorted(cache.iterdir()) == kept and kept[0].stat().st_mtime_ns == before
    # Another source is another entry: never the code of the first.
    third = payload(tmp_path / "third.zip", "two")
    assert run(third, cache) == ["sitecustomize", "two", str(third / "probe.py")]
    assert len(list(cache.iterdir())) == 2


def test_a_cache_entry_that_is_not_code_is_compiled_over(tmp_path):
    cache = tmp_path / "cache"
    zip_path = payload(tmp_path / "p.zip", "one")
    run(zip_path, cache)
    (entry,) = cache.iterdir()
    for junk in (b"not marshal data", marshal.dumps(42)):
        entry.write_bytes(junk)
        assert run(zip_path, cache) == ["sitecustomize", "one", str(zip_path / "probe.py")]
        assert entry.read_bytes() != junk


def test_off_without_the_variable_and_on_in_every_ansible_run(tmp_path):
    # without the variable zipimport compiles as it does on a node
    assert run(payload(tmp_path / "p.zip", "one"), None) == ["zipimport", "one", str(tmp_path / "p.zip" / "probe.py")]
    env = ansible_env()
    assert env["PYTHONPATH"].split(":")[0] == str(BYTECODE) and env["CPUPOOLS_TEST_BYTECODE"]
