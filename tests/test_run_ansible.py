"""tests/helpers.run_ansible: ansible-core 2.21's RPC start failure is tried again, nothing else is."""

from pathlib import Path

from helpers import RPC_NOT_STARTED, RPC_RETRIES, run_ansible

FAKE = """#!/bin/sh
# Fails like ansible-playbook whose RPC server did not start, {fail} times; then exits {then}.
n=$(cat "$0.count" 2>/dev/null || echo 0)
echo $((n + 1)) >"$0.count"
if [ "$n" -lt {fail} ]; then
    echo "[ERROR]: {message}." >&2
    exit 250
fi
echo "PLAY RECAP"
exit {then}
"""


def _fake(tmp_path: Path, fail: int, then: int = 0) -> Path:
    path = tmp_path / "ansible-playbook"
    path.write_text(FAKE.format(fail=fail, then=then, message=RPC_NOT_STARTED))
    path.chmod(0o755)
    return path


def _attempts(fake: Path) -> int:
    return int(Path(f"{fake}.count").read_text())


def test_a_late_rpc_server_is_waited_out(tmp_path):
    fake = _fake(tmp_path, fail=1)
    proc = run_ansible([fake])
    assert (proc.returncode, proc.stdout.strip(), _attempts(fake)) == (0, "PLAY RECAP", 2)


def test_the_retries_end_and_the_last_failure_is_returned(tmp_path):
    fake = _fake(tmp_path, fail=99)
    proc = run_ansible([fake])
    assert proc.returncode == 250 and RPC_NOT_STARTED in proc.stderr
    assert _attempts(fake) == RPC_RETRIES + 1


def test_any_other_failure_is_returned_at_once(tmp_path):
    fake = _fake(tmp_path, fail=0, then=2)
    proc = run_ansible([fake])
    assert (proc.returncode, _attempts(fake)) == (2, 1)
    # status 250 without the message (an unexpected exception in ansible-playbook) is not tried again either
    other = tmp_path / "other"
    other.write_text('#!/bin/sh\necho x >>"$0.count"\necho "[ERROR]: Unexpected Exception" >&2\nexit 250\n')
    other.chmod(0o755)
    assert run_ansible([other]).returncode == 250
    assert Path(f"{other}.count").read_text().count("x") == 1
