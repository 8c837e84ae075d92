"""Keep the extended resources advertised, from the node itself (stdlib only).

Kubelet drops extended resources that were patched into the node status when
it re-registers or restarts (it zeroes or forgets capacity it does not manage
itself); CMK lost them this way (its issue 248). The node agent's ``cmk
reconcile`` timer calls ``readvertise``: it reads the Node with the kubelet's
own credentials and, only when a count is missing or wrong, sends the same
guarded JSON patch of ``status.capacity`` as the Ansible module. No extra
credential is placed on the node: the kubelet may patch its own Node status
(Node authorizer, ``system:nodes``).

Standard library only: ``http.client`` + ``ssl`` + a reader for the small
YAML subset kubeconfigs are written in (block mappings and sequences, plain
and quoted scalars, ``{}``/``[]``; JSON kubeconfigs too). Anything else in the
file is refused with the line number, never echoed (it may hold a key).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import re
import shutil
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from ..core.errors import K8sError
from .k8s import advertise_only, check_extended_resource, check_node_name
from .k8s_apply import Api, ensure_node

DEFAULT_KUBECONFIG = "/etc/kubernetes/kubelet.conf"

# Minimal YAML --------------------------------------------------------------

_KEY = re.compile(r"^((?:\"[^\"]*\")|(?:'[^']*')|[^\s\"'#][^:]*?):(?:\s+(.*))?$")


def _err(lineno: int, what: str) -> K8sError:
    return K8sError(f"kubeconfig line {lineno}: {what} (only the plain YAML subset kubeconfigs use is read)")


def _scalar(text: str, lineno: int) -> object:
    text = text.strip()
    if text.startswith('"'):
        end = text.rfind('"')
        if end == 0:
            raise _err(lineno, "unterminated double-quoted string")
        try:
            return json.loads(text[: end + 1])
        except ValueError:
            raise _err(lineno, "unsupported escape in a double-quoted string") from None
    if text.startswith("'"):
        end = text.rfind("'")
        if end == 0:
            raise _err(lineno, "unterminated single-quoted string")
        return text[1:end].replace("''", "'")
    text = re.split(r"\s+#", text, maxsplit=1)[0].strip()
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if text in ("null", "~", ""):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text[0] in "{[|>&*!%@`":
        raise _err(lineno, f"unsupported YAML construct {text[0]!r}")
    return text


def parse_kubeconfig_text(text: str) -> dict:
    """Parse a kubeconfig (JSON, or block-style YAML) into a dict."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise K8sError(f"kubeconfig is not valid JSON (line {exc.lineno})") from None  # type: ignore[attr-defined]
        if not isinstance(data, dict):
            raise K8sError("kubeconfig is not a mapping")
        return data
    lines: list[list] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise _err(number, "tab in indentation")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        lines.append([len(raw) - len(raw.lstrip()), stripped, number])
    if not lines:
        return {}
    value, index = _block(lines, 0, lines[0][0])
    if index != len(lines):
        raise _err(lines[index][2], "unexpected indentation")
    if not isinstance(value, dict):
        raise K8sError("kubeconfig is not a mapping")
    return value


def _block(lines: list[list], i: int, indent: int) -> tuple[object, int]:
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        return _sequence(lines, i, indent)
    if _KEY.match(lines[i][1]):
        return _mapping(lines, i, indent)
    value = _scalar(lines[i][1], lines[i][2])
    return value, i + 1


def _child(lines: list[list], i: int, indent: int) -> tuple[object, int]:
    """The block value of a key or item whose text ended at line ``i - 1``."""
    if i < len(lines):
        nxt = lines[i][0]
        if nxt > indent or (nxt == indent and (lines[i][1] == "-" or lines[i][1].startswith("- "))):
            return _block(lines, i, nxt)
    return None, i


def _mapping(lines: list[list], i: int, indent: int) -> tuple[dict, int]:
    out: dict = {}
    while i < len(lines) and lines[i][0] == indent:
        text, number = lines[i][1], lines[i][2]
        if text == "-" or text.startswith("- "):
            break
        match = _KEY.match(text)
        if not match:
            raise _err(number, "expected 'key: value'")
        key = str(_scalar(match.group(1), number))
        rest = match.group(2)
        if rest is None or not rest.strip() or rest.strip().startswith("#"):
            out[key], i = _child(lines, i + 1, indent)
        else:
            out[key] = _scalar(rest, number)
            i += 1
    if i < len(lines) and lines[i][0] > indent:
        raise _err(lines[i][2], "unexpected indentation")
    return out, i


def _sequence(lines: list[list], i: int, indent: int) -> tuple[list, int]:
    out: list = []
    while i < len(lines) and lines[i][0] == indent and (lines[i][1] == "-" or lines[i][1].startswith("- ")):
        text = lines[i][1]
        content = text[1:].lstrip()
        if not content:
            value, i = _child(lines, i + 1, indent)
        else:
            # The item's content starts a block at the column where it begins.
            lines[i] = [indent + len(text) - len(content), content, lines[i][2]]
            value, i = _block(lines, i, lines[i][0])
        out.append(value)
    return out, i


# Connection ----------------------------------------------------------------


@dataclass
class Credentials:
    server: str
    ssl_context: ssl.SSLContext | None
    token: str | None


def _named(items: object, name: str, kind: str, path: str) -> dict:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get(kind)
            return dict(body) if isinstance(body, Mapping) else {}
    raise K8sError(f"kubeconfig {path}: no {kind} named {name!r}")


