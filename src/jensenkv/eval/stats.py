"""Intervals and paired tests over videos: what a table cell needs before anyone acts on it.

A metric of a run is the mean over its videos (prompts x seeds); its 95% interval is a bootstrap over those
videos (scipy.stats.bootstrap, BCa). A corrected row is compared with its uncorrected twin video by video
(same prompt, same seed): the paired difference gets a bootstrap interval and a two-sided sign-flip
permutation p-value (scipy.stats.permutation_test, paired "samples" type), which assumes nothing about the
distribution of the differences. Fewer than 2 videos give NaN bounds: the interval is unknown, not zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 4999


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float   # NaN when it cannot be estimated (fewer than 2 finite values)
    high: float
    n: int


@dataclass(frozen=True)
class PairedDifference:
    delta: float  # mean of treated - baseline over the pairs
    low: float
    high: float
    p_value: float  # two-sided, H0: the pair labels are exchangeable (differences symmetric about 0)
    n: int


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def mean_interval(values, level: float = LEVEL, seed: int = 0, resamples: int = RESAMPLES) -> Interval:
    """Mean and bootstrap CI over the finite entries of ``values`` (one per video)."""
    from scipy import stats

    x = _finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, int(x.size))
    if np.ptp(x) == 0:  # every video equal: the bootstrap distribution is a point
        return Interval(mean, mean, mean, int(x.size))
    res = stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=resamples, method="BCa",
                          random_state=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa degenerates on tiny samples: percentile instead
        res = stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=resamples, method="percentile",
                              random_state=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Interval(mean, low, high, int(x.size))


def paired_difference(treated, baseline, level: float = LEVEL, seed: int = 0,
                      resamples: int = RESAMPLES) -> PairedDifference:
    """treated[i] - baseline[i] over pairs where both are finite (same prompt and seed): mean, CI, p-value."""
    from scipy import stats

    t, b = np.asarray(treated, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if t.shape != b.shape:
        raise ValueError(f"paired values need equal lengths, got {t.size} treated and {b.size} baseline")
    keep = np.isfinite(t) & np.isfinite(b)
    d = t[keep] - b[keep]
    if d.size == 0:
        return PairedDifference(math.nan, math.nan, math.nan, math.nan, 0)
    ci = mean_interval(d, level, seed, resamples)
    if d.size < 2 or np.all(d == 0):
        p = math.nan if d.size < 2 else 1.0
    else:
        res = stats.permutation_test((d,), np.mean, permutation_type="samples", alternative="two-sided",
                                     n_resamples=resamples, random_state=np.random.default_rng(seed))
        p = float(res.pvalue)
    return PairedDifference(ci.mean, ci.low, ci.high, p, int(d.size))
