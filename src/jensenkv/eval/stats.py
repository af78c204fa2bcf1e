"""Intervals, sign-flip tests, power and multiplicity over independent units: what a table cell needs before
anyone acts on it.

The unit is a **cluster**, not a video: videos of one prompt share its content (and a (prompt, seed) shares
its trajectory over rotation or dither replicates), so they are not independent. The caller averages the
videos of each cluster first (``jensenkv.report.rows.cluster_means``: replicates within (prompt, seed), then
seeds within a prompt) and hands these functions one value per cluster; ``videos`` only says how many videos
stand behind them.

- ``mean_interval``: the mean and its Student-t 95% interval over clusters (on 16 clusters the BCa bootstrap
  under-covers: see its docstring).
- ``sign_flip``: the sign-flip (permutation) test of "the cluster values are symmetric about ``null``":
  exact (every one of the 2^n sign vectors) up to EXACT_MAX_CLUSTERS clusters, else MC_DRAWS Monte-Carlo
  draws with the Monte-Carlo standard error. Its smallest attainable p (``floor``) is printed as "p < ...".
- ``shift_test`` / ``paired_difference``: a mean shift (or treated - baseline per cluster) with its interval,
  its sign-flip p against 0, and ``mde``: the smallest shift the current clusters detect at 80% power.
- ``minimum_detectable``: that smallest shift: paired on cluster means, two-sided alpha 0.05, from the
  cluster-level SD with the noncentral t distribution (the t test's power; analytic).
- ``holm``: Holm's step-down adjustment of a family of p-values (controls the family-wise error).
Fewer than 2 clusters give NaN bounds: the interval is unknown, not zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.80
EXACT_MAX_CLUSTERS = 20  # 2^20 sign vectors (8 MB of sums) are enumerated; more clusters: Monte Carlo
MC_DRAWS = 100_000
ALTERNATIVES = ("two-sided", "greater", "less")


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float   # NaN when it cannot be estimated (fewer than 2 finite values)
    high: float
    n: int       # clusters (independent units) behind the interval
    videos: int = -1  # videos behind the clusters (-1: not given, the units are the videos)

    @property
    def num_videos(self) -> int:
        return self.n if self.videos < 0 else self.videos


@dataclass(frozen=True)
class SignFlip:
    """A sign-flip test's p-value and how it was computed."""

    p: float
    method: str     # "exact" (every sign vector) | "monte carlo" | "" (no test: fewer than 2 clusters)
    floor: float    # the smallest p this test can give (exact: 2/2^n two-sided; Monte Carlo: 1/(draws+1))
    se: float = 0.0  # Monte-Carlo standard error of p (0 when exact)

    def text(self, digits: int = 2) -> str:
        """"p=0.031"; at the floor "p=3.1e-05 (exact floor)" or "p<1e-05 (Monte Carlo floor)"; Monte Carlo
        adds its s.e.: "p=0.049 (MC s.e. 0.0007)"."""
        if not math.isfinite(self.p):
            return "p=n/a"
        at_floor = self.p <= self.floor * (1 + 1e-9)
        if self.method == "monte carlo":
            return (f"p<{self.floor:.1g} (Monte Carlo floor)" if at_floor
                    else f"p={self.p:.{digits}g} (MC s.e. {self.se:.1g})")
        return f"p={self.p:.{digits}g}" + (" (exact floor)" if at_floor else "")


@dataclass(frozen=True)
class PairedDifference:
    delta: float  # mean over clusters of the per-cluster mean of treated - baseline (or of the shift)
    low: float
    high: float
    p_value: float  # two-sided sign-flip, H0: cluster differences symmetric about 0
    n: int          # clusters
    videos: int = -1  # videos (pairs) behind the clusters
    test: SignFlip | None = None
    sd: float = math.nan   # SD of the cluster values
    mde: float = math.nan  # smallest |shift| detected at POWER (two-sided ALPHA, t on cluster means)

    @property
    def num_videos(self) -> int:
        return self.n if self.videos < 0 else self.videos


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def mean_interval(values, level: float = LEVEL, videos: int = -1) -> Interval:
    """Mean and Student-t CI over the finite entries of ``values`` (one per cluster; scipy.stats.ttest_1samp).

    Not a bootstrap: over the 16 prompts of a store the BCa bootstrap (scipy.stats.bootstrap) covered 0.895 of
    200 simulated stores at ICC 0.6 (too narrow on few units), the t interval 0.95 (tests/test_claims_stats.py
    holds it to that); the t distribution is also what the power calculation (``minimum_detectable``) assumes."""
    from scipy import stats

    x = _finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, videos)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, int(x.size), videos)
    if np.ptp(x) <= 1e-12 * max(1.0, abs(mean)):  # every cluster equal (to rounding): the interval is the point
        return Interval(mean, mean, mean, int(x.size), videos)
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(confidence_level=level)
    return Interval(mean, float(ci.low), float(ci.high), int(x.size), videos)


