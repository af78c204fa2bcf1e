"""A cache of a batch of videos stores each video exactly as a cache of that video alone would."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig, rtn_quantize
from jensenkv.quant.samples import stack_samples

HEAD_DIM = 16

CONFIGS = {
    "int2-tensor": dict(granularity="tensor"),
    "int2-token": dict(granularity="token"),
    "int2-g8": dict(granularity="token_group", group_size=8),
    "int2-channel-g3": dict(granularity="channel", group_size=3),
    "int3-g4": dict(bits=3, granularity="token_group", group_size=4),
    "int4-sym-int8zero": dict(bits=4, symmetric=True, zero_dtype="int8"),
    "int2-dither": dict(dither="subtractive", dither_seed=5, zero_point="min_aligned", zero_dtype="float16"),
    "int2-hadamard": dict(rotation="hadamard", rotation_seed=3),
    "int2-smoothing": dict(smoothing="channel_mean"),
    "qvg-published": dict(method="qvg", qvg_kmeans="published", qvg_centroids=4, qvg_iters=5, qvg_tol=0.2),
    "qvg-warm": dict(method="qvg", qvg_kmeans="warm_start", qvg_centroids=4, qvg_iters=3, qvg_stages=2),
}


def chunks(batch: int, num: int = 3, tokens: int = 7, seed: int = 0) -> list[torch.Tensor]:
    """(batch, 2, tokens, HEAD_DIM) chunks; video 1 carries an outlier 100x larger than the rest."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        x = torch.randn(batch, 2, tokens, HEAD_DIM, generator=gen)
        if batch > 1:
            x[1] *= 100.0
        out.append(x)
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batched_cache_equals_each_video_alone(name):
    quant = QuantConfig(**{"group_size": 8, **CONFIGS[name]})
    cfg = CacheConfig(key=quant, value=quant, sink_chunks=1)
    ks, vs = chunks(3), chunks(3, seed=1)
    batched = ChunkedKVCache(cfg, HEAD_DIM)
    for k, v in zip(ks, vs):
        batched.commit(k, v)
    alone = []
    for i in range(3):
        cache = ChunkedKVCache(cfg, HEAD_DIM)
        for k, v in zip(ks, vs):
            cache.commit(k[i:i + 1], v[i:i + 1])
        alone.append(cache)
    assert batched.nbytes == sum(c.nbytes for c in alone)
    for j, seg in enumerate(batched.segments()):
        own = [c.segments()[j] for c in alone]
        torch.testing.assert_close(seg.k, torch.cat([s.k for s in own]), rtol=0, atol=0)
        torch.testing.assert_close(seg.v, torch.cat([s.v for s in own]), rtol=0, atol=0)
        if seg.steps is None:
            assert all(s.steps is None for s in own)
        else:
            torch.testing.assert_close(seg.steps.step, torch.cat([s.steps.step for s in own]), rtol=0, atol=0)


def test_a_new_video_batch_starts_every_quantizer_over():
    """clear() between batches: the second batch is quantized as if it were the first (dither counter,
    k-means generator and warm start start over)."""
    for name in ("int2-dither", "qvg-warm", "qvg-published"):
        quant = QuantConfig(**{"group_size": 8, **CONFIGS[name]})
        cfg = CacheConfig(key=quant, value=quant)
        cache = ChunkedKVCache(cfg, HEAD_DIM)
        k = chunks(2, num=1)[0]
        cache.commit(k, k)
        first = cache.segments()[0].k
        cache.clear()
        cache.commit(k, k)
        torch.testing.assert_close(cache.segments()[0].k, first, rtol=0, atol=0)


def test_control_mixing_the_videos_statistics_changes_the_stored_video():
    """The check above can fail: quantizing the batch as one tensor (per-tensor statistics over both
    videos) stores video 0 differently from video 0 alone, because video 1's outlier sets the step."""
    x = chunks(2, num=1)[0]
    mixed = rtn_quantize(x, 2, "tensor", 32).dequantize()[:1]
    alone = rtn_quantize(x[:1], 2, "tensor", 32).dequantize()
    assert (mixed - alone).abs().max() > 0.1


def test_stack_samples_refuses_mixed_kinds():
    a = rtn_quantize(torch.randn(1, 2, 4, HEAD_DIM), 2, "token", 32)
    b = rtn_quantize(torch.randn(1, 2, 5, HEAD_DIM), 2, "token", 32)
    with pytest.raises(ValueError, match="one kind and one"):
        stack_samples([a, b])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_video_of_a_stack_is_its_stored_tensor_alone(name):
    """video_of undoes stack_samples: video b's view reads (and is counted) exactly as its cache alone."""
    quant = QuantConfig(**{"group_size": 8, **CONFIGS[name]})
    cfg = CacheConfig(key=quant, value=quant)
    k, v = chunks(3, num=1)[0], chunks(3, num=1, seed=1)[0]
    batched = ChunkedKVCache(cfg, HEAD_DIM)
    batched.commit(k, v)
    seg = batched.segments()[0]
    for b in range(3):
        alone = ChunkedKVCache(cfg, HEAD_DIM)
        alone.commit(k[b:b + 1], v[b:b + 1])
        own, view = alone.segments()[0], seg.video(b)
        assert view.stored_k.nbytes == own.stored_k.nbytes and view.stored_v.nbytes == own.stored_v.nbytes
        torch.testing.assert_close(view.k, own.k, rtol=0, atol=0)
        torch.testing.assert_close(view.v, own.v, rtol=0, atol=0)
        torch.testing.assert_close(view.steps.step, own.steps.step, rtol=0, atol=0)
