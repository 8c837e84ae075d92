"""cpupools_work_dir: where a run writes on the controller, resolved and prepared by plugin_utils/work_dir.py.

The read-only install itself is tests/collection/test_collection.py (a fresh
ansible-core runs the tarball installed read-only); these are the choices
``auto`` makes and the refusals, with directories made for each case.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import work_dir

ROOT_CAN_WRITE_ANYWHERE = os.geteuid() == 0


def test_the_checkout_is_its_own_work_dir():
    assert str(REPO.resolve()) == work_dir.COLLECTION_DIR
    assert work_dir.resolve("auto") == str(REPO.resolve())
    assert work_dir.resolve("/srv/cpupools") == "/srv/cpupools"


@pytest.fixture
def read_only_collection(tmp_path, monkeypatch):
    """A collection directory this user may not write into (``os.access`` says so, also for root)."""
    coll = tmp_path / "ansible_collections" / "cpupools" / "cpupools"
    coll.mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(coll) else real_access(p, mode))
    return str(coll)


def test_a_read_only_collection_writes_into_the_users_cache(tmp_path, read_only_collection):
    home = tmp_path / "home"
    home.mkdir()
    environ = {"HOME": str(home)}
    assert work_dir.resolve("auto", read_only_collection, environ) == str(home / ".cache" / "cpupools")
    environ["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert work_dir.resolve("auto", read_only_collection, environ) == str(tmp_path / "xdg" / "cpupools")

    path, refusal = work_dir.prepare("auto", True, read_only_collection, environ)
    assert (path, refusal) == (str(tmp_path / "xdg" / "cpupools"), None)
    assert not (tmp_path / "xdg").exists(), "check mode created the work directory"
    path, refusal = work_dir.prepare("auto", False, read_only_collection, environ)
    assert refusal is None and os.path.isdir(path)


def test_without_a_usable_home_it_is_a_private_temporary_directory(tmp_path, read_only_collection, monkeypatch):
    monkeypatch.setattr(work_dir.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "file").write_text("")
    environ = {"HOME": str(tmp_path / "file"), "XDG_CACHE_HOME": "relative"}  # a file in the way; not absolute
    private = str(tmp_path / f"cpupools-{os.getuid()}")
    path, refusal = work_dir.prepare("auto", False, read_only_collection, environ)
    assert (path, refusal) == (private, None)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700

    # Another user could swap the build there before it is copied to the nodes: refused, naming the variable.
    os.chmod(private, 0o777)
    path, refusal = work_dir.prepare("auto", False, read_only_collection, environ)
    assert refusal.startswith(f"cpupools_work_dir: {private!r} belongs to uid {os.getuid()} or others may write")
    assert "(mode 0777)" in refusal


def test_a_work_dir_that_cannot_be_made_is_refused_naming_the_variable(tmp_path):
    (tmp_path / "file").write_text("")
    _, refusal = work_dir.prepare(str(tmp_path / "file" / "cache"), False)
    assert refusal == (
        f"cpupools_work_dir: {str(tmp_path / 'file' / 'cache')!r} is not a directory "
        f"({tmp_path / 'file'} is in its way) on the controller"
    )
    _, refusal = work_dir.prepare(str(tmp_path / "file"), True)
    assert refusal == f"cpupools_work_dir: {str(tmp_path / 'file')!r} is not a directory on the controller"


@pytest.mark.skipif(ROOT_CAN_WRITE_ANYWHERE, reason="root writes into a directory without write permission")
def test_a_work_dir_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    _, refusal = work_dir.prepare(str(locked / "cache"), True)
    assert refusal.startswith(f"cpupools_work_dir: {str(locked / 'cache')!r} is not writable")
