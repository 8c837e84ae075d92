"""No membership test in the roles scans a list once per host of the play.

``hosts | select('in', <a group's list>)`` runs the test ``in`` for each host
against a list: one scan of the group per host, quadratic in the fleet. Under
ansible-core 2.19+'s lazy templating it cost 4.2 s at 1,000 hosts per use, in
one worker while the main process waited (docs/performance.md, issue 43); a
dict of the same names (``dict(x | zip(x))``) makes each test a lookup, and
``intersect`` serves where only the count matters. Read from the sources: the
container of every ``select``/``reject`` with ``in`` must be a dict or a
literal list (a fixed handful of values, not the fleet).
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

MEMBERSHIP = re.compile(r"""\b(?:select|reject)\(\s*(['"])in\1\s*,\s*""")
COMMENT = re.compile(r"^[ \t]*#.*$", re.M)


def scans(text: str) -> list[tuple[int, str]]:
    """(line, container) of each select/reject('in', container) whose container is neither dict(...) nor [...]."""
    found = []
    text = COMMENT.sub("", text)  # a comment may name the pattern it warns about
    for match in MEMBERSHIP.finditer(text):
        container = text[match.end() :]
        if container.startswith(("dict(", "[")):
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.append((line, container.split("\n", 1)[0][:60]))
    return found


def sources() -> list[Path]:
    return sorted(
        p
        for pattern in ("roles/*/tasks/*.yml", "roles/*/defaults/*.yml", "roles/*/vars/*.yml", "roles/*/templates/*.j2")
        for p in REPO.glob(pattern)
    ) + sorted(REPO.glob("playbooks/*.yml"))


def test_the_check_finds_the_scan_and_passes_the_lookup():
    assert scans("{{ ansible_play_hosts | select('in', groups['x']) | list }}") == [(1, "groups['x']) | list }}")]
    assert scans('a\n{{ hosts | reject("in", members) }}') == [(2, "members) }}")]
    assert scans("{{ ansible_play_hosts | select('in', dict(m | zip(m))) | list }}") == []
    assert scans("{{ x | select('in', ['fail', 'warn']) }}") == []
    assert scans("{{ x | selectattr('check', 'in', names) }}") == []  # an attribute of each item: not a host scan
    assert scans("# select('in', <a list>) scans\n{{ x }}") == []


def test_no_role_or_play_scans_a_list_per_host():
    files = sources()
    assert any(p.name == "plan.yml" and "cpupools_plan" in str(p) for p in files)
    found = [f"{p.relative_to(REPO)}:{line}: {container}" for p in files for line, container in scans(p.read_text())]
    assert not found, "a membership test against a list; use dict(x | zip(x)) or intersect:\n" + "\n".join(found)
