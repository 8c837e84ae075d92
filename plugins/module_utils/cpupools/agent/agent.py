"""``cmk``: the node agent, a drop-in for CMK's binary without its bugs.

Subcommands (CMK's command lines; docs/agent.md has the full reference):

* ``isolate``: take cpulists of a pool, pin, run a command, give them back;
* ``reconcile``: free the cpulists of dead processes and of reused PIDs;
* ``describe``: the pool state as CMK's JSON;
* ``node-report``: topology, state and overlap checks as CMK's JSON;
* ``housekeep``: move kernel threads and host tasks off the isolated CPUs
  (cpupools' own, for every runtime: its unit runs the zipapp at boot and on
  a timer).

Startup time matters (``cmk isolate`` wraps every workload start), so this
module imports only what ``isolate`` needs: no ``signal`` (``_signal`` is the
same C module without the enum wrapper), no ``subprocess``, no ``argparse``;
``json`` and the topology code are imported by the subcommands that print
JSON.
"""

from __future__ import annotations

import os
import sys

from ..core.errors import CpupoolsError, NoFreeListsError, StateError, UnknownPoolError, UsageError, show
from ..hardware.locality import CpuLocality, choose_local
from ..node import state as st
from .options import (
    EXIT_INTERNAL,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OSERR,
    conf_dir,
    isolate_shell,
    locality_wanted,
    lock_timeout,
    num_cores,
    proc_fs_of,
    self_identity,
    sysfs_root,
    tasks_or_none,
)

# ``typing`` and ``collections.abc`` cost ``cmk isolate`` milliseconds at start-up: annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

USAGE = """\
usage:
  cmk isolate [--conf-dir=DIR] [--socket-id=N] [--numa-node=N] --pool=POOL [--no-affinity]
              COMMAND [-- ARGS...]
  cmk reconcile [--conf-dir=DIR] [--interval=SECONDS] [--publish] [--metrics-dir=DIR]
                [--kubeconfig=FILE] [--node-name=NODE]
  cmk describe [--conf-dir=DIR]
  cmk node-report [--conf-dir=DIR] [--interval=SECONDS] [--publish]
  cmk housekeep [--config=FILE] [--check] [--power-only] [--restore]

environment: CMK_NUM_CORES (isolate, exclusive pools; default 1), CMK_NUMA_LOCALITY
(isolate: 1 takes several exclusive cpulists from one NUMA node and as few L3
caches as can be, 0 the first free ones in hand-out order; default 1),
CPUPOOLS_SYSFS_ROOT (where sys/ is read; default /), CMK_PROC_FS
(host /proc; default /proc; housekeep: a directory named proc), CMK_LOCK_TIMEOUT (seconds; default 30),
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
    "isolate": {
        "--conf-dir": True,
        "--pool": True,
        "--socket-id": True,
        "--numa-node": True,
        "--no-affinity": False,
        "--namespace": True,
    },
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
    "housekeep": {"--config": True, "--check": False, "--power-only": False, "--restore": False},
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
        raise UsageError(f"unknown subcommand {show(sub)} (isolate, reconcile, describe, node-report, housekeep)")
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
                raise UsageError(f"{sub}: unknown option {_name(name)}")
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


def _name(text: str) -> str:
    """A name from the command line as a message shows it: as it is when short and plain, else quoted shortened."""
    return text if 0 < len(text) <= 60 and text.isprintable() else show(text)


def _join_lists(lists: list[st.CpuList]) -> str:
    """CMK v1.4's join: the cpulists ordered by their first CPU, comma-joined."""
    return ",".join(cl.cpus for cl in sorted(lists, key=lambda cl: cl.cpu_ids[0]))


# isolate ----------------------------------------------------------------------


