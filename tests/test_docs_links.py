"""Every document the READMEs, docs, comments and docstrings point to is in the repository.

What a reader of a checkout (or of the collection, which ships ``docs/``) is
sent to must be there: a Markdown link, any path naming a Markdown file
(``docs/agent.md``, ``roles/cpupools_k8s/README.md``) and any path under
``docs/`` resolves, relative to the file that names it or to the repository
root, to a file of the repository. A section sign cites a numbered
document, and no document here numbers its sections, so each one is a
citation of a document the repository does not hold (the design notes and the
CMK reference the project was written from are not shipped).
"""

from __future__ import annotations

import re

from helpers import REPO

#: The files a reader follows: the top README and ansible.cfg, docs/, the role
#: READMEs, and the text files of the code, playbooks, scenarios and tests.
TREES = ("docs", "plugins", "scripts", "playbooks", "molecule", "tests", ".config/molecule")
SUFFIXES = {".md", ".py", ".yml", ".yaml", ".cfg", ".j2", ".sh", ".txt", ".ini", ".toml"}

LINK = re.compile(r"\]\(([^)\s]+)\)")
MARKDOWN_PATH = re.compile(r"(?<![\w./\"'-])((?:\.\./|[\w.-]+/)*[\w-]+\.md)\b")
DOCS_PATH = re.compile(r"(?<![\w./\"'-])(docs/[\w./-]*\w)")
SECTION_SIGN = "\u00a7"


def documents() -> list[str]:
    found = [REPO / "README.md", REPO / "ansible.cfg", *sorted(REPO.glob("roles/*/README.md"))]
    for tree in TREES:
        found += sorted(
            p
            for p in (REPO / tree).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts and ".hypothesis" not in p.parts
        )
    return [str(p.relative_to(REPO)) for p in found]


def _leads_somewhere(path, target: str) -> bool:
    """Whether ``target`` is a file or folder of the repository, relative to ``path`` or to the root."""
    root = REPO.resolve()
    for where in ((path.parent / target).resolve(), (REPO / target).resolve()):
        if where.exists() and (where == root or root in where.parents):
            return True
    return False


def dangling(name: str) -> list[str]:
    """``name:N: what`` for each reference of file ``name`` that leads nowhere."""
    path = REPO / name
    bad = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        targets = set(MARKDOWN_PATH.findall(line)) | set(DOCS_PATH.findall(line))
        if name.endswith(".md"):
            targets |= {t.split("#")[0] for t in LINK.findall(line) if not re.match(r"[a-z]+:|#", t)}
        bad += [f"{name}:{number}: {t}" for t in sorted(targets) if t and not _leads_somewhere(path, t)]
        if SECTION_SIGN in line:
            bad.append(f"{name}:{number}: a section of a document not in the repository: {line.strip()}")
    return bad


def test_the_scan_covers_the_documents():
    names = documents()
    assert {"README.md", "ansible.cfg", "docs/agent.md", "roles/cpupools_k8s/README.md"} <= set(names)
    assert "plugins/modules/cpupools_k8s_node.py" in names and "molecule/adopt/molecule.yml" in names


def test_every_reference_leads_to_a_file_of_the_repository():
    bad = [line for name in documents() for line in dangling(name)]
    assert not bad, "references to what is not in the repository:\n" + "\n".join(bad)
