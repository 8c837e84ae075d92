"""Shared fixtures: the fixture corpus of sysfs trees, real ansible-playbook runs."""

from __future__ import annotations

import pytest
from helpers import run_playbook
from sysfs import CORPUS, Spec, write_tree


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory):
    """Write the whole fixture corpus once; returns ``name -> root path``."""
    base = tmp_path_factory.mktemp("corpus")
    return {name: write_tree(str(base / name), spec) for name, spec in CORPUS.items()}


@pytest.fixture
def make_root(tmp_path):
    """Write one fixture tree from a ``Spec`` (or corpus name) into a fresh temp dir."""

    def make(spec: Spec | str, name: str = "root"):
        if isinstance(spec, str):
            spec = CORPUS[spec]
        root = tmp_path / name
        write_tree(str(root), spec)
        return root

    return make


@pytest.fixture
def playbook(tmp_path):
    """``playbook(text_or_path, extra_vars, *args)`` -> ``PlaybookResult``."""

    def run(pb, extra_vars=None, *args, **kw):
        return run_playbook(pb, tmp_path, extra_vars, *args, **kw)

    return run
