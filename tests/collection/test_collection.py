"""The repository as the collection cpupools.cpupools: built, installed, run by FQCN, sanity-tested.

What a user with only ``pip install ansible-core`` does, done for real: a
fresh virtual environment with nothing but the pinned ansible-core builds the
tarball from this checkout, installs it into an empty collections path and
runs ``ansible-playbook cpupools.cpupools.site`` against the embedded default
inventory shipped inside it, with no ansible.cfg, no ANSIBLE_* variable and
an empty HOME. ``ansible-test sanity`` runs on the installed copy.

Needs the package index (or pip's cache) for the fresh environment and for
ansible-test's own sanity environments, as scripts/bootstrap.sh does.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers import REPO, VENV_BIN, tree_snapshot

pytestmark = pytest.mark.slow

NS, NAME = "cpupools", "cpupools"
RECAP = re.compile(r"^localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, version = line.split("==")
            out[name.lower().replace("_", "-")] = version
    return out


def _galaxy_version() -> str:
    return re.search(r"^version:\s*(\S+)\s*$", (REPO / "galaxy.yml").read_text(), re.MULTILINE).group(1)


def _clean_env(tmp: Path, bin_dir: Path, collections: Path) -> dict[str, str]:
    """A user's shell: the venv on PATH, nothing of this checkout, an empty HOME."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_NOCOLOR": "1",
    }


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


def _recap(proc: subprocess.CompletedProcess) -> dict[str, int]:
    found = RECAP.findall(proc.stdout)
    assert found, f"no PLAY RECAP for localhost (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    ok, changed, unreachable, failed = (int(n) for n in found[-1])
    return {"ok": ok, "changed": changed, "unreachable": unreachable, "failed": failed}


