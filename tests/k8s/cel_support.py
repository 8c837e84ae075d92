"""Run a MutatingAdmissionPolicy on a pod the way the API server does, with cel-python.

cel-python (pinned in requirements-dev.in) evaluates the policy's CEL text as
written. What it lacks, and what this adapter puts in its place:

- **Object{...} and JSONPatch{...}.** Kubernetes declares ``Object``,
  ``Object.spec``, ``Object.spec.containers`` ... and ``JSONPatch`` as types
  whose constructors build apply configurations and patch operations.
  cel-python resolves ``Object.spec`` as a package path, so each such type
  name followed by ``{`` is renamed to one identifier (``Object.spec.volumes{``
  -> ``Object__spec__volumes{``) bound to a constructor that returns a map of
  the fields. The expression is otherwise untouched.
- **Type checking.** The server type-checks each expression against the Pod
  schema when the policy is created; cel-python has no schema. ``check_fields``
  stands in: every field of every constructed value must be a field of that
  Pod type (``POD_FIELDS``, the subset of the v1 Pod schema these policies use).
- **Merging.** ``apply_configuration`` merges like server-side apply for the
  list types of the fields used (map lists keyed as in the Pod schema) and
  refuses, like the server, an apply configuration that sets an atomic list.
  JSON patches go through the fake API server's RFC 6902 implementation.
- **Admission.** ``admit`` evaluates the match conditions, then the mutations
  in order, and reinvokes them once more when they changed the pod
  (``reinvocationPolicy: IfNeeded``), as the server may.
"""

from __future__ import annotations

import copy
import re

import celpy
import celpy.celtypes as ct
from k8s_fake import apply_json_patch

#: Fields of the Pod types the policy constructs (k8s.io/api/core/v1).
POD_FIELDS = {
    "Object": {"spec"},
    "Object.spec": {"volumes", "containers", "tolerations"},
    "Object.spec.volumes": {"name", "hostPath"},
    "Object.spec.volumes.hostPath": {"path", "type"},
    "Object.spec.tolerations": {"key", "operator", "value", "effect", "tolerationSeconds"},
    "Object.spec.containers": {"name", "env", "volumeMounts"},
    "Object.spec.containers.env": {"name", "value"},
    "Object.spec.containers.volumeMounts": {"name", "mountPath", "readOnly"},
    "JSONPatch": {"op", "path", "from", "value"},
}
#: Map lists of the Pod schema (``+listType=map``) and their keys; every other list is atomic.
MAP_LISTS = {
    ("spec", "volumes"): "name",
    ("spec", "containers"): "name",
    ("spec", "containers", "env"): "name",
    ("spec", "containers", "volumeMounts"): "mountPath",
}
_TYPE_NAME = re.compile(r"\b((?:Object(?:\.[A-Za-z_][A-Za-z0-9_]*)*)|JSONPatch)\s*\{")


class PolicyError(AssertionError):
    """The server would refuse the policy or fail the admission."""


def _plain(value: object) -> object:
    """cel-python values -> JSON-like Python values."""
    if isinstance(value, ct.BoolType):
        return bool(value)
    if isinstance(value, ct.IntType | ct.UintType):
        return int(value)
    if isinstance(value, ct.DoubleType):
        return float(value)
    if isinstance(value, ct.StringType):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, celpy.CELEvalError):
        raise PolicyError(f"CEL evaluation error: {value.args[0]}")
    return value


def _constructor(type_name: str):
    allowed = POD_FIELDS.get(type_name)
    if allowed is None:
        raise PolicyError(f"{type_name} is not a type these tests know (add it to POD_FIELDS)")

    def build(fields=None):
        fields = fields or {}
        unknown = sorted(str(k) for k in fields if str(k) not in allowed)
        if unknown:
            raise PolicyError(f"{type_name} has no field {unknown}")
        return ct.MapType(fields)

    return build


def compile_expression(text: str):
    """``(program, type names)``: the expression with its constructors renamed, compiled."""
    names = sorted(set(_TYPE_NAME.findall(text)))
    rewritten = _TYPE_NAME.sub(lambda m: m.group(1).replace(".", "__") + "{", text)
    env = celpy.Environment()
    try:
        ast = env.compile(rewritten)
    except celpy.CELParseError as exc:
        raise PolicyError(f"CEL syntax error: {exc}") from None
    return env.program(ast), names


def evaluate(text: str, pod: dict, variables: dict | None = None) -> object:
    program, names = compile_expression(text)
    activation = {
        "object": celpy.json_to_cel(pod),
        "oldObject": None,
        "variables": celpy.json_to_cel(variables or {}),
    }
    for name in names:
        activation[name.replace(".", "__")] = _constructor(name)
    try:
        result = program.evaluate(activation)
    except celpy.CELEvalError as exc:
        raise PolicyError(f"CEL evaluation error: {exc.args[0]}") from None
    return _plain(result)


def apply_configuration(pod: dict, config: dict) -> dict:
    """Merge an apply configuration into ``pod`` (structured merge for the Pod lists used)."""
    merged = copy.deepcopy(pod)
    _merge(merged, config, ())
    return merged


def _merge(target: dict, patch: dict, path: tuple) -> None:
    for key, value in patch.items():
        here = (*path, key)
        if isinstance(value, dict):
            _merge(target.setdefault(key, {}), value, here)
        elif isinstance(value, list):
            list_key = MAP_LISTS.get(here)
            if list_key is None:
                raise PolicyError(f"an apply configuration may not set the atomic list {'.'.join(here)}")
            if not value:
                continue
            items = target.setdefault(key, [])
            for entry in value:
                existing = next((i for i in items if i.get(list_key) == entry.get(list_key)), None)
                if existing is None:
                    items.append(copy.deepcopy(entry))
                else:
                    _merge(existing, entry, here)
        else:
            target[key] = value


def matches(policy: dict, pod: dict) -> bool:
    return all(evaluate(c["expression"], pod) is True for c in policy["spec"].get("matchConditions", []))


def mutate_once(policy: dict, pod: dict) -> dict:
    for mutation in policy["spec"]["mutations"]:
        if mutation["patchType"] == "JSONPatch":
            ops = evaluate(mutation["jsonPatch"]["expression"], pod)
            if not isinstance(ops, list):
                raise PolicyError(f"a JSONPatch expression must return a list, not {ops!r}")
            pod = apply_json_patch(copy.deepcopy(pod), ops) if ops else pod
        elif mutation["patchType"] == "ApplyConfiguration":
            config = evaluate(mutation["applyConfiguration"]["expression"], pod)
            pod = apply_configuration(pod, config)
        else:
            raise PolicyError(f"unknown patchType {mutation['patchType']!r}")
    return pod


def admit(policy: dict, pod: dict) -> dict:
    """The pod as the server would store it after this policy."""
    if not matches(policy, pod):
        return pod
    mutated = mutate_once(policy, pod)
    if mutated != pod and policy["spec"].get("reinvocationPolicy") == "IfNeeded":
        again = mutate_once(policy, mutated)
        if again != mutated:
            raise PolicyError("a reinvocation changed the pod again: the mutations are not idempotent")
    return mutated
