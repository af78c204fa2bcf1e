"""causal=True (a causal LM's calls): the queries are the last Q of the R current tokens and see the current tokens up
to their own; every cached key stays visible and only cached quantized keys are corrected."""
from __future__ import annotations

import pytest
import torch

from jensenkv.attention import attention_probes, cached_attention, flex_cached_attention, reference_attention
from jensenkv.attention.triton_kernel import triton_cached_attention
from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig


def _inputs(n_q: int, n_cur: int, seed: int = 0, quant: QuantConfig | None = None):
    gen = torch.Generator().manual_seed(seed)
    cache = ChunkedKVCache(CacheConfig(quant or QuantConfig(bits=2), quant or QuantConfig(bits=2),
                                       keep_reference=True), head_dim=32)
    for _ in range(2):
        cache.commit(torch.randn(1, 3, 24, 32, generator=gen) * 2, torch.randn(1, 3, 24, 32, generator=gen))
    q = torch.randn(1, 3, n_q, 32, generator=gen) * 2
    k, v = torch.randn(1, 3, n_cur, 32, generator=gen) * 2, torch.randn(1, 3, n_cur, 32, generator=gen)
    return q, k, v, cache.segments()


def _by_hand(q, k, v, segments, correction):
    """Query i (the (R - Q + i)-th current token) over every cached key and current tokens 0 .. R - Q + i, one
    query at a time: the non-causal oracle on a truncated current chunk."""
    n_q, n_cur = q.shape[2], k.shape[2]
    rows = [reference_attention(q[:, :, i:i + 1], k[:, :, :n_cur - n_q + i + 1], v[:, :, :n_cur - n_q + i + 1],
                                segments, correction) for i in range(n_q)]
    return torch.cat(rows, dim=2)


@pytest.mark.parametrize("n_q,n_cur", [(8, 8), (3, 8), (1, 5)])
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_causal_equals_one_query_at_a_time(n_q, n_cur, correction):
    q, k, v, segments = _inputs(n_q, n_cur)
    expected = _by_hand(q, k, v, segments, correction)
    assert torch.allclose(reference_attention(q, k, v, segments, correction, causal=True), expected, atol=1e-6)
    assert torch.allclose(cached_attention(q, k, v, segments, correction, causal=True), expected, atol=1e-5)


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_causal_second_order_matches_the_oracle(correction):
    q, k, v, segments = _inputs(6, 6, seed=3)
    fast = cached_attention(q, k, v, segments, correction, second_order=True, causal=True)
    oracle = reference_attention(q, k, v, segments, correction, second_order=True, causal=True)
    assert torch.allclose(fast, oracle, atol=1e-5)
    assert not torch.allclose(fast, cached_attention(q, k, v, segments, correction, second_order=True), atol=1e-3)


def test_causal_probes_see_what_the_attention_sees():
    """With a full-precision cache nothing shifts (dP_S = JSD = 0); with INT2 the quantized output equals the causal
    attention's; P_S + P_R = 1 over the visible keys."""
    q, k, v, segments = _inputs(5, 7, quant=QuantConfig(method="none", store_dtype="float32"))
    exact = attention_probes(q, k, v, segments, causal=True)
    assert exact["delta_p_s"] == pytest.approx(0, abs=1e-7) and exact["jsd"] == pytest.approx(0, abs=1e-7)
    q, k, v, segments = _inputs(5, 7)
    probes = attention_probes(q, k, v, segments, "taylor", causal=True)
    reused = attention_probes(q, k, v, segments, "taylor", causal=True,
                              attended=cached_attention(q, k, v, segments, "taylor", causal=True))
    assert probes["out_mse"] == pytest.approx(reused["out_mse"], rel=1e-4, abs=1e-9)
    assert probes["p_s"] + probes["p_r"] == pytest.approx(1.0)
    non_causal = attention_probes(q, k, v, segments, "taylor")
    assert probes["p_s"] > non_causal["p_s"]  # fewer current keys visible: more mass on the cache


@pytest.mark.parametrize("fn,name", [(flex_cached_attention, "flex"), (triton_cached_attention, "triton")])
def test_backends_without_a_causal_mask_refuse_it(fn, name):
    q, k, v, segments = _inputs(4, 4)
    with pytest.raises(ValueError, match=f"backend='{name}'"):
        fn(q, k, v, segments, "none", causal=True)


@pytest.mark.parametrize("bad", [2, "yes", None])
def test_causal_must_be_a_bool_and_queries_the_last_current_tokens(bad):
    q, k, v, segments = _inputs(4, 4)
    with pytest.raises(ValueError, match="causal"):
        reference_attention(q, k, v, segments, causal=bad)
    q, k, v, segments = _inputs(6, 4)
    with pytest.raises(ValueError, match="R >= Q"):
        cached_attention(q, k, v, segments, causal=True)
