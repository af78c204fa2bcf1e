"""The paper's three claims checked on a results store: a pre-specified primary endpoint, then every claim as
counts over the store's quantizer options, with intervals, exact tests, Holm-adjusted p-values, margins, power
and the paper's own effect sizes.

    python -m jensenkv.report.claims [--results $JENSENKV_RESULTS or results] [--model M] [--out <results>]
                                     [--correction taylor] [--bits 2] [--reference-bits 4] [--allow-incomplete]

Per model in the store (or only ``--model``, matched against the records' model label), from one context
(``jensenkv.report.options``: rows = quantizer options, variants = corrections and other attention-time
options, rotation / dither seeds pooled):

0. The primary endpoint (``report.endpoints.PRIMARY``): the paper's setting, RTN INT2 g32 (integer zero),
   none -> the correction, PSNR; tested alone at 0.05.
1. INT2 cached keys steal attention mass: (a) uncorrected dP_S > 0; (b) the correction brings dP_S to about 0:
   equivalence (TOST) of the corrected mean per-probe |dP_S| with 0 within ``endpoints.ABOUT_ZERO``.
2. The correction improves fidelity to the BF16 video at INT2 (PSNR, SSIM, VBench up; LPIPS down), paired
   per video against the uncorrected run; each row matching a paper quantizer is also tested against the
   paper's own effect (``endpoints.PAPER_TABLE1``).
3. Corrected INT2 at fewer effective bits matches or beats uncorrected INT4 of the same quantizer:
   non-inferiority within ``endpoints.NON_INFERIORITY`` (paired per (prompt, seed)).

The unit of every interval and test is the prompt (``rows.cluster_means``): replicates are averaged within
(prompt, seed), seeds within the prompt; intervals are Student-t intervals and p-values exact sign-flip tests over
prompts (``jensenkv.eval.stats``); n is given as prompts / videos. The verdict rule is
``jensenkv.report.verdicts.RULE``. Then the power of every row, the per-layer error-model diagnostics of the
uncorrected INT2 runs (``jensenkv.report.diagnostics``) and every option of the store side by side. Absent data
are listed as missing, with the reason.

``<out>/claims.md`` is written only from a store that holds the experiment it describes (``claims_gaps``: Table
1's rows, the noise floor, the teacher-forced runs); otherwise the report goes to ``<out>/partial/claims.md``
with a line saying what is missing, and the command exits 1 (``jensenkv.report.publish``).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import ALPHA, Interval, PairedDifference, SignFlip, holm, mean_interval, sign_flip
from jensenkv.report.checks import checks_section
from jensenkv.report.diagnostics import Diagnostics, diagnose, render_diagnostics
from jensenkv.report.hints import fill_command
from jensenkv.report.endpoints import (ABOUT_ZERO, NON_INFERIORITY, NOT_COMPARABLE, PAPER_COMPARABLE, PRIMARY,
                                       PRIMARY_REASON, SOURCE, Margin, paper_effect)
from jensenkv.report.options import Options, load_options
from jensenkv.report.table1 import DIGITS, fmt_signed
from jensenkv.report.verdicts import (FAILS, HOLDS, INCONCLUSIVE, MISSING, REVERSED, RULE, decide, side_of,
                                      summarize)
from jensenkv.exit_codes import EPILOG, guarded, stop
from jensenkv.exit_codes import PARTIAL as PARTIAL_EXIT
from jensenkv.report.publish import (PARTIAL, Part, add_store_args, publish, recover_store, report_error, shown_path,
                                    text_file)
from jensenkv.store.files import portable

# Fidelity metrics and the side of 0 that is better (a paired difference there is an improvement).
FIDELITY = {"psnr": "above", "ssim": "above", "lpips": "below", "vbench": "above"}
NAMES = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "delta_p_s": "dP_S",
         "delta_p_s_abs": "mean abs(dP_S)"}  # no "|" in a name: it would split a markdown table cell
SHIFT_DIGITS = 4
ONE_SIDED_LEVEL = 1 - 2 * ALPHA  # a one-sided test at ALPHA (TOST, non-inferiority) matches this interval: 90%
MATCHING = f"[{ONE_SIDED_LEVEL:.0%} CI, the one-sided tests' own]"
LLM_CLAIMS = "llm_claims.md"  # the LLM report's claims (jensenkv.report.llm_prefill), included as a section


def _digits(metric: str) -> int:
    return DIGITS.get(metric, SHIFT_DIGITS)


def fmt_interval(iv: Interval, metric: str, signed: bool = True) -> str:
    """"+0.0123 [+0.0050, +0.0200]" (signed: shifts and differences) or "27.07 [25.71, 28.10]"; a number that
    would round to 0 gets the digits that show its sign ("+0.00034")."""
    d = _digits(metric)
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "missing"
    bounds = (f"[{fmt_signed(iv.low, d, signed)}, {fmt_signed(iv.high, d, signed)}]"
              if math.isfinite(iv.low) and math.isfinite(iv.high) else "[no interval]")
    return f"{fmt_signed(iv.mean, d, signed)} {bounds}"


def fmt_paired(diff: PairedDifference, metric: str) -> str:
    """"+0.58 [+0.10, +1.02], p=0.031"."""
    if diff.n == 0:
        return "missing"
    p = f", {diff.test.text()}" if diff.test is not None and math.isfinite(diff.test.p) else ""
    return fmt_interval(Interval(diff.delta, diff.low, diff.high, diff.n), metric) + p


def fmt_n(n: int, videos: int) -> str:
    """"16 / 48": prompts (the independent units) / videos behind them."""
    return f"{n} / {videos}"


def fmt_p(p: float) -> str:
    return f"{p:.2g}" if math.isfinite(p) else "-"


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


def _tags(opts: Options, row: str) -> frozenset:
    return opts.runs.loc[opts.runs["row"] == row, "tags"].iloc[0]


def _rows_at(opts: Options, bits: int, variant: str) -> list[str]:
    """Quantized rows at ``bits`` that have a run of ``variant``."""
    return [r for r in opts.rows if r != "bf16" and opts.first(r, "bits") == bits and variant in opts.variants(r)]


def _missing(option: str, tags: frozenset, reason: str, numbers: dict | None = None) -> Entry:
    return Entry(option, tags, numbers or {}, verdict=MISSING, reason=reason)


def superiority(option: str, tags: frozenset, numbers: dict[str, str], est: PairedDifference, claimed: str,
                reason: str, metric: str, primary: bool = False) -> Entry:
    """An option whose claim is "the mean lies on the ``claimed`` side of 0": two-sided sign flip over prompts."""
    if est.n < 2 or est.test is None or not math.isfinite(est.test.p):
        return _missing(option, tags, reason if est.n == 0 else
                        f"{est.n} prompt(s) with {NAMES.get(metric, metric)}: no test", numbers)
    side = side_of(est.delta, claimed)
    return Entry(option, tags, numbers, side, est.test, primary=primary, power=est)


def margin_entry(option: str, tags: frozenset, numbers: dict[str, str], est: PairedDifference,
                 clusters: pd.Series, margin: float, kind: str, claimed: str, reason: str, metric: str) -> Entry:
    """An option whose claim has a margin, tested over the prompt means ``clusters`` (sign flips about the
    margin): ``kind`` "equivalence" (|mean| < margin: TOST, p = the larger of the two one-sided p) or
    "non-inferiority" (mean on the ``claimed`` side of -margin, signed so that ``claimed`` is better)."""
    if est.n < 2:
        return _missing(option, tags, reason if est.n == 0 else
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
    d = _digits(metric)
    found = "excluded" if entry.paper_adjusted < ALPHA else "not excluded"
    return f"{name} {fmt_signed(effect, d, True)}: {found}; {test.text()}, Holm {fmt_p(entry.paper_adjusted)}"


def mde_text(est: PairedDifference | None, metric: str) -> str:
    if est is None or not math.isfinite(est.mde):
        return "-"
    return fmt_signed(est.mde, _digits(metric), False)


def claim_shift(opts: Options, bits: int, correction: str) -> list[Claim]:
    """Claim 1: (a) uncorrected dP_S > 0; (b) the corrected mean |dP_S| is within the margin of 0 (TOST)."""
    a = Claim("1a", f"INT{bits} cached keys steal attention mass",
              "uncorrected dP_S = P_S(quantized cache) - P_S(same call, the run's own cache in full precision), "
              "per video the mean over its probes, per prompt the mean over its videos: claimed above 0, two-sided "
              "sign-flip test over prompts (paper: median about +0.15 on MAGI-1)", ["dP_S uncorrected [95% CI]"])
    margin = ABOUT_ZERO
    b = Claim("1b", f"the {correction} correction brings dP_S to about 0",
              f"mean abs(dP_S) over the probes of each video (every layer, chunk and probed step, so opposite-sign "
              f"layers do not cancel) with {correction}: equivalent to 0 within the margin {margin.value:g} "
              f"({margin.reason}); two one-sided sign-flip tests over prompts (TOST; the lower one is trivially met "
              "by an absolute value). The uncorrected mean abs(dP_S) and the paired change are shown for reference",
              ["mean abs(dP_S) uncorrected", f"mean abs(dP_S) {correction} [95% CI]", MATCHING,
               "d mean abs(dP_S) [95% CI], p"],
              fails=FAILS, margin=margin)
    rows = _rows_at(opts, bits, "none")
    if not rows:
        a.missing.append(f"no uncorrected INT{bits} run in the store: run `python -m jensenkv.run -m "
                         f"experiment=table1` (with 'attention' in eval.metrics)")
    for row in rows:
        tags = _tags(opts, row)
        est = opts.shift(row, "none", "delta_p_s")
        a.entries.append(superiority(row, tags, {a.columns[0]: fmt_interval(est_interval(est), "delta_p_s")}, est,
                                     "above", opts.missing_reason(row, "none", "delta_p_s"), "delta_p_s"))
        if correction not in opts.variants(row):
            b.entries.append(_missing(row, tags, f"no {correction} run of {row}"))
            continue
        fixed = opts.shift(row, correction, "delta_p_s_abs")
        before = opts.interval(row, "none", "delta_p_s_abs")
        numbers = {b.columns[0]: fmt_interval(before, "delta_p_s", False),
                   b.columns[1]: fmt_interval(est_interval(fixed), "delta_p_s", False),
                   b.columns[2]: fmt_interval(mean_interval(opts.clusters(row, correction, "delta_p_s_abs"),
                                                            level=ONE_SIDED_LEVEL), "delta_p_s", False),
                   b.columns[3]: fmt_paired(opts.paired(row, correction, "delta_p_s_abs"), "delta_p_s")}
        entry = margin_entry(row, tags, numbers, fixed, opts.clusters(row, correction, "delta_p_s_abs"),
                             margin.value, "equivalence", "below",
                             opts.missing_reason(row, correction, "delta_p_s_abs"), "delta_p_s_abs")
        if before.n and before.mean < margin.value:  # nothing for the correction to bring down to the margin
            entry.note = f"uncorrected already within the margin: {fmt_signed(before.mean, SHIFT_DIGITS, False)}"
        b.entries.append(entry)
    return [a.finish(), b.finish()]


def est_interval(est: PairedDifference) -> Interval:
    return Interval(est.delta, est.low, est.high, est.n, est.videos)


def claim_fidelity(opts: Options, bits: int, correction: str) -> list[Claim]:
    """Claim 2, one claim per fidelity metric: corrected - uncorrected, paired per video, on the better side."""
    claims = []
    rows = _rows_at(opts, bits, "none")
    for metric, side in FIDELITY.items():
        name = NAMES[metric]
        claim = Claim(f"2 ({name})", f"the {correction} correction improves {name} at INT{bits}",
                      f"{name} with {correction} - {name} uncorrected, paired per video, then averaged per prompt: "
                      f"claimed {side} 0 ({'higher' if side == 'above' else 'lower'} is better), two-sided sign-flip "
                      + (f"test over prompts; a row with the settings of one of the paper's quantizers is also "
                         f"tested against the paper's own effect ({SOURCE}; Holm over those rows)"
                         if metric in PAPER_COMPARABLE else
                         f"test over prompts; not tested against the paper's {name} effect: {NOT_COMPARABLE[metric]}"),
                      [f"{name} uncorrected", f"{name} {correction}", f"d{name} [95% CI]"])
        if not rows:
            claim.missing.append(f"no uncorrected INT{bits} run in the store")
        for row in rows:
            tags = _tags(opts, row)
            if correction not in opts.variants(row):
                claim.entries.append(_missing(row, tags, f"no {correction} run of {row}"))
                continue
            diff = opts.paired(row, correction, metric)
            numbers = {claim.columns[0]: fmt_interval(opts.interval(row, "none", metric), metric, False),
                       claim.columns[1]: fmt_interval(opts.interval(row, correction, metric), metric, False),
                       claim.columns[2]: fmt_interval(est_interval(diff), metric)}
            entry = superiority(row, tags, numbers, diff, side, opts.missing_reason(row, correction, metric), metric,
                                primary=metric == PRIMARY.metric and PRIMARY.matches(tags))
            claim.entries.append(with_paper(entry, opts.paired_clusters(row, correction, metric), metric))
        claims.append(claim.finish())
    return claims


def claim_memory(opts: Options, bits: int, reference_bits: int, correction: str) -> list[Claim]:
    """Claim 3, per fidelity metric: corrected INT``bits`` rows with fewer effective bits than an uncorrected
    INT``reference_bits`` row of the same quantizer, paired per (prompt, seed): non-inferiority."""
    low_rows = _rows_at(opts, bits, correction)
    refs = _rows_at(opts, reference_bits, "none")
    claims = []
    for metric, side in FIDELITY.items():
        name = NAMES[metric]
        margin = NON_INFERIORITY[metric]
        worse = "lower" if side == "above" else "higher"
        claim = Claim(f"3 ({name})", f"{correction}-corrected INT{bits} at fewer bits matches or beats "
                      f"uncorrected INT{reference_bits}",
                      f"{name} of corrected INT{bits} - {name} of uncorrected INT{reference_bits} (same quantizer, "
                      f"fewer effective bits), paired per (prompt, seed) with replicates averaged, then per prompt: "
                      f"non-inferior, i.e. at most {margin.value:g} {worse} (the margin: {margin.reason}); one-sided "
                      "sign-flip test over prompts (paper: 2.19 vs 4.38 bits on MAGI-1, \"50% less memory\")",
                      ["effective bits", f"{name} INT{bits} {correction}", f"{name} INT{reference_bits} none",
                       f"d{name} [95% CI]", MATCHING], fails=FAILS, margin=margin)
        if not low_rows:
            claim.missing.append(f"no {correction}-corrected INT{bits} run in the store")
        for quantizer in dict.fromkeys(opts.first(r, "quantizer") for r in low_rows):
            mine = [r for r in refs if opts.first(r, "quantizer") == quantizer]
            if not mine:
                claim.missing.append(f"{quantizer}: no uncorrected INT{reference_bits} run to compare with"
                                     + _fill_hint(opts, [r for r in low_rows if opts.first(r, "quantizer") == quantizer],
                                                  correction, reference_bits))
                continue
            for ref in mine:
                ref_bits = opts.first(ref, "effective_bits")
                cheaper = [r for r in low_rows if opts.first(r, "quantizer") == quantizer
                           and _less(opts.first(r, "effective_bits"), ref_bits)]
                if not cheaper:
                    claim.missing.append(f"{ref}: no {correction}-corrected INT{bits} {quantizer} run with fewer "
                                         f"effective bits (known: {ref_bits})")
                for row in cheaper:
                    low_bits = opts.first(row, "effective_bits")
                    diff = opts.across(row, correction, ref, "none", metric)
                    numbers = {claim.columns[0]: f"{low_bits:.2f} vs {ref_bits:.2f} ({low_bits / ref_bits - 1:+.0%})",
                               claim.columns[1]: fmt_interval(opts.interval(row, correction, metric), metric, False),
                               claim.columns[2]: fmt_interval(opts.interval(ref, "none", metric), metric, False),
                               claim.columns[3]: fmt_interval(est_interval(diff), metric),
                               claim.columns[4]: fmt_interval(mean_interval(
                                   opts.across_clusters(row, correction, ref, "none", metric),
                                   level=ONE_SIDED_LEVEL), metric)}
                    reason = opts.missing_reason(row, correction, metric) if not len(
                        opts.values(row, correction, metric)) else opts.missing_reason(ref, "none", metric)
                    claim.entries.append(margin_entry(
                        f"{row} + {correction} vs {ref}", _tags(opts, row), numbers, diff,
                        opts.across_clusters(row, correction, ref, "none", metric), margin.value,
                        "non-inferiority", side, reason, metric))
        claims.append(claim.finish())
    return claims


def _fill_hint(opts: Options, rows: list[str], correction: str, bits: int) -> str:
    """": run `python -m jensenkv.run -m ...`": the command that runs the missing uncorrected twins of ``rows``
    (checked by composing it, ``report.hints``), or what to run when no preset composes to them."""
    for row in rows:
        command = fill_command(opts.results_dir, str(opts.members(row, correction)["run_id"].iloc[0]), bits)
        if command is not None:
            return f": run `{command}`"
    return f" (no quant preset composes to it: run this quantizer at quant.bits={bits} with these runs' prompts and seeds)"


def _less(a, b) -> bool:
    return a is not None and b is not None and float(a) < float(b)


def primary_entry(claims: list[Claim]) -> Entry | None:
    """The primary endpoint's entry (claim 2 on PRIMARY.metric, the row of the paper's setting)."""
    return next((e for c in claims for e in c.entries if e.primary), None)


def options_table(opts: Options) -> pd.DataFrame:
    """Every row x variant of the store: dP_S and PSNR with intervals, each variant paired against none."""
    out = []
    for row in opts.rows:
        if row == "bf16":
            continue
        for variant in opts.variants(row):
            dps = opts.interval(row, variant, "delta_p_s")
            psnr = opts.interval(row, variant, "psnr")
            base = variant == "none" or "none" not in opts.variants(row)
            shown = dps if dps.n >= psnr.n else psnr
            out.append({
                "option": row, "variant": variant + (f" ({opts.pooled_note(row, variant)})"
                                                     if opts.pooled_note(row, variant) else ""),
                "n prompts / videos": fmt_n(shown.n, shown.num_videos),
                "dP_S [95% CI]": fmt_interval(dps, "delta_p_s"),
                "d mean abs(dP_S) vs none, p": "-" if base else fmt_paired(
                    opts.paired(row, variant, "delta_p_s_abs"), "delta_p_s"),
                "PSNR [95% CI]": fmt_interval(psnr, "psnr", False),
                "dPSNR vs none, p": "-" if base else fmt_paired(opts.paired(row, variant, "psnr"), "psnr"),
            })
    return pd.DataFrame(out)


def power_table(claims: list[Claim]) -> pd.DataFrame:
    """Per claim-2 row: prompts / videos, and per metric the SD of the prompt-mean differences and the smallest
    effect detected at 80% power (two-sided 0.05, t on prompt means), beside the estimate and the paper's."""
    rows: dict[str, dict[str, str]] = {}
    for claim in claims:
        if not claim.key.startswith("2 "):
            continue
        metric = next(m for m, n in NAMES.items() if claim.key == f"2 ({n})")
        for e in claim.entries:
            if e.power is None:
                continue
            row = rows.setdefault(e.option, {"option": e.option,
                                             "n prompts / videos": fmt_n(e.power.n, e.power.num_videos)})
            d = _digits(metric)
            est = e.power
            row[f"{NAMES[metric]}: d / SD / MDE"] = (f"{fmt_signed(est.delta, d, True)} / "
                                                     f"{fmt_signed(est.sd, d, False)} / {mde_text(est, metric)}")
            if e.paper is not None:
                row[f"paper {NAMES[metric]}"] = f"{e.paper[0]} {fmt_signed(e.paper[1], d, True)}"
    return pd.DataFrame(list(rows.values())).fillna("-")


