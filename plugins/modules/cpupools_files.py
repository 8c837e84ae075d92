#!/usr/bin/python
# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cpupools_files
short_description: Write the text files the plan rendered for a stage, and remove what it retires, in one module run
description:
  - Writes each file of O(files) whose content, mode or owner differs from the
    node's copy, atomically (a temporary file in the same directory, renamed
    over the old one), owned by root, creating missing parent directories
    (mode 0755, root). A file already as wanted is not touched (its mtime stays).
  - One module run for all of a stage's small files (the plan play's
    C(cpupools_converged) renders them, plugins/module_utils/cpupools/node/stage_check.py),
    where a C(copy) loop runs one or two per file.
  - Removes each path of O(remove) that is there (a file, a symbolic link, or a
    directory with all it holds), in the same run, where a C(file) loop runs one per path.
  - A file's bytes can come from a file on the controller (O(files[].src), a
    built program such as the cmk zipapp), read by the module's action plugin
    and sent with the module's arguments, where a C(copy) runs two modules and
    a C(file) task a third for its directory.
  - Supports check mode (says which files would change, writes nothing) and
    diff mode (each changed file's text before and after; for bytes that are
    not text, their size and SHA-256).
version_added: "1.1.0"
options:
  root:
    description: The node's root; every path is under it (tests use a sandbox).
    type: path
    default: /
  files:
    description: The files to write.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's absolute path on the node (under O(root)).
        type: str
        required: true
      content:
        description: Its whole text. One of O(files[].content), O(files[].content_base64) and O(files[].src).
        type: str
      content_base64:
        description: Its bytes, base64-encoded (what the action plugin sends for O(files[].src)).
        type: str
        version_added: "1.1.0"
      src:
        description:
          - A file on the controller whose bytes are the file's content, read by the action plugin
            (call the module as C(cpupools.cpupools.cpupools_files)), which sends them as
            O(files[].content_base64).
        type: path
        version_added: "1.1.0"
      mode:
        description: Its mode, octal.
        type: str
        default: "0644"
      stage:
        description: The stage that writes it, as the plan's file records carry it; not used.
        type: str
      wanted:
        description: Whether the plan wants it, as the plan's file records carry it; a file not wanted fails.
        type: bool
        default: true
  remove:
    description:
      - Absolute paths on the node (under O(root)) to remove when present, after the files are written.
        A directory goes with all it holds; a symbolic link is removed, not followed.
      - The node's root itself, and a path with C(..) in it, are refused before anything changes.
    type: list
    elements: str
    default: []
    version_added: "1.1.0"
attributes:
  check_mode:
    support: full
    description: Compares, writes and removes nothing.
  diff_mode:
    support: full
    description: Each changed file's text before and after.
author:
  - The cpupools authors (@cpupools)
"""

EXAMPLES = r"""
- name: Write the housekeeper's configuration, service and timer
  cpupools.cpupools.cpupools_files:
    root: "{{ cpupools_root }}"
    files:
      - "{{ cpupools_plan_result.files.housekeep }}"
      - "{{ cpupools_plan_result.files.housekeep_service }}"

- name: Install cmk's zipapp, built on the controller
  cpupools.cpupools.cpupools_files:
    root: "{{ cpupools_root }}"
    files:
      - {path: /opt/bin/cmk.pyz, src: build/agent/cmk.pyz, mode: "0755"}

- name: Remove cmk's launcher, its zipapp and its reconcile units
  cpupools.cpupools.cpupools_files:
    root: "{{ cpupools_root }}"
    remove: [/opt/bin/cmk, /opt/bin/cmk.pyz, /etc/systemd/system/cpupools-reconcile.service]
"""

RETURN = r"""
files:
  description:
    - Each file's path and why it was written (C(missing), C(content), C(mode), C(owner)), or null;
      then each path of O(remove) with C(removed) (in check mode too), or null where nothing was there.
  returned: always
  type: list
  elements: dict
  sample:
    - {"path": "/etc/cpupools/housekeep.conf", "changed": "content"}
    - {"path": "/opt/bin/cmk", "changed": "removed"}
