"""The fused Triton kernel against the oracle, on the CPU through TRITON_INTERPRET=1 (on the GPU when present).

Segments come from real caches (packed codes, steps, zero points), with ragged chunk and query
lengths that do not fill the 16-wide tiles.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from attention_testkit import relative_error
from jensenkv.attention import reference_attention
from jensenkv.attention.triton_kernel import triton_cached_attention
from jensenkv.cache import CacheConfig, CacheSegment, ChunkedKVCache
from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig

D = 32
INT2 = QuantConfig(bits=2, group_size=8)  # token groups: G = 4 (unrolled bias)
CONFIGS = {
    "int2-g8": (INT2, INT2),
    "int4-g16": (QuantConfig(bits=4, group_size=16), QuantConfig(bits=4, group_size=16)),
    "int2-rotated": (QuantConfig(bits=2, group_size=8, rotation="hadamard"),) * 2,
    "kivi-int2": (QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
                  QuantConfig(bits=2, group_size=8, zero_dtype="float16")),  # G = D: bias as a tl.dot
    "int4-token-symmetric": (QuantConfig(bits=4, granularity="token", symmetric=True),) * 2,
    "int8-g2": (QuantConfig(bits=8, group_size=2),) * 2,  # G = 16: bias as a tl.dot
    "int2-fixed-point-zero": (QuantConfig(bits=2, group_size=8, zero_point="fixed_point", zero_dtype="int8"),) * 2,
    "int2-min-aligned-zero": (QuantConfig(bits=2, group_size=8, zero_point="min_aligned", zero_dtype="float16"),) * 2,
}


@pytest.fixture(autouse=True)
def triton_device(monkeypatch) -> str:
    """Interpret the kernel on the CPU unless a CUDA device is present."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return "cuda"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return "cpu"


def build(config: str, heads_kv: int = 2, sinks: int = 0, lengths=(20, 13, 7), seed: int = 0,
          key_scale: float = 1.0, device: str = "cpu") -> list:
    key, value = CONFIGS[config]
    cache = ChunkedKVCache(CacheConfig(key=key, value=value, sink_chunks=sinks), head_dim=D)
    gen = torch.Generator().manual_seed(seed)
    for n in lengths:
        k = torch.randn(1, heads_kv, n, D, generator=gen) * key_scale + 0.5  # (B, Hkv, S, D), offset groups
        cache.commit(k.to(device), torch.randn(1, heads_kv, n, D, generator=gen).to(device))
    return cache.segments()


# query scale per config: larger for finer steps, so that the bias is visible (INT8's is not, at any sane scale)
Q_SCALE = {"int4-g16": 6.0, "int4-token-symmetric": 6.0}


def inputs(heads_q: int, heads_kv: int, n_q: int = 10, n_cur: int = 10, seed: int = 1, device: str = "cpu",
           q_scale: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads_q, n_q, D, generator=gen) * q_scale  # (B, Hq, Q, D)
    k = torch.randn(1, heads_kv, n_cur, D, generator=gen)  # (B, Hkv, R, D)
    v = torch.randn(1, heads_kv, n_cur, D, generator=gen)
    return q.to(device), k.to(device), v.to(device)


def expand_heads(segments: list, group: int) -> list[CacheSegment]:
    """The oracle's view of GQA: every KV head repeated for its query heads."""
    out = []
    for seg in segments:
        steps = None if seg.steps is None else GroupSteps(seg.steps.step.repeat_interleave(group, 1), seg.steps.rotation)
        out.append(CacheSegment(k=seg.k.repeat_interleave(group, 1), v=seg.v.repeat_interleave(group, 1), steps=steps))
    return out


def oracle(q, k, v, segments, correction, strength=1.0):
    group = q.shape[1] // k.shape[1]
    return reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                               expand_heads(segments, group), correction, strength=strength)


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_triton_matches_oracle(config: str, correction: str, triton_device: str) -> None:
    segments = build(config, device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device, q_scale=Q_SCALE.get(config, 2.0))
    expected = oracle(q, k, v, segments, correction, strength=0.8)
    actual = triton_cached_attention(q, k, v, segments, correction, strength=0.8)
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    assert relative_error(actual, expected) <= 1e-3
    if correction != "none" and not config.startswith("int8"):  # dropping the bias could not pass
        assert relative_error(oracle(q, k, v, segments, "none"), expected) > 1e-2


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_triton_gqa_with_sinks_several_segments_and_ragged_tails(correction: str, triton_device: str) -> None:
    """4 query heads on 2 KV heads; a full-precision sink chunk; 4 cached chunks; 3 in-flight tokens."""
    segments = build("int2-g8", heads_kv=2, sinks=1, lengths=(9, 17, 20, 3, 11), seed=3, device=triton_device)
    assert segments[0].steps is None and len(segments) == 5
    q, k, v = inputs(4, 2, n_q=19, n_cur=3, seed=4, device=triton_device)
    expected = oracle(q, k, v, segments, correction)
    assert relative_error(triton_cached_attention(q, k, v, segments, correction), expected) <= 1e-3


def test_triton_exact_beyond_the_series_range(triton_device: str) -> None:
    """Wide keys give steps whose |x| exceeds SERIES_MAX_ARG: the kernel sums log(sinh x / x) per channel."""
    segments = build("int2-g8", lengths=(12, 5), key_scale=40.0, device=triton_device)
    q, k, v = inputs(2, 2, n_q=5, seed=6, device=triton_device)
    expected = oracle(q, k, v, segments, "exact")
    assert relative_error(triton_cached_attention(q, k, v, segments, "exact"), expected) <= 1e-3


