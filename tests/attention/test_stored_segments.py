"""The fast paths on real cache views (dequantized from the stored form at each call) against the oracle."""
from __future__ import annotations

import pytest
import torch

from attention_testkit import relative_error
from jensenkv.attention import cached_attention, flex_cached_attention, reference_attention
from jensenkv.attention.workspace import release_workspace, workspace_nbytes
from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig

D = 64
CACHES = {
    "int2-g32": dict(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(bits=2, group_size=32)),
    "int4-g16-sink": dict(key=QuantConfig(bits=4, group_size=16), value=QuantConfig(bits=4, group_size=16),
                          sink_chunks=1),
    "int8-token-symmetric": dict(key=QuantConfig(bits=8, granularity="token", symmetric=True),
                                 value=QuantConfig(method="none")),
    "kivi-int2": dict(key=QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
                      value=QuantConfig(bits=2, group_size=32, zero_dtype="float16")),
    "quarot-int2-window": dict(key=QuantConfig(bits=2, group_size=32, rotation="hadamard"),
                               value=QuantConfig(bits=2, group_size=32, rotation="hadamard"), window_chunks=2),
    "int2-fixed-point-zero": dict(key=QuantConfig(bits=2, group_size=32, zero_point="fixed_point", zero_dtype="int8"),
                                  value=QuantConfig(bits=2, group_size=32, zero_point="fixed_point", zero_dtype="int8")),
    "int2-dither": dict(key=QuantConfig(bits=2, group_size=32, dither="subtractive"),
                        value=QuantConfig(bits=2, group_size=32, dither="subtractive", dither_seed=1)),
    "int2-bf16-values": dict(key=QuantConfig(bits=2, group_size=16),
                             value=QuantConfig(method="none", store_dtype="bfloat16"), sink_chunks=2),
}


def filled(name: str) -> ChunkedKVCache:
    cache = ChunkedKVCache(CacheConfig(**CACHES[name]), head_dim=D)
    gen = torch.Generator().manual_seed(0)
    for n in (12, 9, 16, 5):
        cache.commit(torch.randn(2, 2, n, D, generator=gen) + 1.0, torch.randn(2, 2, n, D, generator=gen))
    return cache


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
@pytest.mark.parametrize("name", list(CACHES))
def test_fast_paths_on_cache_views_match_oracle(name: str, correction: str) -> None:
    cache = filled(name)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 7, D, generator=gen) * 3 for _ in range(3))  # (B, H, Q, D)
    expected = reference_attention(q, k, v, cache.segments(), correction)
    assert relative_error(cached_attention(q, k, v, cache.segments(), correction), expected) <= 1e-5
    actual = flex_cached_attention(q, k, v, cache.segments(), correction, compile_kernel=False)
    assert relative_error(actual, expected) <= 1e-5


def test_workspace_is_one_buffer_sized_to_the_largest_window() -> None:
    release_workspace()
    small, large = filled("int2-g32"), filled("int2-g32")
    large.commit(torch.randn(2, 2, 40, D), torch.randn(2, 2, 40, D))
    q = torch.randn(2, 2, 7, D)
    for cache in (small, large, small):
        cached_attention(q, q, q, cache.segments(), "taylor")
    tokens = large.num_tokens + 7
    expected = 4 * 2 * 2 * (2 * tokens + 7) * (D + 2)  # float32 [k, 2 columns], [v, pad], [q, columns]
    assert workspace_nbytes() == expected
    release_workspace()
    assert workspace_nbytes() == 0
