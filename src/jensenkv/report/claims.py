"""The paper's three claims checked on a results store: numbers with 95% intervals, a verdict, and why.

    python -m jensenkv.report.claims [--results-dir results] [--model M] [--out <results-dir>/claims.md]
                                     [--correction taylor] [--bits 2] [--reference-bits 4]

Per model in the store (or only ``--model``, matched against the records' model label), from one context
(``jensenkv.report.options``: rows = quantizer options, variants = corrections and other attention-time
options, rotation / dither seeds pooled):

1. INT2 cached keys steal attention mass: (a) uncorrected dP_S > 0; (b) the correction moves it toward 0
   (paired per video: |dP_S| corrected - |dP_S| uncorrected < 0).
2. The correction improves fidelity to the BF16 video at INT2 (PSNR, SSIM, VBench up; LPIPS down), paired
   per video against the uncorrected run.
3. Corrected INT2 at fewer effective bits matches or beats uncorrected INT4 of the same quantizer (paired
   per video: corrected INT2 - uncorrected INT4 on the better side of 0).

Every number is a mean over videos with its bootstrap 95% interval (``jensenkv.eval.stats``); paired
differences also carry the sign-flip p-value. The verdict rule is ``jensenkv.report.verdicts.RULE``. Then the
per-layer error-model diagnostics of the uncorrected INT2 runs (``jensenkv.report.diagnostics``) and every
option of the store side by side. Absent data are listed as missing, with the reason.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import Interval, PairedDifference
from jensenkv.report.diagnostics import Diagnostics, diagnose, render_diagnostics
from jensenkv.report.options import Options, load_options
from jensenkv.report.table1 import DIGITS
from jensenkv.report.verdicts import FAILS, HOLDS, MISSING, RULE, summarize, verdict
from jensenkv.tracking import atomic_write, portable

# Fidelity metrics and the side of 0 that is better (a paired difference there is an improvement).
FIDELITY = {"psnr": "above", "ssim": "above", "lpips": "below", "vbench": "above"}
NAMES = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "delta_p_s": "dP_S"}
SHIFT_DIGITS = 4


def _digits(metric: str) -> int:
    return DIGITS.get(metric, SHIFT_DIGITS)


def fmt_interval(iv: Interval, metric: str, signed: bool = True) -> str:
    """"+0.0123 [+0.0050, +0.0200]" (signed: shifts and differences) or "27.07 [25.71, 28.10]"."""
    d, sign = _digits(metric), "+" if signed else ""
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "missing"
    bounds = f"[{iv.low:{sign}.{d}f}, {iv.high:{sign}.{d}f}]" if math.isfinite(iv.low) and math.isfinite(iv.high) \
        else "[no interval]"
    return f"{iv.mean:{sign}.{d}f} {bounds}"


def fmt_paired(diff: PairedDifference, metric: str) -> str:
    """"+0.58 [+0.10, +1.02], p=0.031"."""
    if diff.n == 0:
        return "missing"
    p = f", p={diff.p_value:.2g}" if math.isfinite(diff.p_value) else ""
    return fmt_interval(Interval(diff.delta, diff.low, diff.high, diff.n), metric) + p


@dataclass
class Entry:
    """One option under one claim: its numbers, its verdict, and why it is missing if it is."""

    option: str
    tags: frozenset
    numbers: dict[str, str]
    verdict: str
    reason: str = ""
    note: str = ""  # e.g. the paired test disagrees with the interval (few videos)


@dataclass
class Claim:
    key: str
    title: str
    statement: str  # the quantity, and on which side of what it must lie
    columns: list[str]
    entries: list[Entry] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # data the claim needs that the store lacks, with why

    @property
    def summary(self) -> str:
        return summarize((e.option, e.tags, e.verdict) for e in self.entries)

    @property
    def caveat(self) -> str:
        """"" or which options' verdicts the paired test does not back (shown beside the summary)."""
        weak = [e.option for e in self.entries if e.note]
        return f"not backed by the paired test (p >= {ALPHA}): {', '.join(weak)}" if weak else ""

    @property
    def headline(self) -> str:
        return self.summary + (f" ({self.caveat})" if self.caveat else "")


