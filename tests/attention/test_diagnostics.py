"""Error-model diagnostics recover known error structures exactly or within Monte Carlo tolerance."""
from __future__ import annotations

import pytest
import torch

from jensenkv.attention.diagnostics import error_model_diagnostics
from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig, make_quantizer


def _data(seed=0, b=1, h=2, q=64, k=512, d=64, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, q, d, generator=g, dtype=torch.float64) * q_scale,
            torch.randn(b, h, k, d, generator=g, dtype=torch.float64), g)


def test_uniform_independent_noise_matches_the_papers_model():
    q, k, g = _data(q_scale=0.7)
    step = torch.full((*k.shape[:3], 4), 1.0, dtype=torch.float64)  # 4 groups of 16 channels
    noise = torch.rand(k.shape, generator=g, dtype=torch.float64) - 0.5
    out = error_model_diagnostics(q, k, k + noise, GroupSteps(step))
    assert abs(out["slope"]) < 0.01 and abs(out["corr"]) < 0.02 and abs(out["var_ratio"] - 1) < 0.03
    assert abs(out["mean_err"]) < 0.01 and out["mean_err_abs"] < 0.05  # 512 tokens: SE of a channel's mean 0.013
    assert abs(out["first_order"]) < 0.2 * out["jensen"]  # no first-order shift on average
    assert out["jensen"] == pytest.approx(out["predicted_jensen"], rel=0.15)  # the model predicts the inflation


