"""How the claims report writes its numbers: a metric's digits, a mean with its interval, a paired difference
with its p-value, "prompts / videos" and the smallest detectable effect (``NAMES``: the metrics' names in the
report; ``ONE_SIDED_LEVEL``: the interval that matches a one-sided test).
"""
from __future__ import annotations

import math

from jensenkv.eval.stats import ALPHA, Interval, PairedDifference
from jensenkv.report.table1_format import DIGITS, fmt_signed


NAMES = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "delta_p_s": "dP_S",
         "delta_p_s_abs": "mean abs(dP_S)"}  # no "|" in a name: it would split a markdown table cell
SHIFT_DIGITS = 4
ONE_SIDED_LEVEL = 1 - 2 * ALPHA  # a one-sided test at ALPHA (TOST, non-inferiority) matches this interval: 90%
MATCHING = f"[{ONE_SIDED_LEVEL:.0%} CI, the one-sided tests' own]"


def metric_digits(metric: str) -> int:
    return DIGITS.get(metric, SHIFT_DIGITS)


def fmt_interval(iv: Interval, metric: str, signed: bool = True) -> str:
    """"+0.0123 [+0.0050, +0.0200]" (signed: shifts and differences) or "27.07 [25.71, 28.10]"; a number that
    would round to 0 gets the digits that show its sign ("+0.00034")."""
    d = metric_digits(metric)
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


def est_interval(est: PairedDifference) -> Interval:
    return Interval(est.delta, est.low, est.high, est.n, est.videos)


def mde_text(est: PairedDifference | None, metric: str) -> str:
    if est is None or not math.isfinite(est.mde):
        return "-"
    return fmt_signed(est.mde, metric_digits(metric), False)
