#!/usr/bin/env python3
"""Run ``ansible-test sanity`` on this checkout as an installed collection, without ansible-test's download host.

Usage: ``.venv/bin/python scripts/sanity.py [--ansible-bin DIR] [--tarball PATH] [--workdir DIR] [ARG...]``

1. builds the collection with ``DIR/ansible-galaxy`` (``DIR``: the ``bin``
   directory of the Python running this script, by default), unless
   ``--tarball`` names a build;
2. installs it into ``WORKDIR/ansible_collections/cpupools/cpupools``
   (``WORKDIR``: a new temporary directory, removed afterwards, by default),
   where ansible-test must run;
3. puts the pip bootstrap ansible-test downloads from ci-files.testing.ansible.com
   into its cache, ``~/.ansible/test/cache/get_pip_<version>.py``, when no
   real one is there: a stand-in (tests/collection/get_pip_stand_in.py) that
   runs this Python's pip in each new sanity environment, which installs the
   pip release ansible-test asks for from the package index or pip's cache;
4. runs ``DIR/ansible-test sanity --local --python X.Y --color no
   --skip-test ansible-doc --skip-test pep8 ARG...`` there, and exits with its
   status.

ansible-test's own environments (``~/.ansible/test/venv``) are made from the
package index the first time. tests/collection/test_collection.py runs this
script; docs/collection.md, "Sanity", says why those two tests are skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAND_IN = REPO / "tests" / "collection" / "get_pip_stand_in.py"
#: Checked more strictly by scripts/test.sh: ansible-doc renders every module there; ruff applies
#: pycodestyle's E and W at 120 columns where the sanity test allows 160.
SKIPPED = ("ansible-doc", "pep8")
PROBE = (
    "import os, sys, pip\n"
    "from ansible_test._internal.python_requirements import get_venv_packages\n"
    "class P: version = '%d.%d' % sys.version_info[:2]\n"
    "print(P.version, get_venv_packages(P())['pip'], os.path.dirname(os.path.dirname(pip.__file__)))\n"
)


def provide_pip_bootstrap(python: Path) -> None:
    """Write the stand-in where ansible-test looks for its pip bootstrap, unless a real one is cached."""
    _, pip_version, pip_dir = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    cache = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{pip_version.replace('.', '_')}.py"
    if cache.exists():
        return
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(STAND_IN.read_text().replace("@PIP_DIR@", pip_dir))
    tmp.replace(cache)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ansible-bin", type=Path, default=Path(sys.executable).parent)
    parser.add_argument("--tarball", type=Path)
    parser.add_argument("--workdir", type=Path)
    args, extra = parser.parse_known_args(argv)
    bin_dir = args.ansible_bin.absolute()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="cpupools-sanity-"))
    try:
        tarball = args.tarball
        if tarball is None:
            subprocess.run(
                [str(bin_dir / "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(REPO)],
                cwd=work,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            tarball = next(work.glob("cpupools-cpupools-*.tar.gz"))
        collections = work / "sanity-collections"
        subprocess.run(
            [str(bin_dir / "ansible-galaxy"), "collection", "install", "--force", "-p", str(collections), str(tarball)],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        installed = collections / "ansible_collections" / "cpupools" / "cpupools"
        python = bin_dir / "python"
        provide_pip_bootstrap(python)
        version = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        skips = [arg for test in SKIPPED for arg in ("--skip-test", test)]
        command = [str(bin_dir / "ansible-test"), "sanity", "--local", "--python", version, "--color", "no"]
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        return subprocess.run([*command, *skips, *extra], cwd=installed, env=env, check=False).returncode
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
