"""Floor 3, verify: is the running node quiet? Read, judged and measured against the plan.

``gather`` reads the running kernel under a facts root (interrupts,
workqueues, the command line, the kubelet's state), ``checks`` turns what it
read into findings (docs/verify.md), ``latency`` runs oslat on the isolated
CPUs, and ``run`` does all of it for one node in the result's shape (the
``cpupools_verify`` module). Read-only but for oslat, which never runs in
check mode. May import core, hardware and node (the tasks, the pool state,
the housekeeper's view of kernel threads); nothing imports it but the module.
"""
