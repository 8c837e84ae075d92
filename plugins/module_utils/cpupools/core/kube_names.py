"""Kubernetes' names: what a node name, a label key or value and an extended resource name may be.

One vocabulary for the inventory's check (planning/inputs.py, before anything
is written) and the API side (cluster/k8s.py, before a request is sent), so
that a name one accepts the other cannot refuse. The rules are the API
server's own (apimachinery's validation of qualified names and DNS-1123
subdomains; for extended resources, the core API's ``IsExtendedResourceName``).
Each ``*_fault`` function says what is wrong with a name (quoting a part of it
shortened, never the whole of a huge one), or returns None; the callers raise
their own error with it.
"""

from __future__ import annotations

import re

from .errors import show

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# \Z, not $: $ also matches before a last newline, and a name with one is not a name.
#: A DNS-1123 subdomain (node names, label and resource prefixes): at most 253 characters.
DNS_SUBDOMAIN = re.compile(rf"^(?=.{{1,253}}\Z){_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
#: The name part of a qualified name: 1-63 characters, alphanumeric at both ends.
NAME = re.compile(r"^(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
#: A label value: a name part, or empty.
LABEL_VALUE = re.compile(r"^((?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
#: Kubernetes' own resources: any name with this in it (``IsPrefixedNativeResource``).
NATIVE_PREFIX = "kubernetes.io/"
#: The prefix of a quota's resource names; an extended resource may not start with it.
REQUESTS_PREFIX = "requests."


def is_subdomain(text: object) -> bool:
    return isinstance(text, str) and bool(DNS_SUBDOMAIN.match(text))


def qualified_name_fault(text: str, need_prefix: bool = False) -> str | None:
    """What is wrong with ``text`` as a qualified name, ``[prefix/]name`` (label keys, resource names)."""
    prefix, slash, name = text.rpartition("/")
    if need_prefix and not slash:
        return "needs a domain prefix (like example.com/name)"
    if slash and not DNS_SUBDOMAIN.match(prefix):
        return f"the prefix {show(prefix)} is not a DNS subdomain"
    if not NAME.match(name):
        return "the name part must be 1-63 characters of [A-Za-z0-9-_.], starting and ending with a letter or digit"
    return None


def extended_resource_fault(name: str) -> str | None:
    """What is wrong with ``name`` as an extended resource name, as the API server decides it.

    A qualified name with a domain, not Kubernetes' own (no ``kubernetes.io/``
    anywhere in it, so ``notkubernetes.io/x`` is refused too), not starting
    with ``requests.``, and still a qualified name with ``requests.`` in front
    (how a quota names it). ``requests/x`` is a valid name.
    """
    fault = qualified_name_fault(name, need_prefix=True)
    if fault:
        return fault
    if NATIVE_PREFIX in name:
        return "the kubernetes.io domain is Kubernetes' own"
    if name.startswith(REQUESTS_PREFIX):
        return f"may not start with {REQUESTS_PREFIX!r} (a quota's prefix)"
    if qualified_name_fault(REQUESTS_PREFIX + name):
        return f"too long for a quota to name it ({REQUESTS_PREFIX}<name>: at most 253 characters before the '/')"
    return None
