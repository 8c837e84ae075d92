"""The agent's files on the node, and the controller's build of them.

Where ``cmk`` lives (``AGENT_PATH``; the zipapp is ``<path>.pyz``), a path
on the node under its root, a file's digest, and the digests
``scripts/build_agent.py --check`` prints: what the plan play's check
compares the node's copy of the agent with. Standard library only.
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
    (and reports the build's own error). The verdict (whether the controller's
    own ``build/agent`` holds these bytes yet) is not read: the controller's
    build is what the agent stage copies from, written by that stage's build
    task when a node needs a copy, so a controller that never built (a fresh
    checkout, an AWX/AAP job's new container) does not make a converged node's
    agent stage run.
    """
    if not text or rc:
        return None
    out: dict = {}
    for line in text.splitlines():
        parts = line.split("  ")
        if len(parts) != 3:
            continue
        digest, path, _verdict = parts
        out["pyz_sha256" if path.endswith(".pyz") else "launcher_sha256"] = digest
    return out if "pyz_sha256" in out and "launcher_sha256" in out else None