class _Signals:
    """Forward every catchable signal to the child; remember those that arrive before it exists.

    Not handled: SIGKILL and SIGSTOP (cannot be), SIGCHLD (isolate's own
    business), and the synchronous faults SIGSEGV, SIGBUS, SIGFPE, SIGILL,
    SIGTRAP and SIGSYS (a Python handler cannot return from a real fault). A
    signal whose default is to be ignored (SIGWINCH, SIGURG, SIGCONT) or to
    stop (SIGTSTP, SIGTTIN, SIGTTOU) is forwarded once the child runs and
    otherwise dropped; any other signal before the child starts makes isolate
    give the lists back and exit 128+N.

    A signal that isolate's parent left ignored (``nohup`` ignores SIGHUP, a
    shell's background job SIGINT and SIGQUIT) stays ignored, in isolate and
    in the workload, as a direct ``exec`` and CMK's ``Popen`` keep it: it is
    neither handled nor forwarded, and the child does not reset it
    (``ignored``). SIGPIPE and SIGXFSZ are the exception: Python ignores them
    itself at start-up, so their inherited disposition cannot be known; they
    are forwarded, and reset to the default in the child, as ``subprocess``
    and CMK do.
    """

    SKIP = ("SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS")
    HARMLESS = ("SIGWINCH", "SIGURG", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU")

    def __init__(self) -> None:
        try:
            import _signal as sigmod  # the C module; ``signal`` adds ~4 ms of enum setup
        except ImportError:  # pragma: no cover - other Pythons
            import signal as sigmod  # type: ignore[no-redef]
        self.mod = sigmod
        self.child = 0
        self.pending: list[int] = []
        skip = {getattr(sigmod, name) for name in self.SKIP if hasattr(sigmod, name)}
        self.harmless = {getattr(sigmod, name) for name in self.HARMLESS if hasattr(sigmod, name)}
        python_ignores = {sigmod.SIGPIPE, sigmod.SIGXFSZ}
        self.saved = {}
        self.ignored: list[int] = []
        for num in sorted(int(n) for n in sigmod.valid_signals()):
            if num in skip:
                continue
            try:
                if num not in python_ignores and sigmod.getsignal(num) == sigmod.SIG_IGN:
                    self.ignored.append(num)  # left ignored by the parent: it stays so, here and in the child
                    continue
                self.saved[num] = sigmod.signal(num, self._handle)
            except (OSError, ValueError):  # reserved by the C library
                pass
        self.numbers = sorted(self.saved)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.child:
            try:  # noqa: SIM105 - contextlib costs ~1 ms of start-up
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass
        elif signum not in self.harmless:
            self.pending.append(signum)

    def started(self, child: int) -> None:
        self.child = child
        for signum in self.pending:
            os.kill(child, signum)
        self.pending.clear()


#: ``prctl(PR_SET_PDEATHSIG, ...)``: linux/prctl.h.
PR_SET_PDEATHSIG = 1


def spawn(command: str, argv: list[str], env: dict, signals: _Signals) -> int:
    """Start ``argv`` as isolate's child, bound to isolate's life; return its PID.

    ``fork`` + ``exec`` rather than ``posix_spawn``, for what the child does
    before ``exec``: it resets to their defaults the dispositions Python changed
    (SIGPIPE and SIGXFSZ ignored, the forwarding handlers; a signal the parent
    left ignored stays ignored, see ``_Signals``) and the signal mask,
    and asks the kernel to SIGKILL it when isolate dies (``PR_SET_PDEATHSIG``;
    so a SIGKILLed isolate takes its workload with it, and the lists that
    reconcile frees are really free; not asked by an isolate that is its PID
    namespace's init, whose death the kernel already makes its workload's).
    Signals are blocked from before the fork until the child is recorded, so
    none is lost or handled by the wrong process. ``exec`` errors come back through a close-on-exec pipe and raise
    ``_Exit`` with 127 or 126.
    """
    sigmod = signals.mod
    parent = os.getpid()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    # As its PID namespace's init (a container's entrypoint) isolate needs no death signal: when it dies,
    # the kernel kills every other process of the namespace, its workload too. Elsewhere prctl is loaded
    # here, before the fork: loading _ctypes in the forked child cost ~1 ms before exec (its pages copied
    # on write, the library mapped in the child), in the parent ~0.4 ms.
    prctl = _prctl() if parent != 1 else None
    old_mask = sigmod.pthread_sigmask(sigmod.SIG_BLOCK, sigmod.valid_signals())
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child, which execs or exits
            _child_exec(command, argv, env, parent, write_end, signals, prctl)
        signals.started(child)
    finally:
        sigmod.pthread_sigmask(sigmod.SIG_SETMASK, old_mask)
    os.close(write_end)
    try:
        report = os.read(read_end, 256)
    finally:
        os.close(read_end)
    if not report:
        return child
    os.waitpid(child, 0)
    signals.child = 0
    errno_text, _, strerror = report.decode("ascii", "replace").partition(":")
    import errno

    number = int(errno_text) if errno_text.isdigit() else 0
    shown = _name(command)
    if number == errno.ENOENT:
        raise _Exit(EXIT_NOT_FOUND, f"command not found: {shown}")
    if number in (errno.EACCES, errno.EPERM):
        raise _Exit(EXIT_NOT_EXECUTABLE, f"command not executable: {shown}")
    raise _Exit(EXIT_NOT_EXECUTABLE, f"cannot run {shown}: {strerror}")


def _prctl():
    """``prctl(2)`` of the C library, callable with int arguments; a no-op without ctypes.

    Called through ``_ctypes`` directly, by the function's address: importing
    ``ctypes`` costs about 1.7 ms more, declaring the function's types with
    ``_ctypes`` classes about 0.15 ms more than this.
    Falls back to ``ctypes``, then to nothing (a trimmed python3: the command
    is unbound, as in CMK).
    """
    try:
        import _ctypes

        address = _ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), "prctl")
        call = _ctypes.call_function
        return lambda *args: call(address, args)
    except Exception:  # private API of another Python: try the public one
        pass
    try:
        import ctypes

        return ctypes.CDLL(None).prctl
    except (ImportError, OSError, AttributeError):
        return lambda *_args: 0


