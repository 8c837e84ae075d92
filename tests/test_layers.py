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
sys.path.insert(0, str(REPO / "scripts"))
try:
    import build_agent
finally:
    sys.path.pop(0)

#: Sub-package -> the sub-packages it may import (besides itself). Floors 0-5.
ALLOWED = {
    "core": set(),
    "hardware": {"core"},
    "node": {"core", "hardware"},
    "planning": {"core", "hardware", "node"},
    "verify": {"core", "hardware", "node"},
    "cluster": {"core", "hardware", "node", "planning"},
    "report": {"core", "hardware", "node", "planning"},
    "agent": {"core", "hardware", "node", "cluster"},
}
#: Imports outside the standard library, by sub-package: the report renders its page on the
#: controller, where Ansible brings Jinja2 (imported in the one function that renders).
THIRD_PARTY = {"report": {"jinja2"}}


def modules() -> dict[tuple[str, ...], Path]:
    """``('<sub>', '<module>')`` (``('<sub>',)`` for its ``__init__``) -> its file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[parts[:-1] if parts[-1] == "__init__" else parts] = path
    return found


def imports(parts: tuple[str, ...], path: Path, everywhere: bool = True) -> list[tuple[str, ...]]:
    """What the module imports of the package, read as the agent's build reads it (scripts/build_agent.py)."""
    return build_agent.imported(parts, str(path), everywhere)


def show(parts: tuple[str, ...]) -> str:
    return ".".join(parts) or "cpupools"


def test_every_module_is_in_a_sub_package_with_a_place():
    found = modules()
    top = sorted(show(p) for p in found if len(p) == 1 and found[p].name != "__init__.py")
    assert not top, f"modules outside a sub-package: {top} (put each where its imports say it belongs)"
    subs = {p[0] for p in found if (p and found[p].name == "__init__.py") or len(p) > 1}
    assert subs == set(ALLOWED), f"sub-packages without a place in ALLOWED, or gone: {subs ^ set(ALLOWED)}"


def test_lower_floors_never_import_higher_ones():
    wrong = []
    for parts, path in modules().items():
        if not parts:
            continue
        sub = parts[0]
        for target in imports(parts, path):
            if target and target[0] != sub and target[0] not in ALLOWED[sub]:
                allowed = sorted(ALLOWED[sub]) or "nothing"
                wrong.append(f"{show(parts)} imports {show(target)} ({sub} may import {allowed})")
    assert not wrong, "\n".join(wrong)


def test_init_files_import_nothing():
    """Importing one module loads only its own imports: the agent's zipapp is exactly that closure.

    One exception, in the package's own ``__init__``: inside a module's payload from Ansible it
    installs the bytecode cache (core/bytecode.py), under a condition the agent's zipapp never meets.
    """
    for parts, path in modules().items():
        if path.name == "__init__.py":
            tree = ast.parse(path.read_text(), str(path))
            body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if parts == () and len(body) == 1 and isinstance(body[0], ast.If):
                guard = ast.unparse(body[0].test)
                assert guard.startswith(build_agent.ANSIBLE_PAYLOAD_GUARD), guard
                assert imports(parts, path) and not build_agent.imported(parts, str(path), in_payload=False)
                assert set(imports(parts, path)) == {("core",), ("core", "bytecode")}, imports(parts, path)
                continue
            assert not body, f"{show(parts)}/__init__.py holds more than its docstring"
            assert ast.get_docstring(tree), f"{show(parts)}/__init__.py has no docstring saying what it owns"


def test_standard_library_only_and_relative():
    """The package runs on the node's python3 and as the zipapp's top-level ``cpupools``: nothing else.

    (The report's page, rendered on the controller, is the one exception: THIRD_PARTY.)
    """
    wrong = []
    for parts, path in modules().items():
        known = sys.stdlib_module_names | (THIRD_PARTY.get(parts[0], set()) if parts else set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [node.module.split(".")[0]]
            else:
                continue
            wrong += [f"{show(parts)}:{node.lineno} imports {r}" for r in roots if r not in known]
    assert not wrong, "\n".join(wrong)


def test_the_module_graph_has_no_cycle():
    """Within a floor too: the import-time graph (imports at module level) is acyclic."""
    found = modules()
    graph = {parts: set(imports(parts, path, everywhere=False)) & set(found) for parts, path in found.items()}
    seen: dict[tuple[str, ...], int] = {}

    def visit(parts: tuple[str, ...], trail: list[tuple[str, ...]]) -> None:
        if seen.get(parts) == 2:
            return
        if seen.get(parts) == 1:
            cycle = [*trail[trail.index(parts) :], parts]
            pytest.fail("import cycle: " + " -> ".join(show(p) for p in cycle))
        seen[parts] = 1
        for target in sorted(graph[parts]):
            visit(target, [*trail, parts])
        seen[parts] = 2

    for parts in sorted(graph):
        visit(parts, [])
