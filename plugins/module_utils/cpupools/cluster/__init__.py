"""Floor 4, cluster: the Kubernetes API server's side, over a small HTTP client.

What a node object should carry (labels, taint, extended resources), applying
it with server-side apply, the admission policies, the runtimes' objects, and
retiring CMK's own cluster objects. The same code runs in the modules (on the
controller) and in ``cmk reconcile`` (re-advertising from the node). May import
core, hardware, node and planning; never report.
"""