def _child_exec(
    command: str,
    argv: list[str],
    env: dict,
    parent: int,
    report: int,
    signals: _Signals,
    prctl: Callable[..., int] | None,
) -> None:
    """In the forked child: reset signals, tie to the parent's life (``prctl``: see ``_prctl``), exec. Never returns."""
    sigmod = signals.mod
    try:
        for num in (*signals.numbers, sigmod.SIGPIPE, sigmod.SIGXFSZ):
            sigmod.signal(num, sigmod.SIG_DFL)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sigmod.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # isolate died before prctl took effect
            os._exit(128 + sigmod.SIGKILL)
        sigmod.pthread_sigmask(sigmod.SIG_SETMASK, ())
        os.execvpe(command, argv, env)
    except OSError as exc:
        os.write(report, f"{exc.errno}:{exc.strerror}".encode("ascii", "replace"))
    except BaseException:
        os.write(report, b"0:cannot start the command")
    os._exit(EXIT_NOT_FOUND)


def _free(cl: st.CpuList) -> bool:
    return tasks_or_none(cl) == []


def _on_node(lists: list[st.CpuList], node: int, where: CpuLocality) -> list[st.CpuList]:
    return [cl for cl in lists if any(where.node(c) == node for c in cl.cpu_ids)]


def _pool_nodes(lists: list[st.CpuList], where: CpuLocality) -> str:
    nodes = {where.node(c) for cl in lists for c in cl.cpu_ids} - {None}
    return ", ".join(str(n) for n in sorted(nodes)) or "none known"  # type: ignore[type-var]


def _one_node_holds(lists: list[st.CpuList], count: int, where: CpuLocality) -> bool:
    per_node: dict[int | None, int] = {}
    for cl in lists:
        node = where.node(cl.cpu_ids[0])
        per_node[node] = per_node.get(node, 0) + 1
    return any(n >= count for n in per_node.values())