ALPHA = 0.05  # the level the 95% intervals correspond to


def _entry(option: str, tags: frozenset, numbers: dict[str, str], low: float, high: float, n: int,
           claimed: str, reason: str, p_value: float = math.nan) -> Entry:
    """An option's entry; when the sign-flip test does not reject 0 where the bootstrap interval excludes it
    (BCa intervals are optimistic on few videos), the verdict stands but says so."""
    v = verdict(low, high, claimed) if n >= 2 else MISSING
    note = ""
    if v in (HOLDS, FAILS) and math.isfinite(p_value) and p_value >= ALPHA:
        note = f"but p={p_value:.2g} >= {ALPHA}: too few videos to be sure"
    return Entry(option, tags, {**numbers, "n": str(n)}, v, reason if v == MISSING else "", note)


def _tags(opts: Options, row: str) -> frozenset:
    return opts.runs.loc[opts.runs["row"] == row, "tags"].iloc[0]


def _rows_at(opts: Options, bits: int, variant: str) -> list[str]:
    """Quantized rows at ``bits`` that have a run of ``variant``."""
    return [r for r in opts.rows if r != "bf16" and opts.first(r, "bits") == bits and variant in opts.variants(r)]


def claim_shift(opts: Options, bits: int, correction: str) -> list[Claim]:
    """Claim 1: (a) uncorrected dP_S > 0; (b) the correction shrinks |dP_S| (paired per video)."""
    a = Claim("1a", f"INT{bits} cached keys steal attention mass",
              "uncorrected dP_S = P_S(quantized cache) - P_S(same call, the run's own cache in full precision), "
              "mean over videos of the per-video mean over probes: "
              "claimed above 0 (paper: median about +0.15 on MAGI-1)", ["dP_S uncorrected [95% CI]", "n"])
    b = Claim("1b", f"the {correction} correction brings dP_S to about 0",
              f"paired per video: abs(dP_S) with {correction} - abs(dP_S) uncorrected: claimed below 0",
              ["dP_S uncorrected", f"dP_S {correction}", "d abs(dP_S) [95% CI], p", "n"])
    rows = _rows_at(opts, bits, "none")
    if not rows:
        a.missing.append(f"no uncorrected INT{bits} run in the store: run `python -m jensenkv.run -m "
                         f"experiment=table1` (with 'attention' in eval.metrics)")
    for row in rows:
        iv = opts.interval(row, "none", "delta_p_s")
        a.entries.append(_entry(row, _tags(opts, row), {a.columns[0]: fmt_interval(iv, "delta_p_s")}, iv.low,
                                iv.high, iv.n, "above", opts.missing_reason(row, "none", "delta_p_s")))
        if correction not in opts.variants(row):
            b.entries.append(Entry(row, _tags(opts, row), {}, MISSING, f"no {correction} run of {row}"))
            continue
        diff = opts.paired(row, correction, "abs_delta_p_s")
        numbers = {b.columns[0]: fmt_interval(iv, "delta_p_s"),
                   b.columns[1]: fmt_interval(opts.interval(row, correction, "delta_p_s"), "delta_p_s"),
                   b.columns[2]: fmt_paired(diff, "delta_p_s")}
        b.entries.append(_entry(row, _tags(opts, row), numbers, diff.low, diff.high, diff.n, "below",
                                opts.missing_reason(row, correction, "delta_p_s"), diff.p_value))
    return [a, b]