"""

import base64
import binascii
import hashlib
import os
import shutil
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.agent_files import under
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node.state import atomic_write

ARGUMENT_SPEC = {
    "root": {"type": "path", "default": "/"},
    "files": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "path": {"type": "str", "required": True},
            "content": {"type": "str"},
            "content_base64": {"type": "str"},
            "src": {"type": "path"},
            "mode": {"type": "str", "default": "0644"},
            "stage": {"type": "str"},
            "wanted": {"type": "bool", "default": True},
        },
    },
    "remove": {"type": "list", "elements": "str", "default": []},
}


def difference(path, content, mode):
    """Why ``path`` is not as wanted (``missing``, ``content``, ``mode``, ``owner``), and its old bytes."""
    try:
        with open(path, "rb") as handle:
            old = handle.read()
        info = os.stat(path)
    except FileNotFoundError:
        return "missing", b""
    if old != content:
        return "content", old
    if info.st_mode & 0o7777 != mode:
        return "mode", old
    if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
        return "owner", old
    return None, old


def diff_view(data):
    """``data`` for a diff: its text, or for bytes that are not text their size and digest."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"
    return text if "\0" not in text else f"({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})\n"


def content_of(wanted):
    """The bytes ``wanted`` gives (its text, or its base64), or the reason it gives none or two."""
    given = [key for key in ("content", "content_base64", "src") if wanted[key] is not None]
    if given == ["src"]:
        return None, (
            "src is read on the controller by the action plugin, which this run did not use: "
            "call the module as cpupools.cpupools.cpupools_files"
        )
    if len(given) != 1:
        return None, f"give one of content, content_base64 and src (given: {', '.join(given) or 'none'})"
    if given == ["content"]:
        return wanted["content"].encode("utf-8"), None
    try:
        return base64.b64decode(wanted["content_base64"], validate=True), None
    except (binascii.Error, ValueError):
        return None, "content_base64 is not base64"


def make_parents(directory):
    """Create the missing directories of ``directory``, mode 0755, owned by root when run as root."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        os.chmod(path, 0o755)  # whatever the umask
        if os.geteuid() == 0:
            os.chown(path, 0, 0)


def writable(path):
    """Why the node path ``path`` may not be written or removed, or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    if ".." in path.split("/"):
        return f"{path!r} climbs out with '..'"
    return None


def removable(path):
    """Why the node path ``path`` may not be removed, or None."""
    why = writable(path)
    if not why and not path.strip("/"):
        return "the node's root is never removed"
    return why


def kind_of(path):
    """What is at ``path``, not following a last symbolic link: ``directory``, ``file``, or None."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there, or a file where a directory would be
        return None
    return "directory" if stat.S_ISDIR(info.st_mode) else "file"


def remove_path(path, kind):
    """Remove what is at ``path`` (a directory with all it holds; a link itself)."""
    if kind == "directory":
        shutil.rmtree(path)
    else:
        os.unlink(path)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    root = module.params["root"]
    for path in module.params["remove"]:  # all refused before anything is written
        why = removable(path)
        if why:
            module.fail_json(msg=f"cpupools_files: remove: {why}")
    contents = []
    for wanted in module.params["files"]:  # all refused before anything is written
        refused = writable(wanted["path"])
        if refused:
            module.fail_json(msg=f"cpupools_files: {refused}")
        why = None if wanted["wanted"] else "the plan does not want this file written"
        if not why:
            try:
                mode = int(wanted["mode"], 8)
            except ValueError:
                why = f"mode {wanted['mode']!r} is not octal"
        if not why:
            content, why = content_of(wanted)
            contents.append((wanted, content, mode))
        if why:
            module.fail_json(msg=f"cpupools_files: {wanted['path']}: {why}")
    results, diffs = [], []
    for wanted, content, mode in contents:
        path = under(root, wanted["path"])
        try:
            why, before = difference(path, content, mode)
            if why and not module.check_mode:
                make_parents(os.path.dirname(path))
                atomic_write(path, content, mode=mode, gid=0 if os.geteuid() == 0 else None)
                if os.geteuid() == 0:
                    os.chown(path, 0, 0)
        except OSError as exc:
            module.fail_json(msg=f"cpupools_files: {wanted['path']}: {exc.strerror}", files=results)
        results.append({"path": wanted["path"], "changed": why})
        if why and module._diff:
            diffs.append(
                {
                    "before_header": wanted["path"],
                    "after_header": wanted["path"],
                    "before": diff_view(before),
                    "after": diff_view(content),
                }
            )
    for wanted_gone in module.params["remove"]:
        path = under(root, wanted_gone)
        kind = kind_of(path)
        if kind and not module.check_mode:
            try:
                remove_path(path, kind)
            except OSError as exc:
                module.fail_json(msg=f"cpupools_files: remove {wanted_gone}: {exc.strerror}", files=results)
        results.append({"path": wanted_gone, "changed": "removed" if kind else None})
        if kind and module._diff:
            diffs.append({"before_header": wanted_gone, "after_header": wanted_gone, "before": kind, "after": "absent"})
    changed = any(result["changed"] for result in results)
    module.exit_json(changed=changed, files=results, diff=diffs)


if __name__ == "__main__":
    main()
