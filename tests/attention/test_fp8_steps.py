"""quant.scale_dtype=float8_e4m3fn (steps stored in fp8, rounded up) on every backend: each matches the float64
oracle on the same stored chunks, token-group and per-channel (KIVI) keys, every correction."""
from __future__ import annotations

import pytest
import torch

from attention_testkit import relative_error
from jensenkv.attention import ATTENTION_BACKENDS, reference_attention
from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig

D = 32
FP8 = "float8_e4m3fn"
KEYS = {
    "token-group": QuantConfig(bits=2, group_size=8, scale_dtype=FP8),
    "kivi-channel": QuantConfig(bits=2, granularity="channel", group_size=5, scale_dtype=FP8),
}


@pytest.mark.parametrize("correction", ["taylor", "exact"])
@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("backend", ["cached", "flex", "triton"])
def test_fp8_steps_on_every_backend(backend: str, keys: str, correction: str, monkeypatch) -> None:
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    value = QuantConfig(bits=2, group_size=8, scale_dtype=FP8)
    cache = ChunkedKVCache(CacheConfig(key=KEYS[keys], value=value, sink_chunks=1), head_dim=D)
    gen = torch.Generator().manual_seed(0)
    for n in (16, 20, 13):
        cache.commit(torch.randn(1, 2, n, D, generator=gen), torch.randn(1, 2, n, D, generator=gen))
    segments = cache.segments()
    assert segments[1].stored_k.step.dtype == torch.float8_e4m3fn
    q = torch.randn(1, 2, 6, D, generator=gen) * 3  # (B, H, Q, D)
    k, v = (torch.randn(1, 2, 5, D, generator=gen) for _ in range(2))
    expected = reference_attention(q, k, v, segments, correction)
    assert relative_error(ATTENTION_BACKENDS[backend](q, k, v, segments, correction), expected) <= 1e-5
    assert relative_error(reference_attention(q, k, v, segments, "none"), expected) > 1e-3  # the bias matters