def _material(entry: Mapping, key: str, base: str, path: str) -> tuple[str | None, bytes | None]:
    """(file path, data) for ``key`` / ``key-data`` of a kubeconfig entry."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise K8sError(f"kubeconfig {path}: {key}-data is not base64") from None
    file = entry.get(key)
    if file:
        file = os.path.join(base, str(file))
        if not os.path.isfile(file):
            raise K8sError(f"kubeconfig {path}: {key} {file} does not exist")
        return file, None
    return None, None


def load_credentials(path: str, context: str | None = None) -> Credentials:
    """Server URL, TLS context and token of the kubeconfig's (current) context."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = parse_kubeconfig_text(handle.read())
    except OSError as exc:
        raise K8sError(f"kubeconfig {path}: {exc.strerror}") from None
    except K8sError as exc:
        raise K8sError(f"{path}: {exc}") from None
    name = context or config.get("current-context")
    if not name:
        raise K8sError(f"kubeconfig {path}: no current-context")
    ctx = _named(config.get("contexts"), str(name), "context", path)
    cluster = _named(config.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(config.get("users"), str(ctx.get("user")), "user", path) if ctx.get("user") else {}
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise K8sError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    base = os.path.dirname(os.path.abspath(path))
    token = user.get("token")
    if not token and user.get("tokenFile"):
        with open(os.path.join(base, str(user["tokenFile"])), encoding="utf-8") as handle:
            token = handle.read().strip()
    if not server.startswith("https://"):
        return Credentials(server, None, str(token) if token else None)
    ca_file, ca_data = _material(cluster, "certificate-authority", base, path)
    ctx_ssl = ssl.create_default_context(cafile=ca_file, cadata=ca_data.decode("ascii") if ca_data else None)
    if cluster.get("insecure-skip-tls-verify") is True:
        ctx_ssl.check_hostname = False
        ctx_ssl.verify_mode = ssl.CERT_NONE
    cert_file, cert_data = _material(user, "client-certificate", base, path)
    key_file, key_data = _material(user, "client-key", base, path)
    if cert_file or cert_data:
        _load_client_cert(ctx_ssl, cert_file, cert_data, key_file, key_data, path)
    return Credentials(server, ctx_ssl, str(token) if token else None)


def _load_client_cert(ctx, cert_file, cert_data, key_file, key_data, path) -> None:
    tmp = None
    try:
        if cert_data or key_data:  # ssl wants files: a private temporary directory, removed at once
            tmp = tempfile.mkdtemp(prefix="cpupools-kube-")
            if cert_data:
                cert_file = os.path.join(tmp, "cert.pem")
                _write_private(cert_file, cert_data)
            if key_data:
                key_file = os.path.join(tmp, "key.pem")
                _write_private(key_file, key_data)
        ctx.load_cert_chain(cert_file, key_file or cert_file)
    except (ssl.SSLError, OSError) as exc:
        raise K8sError(f"kubeconfig {path}: client certificate or key not usable ({exc.__class__.__name__})") from None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def stdlib_transport(creds: Credentials, timeout: float = 10.0):
    """A ``k8s_apply`` transport over ``http.client``."""
    url = urlsplit(creds.server)
    prefix = url.path.rstrip("/")

    def transport(method, path, body=None, content_type=None, query=None):
        if url.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                url.hostname, url.port or 443, context=creds.ssl_context, timeout=timeout
            )
        else:
            conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
        headers = {"Accept": "application/json", "User-Agent": "cpupools-agent"}
        if creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type or "application/json"
        target = prefix + path + (f"?{urlencode(query)}" if query else "")
        try:
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise K8sError(f"cannot reach the API server {creds.server}: {exc.__class__.__name__}: {exc}") from None
        finally:
            conn.close()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"message": raw[:200].decode("utf-8", "replace")}
        return response.status, payload

    return transport


# The agent's entry point ---------------------------------------------------


def readvertise(
    kubeconfig_path: str | None,
    node_name: str,
    expected: Mapping[str, int],
    timeout: float = 10.0,
    context: str | None = None,
) -> dict:
    """Re-advertise ``expected`` extended resources when missing or wrong.

    Returns a report: ``enabled`` (false when there is no kubeconfig: the
    feature is off), ``changed``, ``node``, ``server``, ``before`` and
    ``after`` (our resources in the node's capacity), and ``error`` (one
    sentence naming the node and server) instead of raising, so the
    reconcile timer logs it and carries on.
    """
    report: dict = {"enabled": False, "changed": False, "node": node_name, "kubeconfig": kubeconfig_path}
    if not kubeconfig_path or not os.path.isfile(kubeconfig_path):
        report["reason"] = f"no kubeconfig at {kubeconfig_path or '(none configured)'}: re-advertising is off"
        return report
    report["enabled"] = True
    try:
        check_node_name(node_name)
        wanted = {}
        for name, count in expected.items():
            check_extended_resource(name, "extended_resources")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise K8sError(f"{name}: count {count!r} is not a non-negative integer", "extended_resources")
            if count > 0:
                wanted[name] = count
        creds = load_credentials(kubeconfig_path, context)
        report["server"] = creds.server
        api = Api(stdlib_transport(creds, timeout), creds.server, node_name)
        outcome = ensure_node(api, advertise_only(wanted), check_mode=False)
    except K8sError as exc:
        report["error"] = str(exc)
        return report
    report.update(changed=outcome["changed"], before=outcome["before"]["capacity"], after=outcome["after"]["capacity"])
    return report
