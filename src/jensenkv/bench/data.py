"""Synthetic attention inputs for the benchmarks: Gaussian with a few outlier channels, as real keys have."""
from __future__ import annotations

import torch


def synthetic_heads(
    batch: int, heads: int, tokens: int, head_dim: int, seed: int, outlier_channels: int = 4
) -> torch.Tensor:
    """(B, H, S, D) float32 values ~ N(0, 1), with ``outlier_channels`` channels per head scaled by 8.

    Outlier channels make per-group ranges (and so quantization steps and the Jensen bias) uneven
    across groups, like the keys of real video DiTs; timings do not depend on it, byte counts do not either.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, tokens, head_dim, generator=gen)  # (B, H, S, D)
    idx = torch.randperm(head_dim, generator=gen)[:outlier_channels]
    x[..., idx] *= 8.0
    return x
