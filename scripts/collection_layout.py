#!/usr/bin/env python3
"""Bring files written for the old layout into the collection layout, mechanically.

Until the collection commit, modules lived in ``library/``, the shared code in
``module_utils/`` and the documentation fragment in ``doc_fragments/``, and
modules imported ``ansible.module_utils.cpupools``. A branch made before that
commit adds files at the old places and with the old imports; after merging it,
run::

    python3 scripts/collection_layout.py          # rewrite and move
    python3 scripts/collection_layout.py --check  # only list what it would do; exit 1 if anything

What it does, and nothing else (idempotent: a second run does nothing):

1. moves ``library/*.py`` to ``plugins/modules/``, ``module_utils/**`` to
   ``plugins/module_utils/`` and ``doc_fragments/*.py`` to
   ``plugins/doc_fragments/`` (``git mv`` inside a git work tree);
2. in ``plugins/modules/*.py`` and ``plugins/module_utils/*.py``: the import
   prefix ``ansible.module_utils.cpupools`` becomes the collection's
   ``ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools`` (this
   also covers ``cpupools_kube``), the documentation fragment
   ``cpupools_kube`` becomes ``cpupools.cpupools.cpupools_kube``, and the tasks
   of EXAMPLES call the modules by FQCN (``cpupools.cpupools.cpupools_<name>:``),
   as users outside the collection must;
3. in Python files outside ``plugins/`` (tests, bench, scripts): the path
   pieces ``"module_utils"`` and ``"library"`` joined onto the repository root
   (``REPO / "module_utils"``, ``os.path.join(HERE, "..", "module_utils")``)
   gain their ``"plugins"`` parent (``"library"`` becomes ``"modules"``);
4. in YAML, shell, Markdown and Jinja2 template (``.j2``) files: the paths ``module_utils/cpupools``,
   ``library/*.py`` and ``library/cpupools_<name>.py`` get their ``plugins/``
   parent (``library/`` becoming ``plugins/modules/``).

``plugins/module_utils/cpupools/`` itself is never rewritten: it imports only
the standard library and itself (relatively), so that the node agent zipapp
runs it as the top-level package ``cpupools``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE = "cpupools"
NAME = "cpupools"
COLLECTION_UTILS = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils"
MOVES = (
    ("library", "plugins/modules"),
    ("module_utils", "plugins/module_utils"),
    ("doc_fragments", "plugins/doc_fragments"),
)
# Files that spell the old layout on purpose (to describe or test the conversion).
OLD_ON_PURPOSE = ("scripts/collection_layout.py", "tests/collection/test_collection.py", "docs/collection.md")
SKIP_DIRS = {".git", ".venv", "sandbox", "build", ".ansible", "collections", "__pycache__", "reports", ".ruff_cache"}

# 2. module imports and the documentation fragment
IMPORT_RE = re.compile(r"\bansible\.module_utils\.(cpupools\w*)")
FRAGMENT_RE = re.compile(r"^(\s*(?:-\s+|extends_documentation_fragment:\s+))cpupools_kube\s*$", re.MULTILINE)
# 2b. the module key of each task in EXAMPLES (task keys sit two spaces in, under `- name:`)
EXAMPLES_RE = re.compile(r'^(EXAMPLES = r?""")(.*?)(""")', re.MULTILINE | re.DOTALL)
EXAMPLE_TASK_RE = re.compile(r"^(  )(cpupools_\w+):[ \t]*$", re.MULTILINE)
# 3. path pieces in Python: `/ "module_utils"` or `, "module_utils"` not already after "plugins"
PY_PATH_RE = re.compile(r"""(?P<before>["']?)(?P<sep>\s*(?:/|,)\s*)(?P<q>["'])(?P<dir>module_utils|library)(?P=q)""")
# 4. path tails in YAML and shell
TEXT_PATH_RE = re.compile(r"(?<![\w/])(/?)(module_utils/cpupools|library/(?:\*|cpupools_\w+)\.py)")


def _rewrite_examples(block: re.Match[str]) -> str:
    body = EXAMPLE_TASK_RE.sub(lambda m: f"{m.group(1)}{NAMESPACE}.{NAME}.{m.group(2)}:", block.group(2))
    return f"{block.group(1)}{body}{block.group(3)}"


def _rewrite_module(text: str) -> str:
    text = IMPORT_RE.sub(lambda m: f"{COLLECTION_UTILS}.{m.group(1)}", text)
    text = EXAMPLES_RE.sub(_rewrite_examples, text)
    return FRAGMENT_RE.sub(lambda m: f"{m.group(1)}{NAMESPACE}.{NAME}.cpupools_kube", text)


def _rewrite_py_paths(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        # Already "plugins" / "module_utils": the token before the separator is "plugins".
        head = text[: m.start("sep")]
        if re.search(r"""["']plugins["']\s*$""", head):
            return m.group(0)
        q = m.group("q")
        new = "modules" if m.group("dir") == "library" else "module_utils"
        joiner = m.group("sep")
        return f"{m.group('before')}{joiner}{q}plugins{q}{joiner}{q}{new}{q}"

    return PY_PATH_RE.sub(repl, text)


def _rewrite_text_paths(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        tail = m.group(2).replace("library/", "modules/")
        return f"{m.group(1)}plugins/{tail}"

    return TEXT_PATH_RE.sub(repl, text)


def _files(top: str):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield os.path.join(dirpath, name)


def _in_git(root: str) -> bool:
    return os.path.isdir(os.path.join(root, ".git")) or os.path.isfile(os.path.join(root, ".git"))


def plan_moves(root: str) -> list[tuple[str, str]]:
    moves = []
    for old, new in MOVES:
        old_dir = os.path.join(root, old)
        if not os.path.isdir(old_dir) or os.path.islink(old_dir):
            continue
        for path in _files(old_dir):
            rel = os.path.relpath(path, old_dir)
            moves.append((path, os.path.join(root, new, rel)))
    return moves


def plan_rewrites(root: str) -> list[tuple[str, str]]:
    """(path, new text) of every file whose text changes."""
    out = []
    for path in _files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if rel.startswith(("plugins/module_utils/cpupools/", "module_utils/cpupools/")):
            continue
        if rel in OLD_ON_PURPOSE:
            continue
        if rel.startswith(("plugins/", "library/", "module_utils/", "doc_fragments/")) and rel.endswith(".py"):
            rewrite = _rewrite_module
        elif rel.endswith(".py"):
            rewrite = _rewrite_py_paths
        elif rel.endswith((".yml", ".yaml", ".sh", ".cfg", ".md", ".j2")) or rel in (".ci/run",):
            rewrite = _rewrite_text_paths
        else:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        new = rewrite(text)
        if new != text:
            out.append((path, new))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when something would change")
    parser.add_argument("--root", default=REPO, help="repository root (default: this script's repository)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)

    moves = plan_moves(root)
    for old, new in moves:
        print(f"move     {os.path.relpath(old, root)} -> {os.path.relpath(new, root)}")
        if args.check:
            continue
        os.makedirs(os.path.dirname(new), exist_ok=True)
        if os.path.exists(new):
            print(f"collection_layout: {os.path.relpath(new, root)} exists; merge it by hand", file=sys.stderr)
            return 2
        if _in_git(root):
            subprocess.run(["git", "-C", root, "mv", old, new], check=True)
        else:
            os.rename(old, new)
    if moves and not args.check:
        for old, _new in MOVES:
            old_dir = os.path.join(root, old)
            # What is left after the moves is bytecode only.
            if os.path.isdir(old_dir) and not any(True for _path in _files(old_dir)):
                shutil.rmtree(old_dir)

    # In check mode the moves have not happened: rewrite as if they had by
    # reading the files where they are now.
    rewrites = plan_rewrites(root)
    for path, text in rewrites:
        print(f"rewrite  {os.path.relpath(path, root)}")
        if args.check:
            continue
        tmp = path + ".collection_layout.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    if args.check:
        return 1 if moves or rewrites else 0
    # The longer import lines may pass the line length: let the formatter wrap them.
    ruff = os.path.join(root, ".venv", "bin", "ruff")
    changed_py = [path for path, _text in rewrites if path.endswith(".py")]
    if changed_py and os.path.exists(ruff):
        subprocess.run([ruff, "format", "--quiet", *changed_py], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
