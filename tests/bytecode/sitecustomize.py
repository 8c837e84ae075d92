"""The tests' bytecode cache for what Python compiles from a zip (Ansible's AnsiballZ payloads).

Loaded by every Python of a test's Ansible run (``tests/helpers.py`` puts this
directory on ``PYTHONPATH`` and names the cache in ``CPUPOOLS_TEST_BYTECODE``),
the controller's and the local "nodes'" alike. Python's ``zipimport`` writes no
``.pyc``, and it compiles a module's source twice per import (once to name its
file, once to run it): every module execution compiles ansible-core's
module_utils from the payload again, about 40 % of the CPU of a module run on
the tests' Python 3.13 (README, "Testing"). Here the code ``zipimport``
compiles is kept by a digest of the source, the interpreter's magic number and
its ``-O`` level, and read back for the same source: the module runs the same
code, compiled once for the whole test session. Its file name is set to the
payload's path, as a compile would. A cache that cannot be read or written
falls back to the compile; a Python whose ``zipimport`` has no
``_compile_source`` is left as it is. Off when the variable is unset: the
benchmarks measure the real cost.
"""

import os

_CACHE = os.environ.get("CPUPOOLS_TEST_BYTECODE")


def _install(cache):
    import zipimport

    compile_source = getattr(zipimport, "_compile_source", None)
    if compile_source is None:
        return

    def cached_compile(pathname, source):
        import _imp
        import hashlib
        import importlib.util
        import marshal
        import sys

        # what compile() reads besides the source: the interpreter's bytecode and its -O level
        salt = importlib.util.MAGIC_NUMBER + bytes([sys.flags.optimize])
        path = os.path.join(cache, hashlib.sha256(salt + source).hexdigest())
        try:
            with open(path, "rb") as cached:
                code = marshal.loads(cached.read())
        except (OSError, ValueError, EOFError, TypeError):
            code = None
        if isinstance(code, type(cached_compile.__code__)):
            _imp._fix_co_filename(code, pathname)
            return code
        code = compile_source(pathname, source)
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(cache, exist_ok=True)
            with open(temporary, "wb") as out:
                out.write(marshal.dumps(code))
            os.replace(temporary, path)
        except OSError:
            pass
        return code

    zipimport._compile_source = cached_compile


if _CACHE:
    _install(_CACHE)
