"""``cmk``: the node agent, a drop-in for CMK's binary without its bugs.

Subcommands (CMK's command lines; docs/agent.md has the full reference):

* ``isolate``: take cpulists of a pool, pin, run a command, give them back;
* ``reconcile``: free the cpulists of dead processes and of reused PIDs;
* ``describe``: the pool state as CMK's JSON;
* ``node-report``: topology, state and overlap checks as CMK's JSON.

Startup time matters (``cmk isolate`` wraps every workload start), so this
module imports only what ``isolate`` needs: no ``signal`` (``_signal`` is the
same C module without the enum wrapper), no ``subprocess``, no ``argparse``;
``json`` and the topology code are imported by the subcommands that print
JSON.
"""

from __future__ import annotations

import os
import sys

from . import state as st
from .errors import CpupoolsError, NoFreeListsError, StateError, UnknownPoolError, UsageError

EXIT_OK = 0
EXIT_USAGE = UsageError.exit_status  # 64
EXIT_INTERNAL = 70
EXIT_OSERR = 71  # setting the CPU affinity failed
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

USAGE = """\
usage:
  cmk isolate [--conf-dir=DIR] [--socket-id=N] --pool=POOL [--no-affinity] COMMAND [-- ARGS...]
  cmk reconcile [--conf-dir=DIR] [--interval=SECONDS] [--publish] [--metrics-dir=DIR]
                [--kubeconfig=FILE] [--node-name=NODE]
  cmk describe [--conf-dir=DIR]
  cmk node-report [--conf-dir=DIR] [--interval=SECONDS] [--publish]

environment: CMK_NUM_CORES (isolate, exclusive pools; default 1), CMK_PROC_FS
(host /proc; default /proc), CMK_LOCK_TIMEOUT (seconds; default 30),
CMK_ISOLATE_SHELL (isolate: 1 runs "COMMAND ARGS..." through /bin/sh -c as CMK
v1.4 did, 0 runs argv; default: isolate_shell in <conf-dir>/cpupools.agent, else 0),
CPUPOOLS_METRICS_DIR (reconcile's node_exporter textfile directory),
CPUPOOLS_KUBECONFIG, NODE_NAME, CPUPOOLS_EXCLUSIVE_RESOURCE, CPUPOOLS_ENI_RESOURCE
(reconcile re-advertises the extended resources with the kubelet's credentials).
exit status: isolate exits with its command's status (128+N when it died of
signal N); 64 usage, 65 unknown pool/socket, 69 lock timeout, 70 internal
error, 71 affinity failed, 75 not enough free cpulists, 77 permission denied,
78 state missing or corrupt, 126 command not executable, 127 command not found.
"""

#: Options per subcommand: name -> takes a value. ``--namespace`` is CMK's
#: (its ConfigMap variant); accepted and ignored, as the state is host-local.
_OPTIONS = {
    "isolate": {"--conf-dir": True, "--pool": True, "--socket-id": True, "--no-affinity": False, "--namespace": True},
    "reconcile": {
        "--conf-dir": True,
        "--interval": True,
        "--publish": False,
        "--namespace": True,
        "--metrics-dir": True,
        "--kubeconfig": True,
        "--node-name": True,
    },
    "describe": {"--conf-dir": True, "--namespace": True},
    "node-report": {"--conf-dir": True, "--interval": True, "--publish": False, "--namespace": True},
}


