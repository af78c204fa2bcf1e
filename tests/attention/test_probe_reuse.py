"""Probes that reuse the attention call's output and the cache's stored form equal the full recomputation.

The oracle restates the probes' previous computation in float64: each chunk dequantized on its own
(``seg.k`` / ``seg.v``), the quantized and reference attentions as two separate softmaxes, the quantized output
recomputed as p @ V. The probes under test read the chunks' stored form in one pass, run both sides as one
batched op, compute the current chunk's scores once and take the quantized output from the attention call.
"""
from __future__ import annotations

import math

import pytest
import torch

from jensenkv.attention import PROBE_KEYS, attention_probes, jensen_shannon
from jensenkv.attention.config import AttentionConfig
from jensenkv.attention.cpu import cached_attention
from jensenkv.attention.videos import probe_videos
from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.correction import group_bias
from jensenkv.quant import QuantConfig

HEADS, TOKENS, DIM = 2, 16, 64


def _cache_case(batch: int = 1, chunks: int = 3, seed: int = 5):
    """A real INT2 cache (token groups of 32, full-precision copy kept) with ``chunks`` commits, and a query chunk."""
    gen = torch.Generator().manual_seed(seed)
    int2 = QuantConfig(method="rtn", bits=2, granularity="token_group", group_size=32)
    cache = ChunkedKVCache(CacheConfig(key=int2, value=int2, keep_reference=True), DIM)
    for _ in range(chunks):
        cache.commit(*(torch.randn(batch, HEADS, TOKENS, DIM, generator=gen) for _ in range(2)))  # (B, H, S, D)
    q, k_cur, v_cur = (torch.randn(batch, HEADS, TOKENS, DIM, generator=gen) for _ in range(3))  # (B, H, T, D)
    return q, k_cur, v_cur, cache.segments()


def _old_probes(q, k_cur, v_cur, segments, correction: str) -> dict[str, float]:
    """The probes' previous computation, in float64: per-chunk dequantization, two softmaxes, p @ V recomputed."""
    scale = 1 / math.sqrt(q.shape[-1])
    q = q.double()
    keys = torch.cat([s.k for s in segments] + [k_cur], 2).double()  # (B, H, K_total, D)
    values = torch.cat([s.v for s in segments] + [v_cur], 2).double()
    keys_ref = torch.cat([s.k_ref for s in segments] + [k_cur], 2).double()
    values_ref = torch.cat([s.v_ref for s in segments] + [v_cur], 2).double()
    scores = scale * q @ keys.transpose(-1, -2)  # (B, H, Q, K_total)
    start, bias_sum, bias_count = 0, 0.0, 0
    for seg in segments:
        width = seg.k.shape[-2]
        if correction != "none" and seg.steps is not None:
            bias = group_bias(q, seg.steps, correction, scale).double()  # (B, H, Q, K_i)
            scores[..., start : start + width] -= bias
            bias_sum, bias_count = bias_sum + bias.sum().item(), bias_count + bias.numel()
        start += width
    p = torch.softmax(scores, -1)
    r = torch.softmax(scale * q @ keys_ref.transpose(-1, -2), -1)
    out, out_ref = p @ values, r @ values_ref  # (B, H, Q, Dv)
    n_cached = start
    head_p_s, head_p_s_ref = p[..., :n_cached].sum(-1).mean((0, 2)), r[..., :n_cached].sum(-1).mean((0, 2))  # (H,)
    return {
        "p_s": head_p_s.mean().item(), "p_r": 1 - head_p_s.mean().item(), "p_s_ref": head_p_s_ref.mean().item(),
        "delta_p_s": (head_p_s - head_p_s_ref).mean().item(), "jsd": jensen_shannon(p, r).mean().item(),
        "out_mse": (out - out_ref).square().mean().item(),
        "out_rel_err": ((out - out_ref).norm() / out_ref.norm()).item(),
        "bias_mean": bias_sum / bias_count if bias_count else 0.0,
        "p_s_head_median": head_p_s.median().item(),
        "delta_p_s_head_median": (head_p_s - head_p_s_ref).median().item(),
    }


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_reused_attention_output_equals_the_old_computation(correction: str) -> None:
    q, k_cur, v_cur, segments = _cache_case()
    attended = cached_attention(q, k_cur, v_cur, segments, correction)  # (B, H, T, D): the call probes follow
    reused = attention_probes(q, k_cur, v_cur, segments, correction, attended=attended)
    old = _old_probes(q, k_cur, v_cur, segments, correction)
    assert old["out_mse"] > 1e-3 and old["jsd"] > 1e-4  # INT2: the comparison is not between equal things
    for key in PROBE_KEYS:
        assert reused[key] == pytest.approx(old[key], abs=1e-6), key


def test_a_wrong_attention_output_moves_the_output_error() -> None:
    """Control: the reused output is really read (noise of s.d. 0.1 on it moves out_mse by ~0.01, not 1e-6)."""
    q, k_cur, v_cur, segments = _cache_case()
    attended = cached_attention(q, k_cur, v_cur, segments, "taylor")
    noise = 0.1 * torch.randn(attended.shape, generator=torch.Generator().manual_seed(0))  # (B, H, T, D)
    wrong = attention_probes(q, k_cur, v_cur, segments, "taylor", attended=attended + noise)
    assert abs(wrong["out_mse"] - _old_probes(q, k_cur, v_cur, segments, "taylor")["out_mse"]) > 1e-3


def test_second_order_reuse_equals_recomputation() -> None:
    q, k_cur, v_cur, segments = _cache_case(seed=8)
    attended = cached_attention(q, k_cur, v_cur, segments, "taylor", second_order=True)
    reused = attention_probes(q, k_cur, v_cur, segments, "taylor", second_order=True, attended=attended)
    recomputed = attention_probes(q, k_cur, v_cur, segments, "taylor", second_order=True)
    for key in PROBE_KEYS:
        assert reused[key] == pytest.approx(recomputed[key], abs=1e-6), key


def test_probe_videos_reuse_each_videos_output() -> None:
    """A batch of 2: each video's probes take its own rows of the batched attention output."""
    q, k_cur, v_cur, segments = _cache_case(batch=2, seed=9)
    settings = AttentionConfig(correction="taylor", probes=True)
    attended = cached_attention(q, k_cur, v_cur, segments, "taylor")  # (2, H, T, D)
    reused = probe_videos(q, k_cur, v_cur, segments, settings, 1.0, attended)
    recomputed = probe_videos(q, k_cur, v_cur, segments, settings, 1.0)
    assert [r["sample"] for r in reused] == [0, 1]
    for got, expected in zip(reused, recomputed):
        for key in PROBE_KEYS:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), key
    assert reused[0]["out_mse"] != pytest.approx(reused[1]["out_mse"], abs=1e-6)  # two videos, two answers


def test_attended_of_another_shape_is_rejected() -> None:
    q, k_cur, v_cur, segments = _cache_case()
    with pytest.raises(ValueError, match=r"attended with shape \(1, 2, 8, 64\) is not allowed"):
        attention_probes(q, k_cur, v_cur, segments, "taylor", attended=q[:, :, :8])
