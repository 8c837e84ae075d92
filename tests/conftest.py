"""Shared fixtures: the fixture corpus of sysfs trees, real ansible-playbook runs."""

from __future__ import annotations

import os
import resource

import pytest
from helpers import run_playbook
from sysfs import CORPUS, Spec, write_tree

#: The longest tests, longest first (``--durations``: 100-400 s each on two
#: cores). xdist hands tests out in collection order; a long test collected
#: late runs alone on one worker after the other has run out of work, which
#: cost the suite minutes. So these start first, then every other ``slow``
#: test (real playbook runs), then the quick ones fill the gaps at the end.
#:
#: The first, test_converged's fleet (12 hosts since, 20 then), stays one item: its
#: ansible-playbook runs with 4 forks and keeps about 1.5 cores busy on its own
#: (alone, pytest without -n: 412 s, 636 CPU-s). Split into two fleets of
#: every other shape, one per worker (-n 2), it took 476 s on both workers and
#: 707 CPU-s: more of the two cores, for no gain on a suite that keeps them
#: busy (both under nice -n 19, on a machine shared with other jobs).
LONGEST = (
    "tests/playbook/test_converged.py::test_every_shape_and_transition",
    "tests/agent/test_state_crash.py::test_a_kill_at_any_system_call",
    "tests/playbook/test_check_mode.py::test_fresh_rerun_resize_uninstall",
    "tests/playbook/test_kubelet_playbook.py::test_kubelet_runtime_end_to_end",
    "tests/playbook/test_reboot.py::test_rollout_reboots_verifies_and_readmits",
    "tests/cluster/test_migrate_playbook.py::test_migrate_in_check_mode",
    "tests/agent/test_isolate_shell.py::test_role_writes_the_node_default",
    "tests/playbook/test_hugepages_playbook.py::test_check_then_converge",
    "tests/agent/test_agent_faults.py::test_isolate_killed_at_every_call",
    "tests/agent/test_agent_role.py::test_install_is_idempotent",
    "tests/cluster/test_admission_role.py::test_uninstalling_some_nodes",
    "tests/collection/",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        for index, prefix in enumerate(LONGEST):
            if item.nodeid.startswith(prefix):
                return index
        return len(LONGEST) + (0 if item.get_closest_marker("slow") else 1)

    items.sort(key=rank)  # stable: the collection order otherwise


#: How many tests the CPU summary lists (the run's log: the suite's cost is CPU first, docs in README "Testing").
CPU_SUMMARY = 30
#: ...for a run that cost at least this many CPU-seconds (not a quick run of a few tests).
CPU_SUMMARY_FROM = 60


def _cpu_seconds() -> float:
    """This process's CPU time and that of every child it waited for (ansible-playbook, its workers, cmk)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _with_cpu(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _with_cpu(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _with_cpu(item, "teardown"))


def _with_cpu(item, when: str):
    started = _cpu_seconds()
    try:
        return (yield)
    finally:
        item.user_properties.append((f"cpu_{when}", _cpu_seconds() - started))


def pytest_terminal_summary(terminalreporter):
    """The tests that cost the most CPU (a test's processes and the children they waited for), as
    ``--durations`` lists wall time: on two shared cores the suite's length follows its CPU."""
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, seconds in getattr(report, "user_properties", ()):
                if name == f"cpu_{getattr(report, 'when', '')}":
                    spent[report.nodeid] = spent.get(report.nodeid, 0.0) + seconds
    total = sum(spent.values())
    if total < CPU_SUMMARY_FROM:
        return
    terminalreporter.write_sep(
        "=", f"most CPU: {min(CPU_SUMMARY, len(spent))} of {len(spent)} tests, {total:.0f} CPU-s in all"
    )
    for nodeid, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:CPU_SUMMARY]:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")
    # By file too: where a cut of CI's time can come from is a file's many small tests as often as one big one.
    per_file: dict[str, list[float]] = {}
    for nodeid, seconds in spent.items():
        per_file.setdefault(nodeid.split("::", 1)[0], []).append(seconds)
    if len(per_file) > 1:
        terminalreporter.write_sep("=", f"most CPU by file: {min(CPU_SUMMARY, len(per_file))} of {len(per_file)}")
        for path, times in sorted(per_file.items(), key=lambda kv: -sum(kv[1]))[:CPU_SUMMARY]:
            terminalreporter.write_line(f"{sum(times):8.1f}s cpu  {len(times):4d} tests  {path}")


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


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory):
    """etcd + kube-apiserver v1.36 on loopback, one per pytest process (tests/k8s_real.py).

    Without the programs the test skips, saying what to set; with
    ``CPUPOOLS_REQUIRE_REAL_K8S=1`` (CI) it fails instead.
    """
    from k8s_real import RealKube, assets_dir

    bin_dir, why = assets_dir()
    if bin_dir is None:
        if os.environ.get("CPUPOOLS_REQUIRE_REAL_K8S") == "1":
            pytest.fail(f"CPUPOOLS_REQUIRE_REAL_K8S=1 but {why}", pytrace=False)
        pytest.skip(why)
    kube = RealKube.start(bin_dir, tmp_path_factory.mktemp("kube"))
    yield kube
    kube.stop()
