"""The agent's zipapp holds exactly the code ``cmk`` imports, and runs with nothing else.

What ``cmk`` imports is seen from outside here, not read from the sources as
scripts/build_agent.py reads it: every subcommand and path that imports
lazily (isolate, its errors, describe, node-report, reconcile with its
metrics and its re-advertising) runs from a copy of the launcher and the
``.pyz`` alone in an empty directory, under ``env -i`` and ``python3 -I -S``,
and a process that imports from the copy lists the package's modules it
loaded (at exit, and in isolate's child at ``exec``).
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from agent_support import PLAN_1X, REPO, make_plan, tasks_of, write_plan_state
from helpers import cache_tag

#: Run in a process of its own: import cmk from the .pyz given, run it, append the
#: cpupools modules it loaded (their files) to OUT at exit and at any exec.
PROBE = """\
import os, sys
out, pyz, *argv = sys.argv[1:]
sys.path.insert(0, pyz)

def dump():
    names = sorted(n for n in sys.modules if n == "cpupools" or n.startswith("cpupools."))
    with open(out, "a") as handle:
        handle.writelines(f"{sys.modules[n].__file__}\\n" for n in names)

def hook(event, _args):
    if event == "os.exec":
        dump()

sys.addaudithook(hook)
try:
    from cpupools.agent.agent import main
    code = main(argv)
finally:
    dump()
sys.exit(code)
"""

#: A kubeconfig whose server refuses the connection: the re-advertise path runs and fails quietly.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:9
users:
- name: u
  user:
    token: t
contexts:
- name: x
  context:
    cluster: c
    user: u
current-context: x
"""


@pytest.fixture(scope="module")
def alone(cmk, tmp_path_factory):
    """The launcher and the zipapp copied into an empty directory; the checkout is nowhere near."""
    where = tmp_path_factory.mktemp("alone")
    for name in ("cmk", "cmk.pyz"):
        shutil.copy2(Path(cmk).with_name(name), where / name)
    return where


def bare_env(**extra: str) -> dict[str, str]:
    """``env -i`` with a node's PATH: no PYTHONPATH, no HOME, nothing of this test's environment."""
    return {"PATH": "/usr/bin:/bin", **extra}


def run_alone(argv: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in bare_env(**extra).items()), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def members(pyz: Path) -> set[str]:
    with zipfile.ZipFile(pyz) as zf:
        return {n for n in zf.namelist() if n.endswith(".py") and n != "__main__.py"}


