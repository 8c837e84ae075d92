#!/usr/bin/env python3
"""Build the ``cmk`` node agent: a zipapp of its own import closure, byte-identical on every build.

Usage: ``python3 scripts/build_agent.py [--shebang=LINE] [--python=PATH ...] [--check [--stage=DIR]] [OUTPUT]``
(default ``build/cmk``).
Writes two files: ``OUTPUT.pyz``, the zipapp (runnable by itself:
``python3 cmk.pyz isolate ...``), and ``OUTPUT``, a few-line launcher that
imports the agent from the ``.pyz`` beside it. The launcher exists for start-up
time: Python runs a zipapp through ``runpy``, whose imports cost ~5 ms on every
``cmk isolate``; importing from the zip directly costs nothing extra.

The launcher is read by two languages. Its second line,
``"exec" "python3" "-IS" "$0" "$@"``, is for a shell the command
``exec python3 -IS <launcher> ARGS`` and for Python a string statement that
does nothing. ``--shebang`` sets the interpreter line (default ``/bin/sh``):
with a shell (busybox's too) ``cmk`` runs on the first ``python3`` of the
workload's ``PATH``, isolated (``-I``: no ``PYTHON*`` variables, no user
site-packages) and without ``site`` (``-S``: no .pth files, no
sitecustomize, about 2 ms at every start); with a Python interpreter line
(``/usr/bin/env python3``, ``/usr/bin/python3 -IS``, for an image without
``/bin/sh``) Python runs the launcher itself.
Prints ``<sha256>  <path>  written|unchanged`` for both; rewrites a file only when its bytes
differ, so an unchanged build keeps its mtime.

``--check`` writes nothing at OUTPUT: it builds in memory and prints
``would be written`` or ``unchanged``, exactly as the real build would decide
(Ansible's check mode runs it, so ``--check`` on a fresh checkout creates no
``build/``). ``--stage=DIR`` (with ``--check``) writes the two files into DIR
instead, a temporary directory, so the copy task can compare them with the
node's files and predict its own change.

What goes in: ``cpupools/agent/agent.py`` and every module of the package it
imports, directly or through another, at module level or inside a function
(``reconcile`` imports the report and Kubernetes code only when it runs),
with the ``__init__.py`` of each package on the way: read from every import
statement of the sources with ``ast``, not listed by hand. Nothing else of
module_utils/cpupools (the planner, the report, the controller's Kubernetes
code) reaches a node. A relative import that names no module of the package
fails the build.

Determinism: files in sorted order, a fixed timestamp (1980-01-01), fixed
permissions, no compression. Each module is stored as source; its bytecode
(``optimize=2``, and a ``from __future__`` import compiled as its flag, so
that importing the module does not import ``__future__``) is in one member
per Python version, ``cpupools-bytecode/<cache tag>`` (``PRELOAD``): the
launcher reads that member once and imports every module from it, without
zipimport's per-module work (``cmk isolate`` starts about 1.3 ms sooner). This
Python's version is always there; each ``--python=PATH`` (repeatable:
``cpupools_agent_bytecode_pythons``), an interpreter on this machine, adds
its own version's. A Python of a version the build does not carry compiles
every source at every start (zipimport has nowhere to keep the result: 45 ms
instead of 12 for ``cmk --help``, a build by Python 3.13 run by 3.11). The
bytecode is the same for a fresh interpreter of one Python version; run
inside a process that has imported other code (an Ansible worker),
``marshal`` may write it otherwise, because it depends on the reference
counts of interned constants: run this script on its own.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import marshal
import os
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.join(REPO, "plugins", "module_utils", "cpupools")
#: The agent's entry module, relative to the package.
ENTRY = ("agent", "agent")
SHEBANG = b"#!/usr/bin/env python3\n"
EPOCH = (1980, 1, 1, 0, 0, 0)
DEFAULT_SHEBANG = "/bin/sh"
#: The agent's modules, served from one read of their bytecode: ``cpupools-bytecode/<cache tag>`` in the
#: zip, one marshalled dict per Python version the build carries: module name -> (its source's path in
#: the zip, its code, marshalled), and under ``""`` the code of ``PRELOAD`` below, compiled by that
#: Python like the modules. zipimport's way costs each module ~0.2 ms of pure-Python work (its path
#: hooks, a zipimporter per package, an open and a read of the archive per module): without it
#: ``cmk isolate`` starts ~1.3 ms sooner. ``PRELOAD`` runs with ``found`` (the dict) and ``zipapp`` (the
#: path of cmk.pyz) and puts a finder of those modules first on ``sys.meta_path``; the launcher
#: (``LOAD``) runs it, compiled, and so pays no compile for it at each start. A Python whose version
#: the build does not carry finds no member and imports the sources from the zip (compiled each time).
PRELOAD = """\
import marshal
import sys
import zipimport
from _frozen_importlib import ModuleSpec  # importlib.machinery's, without importing importlib


