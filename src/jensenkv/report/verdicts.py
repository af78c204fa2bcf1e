"""The verdict rule of the claims report: a 95% interval against the side of a reference that a claim names.

For one option (a quantizer row) a claim is a statement "the quantity lies above (or below) the reference"
(0 for a shift or a paired difference; an INT4 row's value enters as a paired difference against it):

- "holds": the whole interval is on the claimed side (strictly);
- "does not hold": the whole interval is on the other side (strictly);
- "inconclusive": the interval touches or straddles the reference;
- "missing": no interval (fewer than 2 videos, or no data): never a verdict without an interval.

Over several options, ``summarize`` says "holds" when every option with an interval holds, "holds when <tags>"
when only some do (naming the tags that set those options apart, e.g. "quarot", else the options), "does not
hold" when every option with an interval does not, and "inconclusive" otherwise.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

HOLDS, FAILS, INCONCLUSIVE, MISSING = "holds", "does not hold", "inconclusive", "missing"
SIDES = ("above", "below")

RULE = ("A claim states that a quantity lies above (or below) a reference: 0 for a shift or a paired difference, "
        "the INT4 row for a memory claim (as the paired difference to it). Verdict per option from its 95% interval: "
        "**holds** when the whole interval is on the claimed side, **does not hold** when it is wholly on the "
        "other side, **inconclusive** when it touches or straddles the reference, **missing** when there is no "
        "interval (fewer than 2 videos). Over options: **holds** when every option with an interval holds, "
        "**holds when X** when only the options with X hold, **does not hold** when none holds and every one "
        "fails, else **inconclusive**. A paired verdict whose sign-flip p-value is >= 0.05 keeps its verdict but says "
        "so (bootstrap intervals are optimistic on few videos).")


def verdict(low: float, high: float, claimed: str = "above", reference: float = 0.0) -> str:
    """The verdict for one interval [low, high] and the claimed side of ``reference``."""
    if claimed not in SIDES:
        raise ValueError(f"claimed={claimed!r} is not allowed: use one of {SIDES}")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return MISSING
    if low > high:
        raise ValueError(f"interval [{low}, {high}] is not allowed: low must be <= high")
    above, below = low > reference, high < reference
    if not (above or below):
        return INCONCLUSIVE
    return HOLDS if above == (claimed == "above") else FAILS


def distinguishing_tags(holding: Sequence[frozenset[str]], others: Sequence[frozenset[str]]) -> set[str]:
    """Tags every holding option has and no other option has (empty when none sets them apart)."""
    if not holding:
        return set()
    common = set.intersection(*(set(t) for t in holding))
    return common - set().union(*(set(t) for t in others)) if others else common


def summarize(results: Iterable[tuple[str, frozenset[str], str]]) -> str:
    """One verdict over options: ``results`` holds (option name, its tags, its verdict)."""
    results = [r for r in results if r[2] != MISSING]
    if not results:
        return MISSING
    holding = [r for r in results if r[2] == HOLDS]
    if len(holding) == len(results):
        return HOLDS
    if holding:
        rest = [r for r in results if r[2] != HOLDS]
        tags = distinguishing_tags([r[1] for r in holding], [r[1] for r in rest])
        what = " and ".join(sorted(tags)) if tags else "one of: " + ", ".join(r[0] for r in holding)
        return f"holds when {what}"
    if all(r[2] == FAILS for r in results):
        return FAILS
    return INCONCLUSIVE