def acquire(
    conf: str,
    pool_name: str,
    socket: str | None,
    environ: dict[str, str] | os._Environ,
    pid: int,
    start: int,
    proc_fs: str,
    timeout: float,
    numa_node: int | None = None,
    where: CpuLocality | None = None,
) -> tuple[list[st.CpuList], dict[str, st.Pool]]:
    """Take cpulists of ``pool_name`` for ``pid`` under the lock; return them and the pools read.

    Exclusive pools: ``CMK_NUM_CORES`` free cpulists (restricted to ``socket``
    and to ``numa_node``, a list being on the node of its first CPU). One
    list is the first free one in the plan's hand-out order; several come
    from one NUMA node and as few L3 domains as possible
    (``locality.choose_local``), unless ``CMK_NUMA_LOCALITY=0`` asks for the
    first free ones in hand-out order. When too few are free, or no NUMA node
    has enough, holders that died are reclaimed first (what ``reconcile``
    would do) before failing or spreading over the fewest, nearest nodes (by
    the distance table, read only then).
    Shared/infra pools: every cpulist of the pool on ``socket``, or on all
    sockets; with ``numa_node``, those with CPUs on that node.
    """
    where = where or CpuLocality()
    with st.StateLock(conf, timeout):
        # Stray entries are skipped: one of them must not stop every isolate (reconcile reports them).
        pools = st.read_state(conf, (pool_name, "shared", "infra"), strays=[])
        pool = pools.get(pool_name)
        if pool is None:
            raise UnknownPoolError(
                f"requested pool {_name(pool_name)} does not exist (pools: {', '.join(sorted(pools))})"
            )
        if socket is not None and socket not in pool.sockets:
            raise UnknownPoolError(
                f"pool {pool_name} has no socket {socket} (sockets: {', '.join(sorted(pool.sockets, key=int))})"
            )
        on = f" on socket {socket}" if socket is not None else ""
        if numa_node is not None:
            on += f" on NUMA node {numa_node}"
        if pool.exclusive:
            # As in CMK, CMK_NUM_CORES only counts (and is only checked) for exclusive pools.
            count = num_cores(environ)
            candidates = st.ordered_for_handout(pool, st.read_handout_order(conf, pool_name), socket)
            # Only where sysfs places every list: a state of CPUs this host does not show is handed out as planned.
            wanted = locality_wanted(environ)  # checked for every exclusive isolate, as CMK_NUM_CORES is
            local = count > 1 and wanted and all(where.node(cl.cpu_ids[0]) is not None for cl in candidates)
            if numa_node is not None:
                on_node = [cl for cl in candidates if where.node(cl.cpu_ids[0]) == numa_node]
                if not on_node:
                    raise UnknownPoolError(
                        f"pool {pool_name} has no cpu lists{on} (NUMA nodes: {_pool_nodes(candidates, where)})"
                    )
                candidates = on_node
            free = [cl for cl in candidates if _free(cl)]
            if len(free) < count or (local and not _one_node_holds(free, count, where)):
                for cl in candidates:
                    if tasks_or_none(cl):
                        alive = [t for t in cl.tasks if st.task_alive(proc_fs, t, cl.starts.get(t))]
                        if alive != cl.tasks:
                            st.write_tasks(cl, alive, {})
                free = [cl for cl in candidates if _free(cl)]
            if len(free) < count:
                raise NoFreeListsError(
                    f"not enough free cpu lists in pool {pool_name}{on}: {count} requested, "
                    f"{len(free)} free of {len(candidates)}"
                )
            if local:
                chosen = choose_local(
                    free,
                    count,
                    lambda cl: where.node(cl.cpu_ids[0]),
                    lambda cl: where.l3(cl.cpu_ids[0]),
                    where.distance,
                )
            else:
                chosen = free[:count]
        else:
            chosen = pool.cpulists(socket)
            if numa_node is not None:
                chosen = _on_node(chosen, numa_node, where)
            if not chosen:
                listed = pool.cpulists(socket)
                nodes = f" (NUMA nodes: {_pool_nodes(listed, where)})" if numa_node is not None and listed else ""
                raise UnknownPoolError(f"no cpu lists in pool {pool_name}{on}{nodes}")
        for cl in chosen:
            st.write_tasks(cl, [*cl.tasks, pid], {pid: start})
    return chosen, pools


