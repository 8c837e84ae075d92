"""Test helpers importable from any test module: real ansible-playbook runs, snapshots.

The fixtures that use them are in tests/conftest.py (a test imports from
``helpers``, never from ``conftest``: every test folder has its own conftest)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
#: tests/bytecode/sitecustomize.py: the compile cache of the Pythons of every Ansible run of the tests
BYTECODE = REPO / "tests" / "bytecode"
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))


@dataclass
class PlaybookResult:
    rc: int
    stdout: str
    stderr: str
    data: dict | None

    @property
    def stats(self) -> dict:
        return (self.data or {}).get("stats", {})

    def changed(self, host: str = "localhost") -> int:
        return self.stats.get(host, {}).get("changed", 0)

    def failed(self, host: str = "localhost") -> int:
        s = self.stats.get(host, {})
        return s.get("failures", 0) + s.get("unreachable", 0)

    def tasks(self) -> list[dict]:
        out = []
        for play in (self.data or {}).get("plays", []):
            out.extend(play.get("tasks", []))
        return out

    def result(self, task_name: str, host: str = "localhost") -> dict:
        """The result of the last task called ``task_name`` (with or without its ``role : `` prefix) on ``host``."""
        found = None
        for task in self.tasks():
            name = task["task"]["name"]
            if (name == task_name or name.endswith(f" : {task_name}")) and host in task["hosts"]:
                found = task["hosts"][host]
        if found is None:
            raise AssertionError(
                f"no task {task_name!r} ran on {host}; ran: {[t['task']['name'] for t in self.tasks()]}"
            )
        return found

    def messages(self) -> str:
        """Every ``msg`` of a failed task, joined (for asserting error text)."""
        out = []
        for task in self.tasks():
            for res in task["hosts"].values():
                if res.get("failed") and res.get("msg"):
                    out.append(str(res["msg"]))
        return "\n".join(out)


def cache_tag(python: str) -> str:
    """``sys.implementation.cache_tag`` of the interpreter ``python`` (whose ``.pyc`` cmk's zipapp carries)."""
    argv = [python, "-c", "import sys; print(sys.implementation.cache_tag)"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    tmp = Path(env.get("TMPDIR", "/tmp"))
    env.update(
        {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_LOCAL_TEMP": str(tmp / "cpupools-ansible-local"),
            # every Python of the run compiles the payloads' module_utils once per session (tests/bytecode)
            "PYTHONPATH": os.pathsep.join(filter(None, [str(BYTECODE), env.get("PYTHONPATH")])),
            "CPUPOOLS_TEST_BYTECODE": str(tmp / "cpupools-test-bytecode"),
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.update(extra)
    return env


def run_playbook(
    playbook: str | Path,
    tmp_path: Path,
    extra_vars: dict | None = None,
    *args: str,
    inventory: str | None = None,
    env: dict[str, str] | None = None,
    wrapper: list[str] | None = None,
) -> PlaybookResult:
    """Run real ``ansible-playbook``; ``playbook`` is a path or YAML text.

    Returns the parsed JSON callback output. The default inventory is
    ``localhost`` with the local connection. ``wrapper`` runs it under
    another program (``["strace", "-f", ...]``).
    """
    if isinstance(playbook, str) and "\n" in playbook:
        path = tmp_path / "playbook.yml"
        path.write_text(textwrap.dedent(playbook))
        playbook = path
    cmd = [*(wrapper or []), str(VENV_BIN / "ansible-playbook"), str(playbook)]
    if inventory is None:
        cmd += ["-i", "localhost,", "-c", "local"]
    else:
        cmd += ["-i", inventory]
    if extra_vars:
        vars_file = tmp_path / f"extra-vars-{len(list(tmp_path.glob('extra-vars-*')))}.json"
        vars_file.write_text(json.dumps(extra_vars))
        cmd += ["-e", f"@{vars_file}"]
    cmd += list(args)
    proc = subprocess.run(cmd, cwd=REPO, env=env or ansible_env(), capture_output=True, text=True, check=False)
    try:
        data = json.loads(proc.stdout[proc.stdout.index("{") :]) if "{" in proc.stdout else None
    except ValueError:
        data = None
    return PlaybookResult(proc.returncode, proc.stdout, proc.stderr, data)


def local_nodes(path: Path, hosts: dict[str, dict], variables: dict | None = None) -> str:
    """Write an inventory whose ``cpupools_nodes`` are ``hosts`` (name -> its variables, in that order), each
    run with the local connection and the controller's Python, and ``variables`` for all; its path."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    nodes = {name: {**local, **own} for name, own in hosts.items()}
    data = {"all": {"children": {"cpupools_nodes": {"hosts": nodes}}, "vars": variables or {}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def tree_snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """``relative path -> (sha256 of the content, mtime_ns)`` of every file under root."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            out[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)
    return out


def plan_play_files(variables: dict, host: str = "localhost") -> dict:
    """``cpupools_plan_result`` as the plan play hands it to the kernel and agent stages.

    The stages write the files the plan play's module rendered
    (``cpupools_plan_result.files``). A test that runs one stage's role on its
    own, with a plan it gives as ``cpupools_plan``, gives these too: rendered
    by the same functions, from the same variables and plan.
    """
    from cpupools.node.kargs import housekeeping_outputs
    from cpupools.node.stage_check import desired_files, node_pid_namespace
    from cpupools.planning.inputs import validate_inputs

    values = validate_inputs({k: v for k, v in variables.items() if k != "cpupools_plan"}).values
    outputs = housekeeping_outputs(variables["cpupools_plan"])
    files = desired_files(values, outputs, host, node_pid_namespace())
    return {"files": {name: item.to_result() for name, item in files.items()}}


def run_module(name: str, args: dict, tmp_path: Path) -> dict:
    """Run ``plugins/modules/<name>.py`` directly, as outside a task (no action plugin), with this Python.

    For the modules whose action does their work on the controller: the module
    run directly must give what the action gives.
    """
    args_file = tmp_path / f"{name}-args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py"), str(args_file)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO / "collections")),
    )
    return json.loads(proc.stdout)


def wait_for(condition, failure, timeout: float = 30.0, interval: float = 0.05):
    """Call ``condition`` every ``interval`` s until it returns something true, and return that.

    A test waits for the effect it needs (a process holding its list, a
    server's informer catching up with a write), not for a fixed time. Fails
    with ``failure`` (a text, or a function that makes it from what was last
    seen) after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, failure() if callable(failure) else failure
        time.sleep(interval)
    return value
