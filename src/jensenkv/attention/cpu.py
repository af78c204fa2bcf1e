"""Fast CPU cached attention: one SDPA call, the bias folded in without a (Q, K, D) tensor.

- none:   SDPA on the concatenated [cached..., current] K/V.
- taylor: the bias strength * scale^2/24 * sum_j qn2_j step_j^2 is a dot product over G extra
  columns, so SDPA sees q_aug = [q, -strength*scale/24 * qn2] and k_aug = [k, step^2] (zeros for
  the current chunk and for segments without steps) with ``scale`` passed explicitly. Values are
  unchanged (SDPA allows Ev != E). Segments with different (G, rotation) get their own columns.
- exact:  the bias from ``group_bias`` as an additive float attn_mask: memory (Q, K).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from jensenkv.attention._inputs import SegmentLike, resolve_scale, validate_attention_inputs
from jensenkv.correction import GroupSteps, bias_basis_query, group_bias, query_group_sq_norms


def cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str = "none",
    scale: float | None = None,
    strength: float = 1.0,
) -> torch.Tensor:
    """Same contract as ``reference_attention``: q (B, H, Q, D), k_cur/v_cur (B, H, R, D/Dv) -> (B, H, Q, Dv)."""
    validate_attention_inputs(q, k_cur, v_cur, segments, correction, strength)
    scale = resolve_scale(scale, q.shape[-1])
    keys = torch.cat([seg.k.to(q.dtype) for seg in segments] + [k_cur], dim=-2)  # (B, H, K_total, D)
    values = torch.cat([seg.v.to(v_cur.dtype) for seg in segments] + [v_cur], dim=-2)  # (B, H, K_total, Dv)
    corrected = correction != "none" and any(seg.steps is not None for seg in segments)
    if not corrected:
        return F.scaled_dot_product_attention(q, keys, values, scale=scale)
    if correction == "taylor":
        q_aug, k_aug = taylor_augmented_columns(q, k_cur, segments, scale, strength)
        return F.scaled_dot_product_attention(q_aug, k_aug, values, scale=scale)
    mask = exact_bias_mask(q, k_cur, segments, scale, strength)  # (B, H, Q, K_total)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)


def _step_kind(steps: GroupSteps) -> tuple[int, int]:
    """Segments sharing group count and rotation object share augmented columns."""
    return steps.step.shape[-1], id(steps.rotation)


def taylor_augmented_columns(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    scale: float,
    strength: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q_aug (B, H, Q, D + C) and k_aug (B, H, K_total, D + C) with scale * q_aug.k_aug = scale*q.k - b.

    C = sum of G over the distinct (G, rotation) kinds of step-carrying segments. The extra columns
    are computed in float32 and cast to q's dtype.
    """
    kinds: dict[tuple[int, int], GroupSteps] = {}
    for seg in segments:
        if seg.steps is not None:
            kinds.setdefault(_step_kind(seg.steps), seg.steps)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_extra = []
    for steps in kinds.values():
        qn2 = query_group_sq_norms(bias_basis_query(q.to(work), steps), steps.step.shape[-1])  # (B, H, Q, G)
        q_extra.append(-(strength * scale / 24.0) * qn2)
    offsets, width = {}, 0
    for kind, steps in kinds.items():
        offsets[kind] = width
        width += steps.step.shape[-1]
    k_blocks = []
    for seg in segments:
        extra = seg.k.new_zeros(*seg.k.shape[:-1], width, dtype=work)  # (B, H, K_i, C)
        if seg.steps is not None:
            start = offsets[_step_kind(seg.steps)]
            groups = seg.steps.step.shape[-1]
            extra[..., start : start + groups] = seg.steps.step.to(work).square()
        k_blocks.append(torch.cat([seg.k.to(q.dtype), extra.to(q.dtype)], dim=-1))  # (B, H, K_i, D + C)
    k_blocks.append(torch.cat([k_cur, k_cur.new_zeros(*k_cur.shape[:-1], width)], dim=-1))  # (B, H, R, D + C)
    q_aug = torch.cat([q] + [x.to(q.dtype) for x in q_extra], dim=-1)  # (B, H, Q, D + C)
    return q_aug, torch.cat(k_blocks, dim=-2)


def exact_bias_mask(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    scale: float,
    strength: float,
) -> torch.Tensor:
    """Additive mask (B, H, Q, K_total) in q's dtype: -exact bias on step-carrying cached columns, else 0."""
    blocks = []
    for seg in segments:
        if seg.steps is None:
            blocks.append(q.new_zeros(*q.shape[:-1], seg.k.shape[-2]))  # (B, H, Q, K_i)
        else:
            blocks.append(-group_bias(q, seg.steps, "exact", scale, strength).to(q.dtype))
    blocks.append(q.new_zeros(*q.shape[:-1], k_cur.shape[-2]))  # (B, H, Q, R): current chunk, no bias
    return torch.cat(blocks, dim=-1)