def release(conf: str, pool_name: str, pid: int, timeout: float) -> None:
    """Remove ``pid`` from every cpulist of the pool (the module may have moved it)."""
    with st.StateLock(conf, timeout):
        pools = st.read_state(conf, (pool_name,), strays=[])
        pool = pools.get(pool_name)
        if pool is None:
            return
        for cl in pool.cpulists():
            if pid in (tasks_or_none(cl) or ()):
                st.write_tasks(cl, [t for t in cl.tasks if t != pid], {})


def assigned_cpus(chosen: list[st.CpuList], numa_node: int | None, where: CpuLocality) -> list[int]:
    """The CPUs isolate pins to: those of ``chosen``, only those on ``numa_node`` when one is asked for.

    (An exclusive list is on one node already; a shared or infra list spans its socket.)
    """
    cpus = sorted({c for cl in chosen for c in cl.cpu_ids})
    if numa_node is None:
        return cpus
    return [c for c in cpus if where.node(c) == numa_node]


def child_env(
    environ: dict[str, str] | os._Environ,
    chosen: list[st.CpuList],
    pools: dict[str, st.Pool],
    cpus: list[int] | None = None,
    where: CpuLocality | None = None,
) -> dict:
    """The command's environment: CMK's ``CMK_CPUS_*``, and where the assigned CPUs are.

    ``CMK_NUMA_NODES_ASSIGNED`` and ``CMK_L3_DOMAINS_ASSIGNED``: the NUMA nodes
    and L3 cache domains of ``cpus``, ascending, comma-joined (empty where
    sysfs does not show them).
    """
    from ..core.cpulist import format_cpumask

    env = dict(environ)
    all_cpus = sorted({c for cl in chosen for c in cl.cpu_ids})
    if cpus is None or cpus == all_cpus:
        env["CMK_CPUS_ASSIGNED"] = _join_lists(chosen)
        cpus = all_cpus
    else:
        env["CMK_CPUS_ASSIGNED"] = ",".join(str(c) for c in cpus)
    env["CMK_CPUS_ASSIGNED_MASK"] = format_cpumask(cpus)
    for pool_name, var in (("shared", "CMK_CPUS_SHARED"), ("infra", "CMK_CPUS_INFRA")):
        if pool_name in pools:
            env[var] = _join_lists(pools[pool_name].cpulists())
    if where is not None:
        where.read_l3(*cpus)
        nodes = {where.node(c) for c in cpus} - {None}
        env["CMK_NUMA_NODES_ASSIGNED"] = ",".join(str(n) for n in sorted(nodes))  # type: ignore[type-var]
        l3 = {where.l3(c) for c in cpus} - {None}
        env["CMK_L3_DOMAINS_ASSIGNED"] = ",".join(str(d) for d in sorted(l3))  # type: ignore[type-var]
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
        raise UsageError(f"--socket-id={show(socket_raw)} is not a socket number (or -1 for any)")
    node_raw = str(opts.get("--numa-node", "-1"))
    if node_raw == "-1":
        numa_node = None
    elif node_raw.isdigit() and node_raw.isascii() and len(node_raw) <= 9:
        numa_node = int(node_raw)
    else:
        raise UsageError(f"--numa-node={show(node_raw)} is not a NUMA node number (or -1 for any)")
    # One handle on the state directory for the whole isolate: the lists are taken and given back in the
    # tree it opened, even if the directory is replaced meanwhile (state.ConfDir).
    conf = st.open_conf(conf_dir(opts)).path
    timeout = lock_timeout(environ)
    proc_fs = proc_fs_of(environ)
    pool_name = str(pool_name)
    if isolate_shell(environ, conf):
        # CMK v1.4: Popen(" ".join([command] + args), shell=True); "$CMK_CPUS_ASSIGNED", ";" work again.
        positional = ["/bin/sh", "-c", " ".join(positional)]
    pid, start = self_identity(proc_fs, "record or reclaim tasks", conf)
    signals = _Signals()
    where = CpuLocality(sysfs_root(environ))
    chosen, pools = acquire(conf, pool_name, socket, environ, pid, start, proc_fs, timeout, numa_node, where)
    status = EXIT_INTERNAL
    try:
        if signals.pending:
            return 128 + signals.pending[0]
        cpus = assigned_cpus(chosen, numa_node, where)
        env = child_env(environ, chosen, pools, cpus, where)
        if not opts.get("--no-affinity"):
            try:
                os.sched_setaffinity(0, cpus)
            except OSError as exc:
                raise _Exit(EXIT_OSERR, f"cannot pin to CPUs {env['CMK_CPUS_ASSIGNED']}: {exc.strerror}") from None
        child = spawn(positional[0], positional, env, signals)
        _, wstatus = os.waitpid(child, 0)
        signals.child = 0  # never signal a PID that may be reused from here on
        code = os.waitstatus_to_exitcode(wstatus)
        status = 128 - code if code < 0 else code
        return status
    finally:
        try:
            release(conf, pool_name, pid, timeout)
        except CpupoolsError as exc:
            sys.stderr.write(
                f"cmk isolate: could not release cpu lists of PID {pid} ({st.as_given(str(exc))}); reconcile will\n"
            )


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
        raise UsageError(f"{sub}: unexpected argument {show(positional[0])}")
    from . import reconcile  # not needed by isolate: kept out of its start-up

    if sub == "reconcile":
        return reconcile.cmd_reconcile(opts, environ)
    if sub == "housekeep":
        return reconcile.cmd_housekeep(opts, environ)
    return reconcile.cmd_json(sub, opts, environ)


