"""Write the fixture CPU topology of one molecule platform.

Usage: write_fixture.py DEST SPEC_JSON

SPEC_JSON holds keyword arguments of ``tests/fixtures/sysfs.py``'s ``Spec``
(lists stand for its tuples), for example
``{"sockets": 2, "cores_per_socket": 8, "threads": 2}``. The tree is written
afresh: DEST is removed first, so a platform never sees a stale topology.

Beside the topology, ``proc/config.gz``: the build configuration of the
kernel the fixture node runs, a distribution kernel built for isolation
(CONFIG_NO_HZ_FULL, CONFIG_RCU_NOCB_CPU). create.yml mounts it over the
container's ``/proc/config.gz`` where the machine has one: that file is
the machine's kernel's, not the node's, and the kernel stage checks the
arguments it writes against it (docs/kernel-args.md).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))

from sysfs import Spec, write_tree  # noqa: E402

#: What the kernel stage reads of a kernel's configuration, as a distribution kernel has it.
KERNEL_CONFIG = """\
CONFIG_IKCONFIG=y
CONFIG_IKCONFIG_PROC=y
CONFIG_NO_HZ_COMMON=y
CONFIG_NO_HZ_FULL=y
CONFIG_RCU_NOCB_CPU=y
"""


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
    with gzip.open(os.path.join(dest, "proc", "config.gz"), "wt", encoding="utf-8") as handle:
        handle.write(KERNEL_CONFIG)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