def _build(ansible_galaxy: Path, out: Path, env: dict[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    proc = _run([ansible_galaxy, "collection", "build", "--output-path", out, REPO], cwd=out, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tarball = out / f"{NS}-{NAME}-{_galaxy_version()}.tar.gz"
    assert tarball.is_file(), proc.stdout
    return tarball


def _install(ansible_galaxy: Path, tarball: Path, collections: Path, env: dict[str, str]) -> Path:
    proc = _run([ansible_galaxy, "collection", "install", "-p", collections, tarball], cwd=collections.parent, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = collections / "ansible_collections" / NS / NAME
    assert (installed / "MANIFEST.json").is_file(), proc.stdout + proc.stderr
    return installed


@dataclass(frozen=True)
class Fresh:
    bin: Path  # bin/ of a new virtual environment holding only ansible-core
    tarball: Path  # the collection, built by that environment's ansible-galaxy from this checkout


def _shared_dir(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this session sees (the session's base temp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _make_fresh(shared: Path, core: str) -> Fresh:
    """A new venv holding only ansible-core ``core`` (from the package index or pip's cache), and a build with it.

    Made once under ``shared``: the first pytest-xdist worker to take the
    lock makes it, the others wait and reuse it.
    """
    shared.mkdir(exist_ok=True)
    venv, dist, done = shared / "venv", shared / "dist", shared / "done"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            shutil.rmtree(dist, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    f"ansible-core=={core}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert pip.returncode == 0, pip.stdout + pip.stderr
            collections = shared / "collections"
            collections.mkdir(exist_ok=True)
            _build(venv / "bin" / "ansible-galaxy", dist, _clean_env(shared, venv / "bin", collections))
            done.write_text(core)
    assert done.read_text() == core, f"{shared} holds ansible-core {done.read_text()}, not {core}"
    return Fresh(venv / "bin", dist / f"{NS}-{NAME}-{_galaxy_version()}.tar.gz")


@pytest.fixture(scope="session")
def fresh(tmp_path_factory) -> Fresh:
    """One fresh environment with the pinned ansible-core and one build per test session, shared by the workers.

    Tests that run the collection install the tarball into their own temporary path.
    """
    core = _pins(REPO / "requirements-run.txt")["ansible-core"]
    return _make_fresh(_shared_dir(tmp_path_factory) / "collection-fresh", core)


def _supported_cores() -> tuple[str, str]:
    """The oldest and the newest ansible-core this collection is tested with: runtime.yml's lower bound, the pin."""
    runtime = (REPO / "meta" / "runtime.yml").read_text()
    spec = re.search(r'^requires_ansible:\s*"([^"]+)"', runtime, re.MULTILINE).group(1)
    oldest = re.search(r">=\s*([0-9.]+)", spec).group(1)
    return oldest, _pins(REPO / "requirements-run.txt")["ansible-core"]


def _read_only_prefix(collections: Path) -> list[str]:
    """The command prefix that runs a command with ``collections`` read-only, as an execution environment has it.

    A user other than root cannot write into a tree after ``chmod -R a-w``;
    root can, so as root each command runs in a mount namespace of its own in
    which ``collections`` is a read-only bind mount of itself (writes fail
    with EROFS, and ``access(W_OK)`` says no).
    """
    subprocess.run(["chmod", "-R", "a-w", str(collections)], check=True)
    if os.geteuid() != 0:
        return []
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode:
        pytest.skip("root without unshare --mount: cannot make the collection read-only for root")
    mount = f'mount --bind "{collections}" "{collections}" && mount -o remount,bind,ro "{collections}"'
    return ["unshare", "--mount", "sh", "-c", f'{mount} && exec "$@"', "read-only"]


def _runs_read_only_by_fqcn(fresh_core: Path, tarball: Path, tmp_path: Path, *, full: bool) -> None:
    """Install ``tarball`` read-only; run site.yml (check, run, re-run), reboot.yml --check and uninstall.yml.

    The runs write into the user's cache (``cpupools_work_dir: auto``), never
    into the collection. ``full`` adds the module doc, a stage by FQCN and a
    bad value given with -e.
    """
    collections = tmp_path / "collections"
    collections.mkdir()
    env = _clean_env(tmp_path, fresh_core, collections)
    coll = _install(fresh_core / "ansible-galaxy", tarball, collections, env)
    read_only = _read_only_prefix(collections)
    installed = tree_snapshot(collections)
    work = Path(env["HOME"]) / ".cache" / "cpupools"
    inventory = coll / "inventories" / "local" / "hosts.yml"
    playbook = [*read_only, fresh_core / "ansible-playbook", "-i", inventory]

    if full:
        # The module documentation and a module run by FQCN, from the installed copy.
        doc = _run([fresh_core / "ansible-doc", "-t", "module", f"{NS}.{NAME}.cpupools_plan"], cwd=tmp_path, env=env)
        assert doc.returncode == 0 and str(coll) in doc.stdout, doc.stdout + doc.stderr

    # Check mode first: it predicts changes and writes nothing, not even the agent build.
    check = _run([*playbook, f"{NS}.{NAME}.site", "--check"], cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-4000:]
    assert _recap(check)["changed"] > 0
    assert not (work / "sandbox").exists() and not (work / "build").exists()

    first = _run([*playbook, f"{NS}.{NAME}.site"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert _recap(first)["changed"] > 0
    node = work / "sandbox" / "localhost"
    pools = json.loads((node / "etc" / "cmk" / "cpupools.json").read_text())
    assert pools, "the pool state is empty"
    assert (node / "opt" / "bin" / "cmk").is_file()
    assert (work / "build" / "agent" / "cmk.pyz").is_file()
    assert (work / "sandbox" / "report.html").is_file()
    assert list((node / "etc" / "default" / "grub.d").glob("*.cfg")), "no GRUB drop-in was written"

    second = _run([*playbook, f"{NS}.{NAME}.site"], cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    recap = _recap(second)
    assert (recap["changed"], recap["failed"]) == (0, 0), second.stdout[-4000:]

    if full:
        # One stage by FQCN, and a bad value given with -e refused in one line naming host and variable.
        stage = _run([*playbook, f"{NS}.{NAME}.plan"], cwd=tmp_path, env=env)
        assert stage.returncode == 0 and _recap(stage)["changed"] == 0, stage.stdout[-4000:]
        bad = _run([*playbook, f"{NS}.{NAME}.site", "-e", "cpupools_num_exclusive_cores=lots"], cwd=tmp_path, env=env)
        assert bad.returncode != 0
        assert re.search(r"localhost.*cpupools_num_exclusive_cores.*lots", bad.stdout), bad.stdout[-4000:]
        assert "Traceback" not in bad.stdout + bad.stderr

    # The rolling reboot in check mode (a sandbox node boots through a stand-in command, not run in check mode).
    stand_in = json.dumps({"cpupools_reboot_simulate_command": ["/bin/true"]})
    reboot = _run([*playbook, f"{NS}.{NAME}.reboot", "--check", "-e", stand_in], cwd=tmp_path, env=env)
    assert reboot.returncode == 0, reboot.stdout[-4000:] + reboot.stderr[-4000:]
    assert "cpupools_reboot : Boot the sandbox node" in reboot.stdout, reboot.stdout[-4000:]

    uninstall = _run([*playbook, f"{NS}.{NAME}.uninstall"], cwd=tmp_path, env=env)
    assert uninstall.returncode == 0, uninstall.stdout[-4000:] + uninstall.stderr[-4000:]
    assert _recap(uninstall)["changed"] > 0
    assert not (node / "opt" / "bin" / "cmk").exists() and not (node / "etc" / "cmk").exists()

    assert tree_snapshot(collections) == installed, "a run wrote into the installed collection"


def test_fresh_ansible_core_installs_read_only_and_runs_site_reboot_uninstall_by_fqcn(fresh, tmp_path):
    installed_names = {
        line.split("==")[0].lower()
        for line in subprocess.run(
            [str(fresh.bin / "python"), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        ).stdout.split()
    }
    assert "ansible-core" in installed_names
    assert not installed_names & {"ansible", "kubernetes", "molecule", "ansible-lint", "pytest"}, installed_names
    _runs_read_only_by_fqcn(fresh.bin, fresh.tarball, tmp_path, full=True)


#: The newest 2.20 release: the minor between the lower bound and the pin (meta/runtime.yml).
CORE_2_20 = "2.20.10"


def _compat_cores() -> list[str]:
    return [_supported_cores()[0], CORE_2_20]


@pytest.mark.compat_core
@pytest.mark.parametrize("core", _compat_cores())
def test_each_older_supported_ansible_core_runs_the_installed_collection(core, tmp_path):
    """requires_ansible's lower bound and the newest 2.20, beside the suite (on the pin), in venvs of their own."""
    oldest, newest = _supported_cores()
    assert oldest != newest, f"requires_ansible admits one release only ({oldest}): test it on the pin alone"
    minors = {".".join(v.split(".")[:2]) for v in (oldest, CORE_2_20, newest)}
    assert len(minors) == 3, f"{oldest}, {CORE_2_20} and {newest}: three minors, one of each"
    if tuple(int(n) for n in core.split(".")[:2]) >= (2, 20) and sys.version_info < (3, 12):
        pytest.skip(
            f"ansible-core {core} runs its controller on Python 3.12 or newer; this is {sys.version.split()[0]}"
        )
    old = _make_fresh(tmp_path / f"core-{core}", core)
    version = subprocess.run([str(old.bin / "ansible"), "--version"], capture_output=True, text=True, check=True)
    assert f"core {core}]" in version.stdout.splitlines()[0], version.stdout
    _runs_read_only_by_fqcn(old.bin, old.tarball, tmp_path, full=False)


def test_tarball_holds_the_collection_and_nothing_of_the_checkout(fresh):
    with tarfile.open(fresh.tarball) as tar:
        members = tar.getmembers()
    names = {m.name for m in members}
    links = sorted(m.name for m in members if m.issym() or m.islnk())
    assert not links, f"links in the tarball: {links}"

    modules = sorted(p.name for p in (REPO / "plugins" / "modules").glob("*.py"))
    utils = sorted(str(p.relative_to(REPO)) for p in (REPO / "plugins" / "module_utils").rglob("*.py"))
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
    expected = {
        "MANIFEST.json",
        "CHANGELOG.md",
        "FILES.json",
        "README.md",
        "meta/runtime.yml",
        "meta/execution-environment.yml",
        "requirements.txt",
        "bindep.txt",
        "LICENSE",
        "changelogs/changelog.yaml",
        "changelogs/config.yaml",
        "plugins/filter/work_dir.py",
        "plugins/callback/stages.py",
        "playbooks/site.yml",
        "site.yml",
        "inventories/local/hosts.yml",
        "scripts/build_agent.py",
        "tests/sanity/ignore-2.21.txt",
        "tests/config.yml",
        "plugins/doc_fragments/cpupools_kube.py",
        *(f"plugins/modules/{m}" for m in modules),
        *utils,
        # The cpupools role is the others' declared interface: defaults and two task files, no entry point.
        "roles/cpupools/defaults/main.yml",
        "roles/cpupools/tasks/plan_facts.yml",
        *(f"roles/{r}/tasks/main.yml" for r in roles if r != "cpupools"),
        *(f"roles/{r}/meta/argument_specs.yml" for r in roles if r != "cpupools"),
    }
    assert expected <= names, sorted(expected - names)

    # Nothing of the checkout's own: tests (but tests/sanity), tools and scripts (but the agent build, which
    # the agent role runs), unreleased changelog fragments, the image definition, state of runs.
    unwanted = re.compile(
        r"^(\.venv|\.ansible|\.ci|\.config|\.git|collections|sandbox|build|reports|bench|molecule)(/|$)"
        r"|^tests/(?!sanity(/|$)|config\.yml$)|^scripts/(?!build_agent\.py$)|^ansible\.cfg$|^pyproject\.toml$|^requirements-"
        r"|^changelogs/fragments(/|$)|^execution-environment\.yml$"
        r"|__pycache__|\.pyc$|\.tar\.gz$"
    )
    stray = sorted(n for n in names if unwanted.search(n))
    assert not stray, f"files of the checkout in the collection: {stray[:20]}"


def test_ansible_test_sanity_passes_on_the_installed_collection(fresh, tmp_path):
    """The documented command (docs/collection.md, "Sanity"), with the fresh environment and its build."""
    sys.path.insert(0, str(REPO / "scripts"))
    from sanity import SKIPPED

    collections = tmp_path / "collections"
    collections.mkdir()
    env = _clean_env(tmp_path, fresh.bin, collections)
    env["HOME"] = os.environ.get("HOME", str(Path.home()))  # ansible-test's sanity venvs and pip's cache live here
    script = [fresh.bin / "python", REPO / "scripts" / "sanity.py", "--tarball", fresh.tarball, "--workdir", tmp_path]
    proc = _run(script, cwd=tmp_path, env=env, timeout=1800)
    errors = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith(("ERROR", "FATAL")))
    assert proc.returncode == 0, errors or proc.stdout[-4000:] + proc.stderr[-4000:]
    ran = set(re.findall(r'^Running sanity test "([^"]+)"', proc.stdout, re.MULTILINE))
    assert {"validate-modules", "pylint", "import", "compile", "yamllint", "runtime-metadata"} <= ran, ran
    assert not ran & set(SKIPPED), ran
    assert SKIPPED == ("ansible-doc", "pep8")


def test_sanity_ignores_each_name_a_reason_and_an_existing_file():
    ignores = REPO / "tests" / "sanity" / "ignore-2.21.txt"
    core = _pins(REPO / "requirements-run.txt")["ansible-core"]
    assert ignores.name == f"ignore-{'.'.join(core.split('.')[:2])}.txt", "the ignore file must match the pinned core"
    for line in ignores.read_text().splitlines():
        entry, _, reason = line.partition(" # ")
        path, check = entry.split(" ")
        assert len(reason.split()) >= 4, f"no reason given: {line}"
        assert (REPO / path).is_file(), f"ignore entry for a missing file: {line}"
        assert check, line


@pytest.mark.parametrize("suffix", ["", "-py311"])
def test_run_pins_are_the_dev_pins_and_the_collection_requirement(suffix):
    """The 2.21 set, and the -py311 set (ansible-core 2.19) bootstrap.sh installs on a Python older than 3.12."""
    run = _pins(REPO / f"requirements-run{suffix}.txt")
    dev = _pins(REPO / f"requirements-dev{suffix}.txt")
    differ = {name: (version, dev.get(name)) for name, version in run.items() if dev.get(name) != version}
    assert not differ, (
        f"requirements-run{suffix}.txt pins that requirements-dev{suffix}.txt lacks or pins otherwise: {differ}"
    )
    if suffix:
        # the same direct requirements, but ansible-core (and the ansible bundle of the dev set) one release older
        assert run["ansible-core"].startswith("2.19.") and dev["ansible"].startswith("12."), (run, dev)
        assert run["kubernetes"] == _pins(REPO / "requirements-run.txt")["kubernetes"]
        return
    assert run["ansible-core"].startswith("2.21.") and dev["ansible"].startswith("14."), (run, dev)
    direct = _pins(REPO / "requirements-run.in")
    assert direct.keys() == {"ansible-core", "kubernetes", "jinja2", "pyyaml"}
    assert all(run[name] == version for name, version in direct.items()), (direct, run)
    collection = (REPO / "requirements.txt").read_text()
    assert re.search(rf"^kubernetes>={re.escape(run['kubernetes'])}$", collection, re.MULTILINE), collection


def test_requires_ansible_names_the_tested_range():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    runtime = (REPO / "meta" / "runtime.yml").read_text()
    spec = SpecifierSet(re.search(r'^requires_ansible:\s*"([^"]+)"', runtime, re.MULTILINE).group(1))
    oldest, newest = _supported_cores()
    assert {oldest, CORE_2_20, newest} <= set(spec.filter([oldest, CORE_2_20, newest])), (
        f"requires_ansible {spec} excludes a tested ansible-core"
    )
    assert Version(oldest) < Version(newest)
    assert any(s.operator == "<" for s in spec), f"requires_ansible {spec} has no upper bound"
    # Nothing newer than the pin's minor release is admitted: it is not tested.
    major, minor = Version(newest).release[:2]
    assert f"{major}.{minor + 1}.0" not in spec, f"requires_ansible {spec} admits an untested ansible-core"


def test_license_file_is_the_gpl_galaxy_yml_names():
    galaxy = (REPO / "galaxy.yml").read_text()
    assert re.search(r"^license_file: LICENSE$", galaxy, re.MULTILINE), "galaxy.yml names no license_file"
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["GNU", "GENERAL", "PUBLIC", "LICENSE", "Version"] and "Version 3, 29 June 2007" in text
    # Every plugin says which license, and "or later" (GPL-3.0-or-later), as ansible-test's sanity wants.
    plugins = [
        p
        for kind in ("modules", "action", "filter", "plugin_utils", "doc_fragments")
        for p in (REPO / "plugins" / kind).glob("*.py")
    ]
    assert len(plugins) > 15, plugins
    for path in plugins:
        assert "GNU General Public License v3.0+" in path.read_text()[:400], f"{path}: no license header"


def _antsibull_changelog(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(VENV_BIN / "antsibull-changelog"), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_changelog_fragments_make_the_release_notes_of_the_galaxy_version(tmp_path):
    """The fragments are well formed, and a release (in a copy) turns every one into changelog.yaml and CHANGELOG.md."""
    lint = _antsibull_changelog("lint", cwd=REPO)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    fragments = sorted((REPO / "changelogs" / "fragments").glob("*.yml"))
    assert fragments, "no changelog fragment"
    assert yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"] == {}, (
        "changelog.yaml names a release: move its fragments' version in galaxy.yml on"
    )
    entries = []
    for fragment in fragments:
        for section, items in yaml.safe_load(fragment.read_text()).items():
            entries += [items] if section == "release_summary" else items
    # A copy laid out as an installed collection: antsibull-changelog lists new plugins with ansible-doc there.
    copy = tmp_path / "ansible_collections" / NS / NAME
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".*", "collections", "sandbox", "build", "reports"))
    version = _galaxy_version()
    release = _antsibull_changelog("release", "--version", version, "--date", "2026-12-01", cwd=copy)
    assert release.returncode == 0, release.stdout + release.stderr
    data = yaml.safe_load((copy / "changelogs" / "changelog.yaml").read_text())
    assert list(data["releases"]) == [version]
    changes = data["releases"][version]["changes"]
    released = [changes.pop("release_summary"), *(item for items in changes.values() for item in items)]
    assert sorted(released) == sorted(entries)
    notes = (copy / "CHANGELOG.md").read_text()
    assert f"## v{version.replace('.', chr(92) + '.')}" in notes, notes[:500]
    assert "cpupools\\.cpupools\\.cpupools\\_agent\\_build" in notes  # a new module, listed from its version_added
    assert not list((copy / "changelogs" / "fragments").glob("*.yml")), "the release kept fragments"


def test_execution_environment_renders_offline_with_the_collection_and_its_requirements(fresh, tmp_path):
    """ansible-builder: the definition renders a build context (no registry), and the installed collection declares
    its Python and system requirements where an execution environment's build reads them."""
    builder = VENV_BIN / "ansible-builder"
    definition = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert definition["version"] == 3
    deps = definition["dependencies"]
    assert deps["ansible_core"]["package_pip"] == f"ansible-core=={_supported_cores()[1]}"
    assert deps["galaxy"]["collections"] == [{"name": f"{NS}.{NAME}", "version": _galaxy_version()}]
    context = tmp_path / "context"
    create = subprocess.run(
        [str(builder), "create", "-f", str(REPO / "execution-environment.yml"), "-c", str(context)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert create.returncode == 0, create.stdout + create.stderr
    build = context / "_build"
    assert (build / "requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    assert (build / "bindep.txt").read_text() == (REPO / "bindep.txt").read_text()
    assert yaml.safe_load((build / "requirements.yml").read_text()) == deps["galaxy"]
    containerfile = next(p for p in (context / "Containerfile", context / "Dockerfile") if p.exists()).read_text()
    assert f'EE_BASE_IMAGE="{definition["images"]["base_image"]["name"]}"' in containerfile
    assert f"ansible-core=={_supported_cores()[1]}" in containerfile

    # What the build's introspection finds in the installed collection (meta/execution-environment.yml).
    collections = tmp_path / "collections"
    collections.mkdir()
    _install(fresh.bin / "ansible-galaxy", fresh.tarball, collections, _clean_env(tmp_path, fresh.bin, collections))
    found = subprocess.run(
        [str(builder), "introspect", "--sanitize", str(collections)], capture_output=True, text=True, check=False
    )
    assert found.returncode == 0, found.stdout + found.stderr
    introspected = yaml.safe_load(found.stdout[found.stdout.index("---") :])
    requirement = next(line for line in (REPO / "requirements.txt").read_text().splitlines() if line[:1].isalpha())
    assert any(line.startswith(requirement) for line in introspected["python"]), introspected
    system = [line.split("#")[0].strip() for line in introspected["system"]]
    assert "openssh-clients [platform:rpm]" in system and "openssh-client [platform:dpkg]" in system, introspected


def test_install_from_git_builds_the_same_collection(tmp_path):
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout")
    collections = tmp_path / "collections"
    collections.mkdir()
    env = _clean_env(tmp_path, VENV_BIN, collections)
    proc = _run(
        [VENV_BIN / "ansible-galaxy", "collection", "install", "-p", collections, f"git+file://{REPO},HEAD"],
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    coll = collections / "ansible_collections" / NS / NAME
    manifest = json.loads((coll / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == _galaxy_version()
    files = {entry["name"] for entry in json.loads((coll / "FILES.json").read_text())["files"]}
    assert "playbooks/site.yml" in files and "plugins/modules/cpupools_plan.py" in files
    # tests/sanity and tests/config.yml ship (ansible-test reads them from the installed collection)
    shipped_tests = {f for f in files if f.startswith("tests/") and not f.startswith("tests/sanity")} - {
        "tests/config.yml"
    }
    assert "tests/config.yml" in files
    assert not shipped_tests | {f for f in files if f.startswith(("molecule", "collections", ".venv", "sandbox"))}
    doc = _run([VENV_BIN / "ansible-doc", "-t", "module", f"{NS}.{NAME}.cpupools_plan"], cwd=tmp_path, env=env)
    assert doc.returncode == 0 and str(coll) in doc.stdout, doc.stdout + doc.stderr
