"""A generation holds only what it stores: every family's adapter reserves each cache's final size when a video
starts (``reserve_caches``, the generator's hook), so after a whole video every cache's buffers hold exactly its
stored bytes (``held_nbytes == nbytes``); without the reservation the doubling buffers hold slack. The family kit
(tests/models/test_family_kit.py) checks both for every family; here the cache's own sinks and windows."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig

D = 16


def chunk(seed: int, tokens: int = 8) -> torch.Tensor:
    return torch.randn(1, 2, tokens, D, generator=torch.Generator().manual_seed(seed))  # (B, H, S, D)


def test_a_window_holds_one_chunk_beyond_it_and_sinks_are_reserved_too():
    int2 = QuantConfig(method="rtn", bits=2, group_size=8)
    cache = ChunkedKVCache(CacheConfig(key=int2, value=int2, sink_chunks=1, window_chunks=2), head_dim=D)
    cache.reserve_chunks(6, 8)
    for i in range(6):
        cache.commit(chunk(i), chunk(100 + i))
        if i == 0:
            assert cache.held_nbytes == cache.nbytes  # the sink's own buffer, exactly its size
    assert cache.chunk_indices == [0, 4, 5]
    one_chunk = cache.segments()[1].stored_k.nbytes + cache.segments()[1].stored_v.nbytes
    # the window's buffers hold window + 1 chunks: a commit appends before the oldest leaves
    assert cache.held_nbytes == cache.nbytes + one_chunk
    unreserved = ChunkedKVCache(CacheConfig(key=int2, value=int2, sink_chunks=1, window_chunks=2), head_dim=D)
    for i in range(6):
        unreserved.commit(chunk(i), chunk(100 + i))
    assert unreserved.nbytes == cache.nbytes and unreserved.held_nbytes > cache.held_nbytes  # control
    with pytest.raises(ValueError, match=r"num_chunks=-1 is not allowed"):
        cache.reserve_chunks(-1, 8)
    with pytest.raises(ValueError, match=r"sink_tokens=-2 is not allowed"):
        cache.reserve(0, -2)


def test_a_windowed_video_holds_its_window_and_one_chunk_more():
    from jensenkv.generation.loop import generate_video
    from jensenkv.models.adapters import build_adapter
    from jensenkv.run import preset

    spec = preset("model=tiny", "model.device=cpu", "generation.num_chunks=4", "generation.steps=2",
                  "cache.sink_chunks=1", "cache.window_chunks=1", "quant.bits=2")
    adapter = build_adapter(spec.model, spec.cache_config(False), spec.attention, spec.generation)
    generate_video(adapter, "a red circle moving left", 0)
    caches = {id(c): c for b in ("cond", "uncond") for c in adapter.caches(b)}.values()
    assert spec.generation.use_cfg and caches
    for cache in caches:
        assert cache.chunk_indices == [0, 3]
        last = cache.segments()[-1]
        assert cache.held_nbytes == cache.nbytes + last.stored_k.nbytes + last.stored_v.nbytes
