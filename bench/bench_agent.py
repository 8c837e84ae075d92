#!/usr/bin/env python3
"""Benchmarks of the cmk node agent; prints figures, asserts nothing.

    python3 bench/bench_agent.py [--runs N] [--only-big-reconcile]

1. start-up: ``cmk isolate --pool=shared -- /bin/true`` against
   ``python3 -I -c pass``, interleaved in one run (median and minimum of
   each, and their ratio; target: median ratio at most 1.3), with the default
   launcher (``#!/usr/bin/env python3``) and with ``#!/usr/bin/env -S python3 -IS``;
2. throughput: 8 concurrent workers looping acquire-run-release
   (``cmk isolate --pool=exclusive -- /bin/true``) on 4 exclusive lists for a
   fixed time; cycles per second, and how often a worker found no free list;
3. reconcile: one pass over a state holding 1,000 task entries (half of them
   dead); median wall time of the pass in-process (target: under 100 ms) and
   of the whole ``cmk reconcile`` command;
4. lock waits during a big reconcile: ``cmk reconcile`` over 10,000 dead
   entries, one cpulist each, while a prober takes the state lock the way
   ``cmk isolate`` does every 5 ms; the longest and the 99th-percentile wait
   (target: every wait under 100 ms), and how long the pass took.

The state lives in a temporary directory on the same file system as
``$TMPDIR`` (default /tmp); run with ``TMPDIR=/dev/shm`` to see the cost of the
disk. ``python3`` is whatever ``/usr/bin/env python3`` finds with
PATH=/usr/bin:/bin, as on a node.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins", "module_utils"))

from cpupools.agent import agent_report  # noqa: E402
from cpupools.node import state as st  # noqa: E402
from cpupools.node import state_writer as sw  # noqa: E402

ENV = {k: v for k, v in os.environ.items() if not k.startswith("CMK_")}
ENV["PATH"] = "/usr/bin:/bin"


def write(conf: str, pools: dict, tasks: dict | None = None) -> str:
    plan = {"pools": pools, "exclusive_pools": [p for p in pools if p.startswith("exclusive")]}
    plan["handout_order"] = {p: [c for s in pools[p].values() for c in s] for p in plan["exclusive_pools"]}
    layout = sw.desired_layout(plan)
    sw.ensure_lock_file(conf)
    with st.StateLock(conf):
        sw.write_state(conf, layout, tasks or {}, {}, sw.desired_meta(plan, layout))
    return conf


def bench_startup(cmk: str, cmk_is: str, work: str, runs: int) -> None:
    conf = write(os.path.join(work, "startup"), {"shared": {"0": ["0,1"]}, "infra": {"0": []}})
    args = ["isolate", f"--conf-dir={conf}", "--pool=shared", "--", "/bin/true"]
    cmds = {
        "python3 -I -c pass": ["python3", "-I", "-c", "pass"],
        "cmk isolate --pool=shared -- /bin/true": [cmk, *args],
        "  same, shebang /usr/bin/env -S python3 -IS": [cmk_is, *args],
    }
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(5):  # warm the page cache
        for cmd in cmds.values():
            subprocess.run(cmd, env=ENV, check=True)
    for _ in range(runs):
        for name, cmd in cmds.items():
            started = time.perf_counter()
            subprocess.run(cmd, env=ENV, check=True)
            times[name].append(time.perf_counter() - started)
    base = statistics.median(times["python3 -I -c pass"])
    print(f"1. start-up, {runs} interleaved runs each (target: ratio <= 1.30)")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"   {name:44s} median {median * 1e3:6.2f} ms   min {min(values) * 1e3:6.2f} ms   ratio {median / base:.2f}"
        )


def bench_throughput(cmk: str, work: str, seconds: float) -> None:
    conf = write(os.path.join(work, "throughput"), {"exclusive": {"0": ["0", "1", "2", "3"]}})
    stop = time.monotonic() + seconds
    counts = {"ok": 0, "busy": 0, "other": 0}
    lock = threading.Lock()
    cmd = [cmk, "isolate", f"--conf-dir={conf}", "--pool=exclusive", "--no-affinity", "--", "/bin/true"]

    def worker() -> None:
        while time.monotonic() < stop:
            code = subprocess.run(cmd, env=ENV, check=False).returncode
            with lock:
                counts["ok" if code == 0 else "busy" if code == 75 else "other"] += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    leftover = sum(len(cl.tasks) for cl in st.read_state(conf)["exclusive"].cpulists())
    print(f"2. throughput, 8 workers on 4 exclusive lists for {took:.1f} s")
    print(
        f"   {counts['ok'] / took:7.1f} acquire-run-release cycles/s   ({counts['ok']} cycles, "
        f"{counts['busy']} 'no free list' (status 75), {counts['other']} other failures, {leftover} lists left held)"
    )


def bench_reconcile(cmk: str, work: str, runs: int) -> None:
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        lists = [str(c) for c in range(100)]
        pools = {"exclusive": {"0": lists}, "shared": {"0": [",".join(str(c) for c in range(100, 110))]}}

        def fill() -> str:
            conf = os.path.join(work, "reconcile")
            tasks: dict = {"exclusive": {"0": {}}, "shared": {"0": {}}}
            dead = 2**22 + 10
            for i, cpus in enumerate(lists):  # 100 lists x 5 entries + 500 on shared = 1,000 entries
                tasks["exclusive"]["0"][cpus] = [sleeper.pid if j % 2 else dead + i * 5 + j for j in range(5)]
            tasks["shared"]["0"][pools["shared"]["0"][0]] = [
                sleeper.pid if j % 2 else dead + 1000 + j for j in range(500)
            ]
            import shutil

            shutil.rmtree(conf, ignore_errors=True)
            return write(conf, pools, tasks)

        in_process, whole = [], []
        for _ in range(runs):
            conf = fill()
            started = time.perf_counter()
            reclaimed, _ = agent_report.reconcile_pass(conf, "/proc", 30)
            in_process.append(time.perf_counter() - started)
            conf = fill()
            started = time.perf_counter()
            subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=ENV, check=True, stdout=subprocess.DEVNULL)
            whole.append(time.perf_counter() - started)
        print(f"3. reconcile over 1,000 task entries ({len(reclaimed)} dead, in 101 lists), {runs} runs")
        print(f"   pass in-process      median {statistics.median(in_process) * 1e3:6.1f} ms  (target < 100 ms)")
        print(f"   cmk reconcile (all)  median {statistics.median(whole) * 1e3:6.1f} ms")
    finally:
        sleeper.kill()
        sleeper.wait()


def bench_big_reconcile(cmk: str, work: str, entries: int = 10000) -> None:
    import shutil

    conf = os.path.join(work, "big")
    shutil.rmtree(conf, ignore_errors=True)
    lists = [str(c) for c in range(entries)]
    dead = 2**22 + 100
    tasks = {"exclusive": {"0": {cpus: [dead + i] for i, cpus in enumerate(lists)}}}
    plan = {"pools": {"exclusive": {"0": lists}}, "exclusive_pools": ["exclusive"]}
    plan["handout_order"] = {"exclusive": lists}
    layout = sw.desired_layout(plan)
    sw.ensure_lock_file(conf)
    with st.StateLock(conf):
        starts = {dead + i: 1000 + i for i in range(entries)}
        sw.write_state(conf, layout, tasks, starts, sw.desired_meta(plan, layout))
    waits: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            with st.StateLock(conf):
                waits.append(time.perf_counter() - started)
            time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    res = subprocess.run([cmk, "reconcile", f"--conf-dir={conf}"], env=ENV, check=True, capture_output=True)
    took = time.perf_counter() - started
    done.set()
    prober.join()
    freed = res.stdout.count(b'"pid"')
    waits.sort()
    p99 = waits[int(len(waits) * 0.99)] if waits else 0.0
    print(f"4. cmk reconcile over {entries:,} dead entries (one cpulist each): {took:.2f} s, {freed:,} freed")
    print(
        f"   lock waits of a prober taking the lock every 5 ms meanwhile: {len(waits)} waits, "
        f"max {max(waits, default=0) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms  (target: max < 100 ms)"
    )


def main() -> int:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 100
    if "--only-big-reconcile" in sys.argv:  # section 4 alone
        with tempfile.TemporaryDirectory(prefix="cpupools-bench-") as work:
            out = os.path.join(work, "agent", "cmk")
            subprocess.run(
                [sys.executable, os.path.join(REPO, "scripts", "build_agent.py"), out],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            print(f"load average {os.getloadavg()[0]:.2f}")
            bench_big_reconcile(out, work)
        return 0
    with tempfile.TemporaryDirectory(prefix="cpupools-bench-") as work:
        out = os.path.join(work, "agent", "cmk")
        out_is = os.path.join(work, "agent-is", "cmk")
        build = [sys.executable, os.path.join(REPO, "scripts", "build_agent.py")]
        subprocess.run([*build, out], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*build, "--shebang=/usr/bin/env -S python3 -IS", out_is], check=True, stdout=subprocess.DEVNULL)
        print(f"cmk built at {out}; state under {work}; load average {os.getloadavg()[0]:.2f}")
        bench_startup(out, out_is, work, runs)
        bench_throughput(out, work, 10.0)
        bench_reconcile(out, work, 10)
        bench_big_reconcile(out, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
