"""Floor 1, hardware: the node's CPUs as the kernel shows them in sysfs.

Topology (sockets, NUMA nodes, L3 and L2 domains, cores, core types, SMT,
offline and possible CPUs, the boot's isolation arguments) and locality (the
NUMA distance table and choosing the nearest CPUs). Reads files under a given
root and never writes. May import core only.
"""
