"""Every play whose roles have handlers forces them; no other play does.

A boot loader update notified before a later task fails must still run: a
re-run sees the drop-in unchanged and never regenerates grub.cfg. Ansible's
``force_handlers`` does that, and ``ansible.cfg`` is not read by a run of the
installed collection (AWX, AAP), so the plays say it themselves
(docs/collection.md). A play with no handler gains nothing from it and pays
for it on every host: two implicit ``noop`` tasks and two more flushes, each a
computation of the host's variables in ansible-playbook's main process
(docs/performance.md). Read from the sources: each play's roles (``roles:``,
``import_role``, ``include_role``) and their dependencies.
"""

from __future__ import annotations

import configparser

import yaml
from helpers import REPO

ROLE_KEYS = ("ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role")


def role_closure(names: set[str]) -> set[str]:
    """The roles and, recursively, their meta dependencies."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        meta = REPO / "roles" / name / "meta" / "main.yml"
        deps = (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or [] if meta.exists() else []
        todo.extend(d["role"] if isinstance(d, dict) else d for d in deps)
    return seen


def task_roles(tasks: list | None) -> set[str]:
    found: set[str] = set()
    for task in tasks or []:
        for key in ROLE_KEYS:
            if key in task:
                found.add(task[key]["name"])
        for section in ("block", "rescue", "always"):
            found |= task_roles(task.get(section))
    return found


def plays() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(REPO.glob("playbooks/*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            if "hosts" in play:
                out.append((f"{path.name}: {play['name']}", play))
    return out


def roles_of(play: dict) -> set[str]:
    direct = {r["role"] if isinstance(r, dict) else r for r in play.get("roles") or []}
    for section in ("pre_tasks", "tasks", "post_tasks"):
        direct |= task_roles(play.get(section))
    return role_closure(direct)


def has_handlers(role: str) -> bool:
    return (REPO / "roles" / role / "handlers" / "main.yml").exists()


def test_each_play_forces_handlers_exactly_when_its_roles_have_some():
    checked = plays()
    assert len(checked) > 10
    with_handlers = sorted(name for name, play in checked if any(map(has_handlers, roles_of(play))))
    # the two roles with handlers reach these plays: the check itself sees them
    assert any(name.startswith("kernel.yml") for name in with_handlers)
    assert any(name.startswith("reboot.yml") for name in with_handlers)
    wrong = [
        f"{name}: force_handlers {play.get('force_handlers')!r}, handlers in its roles: {name in with_handlers}"
        for name, play in checked
        if bool(play.get("force_handlers")) != (name in with_handlers)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checkout_does_not_force_handlers_for_every_play():
    # What a run of the installed collection does without is not set for the checkout's runs only.
    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    assert config.has_section("defaults")
    assert not config.has_option("defaults", "force_handlers")
