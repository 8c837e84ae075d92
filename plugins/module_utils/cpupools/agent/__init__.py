"""Floor 5, agent: ``cmk``, the node agent every pinned workload starts through.

``isolate`` (acquire a cpulist, pin, exec the workload, release), ``describe``,
``reconcile`` (free what dead tasks held, write the metrics, re-advertise the
node). It runs as a zipapp of exactly its import closure
(scripts/build_agent.py), so every import here is paid by every workload's
start: keep ``isolate``'s imports few. May import core, hardware, node and
cluster; not planning (a node never plans) and not report.
"""