def main(argv: list[str] | None = None) -> int:
    """Run ``cmk``; user errors print one line on stderr and return their documented status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv, os.environ)
    except _Help:
        sys.stdout.write(USAGE)
        return EXIT_OK
    except _Exit as exc:
        sys.stderr.write(f"cmk: {st.as_given(str(exc))}\n")
        return exc.status
    except StateError as exc:
        sys.stderr.write(f"cmk: {st.as_given(str(exc))}\n")
        return exc.exit_status
    except CpupoolsError as exc:
        sys.stderr.write(f"cmk: {st.as_given(str(exc))}\n")
        return StateError.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        where = f" ({st.as_given(str(exc.filename))})" if exc.filename else ""
        sys.stderr.write(f"cmk: {exc.strerror or exc}{where}\n")
        return EXIT_OSERR
    except Exception as exc:  # a bug: still one line, and a distinct status
        sys.stderr.write(f"cmk: internal error: {exc!r}\n")
        return EXIT_INTERNAL


def leave(status: int) -> None:
    """Exit with ``status`` now, without the interpreter's shutdown; the launcher's last call. Never returns.

    Python's shutdown (module teardown, a last garbage collection) cost
    ``cmk isolate`` about 2 ms of CPU on every workload's start (a fifth of
    the whole command), and ``cmk`` needs none of it: every file it writes is
    closed, synced and renamed before its command returns, and the lock is
    the kernel's (released with the descriptor). Only Python's own buffers of
    stdout and stderr are left, flushed here; a reader that went away
    (``cmk describe | head``) costs the rest of the output, not the status.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # reader gone, or a stream closed by a caller
        pass
    finally:
        os._exit(status)
