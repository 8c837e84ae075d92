"""Floor 3, planning: from the inventory's values and the node's topology to the plan.

The one spec of every ``cpupools_*`` variable and its checks, the pool layout
(housekeeping per NUMA node, shared and exclusive cores by cache and core
type), the host's whole plan (boot arguments, hugepages, kubelet), and the
runtimes' renderings of it (CPU-Pooler, nri-plugins). Pure functions of their
inputs: no file is written and no server is called. May import core,
hardware and node.
"""
