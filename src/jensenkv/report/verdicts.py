"""The verdict rule of the claims report: a test per option, Holm within a claim, counts over options.

For one option (a quantizer row) a claim is a test with two possible findings, the claim's side and the other:

- "holds": the test for the claimed side rejects at ALPHA after Holm's adjustment over the claim's options;
- "does not hold" (a superiority claim: "reversed"): the test for the other side rejects, adjusted the same way;
- "inconclusive": neither rejects;
- "missing": no test (fewer than 2 prompts, or no data): never a verdict without one.

``decide`` turns an option's (side, adjusted p) into its verdict; ``summarize`` turns a claim's verdicts into
counts with the rows named: "holds" only when every tested option holds, the claim's failure word only when
every one fails, "mixed" when some hold and some fail, "holds in part" / "<fails> in part" when the rest are
inconclusive. When two or more options hold and share a setting no other option has (``distinguishing_tags``,
from the quantizer settings, never from labels), the summary names it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from jensenkv.eval.stats import ALPHA

HOLDS, FAILS, INCONCLUSIVE, MISSING = "holds", "does not hold", "inconclusive", "missing"
REVERSED = "reversed"  # the failure word of a superiority claim: significantly on the other side of 0
MIXED = "mixed"
SIDES = ("above", "below")


def decide(side: str, p_adjusted: float, alpha: float = ALPHA) -> str:
    """``side``: HOLDS or FAILS, the finding the option's estimate points to; its test's Holm-adjusted p."""
    if side not in (HOLDS, FAILS):
        raise ValueError(f"side={side!r} is not allowed: use {HOLDS!r} or {FAILS!r}")
    if p_adjusted is None or not math.isfinite(p_adjusted):
        return MISSING
    return side if p_adjusted < alpha else INCONCLUSIVE


def side_of(estimate: float, claimed: str, reference: float = 0.0) -> str:
    """HOLDS when ``estimate`` is on the claimed side of ``reference`` (strictly), else FAILS."""
    if claimed not in SIDES:
        raise ValueError(f"claimed={claimed!r} is not allowed: use one of {SIDES}")
    return HOLDS if (estimate > reference if claimed == "above" else estimate < reference) else FAILS


def distinguishing_tags(holding: Sequence[frozenset[str]], others: Sequence[frozenset[str]]) -> set[str]:
    """Tags every holding option has and no other option has (empty when none sets them apart)."""
    if not holding:
        return set()
    common = set.intersection(*(set(t) for t in holding))
    return common - set().union(*(set(t) for t in others)) if others else common


def summarize(results: Iterable[tuple[str, frozenset[str], str]], fails: str = FAILS) -> str:
    """One line over options: ``results`` holds (option name, its settings' tags, its verdict); ``fails``: the
    claim's word for FAILS (REVERSED for a superiority claim). E.g. "mixed: holds in 1 of 6 (a), reversed in 1
    (b), inconclusive in 4"."""
    results = list(results)
    tested = [r for r in results if r[2] != MISSING]
    missing = [r[0] for r in results if r[2] == MISSING]
    if not tested:
        return MISSING
    holding = [r for r in tested if r[2] == HOLDS]
    failing = [r for r in tested if r[2] == FAILS]
    unclear = len(tested) - len(holding) - len(failing)
    if len(holding) == len(tested):
        word = HOLDS
    elif len(failing) == len(tested):
        word = fails
    elif holding and failing:
        word = MIXED
    elif holding:
        word = f"{HOLDS} in part"
    elif failing:
        word = f"{fails} in part"
    else:
        word = INCONCLUSIVE
    parts = []
    if holding:
        parts.append(f"holds in {len(holding)} of {len(tested)} ({', '.join(r[0] for r in holding)})")
    if failing:
        parts.append(f"{fails} in {len(failing)}{'' if holding else f' of {len(tested)}'} "
                     f"({', '.join(r[0] for r in failing)})")
    if unclear:
        parts.append(f"inconclusive in {unclear}{'' if holding or failing else f' of {len(tested)}'}")
    if missing:
        parts.append(f"missing for {len(missing)}")
    line = f"{word}: " + ", ".join(parts)
    if 1 < len(holding) < len(tested):  # one row is no pattern: it is named above, its settings are not a rule
        tags = distinguishing_tags([r[1] for r in holding], [r[1] for r in tested if r[2] != HOLDS])
        if tags:
            line += f"; only the rows with {' and '.join(sorted(tags))} hold"
    return line


def headline_word(summary: str) -> str:
    """The summary's first word(s), before the counts ("mixed", "holds", "reversed in part", ...)."""
    return summary.split(":", 1)[0]


RULE = ("Each option (quantizer row) gets a test per claim, over **prompts** as independent units: every "
        "video's value is first averaged over its replicates (rotation / dither seeds) within its (prompt, seed), "
        "then over seeds within its prompt; the 95% interval is a Student-t interval over those prompt means and the "
        "p-value an exact sign-flip test over them (2^prompts sign vectors; Monte Carlo with 1e5 draws and its "
        "s.e. above 20 prompts). **Multiplicity:** one pre-specified primary endpoint is tested at 0.05 alone; "
        "every other test is Holm-adjusted within its claim (the family: that claim's options, one metric; the "
        "primary endpoint left out), and the adjusted p is shown beside the raw one. Verdict per option: "
        "**holds** when the adjusted p of the test for the claimed side is < 0.05, **reversed** (or **does not "
        "hold** for a claim with a margin) when the test for the other side rejects, **inconclusive** otherwise, "
        "**missing** without a test (fewer than 2 prompts, or no data). Over options, counts with the rows named: "
        "**holds** / **reversed** only when every option does, **mixed** when some hold and some are reversed, "
        "**holds in part** / **reversed in part** when the others are inconclusive; shared settings are read from "
        "the quantizer settings. A claim with a margin (about 0, matches) is tested against the margin: "
        "equivalence by two one-sided tests (TOST), non-inferiority by one.")