@dataclass
class ModelReport:
    model: str
    opts: Options
    claims: list[Claim]
    diagnostics: Diagnostics
    options: pd.DataFrame

    @property
    def primary(self) -> Entry | None:
        return primary_entry(self.claims)


def build_report(results_dir: str | Path = "results", model: str | None = None, correction: str = "taylor",
                 bits: int = 2, reference_bits: int = 4) -> list[ModelReport]:
    models = load_options(results_dir, model)
    if not models:
        raise FileNotFoundError(f"no finished runs under {Path(results_dir) / 'runs'}: run `python -m jensenkv.run "
                                "-m experiment=table1` first")
    reports = []
    for name, opts in models.items():
        claims = [*claim_shift(opts, bits, correction), *claim_fidelity(opts, bits, correction),
                  *claim_memory(opts, bits, reference_bits, correction)]
        reports.append(ModelReport(name, opts, claims, diagnose(opts, bits), options_table(opts)))
    return reports


def _md_table(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, disable_numparse=True) if not frame.empty else "(none)"


def _metric_of(claim: Claim) -> str:
    name = claim.key.split("(", 1)[-1].rstrip(")") if "(" in claim.key else ""
    return next((m for m, n in NAMES.items() if n == name), "delta_p_s")


def entry_row(claim: Claim, e: Entry) -> dict[str, str]:
    metric = _metric_of(claim)
    row = {"option": e.option + (" (primary)" if e.primary else ""), **{c: e.numbers.get(c, "") for c in claim.columns}}
    if e.test is not None:
        row["p raw"] = e.test.text()
        row["p Holm"] = "primary: alone" if e.primary else fmt_p(e.p_adjusted)
    else:
        row["p raw"] = row["p Holm"] = "-"
    row[f"n {claim.units}"] = fmt_n(e.power.n, e.power.num_videos) if e.power is not None else "-"
    row["MDE 80%"] = mde_text(e.power, metric if metric != "delta_p_s_abs" else "delta_p_s")
    if claim.key.startswith("2 ") and metric in PAPER_COMPARABLE:
        row["vs the paper's effect"] = paper_text(e, metric)
    word = claim.fails if e.verdict == FAILS else e.verdict
    row["verdict"] = word + (f" ({portable(e.reason)})" if e.reason else "") + (f" ({e.note})" if e.note else "")
    return row


