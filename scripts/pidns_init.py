"""PID 1 of a test's own PID namespace: run one command, reap every orphan, exit with the command's status.

    unshare --pid --fork --mount-proc python3 scripts/pidns_init.py COMMAND [ARGS...]

scripts/test.sh runs the CMK v1.4 interleaving test (``-m pidreuse``) so:
its writes to /proc/sys/kernel/ns_last_pid then move the counter of its own
namespace, not the machine's, and it can run beside the other tests. In a
PID namespace, every process orphaned inside it is reparented to its PID 1;
an init that does not wait for them leaves them zombies, which still exist
under /proc, so a killed holder would look alive. This one waits for every
child, forwards SIGTERM, SIGINT and SIGHUP to the command (PID 1 gets no
signal it has no handler for), and exits with the command's status (128 + N
when signal N ended it). When it exits, the kernel kills whatever is left in
the namespace.
"""

from __future__ import annotations

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def exit_status(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pidns_init.py COMMAND [ARGS...]", file=sys.stderr)
        return 64
    child = 0
    early: list[int] = []  # signals that came before the command existed

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child, signum)
        else:
            early.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        child = os.posix_spawnp(argv[0], argv, os.environ)
    except OSError as exc:
        print(f"pidns_init.py: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    for signum in early:
        os.kill(child, signum)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the command lives; be safe
            return 1
        if pid == child:
            return exit_status(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