def claim_fidelity(opts: Options, bits: int, correction: str) -> list[Claim]:
    """Claim 2, one claim per fidelity metric: corrected - uncorrected, paired per video, on the better side."""
    claims = []
    rows = _rows_at(opts, bits, "none")
    for metric, side in FIDELITY.items():
        name = NAMES[metric]
        claim = Claim(f"2 ({name})", f"the {correction} correction improves {name} at INT{bits}",
                      f"paired per video: {name} with {correction} - {name} uncorrected: claimed "
                      f"{side} 0 ({'higher' if side == 'above' else 'lower'} is better)",
                      [f"{name} uncorrected", f"{name} {correction}", f"d{name} [95% CI], p", "n"])
        if not rows:
            claim.missing.append(f"no uncorrected INT{bits} run in the store")
        for row in rows:
            if correction not in opts.variants(row):
                claim.entries.append(Entry(row, _tags(opts, row), {}, MISSING, f"no {correction} run of {row}"))
                continue
            diff = opts.paired(row, correction, metric)
            numbers = {claim.columns[0]: fmt_interval(opts.interval(row, "none", metric), metric, False),
                       claim.columns[1]: fmt_interval(opts.interval(row, correction, metric), metric, False),
                       claim.columns[2]: fmt_paired(diff, metric)}
            claim.entries.append(_entry(row, _tags(opts, row), numbers, diff.low, diff.high, diff.n, side,
                                        opts.missing_reason(row, correction, metric), diff.p_value))
        claims.append(claim)
    return claims


def claim_memory(opts: Options, bits: int, reference_bits: int, correction: str) -> list[Claim]:
    """Claim 3, per fidelity metric: corrected INT``bits`` rows with fewer effective bits than an uncorrected
    INT``reference_bits`` row of the same quantizer, paired per video against it."""
    low_rows = _rows_at(opts, bits, correction)
    refs = _rows_at(opts, reference_bits, "none")
    claims = []
    for metric, side in FIDELITY.items():
        name = NAMES[metric]
        claim = Claim(f"3 ({name})", f"{correction}-corrected INT{bits} at fewer bits matches or beats "
                      f"uncorrected INT{reference_bits}",
                      f"paired per video: {name} of corrected INT{bits} - {name} of uncorrected INT{reference_bits} "
                      f"(same quantizer, fewer effective bits): claimed {side} 0 (paper: 2.19 vs 4.38 bits on "
                      "MAGI-1, \"50% less memory\")",
                      ["effective bits", f"{name} INT{bits} {correction}", f"{name} INT{reference_bits} none",
                       f"d{name} [95% CI], p", "n"])
        if not low_rows:
            claim.missing.append(f"no {correction}-corrected INT{bits} run in the store")
        for quantizer in dict.fromkeys(opts.first(r, "quantizer") for r in low_rows):
            mine = [r for r in refs if opts.first(r, "quantizer") == quantizer]
            if not mine:
                claim.missing.append(f"{quantizer}: no uncorrected INT{reference_bits} run to compare with (run "
                                     "`python -m jensenkv.run -m experiment=tradeoff`, or this quantizer at "
                                     f"quant.bits={reference_bits})")
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
                               claim.columns[3]: fmt_paired(diff, metric)}
                    reason = opts.missing_reason(row, correction, metric) if not len(
                        opts.values(row, correction, metric)) else opts.missing_reason(ref, "none", metric)
                    claim.entries.append(_entry(f"{row} + {correction} vs {ref}", _tags(opts, row), numbers,
                                                diff.low, diff.high, diff.n, side, reason, diff.p_value))
        claims.append(claim)
    return claims


def _less(a, b) -> bool:
    return a is not None and b is not None and float(a) < float(b)


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
            out.append({
                "option": row, "variant": variant + (f" ({opts.pooled_note(row, variant)})"
                                                     if opts.pooled_note(row, variant) else ""),
                "n": max(dps.n, psnr.n),
                "dP_S [95% CI]": fmt_interval(dps, "delta_p_s"),
                "d abs(dP_S) vs none, p": "-" if base else fmt_paired(opts.paired(row, variant, "abs_delta_p_s"),
                                                                 "delta_p_s"),
                "PSNR [95% CI]": fmt_interval(psnr, "psnr", False),
                "dPSNR vs none, p": "-" if base else fmt_paired(opts.paired(row, variant, "psnr"), "psnr"),
            })
    return pd.DataFrame(out)


