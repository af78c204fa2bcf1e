"""MAGI-1's cache stores KV heads (not query heads); INT2 + correction touches cached scores only."""
from __future__ import annotations

import torch

from jensenkv.cache import ChunkedKVCache
from jensenkv.generation.loop import generate_video
from jensenkv.attention.config import AttentionConfig
from magi_testkit import PROMPT, full_precision, int2, tiny_adapter


def _chunk_tokens(adapter) -> int:
    _, h, w = adapter.latent_frame_shape
    p = adapter.model.config.patch_size
    return adapter.generation.frames_per_chunk * (h // p) * (w // p)


def test_cache_bytes_count_kv_heads():
    adapter = tiny_adapter(cache=int2())
    generate_video(adapter, PROMPT, seed=0)
    cfg = adapter.model.config
    tokens = _chunk_tokens(adapter)
    held = adapter.generation.num_chunks - 1  # the last chunk is never re-run, so never cached
    for cache in adapter.caches():
        assert cache._batch_heads == (1, cfg.num_kv_heads) and cfg.num_kv_heads < cfg.num_heads
        assert cache.bf16_nbytes == 2 * 2 * cfg.num_kv_heads * held * tokens * cfg.head_dim
        same = ChunkedKVCache(int2(), cfg.head_dim)
        wide = ChunkedKVCache(int2(), cfg.head_dim)
        for _ in range(held):
            same.commit(*(torch.randn(1, cfg.num_kv_heads, tokens, cfg.head_dim) for _ in range(2)))
            wide.commit(*(torch.randn(1, cfg.num_heads, tokens, cfg.head_dim) for _ in range(2)))
        assert cache.nbytes == same.nbytes < wide.nbytes


def test_int2_with_correction_changes_only_cached_scores():
    """With no cached chunk visible (kv range 0 everywhere) INT2 + Taylor gives the full-precision video bit
    for bit: in-flight keys are never quantized or corrected. With cached chunks visible, it differs."""
    blind = {"kv_range": [0, 0], "window_size": 1}
    attention = AttentionConfig(correction="taylor")
    fp = generate_video(tiny_adapter(**blind), PROMPT, seed=1).latents
    q = generate_video(tiny_adapter(cache=int2(), attention=attention, **blind), PROMPT, seed=1).latents
    assert torch.equal(fp, q)
    fp = generate_video(tiny_adapter(), PROMPT, seed=1).latents
    q = generate_video(tiny_adapter(cache=int2(), attention=attention), PROMPT, seed=1).latents
    assert not torch.allclose(fp, q, atol=1e-4)


def test_reset_and_configure_start_a_new_video():
    adapter = tiny_adapter()
    first = generate_video(adapter, PROMPT, seed=2).latents
    adapter.configure(cache=int2())
    assert all(c.num_chunks == 0 for c in adapter.caches())
    adapter.configure(cache=full_precision())
    assert torch.equal(generate_video(adapter, PROMPT, seed=2).latents, first)
