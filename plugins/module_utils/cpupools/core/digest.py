"""The one digest of a JSON value: its compact text with sorted keys, and that text's SHA-256.

The controller stores a converged host's topology and plan under this digest
(plugin_utils/digest_store.py), and the plan module names them by it when
the controller says it holds them (docs/performance.md, "The converged
result"): both sides must encode alike, so both call this. A value is
encoded as JSON gives it back (``json.loads`` of its text): a dictionary
with integer keys is sorted as the strings the other side reads, not as
numbers.
"""

from __future__ import annotations

import hashlib
import json


def encode(obj) -> tuple[str, str]:
    """``(text, digest)``: the compact JSON text of ``obj`` as JSON gives it back (keys sorted), and its SHA-256."""
    text = json.dumps(json.loads(json.dumps(obj)), sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()