@dataclass
class ModelReport:
    model: str
    opts: Options
    claims: list[Claim]
    diagnostics: Diagnostics
    options: pd.DataFrame


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


def render_claim(claim: Claim) -> str:
    lines = [f"### Claim {claim.key}: {claim.title} — **{claim.summary}**", "", claim.statement + ".", ""]
    if claim.caveat:
        lines += [f"Caveat: {claim.caveat}.", ""]
    reasons = {e.reason for e in claim.entries if e.verdict == MISSING}
    if claim.entries and claim.summary == MISSING and len(reasons) == 1:  # one reason for every option: say it once
        lines.append(f"- missing for every option: {portable(reasons.pop())}")
    elif claim.entries:
        table = pd.DataFrame([{"option": e.option, **{c: e.numbers.get(c, "") for c in claim.columns},
                               "verdict": e.verdict + (f" ({portable(e.reason)})" if e.reason else "")
                               + (f" ({e.note})" if e.note else "")}
                              for e in claim.entries])
        lines += [_md_table(table), ""]
    lines += [f"- missing: {portable(m)}" for m in claim.missing]
    return "\n".join(lines).rstrip() + "\n"


def render(reports: list[ModelReport], results_dir: str | Path, correction: str) -> str:
    lines = ["# The paper's claims on this store", "",
             (f"Generated by `python -m jensenkv.report.claims --results-dir {portable(str(results_dir))}` "
              "(`make reproduce-table1` regenerates it). Every number: mean over videos (prompt x seed) with its "
              "bootstrap 95% interval; d = paired difference per video with its two-sided sign-flip p-value; "
              "n = videos (pairs)."), "", "**Verdict rule.** " + RULE, ""]
    for rep in reports:
        lines += [f"## {rep.model}", "", f"Runs over {rep.opts.selection.context_desc}."]
        if rep.opts.selection.left_out:
            lines += ["", f"Left out ({len(rep.opts.selection.left_out)} runs of other contexts, never mixed in):"]
            lines += [f"- {portable(x)}" for x in rep.opts.selection.left_out]
        lines += ["", "| claim | verdict |", "|---|---|"]
        lines += [f"| {c.key}: {c.title} | {c.headline} |" for c in rep.claims]
        lines.append("")
        lines += [render_claim(c) for c in rep.claims]
        lines.append(render_diagnostics(rep.diagnostics))
        lines += ["## Every option side by side", "",
                  ("Rows: the store's quantizer options; variants: the corrections and attention-time options "
                   "(paired against 'none' of the same option; seeds pooled where noted)."), "",
                  _md_table(rep.options), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_claims(results_dir: str | Path = "results", out: str | Path | None = None, model: str | None = None,
                 correction: str = "taylor", bits: int = 2, reference_bits: int = 4) -> tuple[Path, list[ModelReport]]:
    reports = build_report(results_dir, model, correction, bits, reference_bits)
    text = render(reports, results_dir, correction)
    path = Path(out) if out is not None else Path(results_dir) / "claims.md"
    return atomic_write(path, lambda f: f.write(text), mode="w"), reports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default="results", help="results directory with runs/ (default: results)")
    parser.add_argument("--model", default=None, help="only this model (its label in the records)")
    parser.add_argument("--out", default=None, help="the report's path (default: <results-dir>/claims.md)")
    parser.add_argument("--correction", default="taylor", help="the paper's correction (default: taylor)")
    parser.add_argument("--bits", type=int, default=2, help="the claims' bit width (default: 2)")
    parser.add_argument("--reference-bits", type=int, default=4, help="claim 3's reference (default: 4)")
    args = parser.parse_args(argv)
    try:
        path, reports = write_claims(args.results_dir, args.out, args.model, args.correction, args.bits,
                                     args.reference_bits)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    for rep in reports:
        for claim in rep.claims:
            print(f"{rep.model} claim {claim.key}: {claim.headline}")
    print(f"claims: {path}")


if __name__ == "__main__":
    main()