def parse_args(argv: list[str]) -> tuple[str, dict[str, str | bool], list[str]]:
    """``(subcommand, options, positional)``; for isolate, positional is the command and its args.

    Like CMK's docopt line, options may come before or after the command
    until ``--``; everything after ``--`` belongs to the command.
    """
    if not argv or argv[0] in ("-h", "--help", "help"):
        raise _Help()
    sub = argv[0]
    known = _OPTIONS.get(sub)
    if known is None:
        raise UsageError(f"unknown subcommand {sub!r} (isolate, reconcile, describe, node-report)")
    opts: dict[str, str | bool] = {}
    positional: list[str] = []
    rest = argv[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if token == "--":
            positional.extend(rest[i:])
            break
        if token in ("-h", "--help"):
            raise _Help()
        if token.startswith("--") and (token.partition("=")[0] in known or not positional):
            name, eq, value = token.partition("=")
            if name not in known:
                raise UsageError(f"{sub}: unknown option {name}")
            if known[name]:
                if not eq:
                    if i >= len(rest):
                        raise UsageError(f"{sub}: option {name} needs a value")
                    value = rest[i]
                    i += 1
                opts[name] = value
            else:
                if eq:
                    raise UsageError(f"{sub}: option {name} takes no value")
                opts[name] = True
            continue
        positional.append(token)
    return sub, opts, positional


class _Help(Exception):
    pass


def _conf(opts: dict[str, str | bool]) -> str:
    return str(opts.get("--conf-dir") or st.DEFAULT_CONF_DIR)


def _seconds(opts: dict[str, str | bool], name: str) -> float:
    raw = str(opts.get(name, "0"))
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds") from None


def num_cores(environ: dict[str, str] | os._Environ) -> int:
    """``CMK_NUM_CORES``: how many exclusive cpulists ``isolate`` takes (default 1)."""
    raw = environ.get("CMK_NUM_CORES", "") or "1"
    if not (raw.strip().isdigit() and raw.strip().isascii()) or int(raw) < 1:
        raise UsageError(f"CMK_NUM_CORES={raw!r}: requested numbers of cores must be a positive integer")
    return int(raw)


def _join_lists(lists: list[st.CpuList]) -> str:
    """CMK v1.4's join: the cpulists ordered by their first CPU, comma-joined."""
    return ",".join(cl.cpus for cl in sorted(lists, key=lambda cl: cl.cpu_ids[0]))


# isolate ----------------------------------------------------------------------

_SWITCH = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def isolate_shell(environ: dict[str, str] | os._Environ, conf: str) -> bool:
    """Whether ``isolate`` runs its command through ``/bin/sh -c`` (CMK v1.4) instead of as argv.

    The workload's ``CMK_ISOLATE_SHELL`` decides; without it, the node's
    default ``isolate_shell`` in ``<conf>/cpupools.agent`` (written by the
    cpupools_agent role); without that, argv.
    """
    raw = environ.get("CMK_ISOLATE_SHELL", "")
    where = "CMK_ISOLATE_SHELL"
    if not raw:
        path = os.path.join(conf, st.AGENT_SETTINGS)
        try:
            with open(path, encoding="ascii") as handle:
                for line in handle:
                    key, eq, value = line.partition("=")
                    if eq and key.strip() == "isolate_shell":
                        raw, where = value.strip(), f"{path}: isolate_shell"
        except FileNotFoundError:
            return False
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"cannot read {path}: {exc}") from None
    if not raw:
        return False
    value = _SWITCH.get(raw.strip().lower())
    if value is None:
        raise UsageError(f"{where}={raw!r}: expected 1 (run the command through /bin/sh -c) or 0")
    return value


class _Signals:
    """Forward TERM/INT/HUP to the child; remember those that arrive before it exists."""

    NAMES = ("SIGTERM", "SIGINT", "SIGHUP")

    def __init__(self) -> None:
        try:
            import _signal as sigmod  # the C module; ``signal`` adds ~4 ms of enum setup
        except ImportError:  # pragma: no cover - other Pythons
            import signal as sigmod  # type: ignore[no-redef]
        self.mod = sigmod
        self.child = 0
        self.pending: list[int] = []
        self.numbers = [getattr(sigmod, name) for name in self.NAMES]
        self.saved = {num: sigmod.signal(num, self._handle) for num in self.numbers}

    def _handle(self, signum: int, _frame: object) -> None:
        if self.child:
            try:  # noqa: SIM105 - contextlib costs ~1 ms of start-up
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass
        else:
            self.pending.append(signum)

    def started(self, child: int) -> None:
        self.child = child
        for signum in self.pending:
            os.kill(child, signum)
        self.pending.clear()


