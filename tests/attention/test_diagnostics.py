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
    assert abs(out["theta"]) < 0.05 and abs(out["var_ratio"] - 1) < 0.03
    assert abs(out["first_order"]) < 0.2 * out["jensen"]  # no first-order shift on average
    assert out["jensen"] == pytest.approx(out["predicted_taylor"], rel=0.15)  # b predicts the inflation


def test_key_proportional_error_gives_theta_minus_one_over_c():
    q, k, _ = _data()
    step = torch.full((*k.shape[:3], 1), 0.1, dtype=torch.float64)
    out = error_model_diagnostics(q, k, 0.8 * k, GroupSteps(step))  # e = -0.2 k
    assert out["theta"] == pytest.approx(-1 / 0.2, rel=1e-9)


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


def test_rtn_integer_zero_on_outlier_groups_has_negative_theta_and_small_variance():
    """The mechanism behind the built-in model's over-correction: an outlier sets a group's range, the
    small channels round to the zero level and lose their value, so e = -k there."""
    g = torch.Generator().manual_seed(5)
    k = 0.05 * torch.randn(1, 1, 512, 32, generator=g, dtype=torch.float64) + 0.03
    k[..., 0] = 3.0 + torch.rand(1, 1, 512, generator=g, dtype=torch.float64)  # outlier channel
    q = torch.randn(1, 1, 32, 32, generator=g, dtype=torch.float64)
    quantizer = make_quantizer(QuantConfig(bits=2, group_size=32, zero_dtype="uint8", store_dtype="float32"), 32)
    t = quantizer.quantize(k.float())
    out = error_model_diagnostics(q, k, t.dequantize().double(), t.group_steps())
    assert out["theta"] < -0.5 and out["var_ratio"] < 0.5


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
    assert gqa["em_theta"] == pytest.approx(direct["theta"])