def test_the_jensen_term_matches_sum_pi_one_minus_pi_b_not_sum_pi_b_when_the_model_is_true():
    """e ~ U(-D/2, D/2) independent of k, on peaky rows (n_eff ~ 1.4 of 8 keys): over 20 x 256 draws of the error
    the measured Jensen term equals sum pi (1 - pi) b within its sampling error, and is a quarter of sum pi b.
    (To second order jensen = sum pi delta^2 / 2 - (sum pi delta)^2 / 2, whose expectation is sum pi b - sum pi^2 b.)"""
    g = torch.Generator().manual_seed(0)
    d, keys, trials, step_size = 32, 8, 256, 0.5
    q = torch.randn(1, 1, 4, d, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(1, 1, keys, d, generator=g, dtype=torch.float64)
    k[..., 0, :] = 1.2 * q[0, 0].mean(0)  # one key most queries attend to
    q, k = q.expand(trials, -1, -1, -1), k.expand(trials, -1, -1, -1)  # (trials, 1, Q, d), (trials, 1, K, d)
    step = GroupSteps(torch.full((trials, 1, keys, 1), step_size, dtype=torch.float64))
    draws = []
    for _ in range(20):
        e = (torch.rand(k.shape, generator=g, dtype=torch.float64) - 0.5) * step_size
        out = error_model_diagnostics(q, k, k + e, step)
        draws.append(out["jensen"])
    measured = torch.tensor(draws)
    se = float(measured.std() / len(draws) ** 0.5)
    assert out["n_eff"] < 2
    assert abs(float(measured.mean()) - out["predicted_jensen"]) < 3 * se
    assert abs(float(measured.mean()) - out["predicted_taylor"]) > 100 * se  # the old comparison: far off
    assert out["predicted_jensen"] < 0.3 * out["predicted_taylor"]


def test_key_proportional_error_gives_slope_minus_the_shrink_and_corr_minus_one():
    q, k, _ = _data()
    step = torch.full((*k.shape[:3], 1), 0.1, dtype=torch.float64)
    out = error_model_diagnostics(q, k, 0.8 * k, GroupSteps(step))  # e = -0.2 k
    assert out["slope"] == pytest.approx(-0.2, rel=1e-9) and out["corr"] == pytest.approx(-1.0, rel=1e-9)


def test_a_grid_that_shrinks_keys_by_20_percent_has_a_bounded_negative_corr_and_slope_minus_0_2():
    """k_hat = D round(0.8 k / D): e = -0.2 k + rounding error. Cov(k, e) / Var(e) (the former theta) is about
    -4.4 here and changes with D; slope stays -0.2, corr is negative and in [-1, 1]."""
    q, k, _ = _data(h=2, k=512)
    size = 0.25
    k_hat = torch.round(0.8 * k / size) * size
    out = error_model_diagnostics(q, k, k_hat, GroupSteps(torch.full((*k.shape[:3], 1), size, dtype=torch.float64)))
    assert out["slope"] == pytest.approx(-0.2, abs=0.005)
    assert -1.0 < out["corr"] < -0.5
    e_c = (k_hat - k) - (k_hat - k).mean(2, keepdim=True)
    k_c = k - k.mean(2, keepdim=True)
    assert float((k_c * e_c).sum() / e_c.square().sum()) < -3  # what theta reported: no fixed scale


def test_a_constant_offset_is_seen_by_the_mean_error_not_by_slope_or_var_ratio():
    """e = U(-D/2, D/2) + 0.3 D on every element: the centred statistics look exactly like the model (slope 0,
    var_ratio 1); mean(e)/D is +0.3 in every channel group."""
    q, k, g = _data(k=1024)
    q = q.abs()  # queries with positive channels: the offset raises every score
    size = 0.5
    step = torch.full((*k.shape[:3], 4), size, dtype=torch.float64)
    e = (torch.rand(k.shape, generator=g, dtype=torch.float64) - 0.5 + 0.3) * size
    out = error_model_diagnostics(q, k, k + e, GroupSteps(step))
    assert abs(out["slope"]) < 0.01 and abs(out["var_ratio"] - 1) < 0.03
    assert out["mean_err"] == pytest.approx(0.3, abs=0.01) and out["mean_err_abs"] == pytest.approx(0.3, abs=0.02)
    offset_score = float((q.sum(-1) * 0.3 * size / q.shape[-1] ** 0.5).mean())  # scale q . (0.3 D, ..., 0.3 D)
    assert out["first_order"] == pytest.approx(offset_score, rel=0.05)


def test_a_constant_key_offset_is_all_first_order():
    q, k, _ = _data()
    step = torch.full((*k.shape[:3], 1), 0.1, dtype=torch.float64)
    shift = torch.linspace(-0.3, 0.3, k.shape[-1], dtype=torch.float64)  # same error on every token
    out = error_model_diagnostics(q, k, k + shift, GroupSteps(step))
    expected = float((q @ shift / k.shape[-1] ** 0.5).mean())
    assert out["first_order"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert out["log_zs_shift"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert abs(out["jensen"]) < 1e-12


def test_n_eff_measures_peakiness():
    q, k, _ = _data(k=256)
    step = torch.full((*k.shape[:3], 1), 0.1, dtype=torch.float64)
    flat = error_model_diagnostics(torch.zeros_like(q), k, k, GroupSteps(step))
    assert flat["n_eff"] == pytest.approx(256) and flat["n_eff_fraction"] == pytest.approx(1.0)
    q_same = torch.full_like(q, 0.5)
    k_peaky = k.clone()
    k_peaky[:, :, 7] = 20.0  # one key aligned with every query: score 80 against O(1) for the rest
    peaky = error_model_diagnostics(q_same, k_peaky, k_peaky, GroupSteps(step))
    assert peaky["n_eff"] < 1.5 and peaky["log_zs_shift"] == 0


def _outlier_group_keys():
    g = torch.Generator().manual_seed(5)
    k = 0.05 * torch.randn(1, 1, 512, 32, generator=g, dtype=torch.float64) + 0.03  # (1, 1, 512, 32)
    k[..., 0] = 3.0 + torch.rand(1, 1, 512, generator=g, dtype=torch.float64)  # outlier channel
    return torch.randn(1, 1, 32, 32, generator=g, dtype=torch.float64), k


def test_the_min_aligned_grid_leaves_a_mean_error_on_small_channels_that_dither_removes():
    """An outlier sets the group's range: the 31 small channels sit below one step and all round to the same
    level, so their error has a mean; subtractive dither on the same grid makes it zero-mean."""
    q, k = _outlier_group_keys()
    found = {}
    for dither in ("none", "subtractive"):
        cfg = QuantConfig(bits=2, group_size=32, zero_point="min_aligned", dither=dither, store_dtype="float32")
        t = make_quantizer(cfg, 32).quantize(k.float())
        found[dither] = error_model_diagnostics(q, k, t.dequantize().double(), t.group_steps())
    assert found["none"]["small_fraction"] == pytest.approx(31 / 32)
    assert found["none"]["mean_err_small"] < -0.05 and found["none"]["mean_err_abs"] > 0.05
    assert abs(found["subtractive"]["mean_err_small"]) < 0.01  # 512 x 31 draws: SE 0.0023
    assert found["none"]["first_order"] > 10 * abs(found["subtractive"]["first_order"])


def test_rtn_integer_zero_on_outlier_groups_has_negative_slope_and_small_variance():
    """The mechanism behind the built-in model's over-correction: an outlier sets a group's range, the
    small channels round to the zero level and lose their value, so e = -k there."""
    q, k = _outlier_group_keys()
    quantizer = make_quantizer(QuantConfig(bits=2, group_size=32, zero_dtype="uint8", store_dtype="float32"), 32)
    t = quantizer.quantize(k.float())
    out = error_model_diagnostics(q, k, t.dequantize().double(), t.group_steps())
    assert out["slope"] < -0.3 and out["corr"] < -0.5 and out["var_ratio"] < 0.5


def test_bad_shapes_are_refused():
    q, k, _ = _data()
    step = GroupSteps(torch.ones(*k.shape[:3], 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="shapes"):
        error_model_diagnostics(q, k, k[:, :, :10], step)


def test_segment_diagnostics_pool_quantized_segments_and_skip_unquantized_ones():
    from types import SimpleNamespace

    from jensenkv.attention.diagnostics import segment_diagnostics

    q, k, g = _data(k=256)
    step = torch.full((*k.shape[:3], 4), 1.0, dtype=torch.float64)
    k_hat = k + torch.rand(k.shape, generator=g, dtype=torch.float64) - 0.5
    half = k.shape[2] // 2
    segs = [SimpleNamespace(k=k_hat[:, :, :half], k_ref=k[:, :, :half], steps=GroupSteps(step[:, :, :half])),
            SimpleNamespace(k=k_hat[:, :, half:], k_ref=k[:, :, half:], steps=GroupSteps(step[:, :, half:])),
            SimpleNamespace(k=k, k_ref=None, steps=None)]  # a full-precision sink: no error to describe
    pooled = segment_diagnostics(q, segs)
    direct = error_model_diagnostics(q, k, k_hat, GroupSteps(step))
    assert pooled == {f"em_{key}": value for key, value in direct.items()}
    assert segment_diagnostics(q, segs[2:]) == {}
    gqa = segment_diagnostics(torch.cat([q, q], dim=1), segs[:2])  # 4 query heads on 2 KV heads
    assert gqa["em_slope"] == pytest.approx(direct["slope"])
