"""Intervals and paired tests over independent units: coverage, calibration under the null, power from pairing,
edges. (Clustered data, the exact sign flip, power and Holm: tests/test_claims_stats.py.)"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jensenkv.eval.stats import mean_interval, paired_difference


def test_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    trials = 200
    for i in range(trials):
        sample = rng.normal(3.0, 2.0, size=24)
        ci = mean_interval(sample)
        assert ci.low <= ci.mean <= ci.high and ci.n == 24
        hits += ci.low <= 3.0 <= ci.high
    assert 0.88 <= hits / trials <= 0.99  # binomial sd ~ 1.5% around 95%


def test_interval_narrows_with_more_videos():
    rng = np.random.default_rng(1)
    small = mean_interval(rng.normal(size=8))
    large = mean_interval(rng.normal(size=128))
    assert large.high - large.low < 0.5 * (small.high - small.low)


def test_pairing_finds_a_small_consistent_shift_hidden_by_prompt_variance():
    rng = np.random.default_rng(2)
    per_prompt = rng.normal(25.0, 5.0, size=48)        # PSNR varies a lot across prompts
    baseline = per_prompt + rng.normal(0, 0.1, size=48)
    treated = per_prompt + 0.3 + rng.normal(0, 0.1, size=48)  # +0.3 dB on every prompt
    paired = paired_difference(treated, baseline)
    assert paired.p_value < 0.001 and paired.low > 0 and paired.test.method == "monte carlo"  # 48 > 20 units and abs(paired.delta - 0.3) < 0.1
    unpaired_low = mean_interval(treated).low - mean_interval(baseline).high
    assert unpaired_low < 0  # the unpaired intervals overlap: only pairing resolves it


def test_p_values_are_not_small_under_the_null():
    rng = np.random.default_rng(3)
    p = [paired_difference(rng.normal(size=16), rng.normal(size=16)).p_value
         for i in range(100)]
    assert 0.02 <= np.mean(np.array(p) < 0.05) <= 0.12  # about 5% false positives
    assert 0.35 <= np.mean(p) <= 0.65                     # roughly uniform


def test_edges_say_unknown_instead_of_inventing_an_interval():
    one = mean_interval([1.5])
    assert one.mean == 1.5 and math.isnan(one.low) and math.isnan(one.high) and one.n == 1
    empty = mean_interval([math.nan, math.inf])
    assert empty.n == 0 and math.isnan(empty.mean)
    same = mean_interval([2.0, 2.0, 2.0])
    assert (same.low, same.high) == (2.0, 2.0)
    zero = paired_difference([1.0, 2.0], [1.0, 2.0])
    assert zero.delta == 0 and zero.p_value == 1.0
    partial = paired_difference([1.0, math.nan, 3.0], [0.0, 1.0, 2.0])
    assert partial.n == 2 and partial.delta == 1.0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1.0, 2.0], [1.0])
