"""nodecode: when the plan play's module may run the node's compiled copy of the package."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest
from cpupools.node import nodecode
from helpers import REPO

PACKAGE = REPO / "plugins" / "module_utils" / "cpupools"


def build_for(pyz: bytes) -> dict:
    return {"stale": False, "pyz_sha256": hashlib.sha256(pyz).hexdigest(), "launcher_sha256": "0" * 64}


def test_the_nodes_copy_is_used_only_when_it_is_the_build(tmp_path):
    pyz = tmp_path / "opt/bin/cmk.pyz"
    pyz.parent.mkdir(parents=True)
    pyz.write_bytes(b"the build")
    raw = {"cpupools_root": str(tmp_path)}
    assert nodecode.installed_build(raw, build_for(b"the build")) == str(pyz)
    assert nodecode.installed_build(raw, build_for(b"another build")) is None
    assert nodecode.installed_build(raw, None) is None  # no build this run (it failed, or was not asked for)
    moved = {"cpupools_root": str(tmp_path), "cpupools_agent_path": "/usr/local/bin/cmk"}
    assert nodecode.installed_build(moved, build_for(b"the build")) is None  # no file there
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin/cmk.pyz").write_bytes(b"the build")
    assert nodecode.installed_build(moved, build_for(b"the build")) == str(tmp_path / "usr/local/bin/cmk.pyz")


@pytest.mark.parametrize(
    "raw",
    [
        {"cpupools_root": 5},
        {"cpupools_root": ""},
        {"cpupools_root": None},
        {"cpupools_agent_path": "opt/bin/cmk"},
        {"cpupools_agent_path": ["/opt/bin/cmk"]},
        {"cpupools_root": "/nonexistent\x00"},
    ],
    ids=repr,
)
def test_a_value_that_is_no_usable_path_means_not_found(raw):
    # The inputs are not checked yet when this runs: the chosen code refuses them by name afterwards.
    assert nodecode.installed_build(raw, build_for(b"x")) is None


def test_a_directory_in_place_of_the_file_means_not_found(tmp_path):
    (tmp_path / "opt/bin/cmk.pyz").mkdir(parents=True)
    assert nodecode.installed_build({"cpupools_root": str(tmp_path)}, build_for(b"x")) is None


def _uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(f"assert at line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id == "__debug__":
            found.append(f"__debug__ at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == "__doc__":
            found.append(f"__doc__ at line {node.lineno}")
    return found


def test_the_package_behaves_the_same_compiled_with_optimize_2():
    """cmk.pyz holds optimize=2 bytecode (no asserts, no docstrings), and the plan play's check may run it."""
    found = {path.name: uses for path in sorted(PACKAGE.glob("*.py")) if (uses := _uses(ast.parse(path.read_text())))}
    assert not found, found
    # The scan itself sees what it looks for.
    assert _uses(ast.parse("assert x\nif __debug__: pass\ny = f.__doc__\n")) == [
        "assert at line 1",
        "__debug__ at line 2",
        "__doc__ at line 3",
    ]


def test_nodecode_imports_nothing_of_the_package():
    """The module imports it before it knows which copy of the package to use."""
    tree = ast.parse(Path(nodecode.__file__).read_text())
    relative = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == []
