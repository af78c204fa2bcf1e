"""Zero-point conventions, subtractive dither and channel-mean smoothing: bounds, bytes, and the error model.

The correction (jensenkv.correction) assumes a key error e ~ U(-D/2, D/2) independent of the key; these tests
check which grid gives that (dither does, exactly) and that every option keeps |e| <= D/2 with honest bytes.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from jensenkv.correction import jensen_bias
from jensenkv.quant import ChannelMeanTensor, DitherDraw, QuantConfig, RTNTensor, bits_per_element, make_quantizer
from jensenkv.quant.rtn import round_up_to_dtype, rtn_quantize

GRANULARITIES = ["tensor", "token", "token_group", "channel"]
CONVENTIONS = [("integer", "none"), ("min_aligned", "none"), ("fixed_point", "none"), ("min_aligned", "subtractive")]


def keys_like(b=1, h=2, s=40, d=64, seed=0) -> torch.Tensor:
    """(B, H, S, D) with per-channel offsets and an outlier channel, like post-RoPE keys."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, s, d, generator=gen) + 3 * torch.randn(1, h, 1, d, generator=gen)
    x[..., 5] *= 20
    return x


def outlier_groups(s=256, seed=0) -> torch.Tensor:
    """(1, 1, S, 32): one group per token whose range outliers set (min in [-12, -2], max 6); the other 30
    channels sit near +0.3."""
    gen = torch.Generator().manual_seed(seed)
    x = 0.3 + 0.05 * torch.randn(1, 1, s, 32, generator=gen)
    x[..., 0] = -2.0 - 10 * torch.rand(1, 1, s, generator=gen)
    x[..., 1] = 6.0
    return x


def elementwise_steps(t) -> torch.Tensor:
    """(B, H, S, D): the step group_steps() gives every element (the correction's view of the error)."""
    step = t.group_steps().step  # (B, H, S, G)
    return step.repeat_interleave(t.shape[-1] // step.shape[-1], dim=-1)


def assert_within_half_step(t, x):
    err = (t.dequantize() - x).abs()
    assert torch.isfinite(err).all()
    assert (err <= elementwise_steps(t) / 2 * (1 + 1e-5) + 1e-6).all(), float((err / elementwise_steps(t)).max())


@pytest.mark.parametrize("granularity, bits, convention",
                         list(itertools.product(GRANULARITIES, [2, 3, 4], CONVENTIONS)))
def test_every_convention_keeps_the_half_step_bound(granularity, bits, convention):
    zero_point, dither = convention
    cfg = QuantConfig(bits=bits, granularity=granularity, group_size=16, zero_point=zero_point, dither=dither)
    for x in (keys_like(), 50 + keys_like(seed=1), outlier_groups(s=40).repeat(1, 2, 1, 2)):
        t = make_quantizer(cfg, 64).quantize(x)
        assert t.zero_point == zero_point and t.zero.dtype == cfg.torch_zero_dtype
        assert_within_half_step(t, x)


@pytest.mark.parametrize(
    "overrides, zero_bytes, extra",
    [
        ({}, 1, 0),  # integer zero: uint8
        ({"zero_dtype": "int8"}, 1, 0),
        ({"zero_point": "fixed_point"}, 1, 0),  # int8 with 5 fractional bits at INT2
        ({"zero_point": "min_aligned"}, 2, 0),  # the group minimum in scale_dtype (float16)
        ({"zero_point": "min_aligned", "scale_dtype": "float32"}, 4, 0),
        ({"zero_dtype": "bfloat16"}, 2, 0),  # a float zero dtype is the min-aligned grid, stored in that dtype
        ({"dither": "subtractive"}, 2, 16),  # + the draw's seed and counter
    ],
)
def test_bytes_per_group_of_each_convention(overrides, zero_bytes, extra):
    cfg = QuantConfig(**overrides)
    t = make_quantizer(cfg, 128).quantize(torch.randn(1, 2, 64, 128))
    groups = 2 * 64 * 4
    step_bytes = cfg.torch_scale_dtype.itemsize
    assert t.nbytes == 2 * 64 * 128 // 4 + groups * (step_bytes + zero_bytes) + extra
    assert t.nbytes - extra == bits_per_element(cfg, 128, 64) * 2 * 64 * 128 / 8


def test_integer_zero_drops_the_small_channels_mean_and_dither_does_not():
    """The first-order shift behind the over-correction: with a grid level at 0 and a step set by the outliers
    (>= 2.7 at INT2), every channel near +0.3 rounds to exactly 0 and loses its mean. Moving the grid to the
    minimum changes the shift but does not remove it (here it is about +0.35); only dither makes it ~0 with
    the variance D^2/12 the correction assumes."""
    x = outlier_groups(s=1024)
    small = (..., slice(2, None))
    stats = {}
    for zero_point, dither in (("integer", "none"), ("fixed_point", "none"), ("min_aligned", "none"),
                               ("min_aligned", "subtractive")):
        t = make_quantizer(QuantConfig(zero_point=zero_point, dither=dither), 32).quantize(x)
        err = (t.dequantize() - x)[small]
        stats[zero_point, dither] = (float(err.mean()), float(err.var() / (t.step.float() ** 2 / 12).mean()))
        if zero_point == "integer":
            assert (t.dequantize()[small] == 0).all()
    assert stats["integer", "none"][0] == pytest.approx(-0.3, abs=0.01)
    assert stats["integer", "none"][1] < 0.01  # error variance far below D^2/12: b over-estimates the inflation
    assert abs(stats["min_aligned", "subtractive"][0]) < 0.02
    assert stats["min_aligned", "subtractive"][1] == pytest.approx(1.0, abs=0.03)
    for key in (("fixed_point", "none"), ("min_aligned", "none")):
        assert abs(stats[key][0] - stats["integer", "none"][0]) > 0.3  # a different grid, a different shift


def test_fixed_point_zero_puts_code_zero_within_a_64th_step_of_the_minimum():
    x = keys_like()
    t = make_quantizer(QuantConfig(zero_point="fixed_point", group_size=16), 64).quantize(x)
    mn = x.reshape(1, 2, 40, 4, 16).amin(-1)  # (B, H, S, G): every group straddles 0 here, so none widened
    level0 = -t.zero.float() / 32 * t.step.float()  # INT2: F = 5 fractional bits
    assert t.zero.dtype == torch.int8
    assert ((level0 - mn).abs() <= t.step.float() / 64 * (1 + 1e-5) + 1e-6).all()


# --- subtractive dither -------------------------------------------------------------------------------------

def dither_cfg(**overrides) -> QuantConfig:
    return QuantConfig(**{"method": "rtn", "bits": 2, "granularity": "token_group", "group_size": 32,
                          "dither": "subtractive", **overrides})


def test_dither_as_written_picks_the_min_aligned_grid():
    cfg = dither_cfg()
    assert cfg.zero_convention == "min_aligned" and cfg.label == "rtn+dither"
    t = make_quantizer(cfg, 128).quantize(torch.randn(1, 1, 8, 128))
    assert t.zero_point == "min_aligned" and t.zero.dtype == torch.float16


def test_dither_draws_fresh_offsets_per_call_and_reproduces_from_the_seed():
    x = keys_like(d=128)
    q = make_quantizer(dither_cfg(dither_seed=7), 128)
    first, second = q.quantize(x), q.quantize(x)
    assert (first.dither, second.dither) == (DitherDraw(7, 0), DitherDraw(7, 1))
    assert not torch.equal(first.packed, second.packed)  # consecutive chunks differ
    again = make_quantizer(dither_cfg(dither_seed=7), 128)
    assert torch.equal(again.quantize(x).packed, first.packed)  # the config reproduces the run
    assert torch.equal(again.quantize(x).dequantize(), second.dequantize())
    other = make_quantizer(dither_cfg(dither_seed=8), 128).quantize(x)
    assert not torch.equal(other.packed, first.packed)
    q.reset()  # a new video starts the counter over
    assert q.quantize(x).dither == DitherDraw(7, 0)
    # only the seed and counter are stored: no tensor as large as the offsets (one per element)
    stored = [v for v in vars(first).values() if isinstance(v, torch.Tensor)]
    assert all(v.numel() * v.element_size() < x.numel() for v in stored)


def test_dequantize_subtracts_the_offset_it_added():
    """Dequantizing with a different draw's offsets breaks the bound: the stored (seed, counter) matters."""
    x = keys_like(d=128)
    t = make_quantizer(dither_cfg(), 128).quantize(x)
    assert_within_half_step(t, x)
    wrong = RTNTensor(t.packed, t.step, t.zero, t.bits, t.layout, None, "min_aligned", DitherDraw(0, 99))
    assert ((wrong.dequantize() - x).abs() > elementwise_steps(t) / 2 * 1.01).any()


def _draws(cfg: QuantConfig, k: torch.Tensor, calls: int, replicas: int) -> torch.Tensor:
    """(calls * replicas, K, D) errors k_hat - k over independent draws (replicas: copies along B)."""
    q = make_quantizer(cfg, k.shape[-1])
    batch = k.expand(replicas, -1, -1, -1)  # (R, 1, K, D): each replica gets its own offsets
    return torch.cat([(q.quantize(batch).dequantize() - batch)[:, 0] for _ in range(calls)])


def test_dither_error_is_uniform_and_independent_of_the_key():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, 16, 128, generator=gen)
    k[..., 3] += 5  # outlier channel: the case where plain RTN's error is far from uniform
    cfg = dither_cfg()
    step = elementwise_steps(make_quantizer(cfg, 128).quantize(k))[0, 0]  # (K, D): steps do not depend on u
    u = _draws(cfg, k, calls=8, replicas=64) / step  # (N, K, D) error in steps
    assert u.abs().max() <= 0.5 + 1e-5
    assert float(u.mean()) == pytest.approx(0.0, abs=0.002)
    assert float(u.var()) == pytest.approx(1 / 12, rel=0.01)
    # independent of the key: no correlation with k, and the same law at every element
    kk = k[0, 0].expand_as(u)
    corr = float(((kk - kk.mean()) * (u - u.mean())).mean() / (kk.std() * u.std()))
    assert abs(corr) < 0.01
    assert u.mean(0).abs().max() < 4 * math.sqrt(1 / 12 / u.shape[0])  # per-element mean ~ 0 (4 sigma)
    # uniform: Kolmogorov-Smirnov distance to U(-1/2, 1/2) below the 0.1% critical value
    sample = u.reshape(-1)[:: 7].sort().values
    n = sample.numel()
    cdf = sample + 0.5
    ks = torch.maximum(torch.arange(1, n + 1) / n - cdf, cdf - torch.arange(n) / n).max()
    assert float(ks) < 1.95 / math.sqrt(n)


@pytest.mark.parametrize("dither", ["subtractive", "none"])
def test_dither_makes_exp_score_unbiased_after_the_exact_bias(dither):
    """E[exp(s_hat - b_exact)] = exp(s) for every key within 1% (Monte Carlo over draws), which is what the
    correction assumes; the same grid without dither misses it by far more, key by key."""
    gen = torch.Generator().manual_seed(1)
    d, keys = 128, 8
    k = torch.randn(1, 1, keys, d, generator=gen)  # Gaussian groups
    q = 0.6 * torch.randn(d, generator=gen)
    scale = 1 / math.sqrt(d)
    cfg = dither_cfg() if dither == "subtractive" else dither_cfg(dither="none", zero_point="min_aligned")
    step = elementwise_steps(make_quantizer(cfg, d).quantize(k))[0, 0]  # (K, D)
    b = jensen_bias(q[None], step, method="exact", scale=scale)[0]  # (K,)
    assert 0.005 < float(b.mean()) < 0.1  # a real, moderate bias
    err = _draws(cfg, k, calls=32, replicas=512)  # (N, K, D)
    ratio = torch.exp(scale * err @ q - b).mean(0)  # (K,) E[exp(s_hat - s - b)]
    if dither == "subtractive":
        assert (ratio - 1).abs().max() < 0.01, ratio
    else:
        assert (ratio - 1).abs().max() > 0.05, ratio


# --- channel-mean smoothing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_channel_mean_smoothing_round_trip_bytes_and_unchanged_steps(rotation):
    x = keys_like()  # channel offsets: the mean is most of each channel
    cfg = QuantConfig(smoothing="channel_mean", group_size=16, rotation=rotation)
    q = make_quantizer(cfg, 64)
    t = q.quantize(x)
    assert isinstance(t, ChannelMeanTensor) and t.mean.shape == (1, 2, 1, 64) and t.mean.dtype == torch.float16
    assert t.nbytes == t.inner.nbytes + 2 * 64 * 2  # the mean's bytes counted
    assert t.nbytes == bits_per_element(cfg, 64, 40) * x.numel() / 8
    # steps are the inner tensor's: the mean shift does not change what the correction sees
    inner = rtn_quantize((x if q.rotation is None else q.rotation.apply(x)) - t.mean.float(), 2, "token_group", 16,
                         zero_dtype=torch.uint8)
    assert torch.equal(t.group_steps().step, inner.group_steps().step)
    assert t.group_steps().rotation is t.rotation
    basis = t.rotation.apply if t.rotation is not None else (lambda v: v)
    err = (basis(t.dequantize()) - basis(x)).abs()
    assert (err <= elementwise_steps(t) / 2 * (1 + 1e-5) + 1e-5).all()


def test_channel_mean_smoothing_shrinks_steps_on_offset_channels():
    x = keys_like(d=64)
    plain = make_quantizer(QuantConfig(group_size=16), 64).quantize(x)
    smooth = make_quantizer(QuantConfig(group_size=16, smoothing="channel_mean"), 64).quantize(x)
    assert smooth.group_steps().step.mean() < 0.8 * plain.group_steps().step.mean()
    assert (smooth.dequantize() - x).square().mean() < (plain.dequantize() - x).square().mean()


# --- fp8 steps --------------------------------------------------------------------------------------------------

def test_fp8_steps_round_up_and_overflow_is_a_clear_error():
    x = torch.tensor([1e-3, 0.0137, 0.3, 1.0, 300.0, 448.0])
    up = round_up_to_dtype(x, torch.float8_e4m3fn)
    assert up.dtype == torch.float8_e4m3fn and (up.float() >= x).all()
    below = (up.view(torch.int8) - 1).view(torch.float8_e4m3fn).float()  # the next value down
    assert (below < x).all()
    with pytest.raises(ValueError, match="scale_dtype"):
        round_up_to_dtype(torch.tensor([500.0]), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale_dtype"):
        make_quantizer(QuantConfig(scale_dtype="float8_e4m3fn", symmetric=True), 32).quantize(
            torch.full((1, 1, 2, 32), 1000.0).cumsum(-1))