def test_triton_merges_chunks_of_different_layouts(triton_device: str) -> None:
    segments = build("int2-g8", lengths=(12,), device=triton_device) + build("kivi-int2", lengths=(9, 4), seed=2,
                                                                            device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device)
    for correction in ("none", "taylor"):
        expected = oracle(q, k, v, segments, correction)
        assert relative_error(triton_cached_attention(q, k, v, segments, correction), expected) <= 1e-3


def test_triton_without_cached_chunks_is_plain_attention(triton_device: str) -> None:
    q, k, v = inputs(2, 2, device=triton_device)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert relative_error(triton_cached_attention(q, k, v, [], "taylor"), expected) <= 1e-5


def test_triton_rejects_what_it_cannot_read(triton_device: str) -> None:
    q, k, v = inputs(2, 2, device=triton_device)
    with pytest.raises(ValueError, match=r"3 KV heads .* multiple of the KV heads"):
        triton_cached_attention(q, k[:, :1].expand(1, 3, -1, -1), v[:, :1].expand(1, 3, -1, -1), [], "none")
    qvg = QuantConfig(method="qvg", qvg_centroids=2, qvg_iters=1, group_size=8)
    cache = ChunkedKVCache(CacheConfig(key=qvg, value=qvg), head_dim=D)
    cache.commit(k, v)
    with pytest.raises(ValueError, match=r"segments\[0\].stored_k is QVGTensor.*backend=cached"):
        triton_cached_attention(q, k, v, cache.segments(), "taylor")
    dithered = QuantConfig(bits=2, group_size=8, dither="subtractive")
    cache = ChunkedKVCache(CacheConfig(key=dithered, value=dithered), head_dim=D)
    cache.commit(k, v)
    with pytest.raises(ValueError, match=r"stored_k is dithered.*backend=cached"):
        triton_cached_attention(q, k, v, cache.segments(), "taylor")
    (seg,) = build("int2-g8", lengths=(4,), device=triton_device)
    dense = CacheSegment(k=seg.k, v=seg.v, steps=seg.steps)
    with pytest.raises(ValueError, match=r"segments\[0\] carries steps but no stored form"):
        triton_cached_attention(q, k, v, [dense], "taylor")
    with pytest.raises(ValueError, match=r"block_n=24 .*power of two"):
        triton_cached_attention(q, k, v, [], "none", block_n=24)


def test_triton_bias_only_on_cached_keys(triton_device: str) -> None:
    """Huge strength: the quantized chunks lose all mass; the current chunk keeps its own attention."""
    segments = build("int2-g8", lengths=(12, 5), device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device)
    actual = triton_cached_attention(q, k, v, segments, "taylor", strength=1e4)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert relative_error(actual, expected) <= 1e-5
    assert dataclasses.is_dataclass(CacheSegment)


def test_triton_backend_in_the_processor_matches_cached(triton_device: str) -> None:
    """backend="triton" reaches the kernel through the adapter: same denoiser output as backend="cached"."""
    from diffusers import SkyReelsV2Transformer3DModel

    from jensenkv.generate import GenerationConfig
    from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter

    config = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4,
              "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 32, "num_layers": 1,
              "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
    int2 = QuantConfig(bits=2, group_size=8)
    outputs = {}
    for backend in ("cached", "triton"):
        torch.manual_seed(0)
        adapter = ChunkwiseAdapter(SkyReelsV2Transformer3DModel(**config).to(triton_device),
                                   lambda prompts: torch.ones(len(prompts), 4, 16, device=triton_device),
                                   (4, 4, 8), GenerationConfig(frames_per_chunk=2, steps=2),
                                   CacheConfig(key=int2, value=int2),
                                   AttentionSettings(backend=backend, correction="taylor"))
        adapter.set_prompt("a red square", "")
        gen = torch.Generator().manual_seed(1)
        frames = [torch.randn(1, 4, 2, 4, 8, generator=gen).to(triton_device) for _ in range(3)]  # (1, C, F, H, W)
        outs = []
        for c, x in enumerate(frames):
            outs.append(adapter.denoise(x, 0.7, c, "cond"))
            adapter.commit(x, c, "cond")
        outputs[backend] = torch.cat([o.flatten() for o in outs])
    assert relative_error(outputs["triton"], outputs["cached"]) <= 1e-4


@pytest.mark.parametrize(("correction", "key_scale"), [("taylor", 1.0), ("exact", 1.0), ("exact", 40.0)])
def test_triton_head_strengths_equal_a_loop_of_float_strengths(correction: str, key_scale: float,
                                                               triton_device: str) -> None:
    """A (Hq,) strength on 4 query heads over 2 KV heads: folded into the bias columns (taylor, series) or
    read per head in the kernel (exact beyond the series' range, key_scale 40)."""
    segments = build("int2-g8", lengths=(12, 5), key_scale=key_scale, device=triton_device)
    q, k, v = inputs(4, 2, n_q=7, seed=8, device=triton_device)
    strength = torch.tensor([0.8, -1.2, 0.0, 2.0], device=triton_device)  # (Hq,)
    actual = triton_cached_attention(q, k, v, segments, correction, strength=strength)
    for h, s in enumerate(strength.tolist()):
        alone = triton_cached_attention(q, k, v, segments, correction, strength=s)[:, h]
        assert relative_error(actual[:, h], alone) <= 1e-5, h
    assert relative_error(actual, oracle(q, k, v, segments, correction, strength=strength)) <= 1e-3
    with pytest.raises(ValueError, match=r"strength has shape \(2,\).*\(H,\) = \(4,\)"):
        triton_cached_attention(q, k, v, segments, correction, strength=strength[:2])  # KV heads, not query heads
