"""Quantize-on-commit throughput: how fast a cache turns one chunk's K and V into stored codes.

Times ChunkedKVCache.commit(k, v) on an emptied cache (all configs interleaved, one commit each per
repetition). Throughput is given in tokens per second (a token = all heads of one layer, K and V)
and in GB/s of float32 K+V input read.
"""
from __future__ import annotations

import torch

from jensenkv.bench.cache_bytes import ChunkShape
from jensenkv.bench.data import synthetic_heads
from jensenkv.bench.quant_configs import key_value_configs
from jensenkv.bench.rows import BenchRow, time_row
from jensenkv.bench.timing import Timing, time_interleaved
from jensenkv.cache import CacheConfig, ChunkedKVCache


def _commit_fn(cache: ChunkedKVCache, k: torch.Tensor, v: torch.Tensor):
    def run() -> None:
        cache.clear()  # a fresh cache each time: QVG state and memory do not grow over repetitions
        with torch.inference_mode():
            cache.commit(k, v)

    return run


def commit_timings(
    configs: list[str], shape: ChunkShape, repeats: int, warmup: int = 1, seed: int = 0
) -> dict[str, Timing]:
    """Median-ready commit timings per config for one chunk of ``shape``."""
    k = synthetic_heads(shape.batch, shape.heads, shape.tokens, shape.head_dim, seed)  # (B, H, S, D)
    v = synthetic_heads(shape.batch, shape.heads, shape.tokens, shape.head_dim, seed + 1)  # (B, H, S, D)
    variants = {}
    for name in configs:
        key_cfg, value_cfg = key_value_configs(name)
        cache = ChunkedKVCache(CacheConfig(key=key_cfg, value=value_cfg), shape.head_dim)
        variants[name] = _commit_fn(cache, k, v)
    return time_interleaved(variants, repeats=repeats, warmup=warmup)


def quantize_throughput_rows(configs: list[str], shape: ChunkShape, timings: dict[str, Timing]) -> list[BenchRow]:
    """Per config: commit seconds, tokens/s and GB/s (float32 K+V bytes read per second)."""
    input_bytes = 2 * shape.batch * shape.heads * shape.tokens * shape.head_dim * 4  # K and V, float32
    rows: list[BenchRow] = []
    for name in configs:
        t = timings[name]
        rows.append(time_row("commit_time", name, shape.label(), t, note="ChunkedKVCache.commit(k, v), one chunk"))
        rows.append(
            BenchRow(
                benchmark="quantize_throughput",
                config=name,
                shape=shape.label(),
                value=shape.tokens / t.median,
                unit="tokens/s",
                median=shape.tokens / t.median,
                repeats=t.repeats,
                numerator=float(shape.tokens),
                denominator=t.median,
                note="tokens of one layer (all heads, K and V) per second of commit",
            )
        )
        rows.append(
            BenchRow(
                benchmark="quantize_throughput",
                config=name,
                shape=shape.label(),
                value=input_bytes / t.median / 1e9,
                unit="GB/s",
                median=input_bytes / t.median / 1e9,
                repeats=t.repeats,
                numerator=input_bytes / 1e9,
                denominator=t.median,
                note="float32 K+V input GB per second of commit",
            )
        )
    return rows