def _self_identity(proc_fs: str) -> tuple[int, int]:
    """Host PID and start time of this process, from ``<CMK_PROC_FS>/self/stat`` (CMK §4.1)."""
    stat = st.read_proc_stat(proc_fs, "self")
    if stat is None:
        raise UsageError(f"CMK_PROC_FS={proc_fs!r}: {proc_fs}/self/stat is not readable; mount the host /proc there")
    return stat[0], stat[2]


def acquire(
    conf: str,
    pool_name: str,
    socket: str | None,
    environ: dict[str, str] | os._Environ,
    pid: int,
    start: int,
    proc_fs: str,
    timeout: float,
) -> tuple[list[st.CpuList], dict[str, st.Pool]]:
    """Take cpulists of ``pool_name`` for ``pid`` under the lock; return them and the pools read.

    Exclusive pools: the first ``CMK_NUM_CORES`` free cpulists in the plan's hand-out
    order (restricted to ``socket``). When too few are free, holders that died
    are reclaimed first (what ``reconcile`` would do) before failing.
    Shared/infra pools: every cpulist of the pool on ``socket``, or on all
    sockets.
    """
    with st.StateLock(conf, timeout):
        pools = st.read_state(conf, (pool_name, "shared", "infra"))
        pool = pools.get(pool_name)
        if pool is None:
            raise UnknownPoolError(f"requested pool {pool_name} does not exist (pools: {', '.join(sorted(pools))})")
        if socket is not None and socket not in pool.sockets:
            raise UnknownPoolError(
                f"pool {pool_name} has no socket {socket} (sockets: {', '.join(sorted(pool.sockets, key=int))})"
            )
        if pool.exclusive:
            # As in CMK, CMK_NUM_CORES only counts (and is only checked) for exclusive pools.
            count = num_cores(environ)
            candidates = st.ordered_for_handout(pool, st.read_handout_order(conf, pool_name), socket)
            free = [cl for cl in candidates if not cl.tasks]
            if len(free) < count:
                for cl in candidates:
                    if cl.tasks:
                        alive = [t for t in cl.tasks if st.task_alive(proc_fs, t, cl.starts.get(t))]
                        if alive != cl.tasks:
                            st.write_tasks(cl, alive, {})
                free = [cl for cl in candidates if not cl.tasks]
            if len(free) < count:
                where = f" on socket {socket}" if socket is not None else ""
                raise NoFreeListsError(
                    f"not enough free cpu lists in pool {pool_name}{where}: {count} requested, "
                    f"{len(free)} free of {len(candidates)}"
                )
            chosen = free[:count]
        else:
            chosen = pool.cpulists(socket)
            if not chosen:
                where = f" on socket {socket}" if socket is not None else ""
                raise UnknownPoolError(f"no cpu lists in pool {pool_name}{where}")
        for cl in chosen:
            st.write_tasks(cl, [*cl.tasks, pid], {pid: start})
    return chosen, pools


def release(conf: str, pool_name: str, pid: int, timeout: float) -> None:
    """Remove ``pid`` from every cpulist of the pool (the module may have moved it)."""
    with st.StateLock(conf, timeout):
        pools = st.read_state(conf, (pool_name,))
        pool = pools.get(pool_name)
        if pool is None:
            return
        for cl in pool.cpulists():
            if pid in cl.tasks:
                st.write_tasks(cl, [t for t in cl.tasks if t != pid], {})


def child_env(environ: dict[str, str] | os._Environ, chosen: list[st.CpuList], pools: dict[str, st.Pool]) -> dict:
    from .cpulist import format_cpumask

    env = dict(environ)
    env["CMK_CPUS_ASSIGNED"] = _join_lists(chosen)
    env["CMK_CPUS_ASSIGNED_MASK"] = format_cpumask(c for cl in chosen for c in cl.cpu_ids)
    for pool_name, var in (("shared", "CMK_CPUS_SHARED"), ("infra", "CMK_CPUS_INFRA")):
        if pool_name in pools:
            env[var] = _join_lists(pools[pool_name].cpulists())
    return env


