"""Bytes of one MAGI-1 chunk in one layer's KV cache at 720p, measured with the suite's cache.

A real-shaped chunk: 8 KV heads x 12,150 tokens (6 latent frames x 45 x 45) x head dim 128, committed to a
``ChunkedKVCache``; ``nbytes`` counts exactly what is stored (packed codes, steps, zero points).

    python scripts/magi_cache_bytes.py
"""
from __future__ import annotations

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig

KV_HEADS, TOKENS, HEAD_DIM, QUERY_HEADS = 8, 6 * 45 * 45, 128, 24


def chunk_bytes(key: QuantConfig, value: QuantConfig, heads: int = KV_HEADS) -> int:
    cache = ChunkedKVCache(CacheConfig(key=key, value=value), HEAD_DIM)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1, heads, TOKENS, HEAD_DIM, generator=gen)  # (B, H_kv, S, D)
    v = torch.randn(1, heads, TOKENS, HEAD_DIM, generator=gen)
    cache.commit(k, v)
    return cache.nbytes


def main() -> None:
    bf16 = QuantConfig(method="none", store_dtype="bfloat16")
    int2 = QuantConfig(method="rtn", bits=2, group_size=32, store_dtype="bfloat16")
    rows = {"bf16 K+V": chunk_bytes(bf16, bf16), "int2 g=32 K+V": chunk_bytes(int2, int2),
            "int2 g=32 K, bf16 V": chunk_bytes(int2, bf16),
            "bf16 K+V if the 24 query heads were cached": chunk_bytes(bf16, bf16, QUERY_HEADS)}
    for name, n in rows.items():
        print(f"{name:45s} {n:>12,d} B  {n / 1e6:8.2f} MB  {n / 2**20:8.2f} MiB")
    print(f"compression bf16 / int2: {rows['bf16 K+V'] / rows['int2 g=32 K+V']:.2f}x")


if __name__ == "__main__":
    main()
