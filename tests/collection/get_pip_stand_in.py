"""Stand-in for the pip bootstrap script ansible-test downloads (get-pip.py).

ansible-test creates every sanity virtual environment without pip, then runs
``get-pip-<version>.py`` from ci-files.testing.ansible.com, cached at
``~/.ansible/test/cache/get_pip_<version>.py``; where that host is not
reachable, the run stops. The real script is pip packed into one file; this one
runs the pip of the test environment instead (its directory is filled in as
PIP_DIR when the file is written) under the new environment's interpreter, so
the pip release ansible-test asks for is installed there from the package index
like every other requirement. Called as ``get_pip [pip options] pip==X
[--no-setuptools] [--no-wheel]``.
"""

import sys

PIP_DIR = "@PIP_DIR@"


def main() -> int:
    args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
    sys.path.insert(0, PIP_DIR)
    from pip._internal.cli.main import main as pip_main

    return pip_main(["install", *args])


if __name__ == "__main__":
    sys.exit(main())
