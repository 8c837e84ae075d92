"""The package's floors (plugins/module_utils/cpupools/__init__.py): what each sub-package may import.

Read from the sources, every import statement including those inside
functions (a lazy import is still an arrow of the graph). A new sub-package
must be given its place here before it can exist.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "plugins" / "module_utils" / "cpupools"

#: Sub-package -> the sub-packages it may import (besides itself). Floors 0-5.
ALLOWED = {
    "core": set(),
    "hardware": {"core"},
    "node": {"core", "hardware"},
    "planning": {"core", "hardware", "node"},
    "cluster": {"core", "hardware", "node", "planning"},
    "report": {"core", "hardware", "node", "planning"},
    "agent": {"core", "hardware", "node", "cluster"},
}
#: Imports outside the standard library, by sub-package: the report renders its page on the
#: controller, where Ansible brings Jinja2 (imported in the one function that renders).
THIRD_PARTY = {"report": {"jinja2"}}


def modules() -> dict[str, ast.Module]:
    """``'<sub>.<module>'`` -> its syntax tree, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return found


def imports(name: str, tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, target)`` of each import of the package by ``name``; a target is ``'<sub>.<module>'`` or ``'<sub>'``."""
    here = name.split(".")[:-1]  # the module's package, relative to cpupools (an __init__'s is its own)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            assert node.level - 1 <= len(here), f"{name}:{node.lineno}: import above the package"
            prefix = [*base, *(node.module.split(".") if node.module else [])]
            if node.module:
                out.append((node.lineno, ".".join(prefix)))
            else:
                out.extend((node.lineno, ".".join([*prefix, alias.name])) for alias in node.names)
    return out


def test_every_module_is_in_a_sub_package_with_a_place():
    tree = modules()
    top = sorted(n for n in tree if "." not in n and n != "__init__")
    assert not top, f"modules outside a sub-package: {top} (put each where its imports say it belongs)"
    subs = {n.split(".")[0] for n in tree if "." in n}
    assert subs == set(ALLOWED), f"sub-packages without a place in ALLOWED, or gone: {subs ^ set(ALLOWED)}"


def test_lower_floors_never_import_higher_ones():
    wrong = []
    for name, tree in modules().items():
        if "." not in name:
            continue
        sub = name.split(".")[0]
        for line, target in imports(name, tree):
            other = target.split(".")[0]
            if other != sub and other not in ALLOWED[sub]:
                wrong.append(f"{name}:{line} imports {target} ({sub} may import {sorted(ALLOWED[sub]) or 'nothing'})")
    assert not wrong, "\n".join(wrong)


def test_init_files_import_nothing():
    """Importing one module loads only its own imports: the agent's zipapp is exactly that closure."""
    for name, tree in modules().items():
        if name.endswith("__init__"):
            body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            assert not body, f"{name}.py holds more than its docstring"
            assert ast.get_docstring(tree), f"{name}.py has no docstring saying what it owns"


def test_standard_library_only_and_relative():
    """The package runs on the node's python3 and as the zipapp's top-level ``cpupools``: nothing else.

    (The report's page, rendered on the controller, is the one exception: THIRD_PARTY.)
    """
    wrong = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [node.module.split(".")[0]]
            else:
                continue
            extra = THIRD_PARTY.get(name.split(".")[0], set())
            wrong += [f"{name}:{node.lineno} imports {r}" for r in roots if r not in sys.stdlib_module_names | extra]
    assert not wrong, "\n".join(wrong)


def test_the_module_graph_has_no_cycle():
    """Within a floor too: the import-time graph (imports at module level) is acyclic."""
    tree = modules()
    graph = {}
    for name, module in tree.items():
        top_level = ast.Module(body=[n for n in module.body if isinstance(n, ast.ImportFrom)], type_ignores=[])
        graph[name] = {t for _, t in imports(name, top_level) if t in tree}
    seen: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if seen.get(name) == 2:
            return
        if seen.get(name) == 1:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(name) :], name]))
        seen[name] = 1
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        seen[name] = 2

    for name in sorted(graph):
        visit(name, [])