def render_claim(claim: Claim) -> str:
    lines = [f"### Claim {claim.key}: {claim.title} — **{claim.summary}**", "", claim.statement + ".", ""]
    reasons = {e.reason for e in claim.entries if e.verdict == MISSING}
    if claim.entries and claim.summary == MISSING and len(reasons) == 1:  # one reason for every option: say it once
        lines.append(f"- missing for every option: {portable(reasons.pop())}")
    elif claim.entries:
        lines += [_md_table(pd.DataFrame([entry_row(claim, e) for e in claim.entries])), ""]
    lines += [f"- missing: {portable(m)}" for m in claim.missing]
    return "\n".join(lines).rstrip() + "\n"


def render_primary(entry: Entry | None, correction: str) -> list[str]:
    head = [f"**Primary endpoint (pre-specified):** {PRIMARY.describe(correction)}; {PRIMARY_REASON}. It is "
            "tested alone at 0.05; every other test below is Holm-adjusted within its claim."]
    if entry is None:
        return head + ["", "- missing: no run of that row with and without the correction in the store"]
    if entry.power is None:
        return head + ["", f"- missing: {portable(entry.reason)}"]
    est, d = entry.power, _digits(PRIMARY.metric)
    words = {HOLDS: "the correction improves it", FAILS: "the correction makes it worse",
             INCONCLUSIVE: "inconclusive against 0", MISSING: "missing"}[entry.verdict]
    text = (f"d{PRIMARY.metric.upper()} = {fmt_interval(est_interval(est), PRIMARY.metric)}, {entry.test.text()} "
            f"(exact sign flip over {est.n} prompts, {est.num_videos} videos): **{words}**")
    if entry.paper is not None:
        name, effect, test = entry.paper
        against = "excludes" if test.p < ALPHA else "does not exclude"
        text += f"; {against} the paper's {fmt_signed(effect, d, True)} dB ({name}, MAGI-1; {test.text()})"
    text += (f". With this SD of the prompt-mean differences ({fmt_signed(est.sd, d, False)}) the current "
             f"{est.n} prompts detect an effect of {mde_text(est, PRIMARY.metric)} with 80% power.")
    return head + ["", text]


