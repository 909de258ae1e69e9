"""``arguments_hash``: what binds an approval card to exactly the call a human saw.

``"sha256:" + hex(SHA-256(canonical JSON of the arguments))``; canonical JSON sorts
object keys by their UTF-16 code units (as RFC 8785 does) and has no whitespace, as the
Rust client writes it, so both clients hash the same arguments the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX = "sha256:"


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, no whitespace)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: _utf16_key(str(kv[0])))
        inner = ",".join(
            json.dumps(str(k), ensure_ascii=False) + ":" + canonical_json(v) for k, v in items
        )
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def arguments_hash(arguments: Any) -> str:
    """``"sha256:<64 hex>"`` of the canonical JSON of ``arguments``."""
    digest = hashlib.sha256(canonical_json(arguments).encode("utf-8")).hexdigest()
    return PREFIX + digest
