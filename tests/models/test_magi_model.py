"""Layout details of the MAGI-1 DiT checked against direct formulas (GQA mapping, text K/V per KV head,
3-D RoPE angles)."""
from __future__ import annotations

import math

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.models.magi.attention import MagiLayerCaches, WindowAttention, WindowChunk
from jensenkv.models.magi.build import build_tiny
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant import QuantConfig


def test_query_head_h_reads_kv_head_h_over_groups():
    """Window attention over [cached chunk, earlier in-flight chunk, itself] equals per-head softmax attention
    in which query head h uses KV head h // (H / H_kv) (not h % H_kv)."""
    torch.manual_seed(0)
    heads, kv_heads, d, t = 4, 2, 8, 3
    fp = QuantConfig(method="none")
    caches = MagiLayerCaches(1, d, heads // kv_heads, CacheConfig(key=fp, value=fp), AttentionConfig())
    cached_k, cached_v = torch.randn(1, kv_heads, t, d), torch.randn(1, kv_heads, t, d)
    caches.caches[0].commit(cached_k, cached_v)
    q = torch.randn(1, heads, 2 * t, d)
    k, v = torch.randn(1, kv_heads, 2 * t, d), torch.randn(1, kv_heads, 2 * t, d)
    window = (WindowChunk(1, 0, None), WindowChunk(2, 0, None))
    out = WindowAttention(caches, window, "cond")(0, q, k, v)  # (1, H, 2T, D)
    for h in range(heads):
        g = h // (heads // kv_heads)
        keys = torch.cat([cached_k[0, g], k[0, g]])  # (T + 2T, D)
        values = torch.cat([cached_v[0, g], v[0, g]])
        scores = q[0, h] @ keys.T / math.sqrt(d)  # (2T, 3T)
        scores[:t, 2 * t:] = float("-inf")  # the first in-flight chunk does not see the second
        expected = torch.softmax(scores, dim=-1) @ values
        assert torch.allclose(out[0, h], expected, atol=1e-5)


def test_text_kv_rows_are_per_kv_head_k_then_v():
    model = build_tiny(seed=0)
    attn = model.videodit_blocks.layers[0].self_attention
    cfg = model.config
    y = torch.randn(5, int(cfg.hidden_size * cfg.xattn_cond_hidden_ratio))
    k, v = attn.text_kv(y)  # (1, H_kv, L, D) each
    w = attn.linear_kv_xattn.weight  # (2 * H_kv * D, xattn_dim)
    d = cfg.head_dim
    for j in range(cfg.num_kv_heads):
        raw_k = y @ w[2 * j * d:(2 * j + 1) * d].T
        assert torch.allclose(k[0, j], attn.k_layernorm_xattn(raw_k), atol=1e-5)
        assert torch.allclose(v[0, j], y @ w[(2 * j + 1) * d:(2 * j + 2) * d].T, atol=1e-5)


def test_rope_angles_are_axis_major_centred_and_offset_by_cached_frames():
    model = build_tiny(seed=0)
    bands = model.rope.bands.detach()  # (n,)
    frames, height, width, cached = 5, 4, 6, 3
    sin, cos = model.rope(frames, height, width, frames - cached)  # the last 2 frames
    s = math.sqrt(height * width / 256)
    for token, (t, h, w) in enumerate([(t, h, w) for t in range(cached, frames) for h in range(height)
                                        for w in range(width)]):
        ph = (h - (height - 1) / 2) / (height - 1) * (height / s - 1)
        pw = (w - (width - 1) / 2) / (width - 1) * (width / s - 1)
        angles = torch.cat([t * bands, ph * bands, pw * bands])  # [t bands, h bands, w bands]
        assert torch.allclose(sin[token], angles.sin(), atol=1e-5)
        assert torch.allclose(cos[token], angles.cos(), atol=1e-5)


def test_cache_holds_normed_roped_keys_of_kv_heads():
    """What the refresh pass commits is the layer's k after k-LayerNorm (w + 1 gain, fp32) and RoPE."""
    from jensenkv.models.magi.model import apply_rope

    model = build_tiny(seed=0)
    cfg = model.config
    layer = model.videodit_blocks.layers[0]
    attn = layer.self_attention
    captured = {}

    def attend(index, q, k, v):
        captured.setdefault(index, (k, v))
        return q * 0

    x = torch.randn(1, cfg.latent_channels, 2, 4, 4)
    hidden = model.x_embedder(x)  # (1, hidden, T, H', W')
    model(x, torch.tensor([0.5]), [torch.randn(3, cfg.caption_channels)], torch.tensor([False]), 4, attend)
    h = hidden.flatten(2)[0].T  # (S, hidden): layer 0 input
    normed = attn.linear_qkv.layer_norm(h)
    raw_k = attn._heads(attn.linear_qkv.k(normed))  # (1, H_kv, S, D)
    gain = attn.k_layernorm.weight + 1
    expected = torch.nn.functional.layer_norm(raw_k, (cfg.head_dim,), gain, attn.k_layernorm.bias, cfg.layernorm_epsilon)
    sin, cos = model.rope(4 + 2, 2, 2, 2)  # start_frame 4: the chunk's 2 frames are frames 4, 5 of the grid
    expected = apply_rope(expected, sin, cos)
    k, v = captured[0]
    assert k.shape == (1, cfg.num_kv_heads, 8, cfg.head_dim)
    assert torch.allclose(k, expected, atol=1e-5)
    assert torch.allclose(v, attn._heads(attn.linear_qkv.v(normed)), atol=1e-6)
    cache = ChunkedKVCache(CacheConfig(key=QuantConfig(method="none"), value=QuantConfig(method="none")), cfg.head_dim)
    cache.commit(k, v)
    assert cache.bf16_nbytes == 2 * 2 * cfg.num_kv_heads * 8 * cfg.head_dim