def cmd_isolate(opts: dict[str, str | bool], positional: list[str], environ: dict[str, str] | os._Environ) -> int:
    pool_name = opts.get("--pool")
    if not pool_name or pool_name is True:
        raise UsageError("isolate: --pool=POOL is required")
    if not positional:
        raise UsageError("isolate: no command given")
    socket_raw = str(opts.get("--socket-id", "-1"))
    if socket_raw == "-1":
        socket = None
    elif socket_raw.isdigit() and socket_raw.isascii():
        socket = str(int(socket_raw))
    else:
        raise UsageError(f"--socket-id={socket_raw!r} is not a socket number (or -1 for any)")
    conf = _conf(opts)
    timeout = st.lock_timeout(environ)
    proc_fs = environ.get("CMK_PROC_FS") or "/proc"
    pool_name = str(pool_name)
    if isolate_shell(environ, conf):
        # CMK v1.4: Popen(" ".join([command] + args), shell=True); "$CMK_CPUS_ASSIGNED", ";" work again.
        positional = ["/bin/sh", "-c", " ".join(positional)]
    pid, start = _self_identity(proc_fs)
    signals = _Signals()
    chosen, pools = acquire(conf, pool_name, socket, environ, pid, start, proc_fs, timeout)
    status = EXIT_INTERNAL
    try:
        if signals.pending:
            return 128 + signals.pending[0]
        env = child_env(environ, chosen, pools)
        if not opts.get("--no-affinity"):
            cpus = [c for cl in chosen for c in cl.cpu_ids]
            try:
                os.sched_setaffinity(0, cpus)
            except OSError as exc:
                raise _Exit(EXIT_OSERR, f"cannot pin to CPUs {env['CMK_CPUS_ASSIGNED']}: {exc.strerror}") from None
        command = positional[0]
        try:
            child = os.posix_spawnp(command, positional, env)
        except FileNotFoundError:
            raise _Exit(EXIT_NOT_FOUND, f"command not found: {command}") from None
        except PermissionError:
            raise _Exit(EXIT_NOT_EXECUTABLE, f"command not executable: {command}") from None
        except OSError as exc:
            raise _Exit(EXIT_NOT_EXECUTABLE, f"cannot run {command}: {exc.strerror}") from None
        signals.started(child)
        _, wstatus = os.waitpid(child, 0)
        signals.child = 0  # never signal a PID that may be reused from here on
        code = os.waitstatus_to_exitcode(wstatus)
        status = 128 - code if code < 0 else code
        return status
    finally:
        try:
            release(conf, pool_name, pid, timeout)
        except CpupoolsError as exc:
            sys.stderr.write(f"cmk isolate: could not release cpu lists of PID {pid} ({exc}); reconcile will\n")


class _Exit(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# entry point ----------------------------------------------------------------------


def run(argv: list[str], environ: dict[str, str] | os._Environ) -> int:
    sub, opts, positional = parse_args(argv)
    if sub == "isolate":
        return cmd_isolate(opts, positional, environ)
    if positional:
        raise UsageError(f"{sub}: unexpected argument {positional[0]!r}")
    from . import agent_report  # not needed by isolate: kept out of its start-up

    if sub == "reconcile":
        return agent_report.cmd_reconcile(opts, environ)
    return agent_report.cmd_json(sub, opts, environ)


def main(argv: list[str] | None = None) -> int:
    """Run ``cmk``; user errors print one line on stderr and return their documented status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv, os.environ)
    except _Help:
        sys.stdout.write(USAGE)
        return EXIT_OK
    except _Exit as exc:
        sys.stderr.write(f"cmk: {exc}\n")
        return exc.status
    except StateError as exc:
        sys.stderr.write(f"cmk: {exc}\n")
        return exc.exit_status
    except CpupoolsError as exc:
        sys.stderr.write(f"cmk: {exc}\n")
        return StateError.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"cmk: {exc.strerror or exc}{where}\n")
        return EXIT_OSERR
    except Exception as exc:  # a bug: still one line, and a distinct status
        sys.stderr.write(f"cmk: internal error: {exc!r}\n")
        return EXIT_INTERNAL
