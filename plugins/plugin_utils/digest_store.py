# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a converged host's plan result names by digest instead of carrying: its topology, its plan and exports.

Every plan result (``cpupools_plan_result``) names its host's topology by
``topology_digest``, the SHA-256 of its compact JSON text, stored once in
``<work_dir>/build/topology/<digest>.json``. A host with work to do also gets
the topology as the fact ``ansible_facts.cpupools`` and the plan and the
stages' exports in its result (the stages read them); a converged host's
result, which goes back to ansible-playbook's main process for every host of
a fleet, carries the digests instead: ``topology_digest``, and
``plan_digest`` for its plan and exports together, stored in
``<work_dir>/build/plan/<digest>.json`` (docs/performance.md, "The converged
result").

The store is content-addressed: identical nodes share one file, a converged
re-run only finds it there (one ``stat`` per host), and a file is never
rewritten. Deleting the directory is safe between runs: the next plan play
writes what it names again. ``topology()`` and ``planned()`` are the one
reader of each: what the host has, else the stored file.

Beside them, ``<work_dir>/build/hosts/`` keeps what the controller holds of
each host's last result, named by a slim one or stored from a whole one
(``remember``), so that the next run can tell the host's module
which digests the controller holds (``named``): the module then leaves out
what it would only send for the controller to store again, and encodes with
the same function (``core/digest.py``).
"""

import contextlib
import hashlib
import json
import os

from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.digest import encode
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.files import replace_file

#: Under the work directory (``cpupools_work_dir``), beside the cmk build: one directory per kind.
KINDS = {"topology": os.path.join("build", "topology"), "plan": os.path.join("build", "plan")}
#: What the controller holds of each host's last result (named by a slim one, stored from a whole one), one file
#: per host (``remember``).
HOSTS = os.path.join("build", "hosts")

__all__ = ["encode", "load", "named", "planned", "remember", "store", "topology"]


def path_of(work_dir, digest, kind="topology"):
    """Where the ``kind`` with ``digest`` is stored."""
    return os.path.join(work_dir, KINDS[kind], f"{digest}.json")


def store(work_dir, text, digest, write=True, kind="topology"):
    """Store ``text`` under ``digest`` unless it is there already; False when it is not there and cannot be.

    Without ``write`` (check mode, which writes nothing on the controller
    either) only a file an earlier run stored counts: True when it is there.
    Written whole or not at all (``core/files.replace_file``: a temporary
    file moved into place), so a reader never sees part of one, and two runs
    writing the same digest at once write the same bytes.
    """
    path = path_of(work_dir, digest, kind)
    if os.path.exists(path):
        return True
    if not write:
        return False
    try:
        replace_file(path, text.encode(), mode=0o644)
    except OSError:
        return False
    return True


def load(work_dir, digest, kind="topology", cache=None):
    """The stored ``kind`` with ``digest``, or None when it is not there (or not what its name says).

    With ``cache`` (a dict the caller keeps for one task) a digest is read,
    checked and parsed once, and every host naming it gets the same object:
    the caller must not change it. A fleet of one node class names one
    topology, and the report read it once per host (docs/performance.md).
    """
    if cache is not None:
        key = (work_dir, digest, kind)
        if key not in cache:
            cache[key] = load(work_dir, digest, kind)
        return cache[key]
    try:
        with open(path_of(work_dir, digest, kind), "rb") as handle:
            data = handle.read()
    except (OSError, TypeError, ValueError):
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    return json.loads(data)


def topology(result, facts=None, cache=None):
    """A host's topology: ``facts["cpupools"]`` when it has the fact, else what its plan result names.

    ``result`` is the host's ``cpupools_plan_result``; None when neither has it.
    ``cache`` as for ``load``.
    """
    found = (facts or {}).get("cpupools")
    if found is not None:
        return found
    result = result or {}
    digest, work_dir = result.get("topology_digest"), result.get("work_dir")
    if not digest or not work_dir:
        return None
    return load(work_dir, digest, cache=cache)


def planned(result, cache=None):
    """``{"plan": ..., "exports": ...}`` of a host's plan result: what it carries, else what it names.

    ``result`` is the host's ``cpupools_plan_result``. Both are None where it
    has neither (a failed host, or a stored record deleted since the plan play
    named it, which a plan play of the same run does not do). ``cache`` as
    for ``load``.
    """
    result = result or {}
    if "plan" in result:
        return {"plan": result.get("plan"), "exports": result.get("exports")}
    digest, work_dir = result.get("plan_digest"), result.get("work_dir")
    record = load(work_dir, digest, "plan", cache) if digest and work_dir else None
    return record or {"plan": None, "exports": None}


def _host_path(work_dir, host):
    """The file of ``host``'s names: the SHA-256 of its name (an inventory name may hold any character)."""
    return os.path.join(work_dir, HOSTS, hashlib.sha256(str(host).encode()).hexdigest() + ".json")


def named(work_dir, host):
    """``{kind: digest}`` of ``host``'s last result that are still stored; {} when none.

    What the plan action gives the module (its ``stored`` option): the module
    names them in place of what they hold when its own digests are the same.
    """
    try:
        with open(_host_path(work_dir, host), "rb") as handle:
            record = json.loads(handle.read())
    except (OSError, TypeError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("host") != host:
        return {}
    found = {}
    for kind in KINDS:
        digest = record.get(kind)
        if _is_digest(digest) and os.path.exists(path_of(work_dir, digest, kind)):
            found[kind] = digest
    return found


def _is_digest(value):
    """A SHA-256 as hex: a record's value never names a file outside the store."""
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


def remember(work_dir, host, names, known=None, write=True):
    """Keep ``names`` (``{kind: digest}``, every kind) as ``host``'s, unless ``known`` (what ``named`` gave)
    says so already; never in check mode (``write``), and quietly not where it cannot be written."""
    if not write or names == known or set(names) != set(KINDS):
        return
    text = json.dumps({"host": host, **names}, sort_keys=True)
    with contextlib.suppress(OSError):
        replace_file(_host_path(work_dir, host), text.encode(), mode=0o644)
