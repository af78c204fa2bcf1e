"""The attention inputs the GPU checks compare on: random q / K / V at a shape, the cached tokens as the suite's
INT2 g=32 cache (or one BF16 block for SDPA), one call through the backend table (GQA expanded for a backend
that cannot read it), the float64 oracle on chosen query rows, and the relative error between outputs.
"""
from __future__ import annotations


import torch

from jensenkv.bench.gpu import GpuShape
from jensenkv.bench.gpu_check_context import CheckContext

CORRECTIONS = ("none", "taylor", "exact")


INT2 = {"bits": 2, "group_size": 32}


def attention_inputs(shape: GpuShape, ctx: CheckContext, quantized: bool, seed: int = 0):
    """(q, k_cur, v_cur, segments): q (1, Hq, Q, D); k_cur / v_cur (1, Hkv, in_flight, D); the cached tokens as
    the segments of the suite's INT2 g=32 cache, committed one chunk at a time (``quantized``), or as one
    BF16 block in front of k_cur / v_cur (the SDPA baseline, no segments)."""
    from jensenkv.bench.presets import preset
    from jensenkv.cache import ChunkedKVCache

    gen = torch.Generator(device=ctx.device).manual_seed(seed)

    def randn(heads: int, tokens: int) -> torch.Tensor:  # (1, heads, tokens, D)
        return torch.randn(1, heads, tokens, shape.dim, generator=gen, device=ctx.device, dtype=ctx.dtype)

    q = randn(shape.heads_q, shape.queries)
    k_cur, v_cur = randn(shape.heads_kv, shape.in_flight), randn(shape.heads_kv, shape.in_flight)
    if not quantized:
        k = torch.cat([randn(shape.heads_kv, shape.cached), k_cur], dim=2)  # (1, Hkv, cached + in_flight, D)
        v = torch.cat([randn(shape.heads_kv, shape.cached), v_cur], dim=2)
        return q, k, v, []
    cache = ChunkedKVCache(preset("rtn", shape.dim, **INT2), shape.dim)
    if hasattr(cache, "reserve"):  # layer buffers sized up front: the peak memory holds no growth slack
        cache.reserve(shape.cached)
    with torch.inference_mode():
        for start in range(0, shape.cached, shape.queries):  # one chunk at a time, as a run commits them
            n = min(shape.queries, shape.cached - start)
            cache.commit(randn(shape.heads_kv, n), randn(shape.heads_kv, n))
    return q, k_cur, v_cur, cache.segments()


def dense_gqa(q, k_cur, v_cur, segments):
    """K/V with each KV head repeated for its query heads, as dense segments: what a backend without GQA is
    handed (MAGI-1's caches expand their GQA heads this way for such backends)."""
    group = q.shape[1] // k_cur.shape[1]

    def rep(t: torch.Tensor) -> torch.Tensor:  # (B, Hkv, S, D) -> (B, Hq, S, D)
        return t.repeat_interleave(group, dim=1)

    dense = [s.expanded(group) for s in segments]
    return q, rep(k_cur), rep(v_cur), dense


def backend_call(name: str, q, k_cur, v_cur, segments, correction: str) -> torch.Tensor:
    """One call through the suite's backend table (``jensenkv.attention.get_backend``), its common contract;
    a backend without GQA gets ``dense_gqa`` inputs when the shape has fewer KV than query heads."""
    from jensenkv.attention.backends import get_backend, reads_kv_heads

    if q.shape[1] != k_cur.shape[1] and not reads_kv_heads(name):
        q, k_cur, v_cur, segments = dense_gqa(q, k_cur, v_cur, segments)
    with torch.inference_mode():
        return get_backend(name)(q, k_cur, v_cur, segments, correction=correction)


def oracle_output(q, k_cur, v_cur, segments, correction: str, rows: torch.Tensor) -> torch.Tensor:
    """The float64 oracle on the query rows ``rows`` (B, Hq, len(rows), Dv); GQA by stacking each KV head's
    query heads along the query axis (each attention row reads only its own KV head)."""
    from jensenkv.attention import reference_attention

    b, heads_q, _, d = q.shape
    group = heads_q // k_cur.shape[1]
    sub = q[:, :, rows].float()  # (B, Hq, n, D): bf16 values, exact in float32
    n = sub.shape[2]
    stacked = sub.reshape(b, heads_q // group, group * n, d)  # (B, Hkv, group * n, D)
    with torch.inference_mode():
        out = reference_attention(stacked, k_cur.float(), v_cur.float(), segments, correction=correction)
    return out.reshape(b, heads_q, n, out.shape[-1])  # (B, Hq, n, Dv)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())