class Bytecode:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in found:
            return None
        where = found[name][0]
        package = where.endswith("/__init__.py")
        spec = ModuleSpec(name, Bytecode, origin=zipapp + "/" + where, is_package=package)
        spec.has_location = True
        if package:
            spec.submodule_search_locations.append(zipapp + "/" + where.rpartition("/")[0])
        return spec

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        exec(marshal.loads(found[module.__name__][1]), module.__dict__)

    @staticmethod
    def get_source(name):  # the lines of a traceback
        return zipimport.zipimporter(zipapp).get_data(found[name][0]).decode()


sys.meta_path.insert(0, Bytecode)
"""
#: The name ``PRELOAD`` is compiled under (it is not a file of the zip).
PRELOAD_NAME = "cpupools-bytecode.py"
#: What the launcher and ``__main__`` run before importing the agent, with ``ZIPAPP`` set.
LOAD = (
    "try:  # this Python's bytecode of the agent, in one read (scripts/build_agent.py: PRELOAD)\n"
    "    import marshal\n"
    "    import zipimport\n\n"
    '    found = zipimport.zipimporter(ZIPAPP).get_data("cpupools-bytecode/" + (sys.implementation.cache_tag or "-"))\n'
    "    found = marshal.loads(found)\n"
    '    exec(marshal.loads(found.pop("")[1]), {"found": found, "zipapp": ZIPAPP})\n'
    "except (OSError, ImportError):  # none for this version (or no _frozen_importlib): the sources\n"
    "    pass\n"
)
LAUNCHER = (
    "#!{shebang}\n"
    '"exec" "python3" "-IS" "$0" "$@"\n'
    '"""cmk: the cpupools node agent. The code is in cmk.pyz beside this file."""\n'
    "import os\n"
    "import sys\n\n"
    'ZIPAPP = os.path.realpath(__file__) + ".pyz"\n'
    "sys.path.insert(0, ZIPAPP)\n" + LOAD.replace("{", "{{").replace("}", "}}") + "try:\n"
    "    from cpupools.agent.agent import leave, main\n"
    "except ImportError as exc:\n"
    '    sys.stderr.write(f"cmk: cannot load {{ZIPAPP}}: {{exc}}\\n")\n'
    "    sys.exit(70)\n"
    "leave(main())\n"
)
MAIN = (
    '"""cmk: the cpupools node agent (built by scripts/build_agent.py)."""\n'
    "import sys\n\n"
    "# Run as python3 cmk.pyz (the housekeeper's unit): the modules from this Python's bytecode, as in the launcher.\n"
    "ZIPAPP = sys.path[0]\n" + LOAD + "from cpupools.agent.agent import leave, main  # noqa: E402\n\n"
    "leave(main())\n"
)


def _entry(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3
    info.external_attr = 0o100644 << 16
    zf.writestr(info, data)


#: How one module's ``.pyc`` is made, run by this Python and by each ``--python`` (given the sources as
#: JSON on stdin, it prints the interpreter's cache tag and the ``.pyc`` of each, base64, as JSON).
#: optimize=2 drops docstrings (the agent never reads them): smaller pyc, faster unmarshal.
#: A ``from __future__ import`` is compiled as its flag, without the statement: as a statement
#: it also imports the module ``__future__`` at run time, the only module of the stdlib's own
#: folder ``cmk isolate`` would import (~0.15 ms). The source keeps it, for another Python.
PYC = """
import __future__, ast, importlib.util
from importlib._bootstrap_external import _code_to_hash_pyc


