# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The connection options every cpupools Kubernetes module takes."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description: Path of the kubeconfig on the controller. Required unless O(in_cluster=true).
    type: path
  context:
    description: Kubeconfig context; its current context when omitted.
    type: str
  in_cluster:
    description: Use the service account of the pod the controller runs in.
    type: bool
    default: false
  request_timeout:
    description: Seconds to wait for each API request.
    type: int
    default: 30
requirements:
  - kubernetes (Python library) on the controller
"""
