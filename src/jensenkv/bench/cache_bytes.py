"""Measured cache bytes per token against BF16 and against the analytic bits-per-element formula.

Keys alone (``K``) and keys plus values (``K+V``) are reported separately: the correction only
concerns keys, the memory saving concerns both. Keys-only bytes come from QuantizedTensor.nbytes;
K+V bytes from ChunkedKVCache.nbytes after committing one chunk, i.e. what the cache really holds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jensenkv.bench.data import synthetic_heads
from jensenkv.bench.quant_configs import key_value_configs, theory_bits_per_element
from jensenkv.bench.rows import BenchRow
from jensenkv.cache import BF16_BYTES, CacheConfig, ChunkedKVCache
from jensenkv.quant import make_quantizer


@dataclass(frozen=True)
class ChunkShape:
    """One committed chunk of one attention layer: (batch, heads, tokens, head_dim)."""

    batch: int = 1
    heads: int = 12
    tokens: int = 4680  # Wan2.1-1.3B: 3 latent frames x 1560 tokens
    head_dim: int = 128

    def label(self) -> str:
        return f"{self.batch}x{self.heads}x{self.tokens}x{self.head_dim}"


def cache_bytes_rows(configs: list[str], shape: ChunkShape, seed: int = 0) -> list[BenchRow]:
    """Per config: bytes per cached token (measured vs theory) and the ratio to BF16, for K and for K+V."""
    k = synthetic_heads(shape.batch, shape.heads, shape.tokens, shape.head_dim, seed)  # (B, H, S, D)
    v = synthetic_heads(shape.batch, shape.heads, shape.tokens, shape.head_dim, seed + 1)  # (B, H, S, D)
    # Per token of one layer, all heads: BF16 stores D values of 2 bytes per head.
    bf16_per_token = BF16_BYTES * shape.batch * shape.heads * shape.head_dim
    rows: list[BenchRow] = []
    for name in configs:
        key_cfg, value_cfg = key_value_configs(name)
        with torch.inference_mode():
            key_bytes = make_quantizer(key_cfg, shape.head_dim).quantize(k).nbytes
            cache = ChunkedKVCache(CacheConfig(key=key_cfg, value=value_cfg), shape.head_dim)
            cache.commit(k, v)
            kv_bytes = cache.nbytes
        bits = {
            "K": theory_bits_per_element(key_cfg, shape.head_dim, shape.tokens),
            "K+V": theory_bits_per_element(key_cfg, shape.head_dim, shape.tokens)
            + theory_bits_per_element(value_cfg, shape.head_dim, shape.tokens),
        }
        for scope, measured, tensors in (("K", key_bytes, 1), ("K+V", kv_bytes, 2)):
            per_token = measured / shape.tokens
            bf16 = bf16_per_token * tensors
            theory_per_token = bits[scope] / 8 * shape.batch * shape.heads * shape.head_dim
            label = f"{scope} {shape.label()}"
            rows.append(
                BenchRow(
                    benchmark="cache_bytes_per_token",
                    config=name,
                    shape=label,
                    value=per_token,
                    unit="bytes/token",
                    numerator=float(measured),
                    denominator=float(shape.tokens),
                    theory=theory_per_token,
                    note="one layer, all heads; measured = nbytes / tokens",
                )
            )
            rows.append(
                BenchRow(
                    benchmark="cache_bytes_ratio",
                    config=name,
                    shape=label,
                    value=per_token / bf16,
                    unit="ratio",
                    numerator=per_token,
                    denominator=float(bf16),
                    theory=theory_per_token / bf16,
                    note=f"measured bytes/token over BF16 ({BF16_BYTES} bytes x D per head, {scope})",
                )
            )
    return rows
