"""The paper's three claims built per model from a store's options (``report.options``): claim 1 (the
attention-mass shift and its correction), claim 2 (fidelity, paired per video) and claim 3 (corrected INT2 at
fewer bits against uncorrected INT4), with every option side by side; ``build_report`` makes one
``ModelReport`` per model of the store.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import mean_interval
from jensenkv.report.diagnostics import Diagnostics, diagnose
from jensenkv.report.hints import fill_command
from jensenkv.report.endpoints import ABOUT_ZERO, NON_INFERIORITY, NOT_COMPARABLE, PAPER_COMPARABLE, PRIMARY, SOURCE
from jensenkv.report.options import Options, load_options
from jensenkv.report.table1_format import fmt_signed
from jensenkv.report.verdicts import FAILS
from jensenkv.report.claim_numbers import (MATCHING, NAMES, ONE_SIDED_LEVEL, SHIFT_DIGITS, est_interval, fmt_interval,
                                           fmt_n, fmt_paired)
from jensenkv.report.claim_entries import Claim, Entry, margin_entry, missing_entry, superiority, with_paper


# Fidelity metrics and the side of 0 that is better (a paired difference there is an improvement).
FIDELITY = {"psnr": "above", "ssim": "above", "lpips": "below", "vbench": "above"}


def _tags(opts: Options, row: str) -> frozenset:
    return opts.runs.loc[opts.runs["row"] == row, "tags"].iloc[0]


def _rows_at(opts: Options, bits: int, variant: str) -> list[str]:
    """Quantized rows at ``bits`` that have a run of ``variant``."""
    return [r for r in opts.rows if r != "bf16" and opts.first(r, "bits") == bits and variant in opts.variants(r)]


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
            b.entries.append(missing_entry(row, tags, f"no {correction} run of {row}"))
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
                claim.entries.append(missing_entry(row, tags, f"no {correction} run of {row}"))
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
