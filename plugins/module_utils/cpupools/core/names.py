"""Names more than one floor speaks: CMK's pool names, the runtimes, verify's checks, the label on cluster objects.

CMK's pool names are its interface (CMK's intel/init.py): the state directory's
``pools/<name>`` folders, the ``--pool`` of ``cmk isolate``, the node's
advertised resources. ``MANAGED_BY`` marks every object cpupools owns in the
cluster (the runtimes' renderings carry it too). Standard library only, and
nothing else of this package.
"""

EXCLUSIVE = "exclusive"
SHARED = "shared"
INFRA = "infra"
ENI = "exclusive-non-isolcpus"
#: Pools in the order CMK creates them (its intel/init.py).
POOL_ORDER = (EXCLUSIVE, SHARED, ENI, INFRA)
#: Pools whose cpulists are handed out whole to one process.
EXCLUSIVE_POOLS = (EXCLUSIVE, ENI)
#: The runtimes that place workloads on the pools (``cpupools_runtime``): cmk's own agent, the
#: kubelet's static CPU manager, and three that read a pool configuration cpupools renders.
CMK = "cmk"
KUBELET = "kubelet"
POOLER = "cpu-pooler"
NRI_TOPOLOGY_AWARE = "nri-topology-aware"
NRI_BALLOONS = "nri-balloons"
RUNTIMES = (CMK, KUBELET, POOLER, NRI_TOPOLOGY_AWARE, NRI_BALLOONS)
#: What verify.yml checks (verify/checks.py), in the order it reports them; ``cpupools_verify_fail_on``
#: picks those that fail a node, and the metrics count findings per check.
VERIFY_CHECKS = ("irq", "workqueue", "kthread", "rcu", "nohz", "process", "cmk", "latency", "power")
#: The label on every cluster object cpupools owns (and may therefore change or delete).
MANAGED_BY = {"app.kubernetes.io/managed-by": "cpupools"}