POWER_NOTE = ("The smallest effect each row detects with 80% power (MDE): paired, on prompt means, two-sided "
              "alpha 0.05, from the SD of the prompt-mean differences with the noncentral t distribution (the t "
              "test's power; the sign-flip test's is close to it). An inconclusive row whose MDE is above the "
              "effect one cares about says the store is too small, not that the effect is absent.")


def render(reports: list[ModelReport], results_dir: str | Path, correction: str, bits: int = 2) -> str:
    lines = ["# The paper's claims on this store", "",
             (f"Generated by `python -m jensenkv.report.claims --results {shown_path(results_dir)}` "
              "(`make reproduce-table1` regenerates it). Every number: a mean with its Student-t 95% interval over "
              "**prompts** (replicates averaged within (prompt, seed), seeds within the prompt); d = paired "
              "difference per video, averaged the same way, with its exact two-sided sign-flip p over prompts; "
              "n = prompts / videos; P_S's reference is the same call with the run's own cache in full precision."),
             "", "**Verdict rule.** " + RULE, ""]
    for rep in reports:
        lines += [f"## {rep.model}", "", f"Runs over {rep.opts.selection.context_desc}."]
        if rep.opts.selection.left_out:
            lines += ["", f"Left out ({rep.opts.selection.num_left_out} runs of other contexts, never mixed in; "
                      "what differs from the runs above):"]
            lines += [f"- {portable(x)}" for x in rep.opts.selection.left_out]
        lines += [""] + render_primary(rep.primary, correction) + [""]
        lines += ["| claim | verdict |", "|---|---|"]
        lines += [f"| {c.key}: {c.title} | {c.headline} |" for c in rep.claims]
        lines.append("")
        lines += [render_claim(c) for c in rep.claims]
        lines += ["## Power: the smallest effect each row detects", "", POWER_NOTE, "",
                  _md_table(power_table(rep.claims)), ""]
        lines.append(render_diagnostics(rep.diagnostics))
        lines.append(checks_section(rep.opts, results_dir, correction, bits))
        lines += ["## Every option side by side", "",
                  ("Rows: the store's quantizer options; variants: the corrections and attention-time options "
                   "(paired against 'none' of the same option; seeds pooled where noted; raw p-values, not "
                   "adjusted)."), "", _md_table(rep.options), ""]
    llm = Path(results_dir) / LLM_CLAIMS
    if llm.is_file():  # the LLM partial-prefill claims, as `python -m jensenkv.report.llm_prefill` wrote them
        lines += [llm.read_text().rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def claims_gaps(results_dir: str | Path, correction: str, model: str | None = None) -> list[str]:
    """What the store lacks of the experiment claims.md describes: Table 1's rows (``table1.missing_rows``),
    the noise floor and the teacher-forced runs (``report.checks``)."""
    from jensenkv.report.checks import NOISE_FLOOR_FILE, TEACHER_FORCED_DIR
    from jensenkv.report.table1 import missing_rows

    results_dir = Path(results_dir)
    gaps = missing_rows(results_dir, correction=correction, model=model)
    if not (results_dir / NOISE_FLOOR_FILE).is_file():
        gaps.append(f"{NOISE_FLOOR_FILE} (python -m jensenkv.run.noise_floor)")
    if not (results_dir / TEACHER_FORCED_DIR / "runs").is_dir():
        gaps.append(f"the teacher-forced runs under {TEACHER_FORCED_DIR}/ (experiment=teacher_forced)")
    return gaps


def write_claims(results_dir: str | Path = "results", out: str | Path | None = None, model: str | None = None,
                 correction: str = "taylor", bits: int = 2, reference_bits: int = 4,
                 allow_incomplete: bool = False) -> tuple[Path, list[ModelReport], str]:
    """Build the report, then write ``<out>/claims.md`` (out: ``results_dir`` by default) when the store holds
    the experiment it describes (``claims_gaps``), else ``<out>/partial/claims.md`` (``report.publish``).
    Returns (the path written, the reports, the why line or "")."""
    reports = build_report(results_dir, model, correction, bits, reference_bits)
    text = render(reports, results_dir, correction, bits)
    part = Part("claims", {"claims.md": text_file(text)}, claims_gaps(results_dir, correction, model))
    published = publish(Path(out) if out is not None else Path(results_dir), [part], allow_incomplete)
    return published.paths["claims.md"], reports, published.incomplete.get("claims", "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG)
    add_store_args(parser, "claims.md goes to <out>/")
    parser.add_argument("--model", default=None, help="only this model (its label in the records)")
    parser.add_argument("--correction", default="taylor", help="the paper's correction (default: taylor)")
    parser.add_argument("--bits", type=int, default=2, help="the claims' bit width (default: 2)")
    parser.add_argument("--reference-bits", type=int, default=4, help="claim 3's reference (default: 4)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help=f"write the report of an incomplete store to <out>/ too (default: <out>/{PARTIAL}/)")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    recover_store(args)
    try:
        path, reports, why = write_claims(args.results, args.out, args.model, args.correction, args.bits,
                                          args.reference_bits, args.allow_incomplete)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    for rep in reports:
        for claim in rep.claims:
            print(f"{rep.model} claim {claim.key}: {claim.headline}")
    print(f"claims: {path}")
    if why and not args.allow_incomplete:
        stop(f"{why}: written to {path}, the committed claims.md is unchanged; run `make reproduce-table1` (or "
             "pass --allow-incomplete)", PARTIAL_EXIT)
    if why:
        stop(f"{why}: written to {path} (--allow-incomplete)", PARTIAL_EXIT)


if __name__ == "__main__":
    main()
