"""The ``kubernetes``-client transport of the cpupools modules (controller only).

Kept outside the ``cpupools`` package on purpose: that package is standard
library only and runs inside the node agent, which must not need the
``kubernetes`` library. Here the client loads the kubeconfig (contexts, client
certificates, tokens, exec plugins) or the in-cluster service account; the
requests themselves are plain JSON sent through the client's ``ApiClient``, so
the logic in ``cpupools.cluster.k8s_apply`` sees dicts, exactly what the server sent.

Nothing here logs or returns a credential: error messages name the kubeconfig
path, the context and the server URL only.

``run_module`` is the ``main()`` every Kubernetes module shares (the connection
options, the check for the library, a ``CpupoolsError`` as the failure
message), and ``connect_api`` the ``Api`` its options name; a module keeps only
its own options and what it does with the API.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.cluster.k8s_apply import Api
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.core.errors import CpupoolsError, K8sError

try:
    import urllib3
    import yaml
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # reported by the module with missing_required_lib
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

CONNECTION_ARGS = {
    "kubeconfig": {"type": "path"},
    "context": {"type": "str"},
    "in_cluster": {"type": "bool", "default": False},
    "request_timeout": {"type": "int", "default": 30},
}

_OBJECT_REPR = re.compile(r"<[^<>]+ object at 0x[0-9a-f]+>:?\s*")


def _reason(exc: BaseException) -> str:
    """A connection error without object reprs (and never a header)."""
    reason = getattr(exc, "reason", None) or exc
    return _OBJECT_REPR.sub("", str(reason)).strip() or type(exc).__name__


def load_configuration(kubeconfig: str | None, context: str | None, in_cluster: bool):
    """A client Configuration from the kubeconfig or the pod's service account."""
    cfg = k8s_client.Configuration()
    if in_cluster:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            raise K8sError(f"in-cluster configuration is not available here: {exc}", "k8s_in_cluster") from None
        return cfg
    if not kubeconfig:
        raise K8sError("no kubeconfig given (and in_cluster is false)", "k8s_kubeconfig")
    if not os.path.isfile(kubeconfig):
        raise K8sError(f"kubeconfig {kubeconfig} does not exist or is not a file", "k8s_kubeconfig")
    try:
        k8s_config.load_kube_config(
            config_file=kubeconfig, context=context or None, client_configuration=cfg, persist_config=False
        )
    except ConfigException as exc:
        where = f" (context {context!r})" if context else ""
        raise K8sError(f"kubeconfig {kubeconfig}{where} is not usable: {exc}", "k8s_kubeconfig") from None
    except yaml.YAMLError as exc:  # YAML errors quote the offending line, which may hold a token: say only where
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise K8sError(f"kubeconfig {kubeconfig} is not valid YAML{where}", "k8s_kubeconfig") from None
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise K8sError(
            f"kubeconfig {kubeconfig} is not usable ({type(exc).__name__}); check its clusters, users and contexts",
            "k8s_kubeconfig",
        ) from None
    return cfg


def connect(kubeconfig: str | None, context: str | None, in_cluster: bool, request_timeout: int = 30):
    """``(transport, server_url)`` for ``cpupools.cluster.k8s_apply``."""
    cfg = load_configuration(kubeconfig, context, in_cluster)
    api_client = k8s_client.ApiClient(configuration=cfg)
    server = cfg.host

    def transport(method, path, body=None, content_type=None, query=None):
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = api_client.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = api_client.call_api(*params, _request_timeout=request_timeout)
            response.read()
        except ApiException as exc:  # TLS failures arrive as status 0
            raise K8sError(f"cannot talk to the API server {server}: {_reason(exc)}", "k8s_kubeconfig") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise K8sError(f"cannot reach the API server {server}: {_reason(exc)}", "k8s_kubeconfig") from None
        raw = response.data or b""
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode("utf-8", "replace")}
        return response.status, data

    return transport, server


def connect_api(params: dict, where: str, rbac_hint: str | None = None) -> Api:
    """The ``cpupools.cluster.k8s_apply.Api`` a module's connection options name; ``where`` is what messages name.

    ``rbac_hint``: what a refusal (403) says the credentials need, when not the k8s stage's.
    """
    p = params
    transport, server = connect(p["kubeconfig"], p["context"], p["in_cluster"], p["request_timeout"])
    return Api(transport, server, where) if rbac_hint is None else Api(transport, server, where, rbac_hint=rbac_hint)


def run_module(argument_spec: dict, run: Callable[[AnsibleModule], dict], where: Callable[[dict], str | None]) -> None:
    """The ``main()`` of every cpupools Kubernetes module.

    ``argument_spec`` is the module's own options (the connection options are
    added here). Without the ``kubernetes`` library the module fails naming it;
    a ``CpupoolsError`` from ``run`` fails with its message, prefixed by
    ``host <where(params)>`` when that is not empty; else ``run``'s result is
    the module's.
    """
    module = AnsibleModule(argument_spec={**argument_spec, **CONNECTION_ARGS}, supports_check_mode=True)
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(KUBERNETES_IMPORT_ERROR))
    try:
        result = run(module)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(where(module.params)))
    module.exit_json(**result)