def test_the_zipapp_holds_exactly_what_cmk_imports(alone, tmp_path):
    pyz = alone / "cmk.pyz"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "imported"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    conf = write_plan_state(tmp_path / "conf", PLAN_1X, {"exclusive": {"0": {"1": [2**22 + 7]}}})
    two = write_plan_state(tmp_path / "two", make_plan({"exclusive": {"0": ["0", "1"]}}))
    kubeconfig = tmp_path / "kubelet.conf"
    kubeconfig.write_text(KUBECONFIG)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    housekeep = tmp_path / "housekeep.conf"  # its --check only reads /proc and sys/, and the pool state
    housekeep.write_text(f"isolated=1\nhousekeeping=0\nconf_dir={conf}\n")
    commands = [
        (["isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/bin/true"], 0),
        (["isolate", f"--conf-dir={two}", "--pool=exclusive", "--no-affinity", "--", "/bin/true"], 0),
        (["isolate", f"--conf-dir={conf}", "--pool=nope", "--", "/bin/true"], None),
        (["isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/nonexistent/cmd"], 127),
        (["isolate", "--pool=shared"], None),
        (["describe", f"--conf-dir={conf}"], 0),
        (["describe", f"--conf-dir={tmp_path / 'absent'}"], None),
        (["node-report", f"--conf-dir={conf}"], 0),
        (["--help"], 0),
        (["frobnicate"], None),
        (["housekeep", f"--config={housekeep}", "--check"], 0),
        (
            [
                "reconcile",
                f"--conf-dir={conf}",
                f"--metrics-dir={metrics}",
                f"--kubeconfig={kubeconfig}",
                "--node-name=n1",
            ],
            0,
        ),
    ]
    for argv, status in commands:
        res = run_alone([sys.executable, "-I", "-S", str(probe), str(out), str(pyz), *argv], cwd, CMK_NUM_CORES="2")
        assert "Traceback" not in res.stderr and "ImportError" not in res.stderr, (argv, res.stderr)
        assert "internal error" not in res.stderr, (argv, res.stderr)
        assert res.returncode == status if status is not None else res.returncode not in (0, 70, 1), (argv, res)
    # The last, reconcile, freed the dead PID's list, wrote the metrics and tried to re-advertise.
    assert "re-advertising on node n1: cannot reach the API server https://127.0.0.1:9" in res.stderr, res.stderr
    assert tasks_of(conf) == {"1": []} and (metrics / "cpupools.prom").exists()
    files = set(out.read_text().split())
    prefix = f"{pyz}/"
    assert all(f.startswith(prefix) for f in files), sorted(f for f in files if not f.startswith(prefix))
    imported = {f.removeprefix(prefix).removesuffix("c") for f in files}  # its .pyc, or its source
    assert "cpupools/cluster/k8s_advertise.py" in imported  # the probe saw the lazy paths
    assert members(pyz) == imported, {"never imported": members(pyz) - imported, "missing": imported - members(pyz)}


def test_the_controllers_code_is_not_in_the_zipapp(cmk):
    names = members(Path(cmk + ".pyz"))
    assert "cpupools/agent/agent.py" in names
    leaked = sorted(
        n
        for n in names
        if n.startswith(("cpupools/planning/", "cpupools/report/"))
        or n.rpartition("/")[2] in ("k8s_admission.py", "cmk_retire.py", "runtimes_apply.py")
    )
    assert leaked == []


