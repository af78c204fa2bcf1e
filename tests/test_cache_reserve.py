"""A generation holds only what it stores: every family's adapter reserves each cache's final size when a video
starts (``reserve_caches``, the generator's hook), so after a whole video every cache's buffers hold exactly its
stored bytes (``held_nbytes == nbytes``); without the reservation the doubling buffers hold slack."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.loop import generate_video
from jensenkv.models.adapters import build_adapter
from jensenkv.quant import QuantConfig
from jensenkv.run import preset

CASES = {
    "tiny": ("model=tiny", "model.device=cpu", "generation.num_chunks=3", "generation.steps=2"),
    "tiny-sink": ("model=tiny", "model.device=cpu", "generation.num_chunks=3", "generation.steps=2",
                  "cache.sink_chunks=1"),
    "magi1_tiny": ("model=magi1_tiny", "model.device=cpu", "generation.num_chunks=4"),
    "worldplay_tiny-rebuild": ("model=worldplay_tiny", "model.device=cpu", "generation.steps=2",
                               "generation.worldplay.memory=rebuild"),
    "worldplay_tiny-append": ("model=worldplay_tiny", "model.device=cpu", "generation.steps=2",
                              "generation.worldplay.memory=append"),
    "worldplay_tiny-text-cached-sink": ("model=worldplay_tiny", "model.device=cpu", "generation.steps=2",
                                        "generation.num_chunks=3", "generation.worldplay.text_in_correction=true",
                                        "cache.sink_chunks=1"),
}


def generated_caches(overrides: tuple[str, ...], reserve: bool, monkeypatch) -> list[ChunkedKVCache]:
    """Every cache (each CFG branch's) after one whole video of INT2 keys and values."""
    spec = preset(*overrides, "quant.bits=2")
    adapter = build_adapter(spec.model, spec.cache_config(False), spec.attention, spec.generation)
    if not reserve:  # every reservation made a no-op: the adapters' hook and WorldPlay's per-write sizing
        monkeypatch.setattr(ChunkedKVCache, "reserve", lambda self, tokens, sink_tokens=0: None)
    generate_video(adapter, "a red circle moving left", 0)
    branches = ("cond", "uncond") if spec.generation.use_cfg else ("cond",)
    caches = [c for b in branches for c in adapter.caches(b)]
    worldplay = getattr(adapter, "_caches", None)  # WorldPlay: also the text K/V when stored as a cache
    if worldplay is not None:
        caches += [c for b in branches for c in worldplay[b].text_caches]
    return list({id(c): c for c in caches}.values())  # MAGI's passes share one cache


@pytest.mark.parametrize("case", CASES)
def test_after_a_video_every_cache_holds_exactly_what_it_stores(case, monkeypatch):
    caches = generated_caches(CASES[case], True, monkeypatch)
    assert caches and all(c.nbytes > 0 for c in caches)
    assert [c.held_nbytes for c in caches] == [c.nbytes for c in caches]


@pytest.mark.parametrize("case", CASES)
def test_control_without_the_reservation_the_buffers_hold_slack(case, monkeypatch):
    caches = generated_caches(CASES[case], False, monkeypatch)
    assert any(c.held_nbytes > c.nbytes for c in caches)


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


def test_a_windowed_video_holds_its_window_and_one_chunk_more(monkeypatch):
    overrides = CASES["tiny"][:2] + ("generation.num_chunks=4", "generation.steps=2", "cache.sink_chunks=1",
                                     "cache.window_chunks=1")
    for cache in generated_caches(overrides, True, monkeypatch):
        assert cache.chunk_indices == [0, 3]
        last = cache.segments()[-1]
        assert cache.held_nbytes == cache.nbytes + last.stored_k.nbytes + last.stored_v.nbytes
