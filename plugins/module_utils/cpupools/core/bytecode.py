"""A bytecode cache for this package when a module's payload carries it.

Ansible sends a module to the node as a zip of source files (AnsiballZ), which
Python imports with ``zipimport``: it has no ``__pycache__`` to write, so every
module run compiles every file of the package it imports, and compiles it twice
(zipimport's ``find_spec`` asks its ``get_filename``, which compiles the module
to learn its path; ``exec_module`` compiles it again). For the converged check
that was 0.14 of its 0.46 CPU-seconds (on a node under qemu's emulation,
seconds), paid by every host on every run. The node agent's zipapp carries its
``.pyc`` already (scripts/build_agent.py) and does not use this.

:func:`install` puts a finder in front of the import system for this package's
sub-modules only. It keeps the import Ansible's zip makes (the same spec, file
names and package paths) and changes where the code object comes from: a file
named by the module, the interpreter's cache tag and the SHA-256 of the magic
number and the source, in a per-user cache directory, written on first use
(atomically) and checked against that digest on every read. A source that
changed, another Python, a damaged or missing entry: the source is compiled,
as without the cache. Entries of older sources of the same module are removed
when a new one is written, so the directory holds one entry per module and
Python version.

Where the cache lives: ``$CPUPOOLS_BYTECODE_CACHE`` if set (``off`` turns it
off), else ``$XDG_CACHE_HOME/cpupools/bytecode``, else
``~/.cache/cpupools/bytecode`` of the user the module runs as (beside
Ansible's own ``~/.ansible/tmp``). Loading code from a file is running it, so
the directory is used only when nobody else can write there: it must be a
real directory (not a symbolic link) owned by the module's user, writable by
nobody else, in a parent that only that user or root can write (or a sticky
one). A file in it must be a regular file of the same owner. Anything else,
or any error reading or writing, and the module compiles its source as it
would without the cache: the cache can make a run faster, never different.

It is not the node's state: check mode writes it too (as Python writes
``__pycache__``), no task reports it, and it can be deleted at any time.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import stat
import sys

#: The environment variable naming the cache directory; its value ``off`` turns the cache off.
ENV = "CPUPOOLS_BYTECODE_CACHE"
_HEADER = b"cpupools-bytecode-1\n"


def cache_dir(environ=None) -> str | None:
    """The directory to use, or None when the cache is off or no safe one exists."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(ENV, "")
    if chosen == "off":
        return None
    if not chosen:
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        if not os.path.isabs(base):
            return None
        chosen = os.path.join(base, "cpupools", "bytecode")
    try:
        os.makedirs(chosen, 0o700, exist_ok=True)
    except OSError:
        return None
    return chosen if _trusted(chosen) else None


def _trusted(path: str) -> bool:
    """Only this user may write the directory or replace it."""
    uid = os.geteuid()
    try:
        own = os.lstat(path)
        parent = os.lstat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    if not stat.S_ISDIR(own.st_mode) or own.st_uid != uid or own.st_mode & 0o022:
        return False
    return parent.st_uid in (0, uid) and (not parent.st_mode & 0o022 or bool(parent.st_mode & stat.S_ISVTX))


def _digest(source: bytes) -> str:
    from importlib.util import MAGIC_NUMBER

    return hashlib.sha256(MAGIC_NUMBER + source).hexdigest()


def _read(path: str, digest: str):
    """The code object stored for ``digest``, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    head = _HEADER + digest.encode() + b"\n"
    if not data.startswith(head):
        return None
    try:
        return marshal.loads(data[len(head) :])
    except (EOFError, ValueError, TypeError):
        return None


def _write(directory: str, name: str, path: str, digest: str, code) -> None:
    """Store ``code`` at ``path`` atomically and drop the entries of the module's older sources."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_HEADER + digest.encode() + b"\n" + marshal.dumps(code))
        os.replace(tmp, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    keep = os.path.basename(path)
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        # This module's entries for other sources, and what a write killed before its rename left.
        if (entry.startswith(name) and entry != keep) or (entry.startswith(".tmp-") and _stale(directory, entry)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def _stale(directory: str, entry: str) -> bool:
    import time

    try:
        return time.time() - os.lstat(os.path.join(directory, entry)).st_mtime > 600
    except OSError:
        return False


class _Loader:
    """One module of the package in Ansible's zip: its source read once, its code from the cache when it can be."""

    def __init__(self, archive, origin: str, source: bytes, directory: str | None, short: str):
        self._archive = archive  # the zipimporter of the directory the module is in
        self._origin = origin
        self._source = source
        self._directory = directory
        self._short = short

    def __getattr__(self, attribute):  # is_package, get_resource_reader, ...: the zip's own answers
        return getattr(self._archive, attribute)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(self.get_code(module.__name__), module.__dict__)

    def get_filename(self, fullname: str) -> str:
        return self._origin

    def get_source(self, fullname: str) -> str:
        return self._source.decode("utf-8")

    def get_code(self, fullname: str):
        if self._directory is None:
            return compile(self._source, self._origin, "exec", dont_inherit=True)
        digest = _digest(self._source)
        name = f"{self._short}.{sys.implementation.cache_tag}."
        path = os.path.join(self._directory, f"{name}{digest[:32]}.bin")
        code = _read(path, digest)
        if code is None:
            code = compile(self._source, self._origin, "exec", dont_inherit=True)
            _write(self._directory, name, path, digest, code)
        else:
            _fix_filename(code, self._origin)
        return code


def _fix_filename(code, filename: str) -> None:
    """Name the payload this run extracted in tracebacks (the stored code names the one it was compiled from)."""
    import _imp

    fix = getattr(_imp, "_fix_co_filename", None)  # what importlib's own source loader calls
    if fix is not None:
        fix(code, filename)


class _Finder:
    """The package's modules in Ansible's zip, found without zipimport's own spec.

    zipimport's ``find_spec`` asks its ``get_filename``, which compiles the module to learn its path,
    and its ``exec_module`` compiles it again: every module of a payload is compiled twice.
    """

    def __init__(self, package: str, directory: str | None):
        self._prefix = package + "."
        self.directory = directory

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self._prefix) or not path:
            return None
        from importlib.machinery import ModuleSpec

        tail = fullname.rpartition(".")[2]
        for entry in path:
            archive = _archive(entry)
            if archive is None:
                continue
            for relative, package in ((f"{tail}/__init__.py", True), (f"{tail}.py", False)):
                origin = f"{entry}/{relative}"
                try:
                    source = archive.get_data(origin)
                except OSError:
                    continue
                loader = _Loader(archive, origin, source, self.directory, fullname[len(self._prefix) :])
                spec = ModuleSpec(fullname, loader, origin=origin, is_package=package)
                spec.has_location = True
                if package:
                    spec.submodule_search_locations = [f"{entry}/{tail}"]
                return spec
        return None  # not in a zip: the import system's own finders


def _archive(entry: str):
    """The zipimporter of a package directory inside a zip, or None for anything else."""
    importer = sys.path_importer_cache.get(entry)
    if importer is None:
        import zipimport

        try:
            importer = zipimport.zipimporter(entry)
        except (ImportError, OSError):
            return None
        sys.path_importer_cache[entry] = importer
    return importer if type(importer).__name__ == "zipimporter" else None


def install(package: str) -> str | None:
    """Import ``package``'s sub-modules through the cache from now on: its directory, None when it is off.

    Off, or with no safe directory, each module is still compiled once instead of zipimport's twice.
    """
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return finder.directory
    directory = cache_dir()
    sys.meta_path.insert(0, _Finder(package, directory))
    return directory