def test_the_zipapp_alone_runs_isolate_describe_and_reconcile(alone, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    dead = 2**22 + 11
    conf = write_plan_state(tmp_path / "conf", PLAN_1X, {"exclusive": {"0": {"1": [dead]}}})
    launcher = str(alone / "cmk")
    # Through the launcher's own interpreter line (#!/bin/sh, which execs python3 -IS), as a node runs it.
    iso = run_alone(
        [launcher, "isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/bin/sh", "-c", "echo $CMK_CPUS_ASSIGNED"],
        cwd,
    )
    assert (iso.returncode, iso.stdout, iso.stderr) == (0, "0\n", "")
    described = run_alone([launcher, "describe", f"--conf-dir={conf}"], cwd)
    assert described.returncode == 0, described.stderr
    pools = json.loads(described.stdout)["pools"]
    assert pools["exclusive"]["cpuLists"]["1"]["tasks"] == [dead]
    assert pools["shared"]["cpuLists"]["0"]["tasks"] == []  # isolate gave its list back
    rec = run_alone([sys.executable, "-I", "-S", launcher, "reconcile", f"--conf-dir={conf}"], cwd)
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["reclaimedCpuLists"] == [{"cpus": "1", "pid": dead, "pool": "exclusive"}]
    assert tasks_of(conf) == {"1": []}
    assert sorted(os.listdir(alone)) == ["cmk", "cmk.pyz"] and os.listdir(cwd) == []


def test_the_closure_is_read_from_every_import_statement(tmp_path, monkeypatch):
    """Module level and inside functions, ``from .pkg import module`` and ``from . import module``; nothing else."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import build_agent
    finally:
        sys.path.pop(0)
    files = {
        "__init__.py": "",
        "agent/__init__.py": "",
        "agent/agent.py": "from ..core import errors\n\ndef later():\n    from . import lazy\n",
        "agent/lazy.py": "import os\nfrom ..core.names import X\n",
        "core/__init__.py": "",
        "core/errors.py": "",
        "core/names.py": "X = 1\n",
        "core/unused.py": "",
        "planning/__init__.py": "",
        "planning/plan.py": "from ..core import errors\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(build_agent, "PACKAGE_DIR", str(tmp_path))
    assert build_agent.closure() == [
        "__init__.py",
        "agent/__init__.py",
        "agent/agent.py",
        "agent/lazy.py",
        "core/__init__.py",
        "core/errors.py",
        "core/names.py",
    ]
    (tmp_path / "agent/lazy.py").write_text("def f():\n    from ..core.missing import X\n")
    with pytest.raises(SystemExit, match=r"lazy.py:2: no module core.missing in the package"):
        build_agent.closure()


#: Shadows the stdlib's _ctypes (isolate loads it for prctl) for a Python that reads PYTHONPATH; a
#: workload's module of that name would leave its command without the death signal, silently.
POISON = 'import sys\nsys.stderr.write("the workload\'s PYTHONPATH reached cmk\\n")\nraise ImportError("poison")\n'


def test_the_launcher_runs_the_path_python3_isolated_through_sh(alone, tmp_path):
    """``#!/bin/sh`` (the default): sh execs the first python3 on PATH with ``-IS`` and the launcher's path.

    The workload's ``PYTHONPATH`` does not reach ``cmk`` (a module there named
    like one of the stdlib's that isolate imports would be imported instead);
    a link to the launcher finds the zipapp beside the link's target; without
    a python3 on PATH, sh says so and isolate exits 127 as ``env`` did.
    """
    assert (alone / "cmk").read_text().startswith('#!/bin/sh\n"exec" "python3" "-IS" "$0" "$@"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "python3.args"
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\nexec /usr/bin/python3 "$@"\n')
    wrapper.chmod(0o755)
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "_ctypes.py").write_text(POISON)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    link = cwd / "cmk-link"
    link.symlink_to(alone / "cmk")
    conf = write_plan_state(tmp_path / "conf", PLAN_1X)
    argv = ["isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/bin/sh", "-c", "echo $CMK_CPUS_ASSIGNED"]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(poison)}
    res = run_alone([str(link), *argv], cwd, **env)
    assert (res.returncode, res.stdout, res.stderr) == (0, "0\n", "")
    assert log.read_text().splitlines() == ["-IS", str(link), *argv]
    # The same poison reaches a launcher whose interpreter line is a plain python3: the test can fail.
    plain = tmp_path / "plain"
    build = [sys.executable, str(REPO / "scripts" / "build_agent.py"), "--shebang=/usr/bin/env python3"]
    subprocess.run([*build, str(plain / "cmk")], check=True, capture_output=True)
    res = run_alone([str(plain / "cmk"), *argv], cwd, **env)
    assert (res.returncode, res.stdout) == (0, "0\n") and "the workload's PYTHONPATH reached cmk" in res.stderr
    # A Python interpreter line reads the exec line as a string and runs the rest.
    res = run_alone([str(plain / "cmk"), *argv], cwd, PATH=env["PATH"])
    assert (res.returncode, res.stdout, res.stderr) == (0, "0\n", "")
    missing = run_alone([str(alone / "cmk"), *argv], cwd, PATH=str(tmp_path / "nowhere"))
    assert missing.returncode == 127 and "python3" in missing.stderr and missing.stdout == ""
    assert tasks_of(conf, "shared") == {"0": []}


def test_the_bytecode_of_another_python_is_carried_and_used_first(tmp_path):
    """``--python`` (``cpupools_agent_bytecode_pythons``): the bytecode of another Python version in a member
    of its own (``cpupools-bytecode/<cache tag>``), from which that Python imports every module of the agent
    at once instead of compiling every source at each start.

    The build is this test's Python (the .venv's) and the node's ``/usr/bin/python3`` another version,
    as a controller on ansible-core 2.20+ (Python 3.12 or later) and a Debian 12 node are.
    """
    node = "/usr/bin/python3"
    own, other = cache_tag(sys.executable), cache_tag(node)
    if own == other:
        pytest.skip(f"{node} is this Python's version ({own}): nothing to compile for another")
    script = [sys.executable, str(REPO / "scripts" / "build_agent.py")]
    plain, carried, again = (tmp_path / name / "cmk" for name in ("plain", "carried", "again"))
    subprocess.run([*script, str(plain)], check=True, capture_output=True)
    # this Python named again adds nothing: its own version's member is there already
    for out in (carried, again):
        subprocess.run([*script, f"--python={node}", f"--python={sys.executable}", str(out)], check=True)
    assert carried.with_suffix(".pyz").read_bytes() == again.with_suffix(".pyz").read_bytes()  # deterministic
    with zipfile.ZipFile(carried.with_suffix(".pyz")) as zf:
        names = zf.namelist()
        tables = {tag: marshal.loads(zf.read(f"cpupools-bytecode/{tag}")) for tag in (own, other)}
    sources = sorted(n for n in names if n.startswith("cpupools/") and n.endswith(".py"))
    assert sorted(n for n in names if not n.startswith("cpupools/")) == sorted(
        ["__main__.py", "__main__.pyc", f"cpupools-bytecode/{own}", f"cpupools-bytecode/{other}"]
    )
    for table in tables.values():  # every module's code, under its module name, and the finder's ("")
        assert sorted(where for key, (where, _code) in table.items() if key) == sources
        assert table["cpupools.agent.agent"][0] == "cpupools/agent/agent.py" and "" in table

    conf = write_plan_state(tmp_path / "conf", PLAN_1X)
    argv = ["isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/bin/sh", "-c", "echo $CMK_CPUS_ASSIGNED"]
    for launcher, loader in ((carried, "<class 'Bytecode'>"), (plain, f'<zipimporter object "{plain}.pyz/')):
        res = run_alone([node, "-v", "-IS", str(launcher), *argv], tmp_path)
        assert (res.returncode, res.stdout) == (0, "0\n"), res.stderr[-2000:]
        imported = [line for line in res.stderr.splitlines() if line.startswith("import 'cpupools")]
        # from the member of 3.11's bytecode; the build without it (the control): each source from the zip
        assert imported and all(f"# {loader}" in line for line in imported), (loader, imported)
    # run as a zipapp (the housekeeper's unit: python3 -IS cpupools.pyz), its __main__ does the same
    res = run_alone([node, "-v", "-IS", str(carried.with_suffix(".pyz")), "--help"], tmp_path)
    imported = [line for line in res.stderr.splitlines() if line.startswith("import 'cpupools")]
    assert res.returncode == 0 and res.stdout.startswith("usage:") and imported
    assert all("# <class 'Bytecode'>" in line for line in imported), imported
    # the build's own Python too, from its own member
    res = run_alone([sys.executable, "-v", "-IS", str(carried), *argv], tmp_path)
    assert res.returncode == 0 and "import 'cpupools.agent.agent' # <class 'Bytecode'>" in res.stderr

    # a Python that cannot be run is refused by name, and nothing is written
    bad = subprocess.run(
        [*script, "--python=/nonexistent/python3", str(tmp_path / "bad" / "cmk")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--python='/nonexistent/python3'" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists()


def test_help_and_unknown_options_write_nothing(tmp_path):
    """``--help`` prints the usage; an option the script does not know is refused: neither is taken for
    OUTPUT (``build_agent.py --help`` in a shell's current directory wrote ``--help`` and ``--help.pyz``)."""
    script = [sys.executable, str(REPO / "scripts" / "build_agent.py")]
    shown = subprocess.run([*script, "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("Usage:") and "--python=PATH" in shown.stdout
    wrong = subprocess.run([*script, "--out=x"], cwd=tmp_path, capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown option '--out=x'" in wrong.stderr, wrong.stderr
    assert list(tmp_path.iterdir()) == []
