"""HunyuanVideo-1.5's 3-D RoPE with WorldPlay's reframed temporal positions.

WorldPlay builds the (cos, sin) table in float32 for ``rope_temporal_size`` frames and slices the rows of
frames ``start .. start + F - 1`` (T l.1050-1066, l.1336-1350; ``posemb_layers.get_nd_rotary_pos_embed``
with ``use_real=True``). Every row depends only on its own (t, h, w) position, so building the rows of the
given temporal positions directly is the same table. Pairs are interleaved: channels (2i, 2i+1) rotate
together (``rotate_half`` on a (..., D/2, 2) view).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def axis_frequencies(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (N,) float32 -> cos, sin (N, dim): each frequency repeated for its channel pair."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))  # (dim/2,)
    angles = torch.outer(positions.float(), freqs)  # (N, dim/2)
    return angles.cos().repeat_interleave(2, dim=1), angles.sin().repeat_interleave(2, dim=1)


def rope_table(frame_positions: Sequence[int], height: int, width: int, dims: Sequence[int],
               theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (F * height * width, sum(dims)) float32 for tokens in (t, h, w) order, frame f at temporal
    position ``frame_positions[f]``."""
    t = torch.as_tensor(list(frame_positions), dtype=torch.float32)
    grid = torch.meshgrid(t, torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32),
                          indexing="ij")  # 3 x (F, height, width)
    parts = [axis_frequencies(axis.reshape(-1), d, theta) for axis, d in zip(grid, dims)]
    return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., D) float32 -> (..., D): each interleaved pair (a, b) -> (-b, a)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)  # (..., D/2, 2)
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D); cos, sin (S, D) -> rotated in float32, cast back to x's dtype."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).type_as(x)
