#!/usr/bin/env python3
"""Build the ``cmk`` node agent: a zipapp of module_utils/cpupools, byte-identical on every build.

Usage: ``python3 scripts/build_agent.py [OUTPUT]`` (default ``build/cmk``).
Prints ``<sha256>  <OUTPUT>``; rewrites OUTPUT only when its bytes differ, so
an unchanged build keeps its mtime.

Determinism: files in sorted order, a fixed timestamp (1980-01-01), fixed
permissions, no compression. Each module is stored as source and as an
unchecked hash-based ``.pyc`` of the building Python, so the node imports
without compiling; on a node whose python3 has another bytecode version,
zipimport ignores the ``.pyc`` and compiles the source (slower start, same
behaviour).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import sys
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.join(REPO, "module_utils", "cpupools")
SHEBANG = b"#!/usr/bin/env python3\n"
EPOCH = (1980, 1, 1, 0, 0, 0)
MAIN = (
    '"""cmk: the cpupools node agent (built by scripts/build_agent.py)."""\n'
    "import sys\n\n"
    "from cpupools.agent import main\n\n"
    "sys.exit(main())\n"
)


def _entry(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3
    info.external_attr = 0o100644 << 16
    zf.writestr(info, data)


def _pyc(name: str, source: bytes) -> bytes:
    code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))


def build() -> bytes:
    """The zipapp bytes: shebang + zip of ``__main__`` and the ``cpupools`` package."""
    files = {"__main__.py": MAIN.encode()}
    for name in sorted(os.listdir(PACKAGE_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE_DIR, name), "rb") as handle:
                files[f"cpupools/{name}"] = handle.read()
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(files):
            _entry(zf, name, files[name])
            _entry(zf, name + "c", _pyc(name, files[name]))
    return buf.getvalue()


def main(argv: list[str]) -> int:
    output = argv[1] if len(argv) > 1 else os.path.join(REPO, "build", "cmk")
    data = build()
    try:
        with open(output, "rb") as handle:
            same = handle.read() == data
    except FileNotFoundError:
        same = False
    if not same:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        tmp = f"{output}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, output)
    print(f"{hashlib.sha256(data).hexdigest()}  {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
