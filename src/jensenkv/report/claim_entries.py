"""A claim and its entries: ``Entry`` (one option under one claim: numbers, test, verdict), ``Claim`` (Holm
within the claim, then each entry's verdict) and the tests that make an entry: superiority over 0, equivalence
or non-inferiority within a margin, and the test against the paper's own effect.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from jensenkv.eval.stats import ALPHA, PairedDifference, SignFlip, holm, sign_flip
from jensenkv.report.endpoints import Margin, paper_effect
from jensenkv.report.table1_format import fmt_signed
from jensenkv.report.verdicts import FAILS, HOLDS, MISSING, REVERSED, decide, side_of, summarize
from jensenkv.report.claim_numbers import NAMES, fmt_p, metric_digits


@dataclass
class Entry:
    """One option under one claim: its numbers, its test, its verdict, and why it is missing if it is."""

    option: str
    tags: frozenset
    numbers: dict[str, str]
    side: str = ""                    # HOLDS / FAILS: the finding the estimate points to
    test: SignFlip | None = None      # the test of that finding (raw)
    p_adjusted: float = math.nan      # Holm within the claim (the primary endpoint: its raw p)
    verdict: str = MISSING
    reason: str = ""
    primary: bool = False
    paper: tuple[str, float, SignFlip] | None = None  # (paper quantizer, its effect, the test against it)
    paper_adjusted: float = math.nan
    power: PairedDifference | None = None  # the estimate whose SD gives the power (cluster-level)
    note: str = ""  # what qualifies the verdict (e.g. the uncorrected value already met the claim)

    @property
    def p(self) -> float:
        return self.test.p if self.test is not None else math.nan


@dataclass
class Claim:
    key: str
    title: str
    statement: str  # the quantity, and on which side of what it must lie
    columns: list[str]
    entries: list[Entry] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # data the claim needs that the store lacks, with why
    fails: str = REVERSED  # the word for a finding on the other side (a claim with a margin: "does not hold")
    margin: Margin | None = None
    units: str = "prompts / videos"  # the independent units / what stands behind them (the n column's name)

    def finish(self) -> Claim:
        """Holm within the claim (the primary endpoint left out), then each option's verdict."""
        family = [e for e in self.entries if e.test is not None and not e.primary]
        for entry, adjusted in zip(family, holm([e.p for e in family])):
            entry.p_adjusted = adjusted
        for entry in self.entries:
            if entry.primary:
                entry.p_adjusted = entry.p
            if entry.test is not None:
                entry.verdict = decide(entry.side, entry.p_adjusted)
                if entry.verdict == MISSING:
                    entry.reason = entry.reason or "no test (fewer than 2 prompts)"
        compared = [e for e in self.entries if e.paper is not None and math.isfinite(e.paper[2].p)]
        for entry, adjusted in zip(compared, holm([e.paper[2].p for e in compared])):
            entry.paper_adjusted = adjusted
        return self

    @property
    def summary(self) -> str:
        return summarize(((e.option, e.tags, e.verdict) for e in self.entries), self.fails)

    @property
    def headline(self) -> str:
        return self.summary


def missing_entry(option: str, tags: frozenset, reason: str, numbers: dict | None = None) -> Entry:
    return Entry(option, tags, numbers or {}, verdict=MISSING, reason=reason)


def superiority(option: str, tags: frozenset, numbers: dict[str, str], est: PairedDifference, claimed: str,
                reason: str, metric: str, primary: bool = False) -> Entry:
    """An option whose claim is "the mean lies on the ``claimed`` side of 0": two-sided sign flip over prompts."""
    if est.n < 2 or est.test is None or not math.isfinite(est.test.p):
        return missing_entry(option, tags, reason if est.n == 0 else
                             f"{est.n} prompt(s) with {NAMES.get(metric, metric)}: no test", numbers)
    side = side_of(est.delta, claimed)
    return Entry(option, tags, numbers, side, est.test, primary=primary, power=est)


def margin_entry(option: str, tags: frozenset, numbers: dict[str, str], est: PairedDifference,
                 clusters: pd.Series, margin: float, kind: str, claimed: str, reason: str, metric: str) -> Entry:
    """An option whose claim has a margin, tested over the prompt means ``clusters`` (sign flips about the
    margin): ``kind`` "equivalence" (|mean| < margin: TOST, p = the larger of the two one-sided p) or
    "non-inferiority" (mean on the ``claimed`` side of -margin, signed so that ``claimed`` is better)."""
    if est.n < 2:
        return missing_entry(option, tags, reason if est.n == 0 else
                             f"{est.n} prompt(s) with {NAMES.get(metric, metric)}: no test", numbers)
    x = clusters.to_numpy()
    if kind == "equivalence":
        lower, upper = sign_flip(x, -margin, "greater"), sign_flip(x, margin, "less")
        within = lower if lower.p >= upper.p else upper  # TOST: both must reject; report the larger p
        if abs(est.delta) < margin:
            return Entry(option, tags, numbers, HOLDS, within, power=est)
        outside = sign_flip(x, margin, "greater") if est.delta >= margin else sign_flip(x, -margin, "less")
        return Entry(option, tags, numbers, FAILS, outside, power=est)
    if kind != "non-inferiority":
        raise ValueError(f"kind={kind!r} is not allowed: use 'equivalence' or 'non-inferiority'")
    worse = -margin if claimed == "above" else margin  # the margin on the worse side of 0
    better_alt, worse_alt = ("greater", "less") if claimed == "above" else ("less", "greater")
    holds = est.delta > worse if claimed == "above" else est.delta < worse
    test = sign_flip(x, worse, better_alt if holds else worse_alt)
    return Entry(option, tags, numbers, HOLDS if holds else FAILS, test, power=est)


def with_paper(entry: Entry, clusters: pd.Series, metric: str) -> Entry:
    """Test a row that is one of the paper's quantizers against the paper's own effect on ``metric``."""
    found = paper_effect(entry.tags, metric)
    if found is not None and len(clusters) >= 2:
        name, effect = found
        entry.paper = (name, effect, sign_flip(clusters.to_numpy(), effect))
    return entry


def paper_text(entry: Entry, metric: str) -> str:
    """"RTN +0.91: excluded; p=3.1e-05, Holm 9.2e-05" / "... not excluded; ..." / "-" (not a paper row)."""
    if entry.paper is None:
        return "-"
    name, effect, test = entry.paper
    d = metric_digits(metric)
    found = "excluded" if entry.paper_adjusted < ALPHA else "not excluded"
    return f"{name} {fmt_signed(effect, d, True)}: {found}; {test.text()}, Holm {fmt_p(entry.paper_adjusted)}"
