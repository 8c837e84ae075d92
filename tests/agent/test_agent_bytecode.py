"""The agent's bytecode: cmk.pyz is compiled with optimize=2, so its code must not need what that drops."""

from __future__ import annotations

import ast

from helpers import REPO

PACKAGE = REPO / "plugins" / "module_utils" / "cpupools"


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
    """cmk.pyz holds optimize=2 bytecode (no asserts, no docstrings)."""
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := _uses(ast.parse(path.read_text())))
    }
    assert not found, found
    # The scan itself sees what it looks for.
    assert _uses(ast.parse("assert x\nif __debug__: pass\ny = f.__doc__\n")) == [
        "assert at line 1",
        "__debug__ at line 2",
        "__doc__ at line 3",
    ]
