# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every ``cpupools_*`` variable of a host, read on the controller for the plan modules' actions.

The modules check them all against the one spec (module_utils/cpupools/inputs.py)
and warn about unknown names; reading them here, in Python, costs less per
host than a Jinja lookup of every variable name in the task's arguments.
"""

import os

PREFIX = "cpupools_"


def host_inputs(task_vars, templar):
    """Name -> templated value of every variable of the task whose name starts with ``cpupools_``."""
    return {name: templar.template(task_vars[name]) for name in sorted(task_vars) if name.startswith(PREFIX)}


def controller_refusal(host, values):
    """What the module (on the node) cannot check: a path on the controller. None, or the refusal.

    ``values`` are the module's normalised inputs (``cpupools_`` stripped). A
    kubeconfig the k8s stage would use must be a file here, or that stage
    would fail after the kernel and agent stages have changed the node.
    Relative paths are left to the k8s stage (they depend on its directory).
    """
    if not values or not values.get("k8s_enabled") or values.get("k8s_in_cluster"):
        return None
    kubeconfig = values.get("k8s_kubeconfig") or ""
    path = os.path.expanduser(os.path.expandvars(kubeconfig))
    if not kubeconfig or not os.path.isabs(path) or os.path.isfile(path):
        return None
    where = f"host {host}: " if host else ""
    return f"{where}cpupools_k8s_kubeconfig: kubeconfig {path} does not exist or is not a file on the controller"
