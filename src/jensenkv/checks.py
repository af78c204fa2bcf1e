"""The value checks every config node uses: each raises one ValueError naming the key, the value and what is
allowed. The bottom of the package: it imports nothing of jensenkv."""
from __future__ import annotations

import math
from typing import Any


def fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(key: str, value: Any, low: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < low:
        fail(key, value, f"must be {'null or ' if optional else ''}an integer >= {low}")


def check_choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        fail(key, value, f"use one of {allowed}")


def check_finite(key: str, value: Any, low: float, *, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > low if strict else value >= low)
    if not ok:
        fail(key, value, f"must be a finite number {'>' if strict else '>='} {low}")


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(key, value, "must be true or false")


def check_finite_tree(tree: Any, prefix: str = "") -> None:
    """One rule for every float of a config tree (mappings and lists, any depth): NaN and inf are refused,
    naming the key. A run id hashes its config, and JSON stores NaN as null, so such a run could never read
    its own record back; no setting of this suite means anything at NaN or inf."""
    if isinstance(tree, float) and not math.isfinite(tree):
        fail(prefix or "the config", tree, "must be a finite number (NaN and inf are not settings)")
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        check_finite_tree(value, f"{prefix}[{key}]" if isinstance(key, int) else f"{prefix}.{key}".lstrip("."))
