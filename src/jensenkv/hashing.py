"""Stable ids of JSON-like objects: what run ids, reference ids and context digests are made of."""
from __future__ import annotations

import hashlib
import json
from typing import Any


def config_hash(obj: Any, length: int = 16) -> str:
    """Stable hex id of a JSON-serialisable object (key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
