"""Write the fixture CPU topology of one molecule platform.

Usage: write_fixture.py DEST SPEC_JSON

SPEC_JSON holds keyword arguments of ``tests/fixtures/sysfs.py``'s ``Spec``
(lists stand for its tuples), for example
``{"sockets": 2, "cores_per_socket": 8, "threads": 2}``. The tree is written
afresh: DEST is removed first, so a platform never sees a stale topology.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))

from sysfs import Spec, write_tree  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} DEST SPEC_JSON", file=sys.stderr)
        return 2
    dest, raw = argv[1], json.loads(argv[2])
    kwargs = {key: tuple(value) if isinstance(value, list) else value for key, value in raw.items()}
    try:
        spec = Spec(**kwargs)
    except TypeError as exc:
        print(f"write_fixture: bad fixture spec {raw!r}: {exc}", file=sys.stderr)
        return 2
    shutil.rmtree(dest, ignore_errors=True)
    write_tree(dest, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
