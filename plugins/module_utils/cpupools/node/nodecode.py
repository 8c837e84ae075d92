"""The controller's build of the agent, and the node's copy of it: which code the plan play's module runs.

``cpupools_converged`` runs on every host of every run. Most of its own cost
is Python compiling this package from the module's payload, which Ansible
ships as source in a zip (no bytecode). The node agent, ``cmk.pyz``, is this
same package with its bytecode compiled once on the controller
(``scripts/build_agent.py``). When the node's ``cmk.pyz`` is the controller's
current build, byte for byte (its SHA-256 is the one ``build_agent.py --check``
printed for the sources of this run), the module imports the package from it
instead: the same sources, without compiling them. On a node whose
``python3`` has another bytecode version, zipimport compiles the same
sources from the ``.pyz``. Any other case (no build, another digest, a file
that cannot be read) uses the payload, as before (docs/performance.md).

Standard library only and nothing else of this package: the module imports
this file before it knows which copy of the package to use.
"""

from __future__ import annotations

import hashlib
import os

#: Default of ``cpupools_agent_path`` (inputs.SPEC): the launcher; the zipapp is ``<path>.pyz``.
AGENT_PATH = "/opt/bin/cmk"


def under(root: str, path: str) -> str:
    """``path`` (absolute on the node) under the node's root ``root``."""
    return os.path.join(root, path.lstrip("/"))


def sha256_of(path: str) -> str | None:
    """SHA-256 of the file's bytes; None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def parse_build(text: str | None, rc: int | None = 0) -> dict | None:
    """The digests ``scripts/build_agent.py --check`` printed (``<sha256>  <path>  <verdict>`` per file).

    None when the build did not run or failed: the agent stage then always runs
    (and reports the build's own error).
    """
    if not text or rc:
        return None
    out: dict = {"stale": False}
    for line in text.splitlines():
        parts = line.split("  ")
        if len(parts) != 3:
            continue
        digest, path, verdict = parts
        out["pyz_sha256" if path.endswith(".pyz") else "launcher_sha256"] = digest
        out["stale"] = out["stale"] or verdict != "unchanged"
    return out if "pyz_sha256" in out and "launcher_sha256" in out else None


def installed_build(raw: dict, build: dict | None) -> str | None:
    """The node's ``cmk.pyz`` when it is ``build`` byte for byte, else None.

    ``raw`` are the host's ``cpupools_*`` variables as given (not yet checked:
    checking them is the code this chooses). A value that is not a usable
    path only means "not found": the chosen code then refuses it by name.
    """
    if not build:
        return None
    root = raw.get("cpupools_root", "/")
    agent = raw.get("cpupools_agent_path", AGENT_PATH)
    if not isinstance(root, str) or not isinstance(agent, str) or not root or not agent.startswith("/"):
        return None
    path = under(root, agent + ".pyz")
    try:
        digest = sha256_of(path)
    except (OSError, ValueError):  # not readable, a directory, a NUL in the path
        return None
    return path if digest is not None and digest == build.get("pyz_sha256") else None