def _all_sums(x: np.ndarray) -> np.ndarray:
    """sum_i s_i x_i for every sign vector s in {-1, +1}^n: (2^n,), built one element at a time."""
    sums = np.zeros(1)
    for value in x:
        sums = np.concatenate([sums + value, sums - value])
    return sums


def sign_flip(values, null: float = 0.0, alternative: str = "two-sided", seed: int = 0,
              draws: int = MC_DRAWS, exact_max: int = EXACT_MAX_CLUSTERS) -> SignFlip:
    """Sign-flip test of H0 "values - null are symmetric about 0" with the mean as statistic: exact for
    n <= ``exact_max``, else ``draws`` Monte-Carlo sign vectors (p = (1 + hits) / (1 + draws))."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r} is not allowed: use one of {ALTERNATIVES}")
    d = _finite(values) - float(null)
    n = d.size
    if n < 2:
        return SignFlip(math.nan, "", math.nan)
    observed = d.sum()
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # ties in floating point count as ties
    if n <= exact_max:
        sums, method = _all_sums(d), "exact"
        total = sums.size
    else:
        rng = np.random.default_rng(seed)
        sums = np.empty(draws)
        for start in range(0, draws, 10_000):  # (chunk, n) signs at a time
            stop = min(draws, start + 10_000)
            signs = rng.integers(0, 2, size=(stop - start, n), dtype=np.int8) * 2 - 1
            sums[start:stop] = signs @ d
        method, total = "monte carlo", draws
    if alternative == "two-sided":
        hits = int(np.count_nonzero(np.abs(sums) >= abs(observed) - tol))
    elif alternative == "greater":
        hits = int(np.count_nonzero(sums >= observed - tol))
    else:
        hits = int(np.count_nonzero(sums <= observed + tol))
    if method == "exact":
        p = hits / total
        floor = (2.0 if alternative == "two-sided" else 1.0) / total
        return SignFlip(min(1.0, p), method, floor)
    p = (1 + hits) / (1 + total)
    return SignFlip(min(1.0, p), method, 1.0 / (1 + total), math.sqrt(p * (1 - p) / total))


def minimum_detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest |mean shift| a two-sided one-sample t test on ``n`` cluster values with SD ``sd`` detects
    with probability ``power`` at level ``alpha`` (noncentral t; NaN below 2 clusters or without an SD)."""
    from scipy import optimize, stats

    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(effect: float) -> float:
        nc = effect / sd * math.sqrt(n)
        wrong_side = float(np.nan_to_num(stats.nct.cdf(-crit, df, nc)))  # NaN far out in the tail: 0
        return float(stats.nct.sf(crit, df, nc)) + wrong_side - power

    upper = sd * (crit + stats.norm.ppf(power)) / math.sqrt(n)  # the normal approximation: a little short
    while not shortfall(upper) > 0:
        upper *= 1.5
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-10 * sd))


def shift_test(values, level: float = LEVEL, seed: int = 0, videos: int = -1) -> PairedDifference:
    """A mean over clusters against 0: interval, exact (or Monte-Carlo) sign-flip p, SD and power."""
    d = _finite(values)
    if d.size == 0:
        return PairedDifference(math.nan, math.nan, math.nan, math.nan, 0, videos)
    ci = mean_interval(d, level, videos)
    if d.size < 2:
        test = SignFlip(math.nan, "", math.nan)
    elif np.all(d == 0):
        test = SignFlip(1.0, "exact" if d.size <= EXACT_MAX_CLUSTERS else "monte carlo", 0.0)
    else:
        test = sign_flip(d, seed=seed)
    sd = float(d.std(ddof=1)) if d.size > 1 else math.nan
    return PairedDifference(ci.mean, ci.low, ci.high, test.p, int(d.size), videos, test, sd,
                            minimum_detectable(sd, int(d.size)))


def paired_difference(treated, baseline, level: float = LEVEL, seed: int = 0, videos: int = -1) -> PairedDifference:
    """treated[i] - baseline[i] over the clusters where both are finite: mean, CI, p-value, power."""
    t, b = np.asarray(treated, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if t.shape != b.shape:
        raise ValueError(f"paired values need equal lengths, got {t.size} treated and {b.size} baseline")
    keep = np.isfinite(t) & np.isfinite(b)
    return shift_test(t[keep] - b[keep], level, seed, videos)


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()
