"""Floor 2, node: what cpupools writes on a node and reads back from it.

Kernel arguments and the boot loaders that carry them, hugepages, the
kubelet's configuration, CMK's state directory (its format, its lock, its
atomic writes) and the writer that applies it, CMK v1.5's configuration,
the agent's files on the node, the node_exporter textfiles, and ``stage_check``,
which compares all of it with the plan. Renders and compares; deciding the layout is planning's. May import core and
hardware.
"""
