# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's topology facts on the controller, by digest: what the plan result names instead of carrying them.

Every plan result (``cpupools_plan_result``) names its host's topology by
``topology_digest``, the SHA-256 of its compact JSON text, stored once in
``<work_dir>/build/topology/<digest>.json``. A host with work to do also gets
the topology as the fact ``ansible_facts.cpupools`` (the stages read it); a
converged host's result, which goes back to ansible-playbook's main process
for every host of a fleet, carries the 64 characters instead of the topology
(17.7 kB for 88 CPUs): docs/performance.md, "The converged result".

The store is content-addressed: identical nodes share one file, a converged
re-run only finds it there (one ``stat`` per host), and a file is never
rewritten. Deleting the directory is safe between runs: the next plan play
writes what it names again. ``topology()`` is the one reader: the fact where
the host has it, else the stored file.
"""

import hashlib
import json
import os

from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.files import replace_file

#: Under the work directory (``cpupools_work_dir``), beside the cmk build.
SUBDIR = os.path.join("build", "topology")


def encode(facts):
    """``(text, digest)``: the topology's compact JSON text and its SHA-256."""
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()


def path_of(work_dir, digest):
    """Where the topology with ``digest`` is stored."""
    return os.path.join(work_dir, SUBDIR, f"{digest}.json")


def store(work_dir, text, digest, write=True):
    """Store ``text`` under ``digest`` unless it is there already; False when it is not there and cannot be.

    Without ``write`` (check mode, which writes nothing on the controller
    either) only a file an earlier run stored counts: True when it is there.
    Written whole or not at all (``core/files.replace_file``: a temporary
    file moved into place), so a reader never sees part of one, and two runs
    writing the same digest at once write the same bytes.
    """
    path = path_of(work_dir, digest)
    if os.path.exists(path):
        return True
    if not write:
        return False
    try:
        replace_file(path, text.encode(), mode=0o644)
    except OSError:
        return False
    return True


def load(work_dir, digest):
    """The stored topology with ``digest``, or None when it is not there (or not what its name says)."""
    try:
        with open(path_of(work_dir, digest), "rb") as handle:
            data = handle.read()
    except (OSError, TypeError, ValueError):
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    return json.loads(data)


def topology(result, facts=None):
    """A host's topology: ``facts["cpupools"]`` when it has the fact, else what its plan result names.

    ``result`` is the host's ``cpupools_plan_result``; None when neither has it.
    """
    found = (facts or {}).get("cpupools")
    if found is not None:
        return found
    result = result or {}
    digest, work_dir = result.get("topology_digest"), result.get("work_dir")
    if not digest or not work_dir:
        return None
    return load(work_dir, digest)