def pyc(name, source):
    tree = ast.parse(source, name)
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    flags = 0
    for node in future:
        for alias in node.names:
            flags |= getattr(__future__, alias.name).compiler_flag
    tree.body = [n for n in tree.body if n not in future]
    code = compile(tree, name, "exec", flags=flags, dont_inherit=True, optimize=2)
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))
"""
PYC_MAIN = """
import base64, json, sys
sources = json.load(sys.stdin)
out = {name: base64.b64encode(pyc(name, text.encode())).decode() for name, text in sources.items()}
json.dump({"tag": sys.implementation.cache_tag, "pyc": out}, sys.stdout)
"""
_namespace: dict = {}
exec(PYC, _namespace)  # our own text: the one definition this Python and each --python run
_pyc = _namespace["pyc"]


def _other_python(python: str, files: dict[str, bytes]) -> tuple[str, dict[str, bytes]]:
    """``(cache tag, name -> .pyc)`` of ``files`` compiled by the interpreter ``python`` (a fresh one: -IS)."""
    sources = {name: data.decode() for name, data in files.items()}
    try:
        proc = subprocess.run(
            [python, "-IS", "-c", PYC + PYC_MAIN],
            input=json.dumps(sources),
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise BuildError(f"--python={python!r}: {exc.strerror}") from None
    if proc.returncode:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        raise BuildError(f"--python={python!r} cannot compile the agent: {lines[-1]}")
    said = json.loads(proc.stdout)
    return said["tag"], {name: base64.b64decode(data) for name, data in said["pyc"].items()}


class BuildError(Exception):
    """A build that cannot be made as asked (exit status 2, one line on stderr)."""


def _file(parts: tuple[str, ...]) -> str | None:
    """The source of module or package ``parts`` (relative to the package), or None."""
    base = os.path.join(PACKAGE_DIR, *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


#: The condition under which the package's ``__init__`` installs the bytecode cache of a module's payload
#: from Ansible (plugins/module_utils/cpupools/core/bytecode.py): never true in the agent's zipapp.
ANSIBLE_PAYLOAD_GUARD = "__name__.startswith('ansible_collections.')"


def imported(
    parts: tuple[str, ...], path: str, everywhere: bool = True, in_payload: bool = True
) -> list[tuple[str, ...]]:
    """The package's modules that the module ``parts`` (at ``path``) imports.

    Wherever the statement is (``everywhere``: a lazy import is still needed
    when its function runs), or at module level only (what importing the
    module runs at once: tests/test_layers.py's cycle check). The one reader
    of the package's import graph: the closure here, the floors there.
    ``in_payload=False`` leaves out what runs only inside an Ansible module's
    payload (an ``if`` on ``ANSIBLE_PAYLOAD_GUARD``): the zipapp's closure.
    """
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), path)
    here = parts if path.endswith("__init__.py") else parts[:-1]  # the package a relative import starts from
    skipped: set[int] = set()
    if not in_payload:
        for top in tree.body:
            if isinstance(top, ast.If) and ast.unparse(top.test).startswith(ANSIBLE_PAYLOAD_GUARD):
                skipped.update(id(node) for node in ast.walk(top))
    found = []
    for node in ast.walk(tree) if everywhere else tree.body:
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level - 1 > len(here):
                raise SystemExit(f"build_agent.py: {path}:{node.lineno}: relative import above the package")
            base = here[: len(here) - node.level + 1] + tuple(node.module.split(".") if node.module else ())
            if _file(base) is None:
                raise SystemExit(f"build_agent.py: {path}:{node.lineno}: no module {'.'.join(base)} in the package")
            found.append(base)
            # ``from .pkg import name``: a submodule when there is one, else a name of ``pkg``.
            found += [(*base, alias.name) for alias in node.names if _file((*base, alias.name)) is not None]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "cpupools" or n.startswith("cpupools.") for n in names if n):
                raise SystemExit(f"build_agent.py: {path}:{node.lineno}: absolute import of the package")
    return found


def closure() -> list[str]:
    """The agent's import closure: the package's files ``cmk`` may import, relative to PACKAGE_DIR, sorted."""
    seen: dict[tuple[str, ...], str] = {}
    todo = [ENTRY]
    while todo:
        parts = todo.pop()
        # Importing a module runs every package's __init__ on its way down, the top one first.
        for depth in range(len(parts) + 1):
            module = parts[:depth]
            if module not in seen:
                path = _file(module)
                if path is None:
                    raise SystemExit(f"build_agent.py: no module {'.'.join(module) or 'cpupools'} in the package")
                seen[module] = path
                todo += imported(module, path, in_payload=False)
    return sorted(os.path.relpath(path, PACKAGE_DIR).replace(os.sep, "/") for path in seen.values())


def build(pythons: tuple[str, ...] = ()) -> bytes:
    """The zipapp bytes: shebang + zip of ``__main__`` and the agent's closure of the ``cpupools`` package.

    Each module is there as source; its bytecode, this Python's and that of
    each of ``pythons``, is in one member per Python version,
    ``cpupools-bytecode/<cache tag>`` (``PRELOAD``: what the launcher reads).
    Without its version's member, a Python compiles every module's source at
    every start (zipimport has nowhere to keep the result), about four times
    the start of ``cmk isolate``.
    """
    files = {"__main__.py": MAIN.encode()}
    for name in closure():
        with open(os.path.join(PACKAGE_DIR, name), "rb") as handle:
            files["cpupools/" + name] = handle.read()
    modules = {name: data for name, data in files.items() if name != "__main__.py"}
    modules[PRELOAD_NAME] = PRELOAD.encode()
    compiled = {sys.implementation.cache_tag: {name: _pyc(name, data) for name, data in modules.items()}}
    for python in pythons:
        tag, pycs = _other_python(python, modules)
        compiled.setdefault(tag, pycs)
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(files):
            _entry(zf, name, files[name])
        _entry(zf, "__main__.pyc", _pyc("__main__.py", files["__main__.py"]))
        for tag in sorted(compiled):
            _entry(zf, f"cpupools-bytecode/{tag}", _bytecode(compiled[tag]))
    return buf.getvalue()


def _bytecode(pycs: dict[str, bytes]) -> bytes:
    """One Python version's member ``cpupools-bytecode/<tag>``: module name -> (source path, marshalled code).

    Marshal format 2 has no back-references, so the bytes depend on the content
    only (not on reference counts); a ``.pyc``'s header (16 bytes) is left out.
    """
    table = {}
    for name in sorted(pycs):
        module = "" if name == PRELOAD_NAME else name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        table[module] = (name, pycs[name][16:])
    return marshal.dumps(table, 2)


def _install(path: str, data: bytes, check: bool = False, stage: str | None = None) -> None:
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
    except FileNotFoundError:
        same = False
    if check:
        if stage is not None:
            staged = os.path.join(stage, os.path.basename(path))
            with open(staged, "wb") as handle:
                handle.write(data)
            os.chmod(staged, 0o755)
        print(f"{hashlib.sha256(data).hexdigest()}  {path}  {'unchanged' if same else 'would be written'}")
        return
    if not same:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    print(f"{hashlib.sha256(data).hexdigest()}  {path}  {'unchanged' if same else 'written'}")


def main(argv: list[str]) -> int:
    shebang = DEFAULT_SHEBANG
    check = False
    stage = None
    args = []
    pythons: list[str] = []
    for arg in argv[1:]:
        if arg.startswith("--shebang="):
            shebang = arg.partition("=")[2].strip().removeprefix("#!")
        elif arg.startswith("--python="):
            pythons.append(arg.partition("=")[2])
        elif arg == "--check":
            check = True
        elif arg.startswith("--stage="):
            stage = arg.partition("=")[2]
        elif arg in ("-h", "--help"):
            print(__doc__.partition("\n\n")[2].partition("\n\n")[0])
            return 0
        elif arg.startswith("-"):
            # (an option it does not know would otherwise be taken for OUTPUT and written to)
            print(f"build_agent.py: unknown option {arg!r} (--help says which there are)", file=sys.stderr)
            return 2
        else:
            args.append(arg)
    if stage is not None and (not check or not os.path.isdir(stage)):
        print(f"build_agent.py: --stage={stage!r} needs --check and an existing directory", file=sys.stderr)
        return 2
    if not shebang.startswith("/") or "\n" in shebang:
        print(f"build_agent.py: --shebang={shebang!r} must be an absolute interpreter path", file=sys.stderr)
        return 2
    output = args[0] if args else os.path.join(REPO, "build", "cmk")
    try:
        zipapp = build(tuple(pythons))
    except BuildError as exc:
        print(f"build_agent.py: {exc}", file=sys.stderr)
        return 2
    _install(output + ".pyz", zipapp, check, stage)
    _install(output, LAUNCHER.format(shebang=shebang).encode(), check, stage)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
