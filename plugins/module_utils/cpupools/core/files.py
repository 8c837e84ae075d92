"""Replacing a file whole on the controller or through Ansible: a temporary file beside it, then a move.

The boot loader's drop-ins, the HTML report, the report store's files and the
controller's store of topologies and plans (plugin_utils/digest_store.py) are
written this way. ``move`` is ``os.replace`` or the module's
``AnsibleModule.atomic_move`` (which keeps an SELinux context and the
replaced file's attributes). The pool state has its own writer
(node/state.py's ``atomic_write``): it works relative to a directory
descriptor, without following a link, in directories the task group may
write, and never through Ansible.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def replace_file(
    path: str,
    data: bytes,
    mode: int = 0o644,
    move: Callable[[str, str], object] = os.replace,
    mtime: float | None = None,
    prefix: str = ".cpupools-",
    suffix: str = "",
) -> None:
    """Put ``data`` at ``path``: a temporary file in its directory (created, 0755), flushed to disk, given
    ``mode`` (and ``mtime``), then moved over ``path``; the temporary file is gone whatever fails."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
