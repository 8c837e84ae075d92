"""scripts/bootstrap.sh picks the controller's Python, and with it the pinned set.

The script runs on a copy of itself and of the requirement files, with a PATH
and a HOME of the test's own: each "Python" there is a small script that
answers the version probe as the named release would, and makes a venv whose
pip only records what it was asked to install.
"""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/bin/sh
# A stand-in for Python {version}: the version probe, -V and -m venv DIR.
if [ "$1" = -c ]; then exit {too_old}; fi
if [ "$1" = -V ]; then echo "Python {version}"; exit 0; fi
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin"
    printf '#!/bin/sh\\necho "{version} $*" >>"%s"\\n' "$LOG" >"$3/bin/python"
    chmod +x "$3/bin/python"
    exit 0
fi
exit 3
"""


def _checkout(tmp_path: Path) -> Path:
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap.sh", tree / "scripts")
    for req in REPO.glob("requirements-*.txt"):
        shutil.copy(req, tree)
    return tree


def _fake(bin_dir: Path, name: str, version: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    too_old = int(tuple(int(n) for n in version.split(".")[:2]) < (3, 12))  # the probe's exit status
    path = bin_dir / name
    path.write_text(FAKE_PYTHON.format(version=version, too_old=too_old))
    path.chmod(0o755)


def _bootstrap(tree: Path, path: list[Path], set_name: str = "dev", **env) -> tuple[subprocess.CompletedProcess, str]:
    log = tree.parent / "pip.log"
    run_env = {
        "PATH": ":".join([*(str(p) for p in path), "/usr/bin", "/bin"]),
        "HOME": str(tree.parent / "home"),
        "LOG": str(log),
        **env,
    }
    proc = subprocess.run(
        ["bash", str(tree / "scripts" / "bootstrap.sh"), set_name],
        capture_output=True,
        text=True,
        env=run_env,
        check=False,
        timeout=60,
    )
    return proc, log.read_text() if log.exists() else ""


def test_a_controller_with_python_3_11_only_gets_ansible_core_2_19_and_one_line_saying_so(tmp_path):
    tree = _checkout(tmp_path)
    fakes = tmp_path / "bin"
    _fake(fakes, "python3", "3.11.2")
    proc, log = _bootstrap(tree, [fakes])
    assert proc.returncode == 0, proc.stderr
    pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"]
    assert log.split() == ["3.11.2", *pip, "requirements-dev-py311.txt"], log
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "3.11.2" in lines[0] and "ansible-core 2.19" in lines[0], proc.stderr
    pins = (tree / "requirements-dev-py311.txt").read_text()
    assert "ansible-core==2.19." in pins


def test_the_newest_python_found_gets_the_newest_core_and_a_re_run_keeps_the_venv(tmp_path):
    tree = _checkout(tmp_path)
    fakes = tmp_path / "bin"
    _fake(fakes, "python3", "3.11.2")
    _fake(fakes, "python3.12", "3.12.9")
    # pyenv's installs are found when PATH has no python3.1x that runs (its shims fail outside a pyenv version)
    _fake(tmp_path / "home" / ".pyenv" / "versions" / "3.13.5" / "bin", "python3", "3.13.5")
    shim = fakes / "python3.13"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    proc, log = _bootstrap(tree, [fakes])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert log.split()[0] == "3.12.9" and log.split()[-1] == "requirements-dev.txt", log
    assert "ansible-core==2.21." in (tree / "requirements-dev.txt").read_text()

    # Without python3.12 on PATH, pyenv's 3.13 is next; the venv already holds the dev set: nothing is done.
    os.remove(fakes / "python3.12")
    again, log_again = _bootstrap(tree, [fakes], "run")
    assert again.returncode == 0 and again.stderr == "" and log_again == log, again.stderr

    # A new venv (the stamp gone) is made with pyenv's 3.13.
    (tree / ".venv" / ".requirements.sha256").unlink()
    third, log_third = _bootstrap(tree, [fakes], "run")
    assert third.returncode == 0, third.stderr
    assert log_third.splitlines()[-1].split()[0] == "3.13.5", log_third
    assert log_third.splitlines()[-1].split()[-1] == "requirements-run.txt", log_third


def test_python_named_in_the_environment_wins(tmp_path):
    tree = _checkout(tmp_path)
    fakes = tmp_path / "bin"
    _fake(fakes, "python3.13", "3.13.5")
    _fake(fakes, "old", "3.11.2")
    proc, log = _bootstrap(tree, [fakes], "run", PYTHON=str(fakes / "old"))
    assert proc.returncode == 0
    assert log.split()[0] == "3.11.2" and log.split()[-1] == "requirements-run-py311.txt", log
    assert "ansible-core 2.19" in proc.stderr
