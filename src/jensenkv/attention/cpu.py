"""Fast CPU cached attention: one SDPA call, the bias folded in without a (Q, K, D) tensor.

- none:   SDPA on the concatenated [cached..., current] K/V.
- taylor: the bias strength * scale^2/24 * sum_j qn2_j step_j^2 is a dot product over G extra
  columns, so SDPA sees q_aug = [q, -strength*scale/24 * qn2] and k_aug = [k, step^2] (zeros for
  the current chunk and for segments without steps) with ``scale`` passed explicitly. Values are
  zero-padded to the same width so the flash kernel applies. Segments with different (G, rotation)
  get their own columns.
- exact:  while every |x| <= SERIES_MAX_ARG, the series form of the bias folded in the same way (G
  columns per series term); otherwise the elementwise bias from ``group_bias`` as an additive float
  attn_mask: memory (Q, K).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Sequence

import torch
import torch.nn.functional as F

from jensenkv.attention._inputs import SegmentLike, resolve_scale, validate_attention_inputs
from jensenkv.correction import (
    SERIES_MAX_ARG,
    GroupSteps,
    bias_basis_query,
    exact_series_key_columns,
    exact_series_query_columns,
    group_bias,
    query_group_sq_norms,
    series_terms,
)


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
    corrected = correction != "none" and any(seg.steps is not None for seg in segments)
    if corrected:
        augmented = augmented_inputs(q, k_cur, v_cur, segments, correction, scale, strength)
        if augmented is not None:
            q_aug, k_aug, v_pad = augmented
            return F.scaled_dot_product_attention(q_aug, k_aug, v_pad, scale=scale)[..., : v_cur.shape[-1]]
    keys = torch.cat([seg.k.to(q.dtype) for seg in segments] + [k_cur], dim=-2)  # (B, H, K_total, D)
    values = torch.cat([seg.v.to(v_cur.dtype) for seg in segments] + [v_cur], dim=-2)  # (B, H, K_total, Dv)
    if not corrected:
        return F.scaled_dot_product_attention(q, keys, values, scale=scale)
    mask = exact_bias_mask(q, k_cur, segments, scale, strength)  # (B, H, Q, K_total): large-|x| exact
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)


def _step_kind(steps: GroupSteps) -> tuple[int, int]:
    """Segments sharing group count and rotation object share augmented columns."""
    return steps.step.shape[-1], id(steps.rotation)


def _bias_columns(
    q: torch.Tensor, segments: Sequence[SegmentLike], correction: str, scale: float, strength: float
) -> tuple[dict, Callable[[GroupSteps], torch.Tensor]] | None:
    """Per step kind: query columns (B, H, Q, C_kind) pre-divided by -scale/strength, and a function giving
    a segment's key columns (B, H, K_i, C_kind), so that scale * q_cols.k_cols = -strength * bias.

    Taylor: C = G, q_cols ~ qn2, k_cols = step^2. Exact: the series form, C = G * N terms; None when
    some |x| may exceed SERIES_MAX_ARG (the caller then uses the elementwise bias as a mask).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    kinds: dict[tuple[int, int], list[GroupSteps]] = {}
    for seg in segments:
        if seg.steps is not None:
            kinds.setdefault(_step_kind(seg.steps), []).append(seg.steps)
    q_cols, key_params = {}, {}
    for kind, members in kinds.items():
        groups = kind[0]
        qb = bias_basis_query(q.to(work), members[0])  # (B, H, Q, D)
        if correction == "taylor":
            q_cols[kind] = -(strength * scale / 24.0) * query_group_sq_norms(qb, groups)  # (B, H, Q, G)
            continue
        q_max = qb.abs().amax()
        bound = float(0.5 * scale * q_max * max(float(m.step.abs().amax()) for m in members))
        if bound > SERIES_MAX_ARG:
            return None
        terms = series_terms(bound)
        q_cols[kind] = -(strength / scale) * exact_series_query_columns(qb, groups, q_max, terms)  # (B, H, Q, G*N)
        key_params[kind] = (q_max, terms)

    def key_columns(steps: GroupSteps) -> torch.Tensor:
        step = steps.step.to(work)  # (B, H, K_i, G)
        if correction == "taylor":
            return step.square()
        q_max, terms = key_params[_step_kind(steps)]
        return exact_series_key_columns(step, scale, q_max, terms)

    return q_cols, key_columns


def augmented_inputs(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str,
    scale: float,
    strength: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """q_aug (B, H, Q, E), k_aug (B, H, K_total, E), v_pad (B, H, K_total, E) with E = max(D + C, Dv).

    scale * q_aug.k_aug = scale*q.k - b: C extra columns (per (G, rotation) kind of step-carrying
    segment: G for Taylor, G x series terms for exact) hold the bias's query and key factors; zeros for
    the current chunk and unquantized segments. Values are zero-padded to the same width because CPU
    SDPA's flash kernel needs E == Ev (otherwise it falls back to materialised (Q, K) scores, ~2x
    slower); the caller slices the output back to Dv. Each tensor is built in one preallocated buffer.
    None when the exact bias has no column form for these inputs.
    """
    columns = _bias_columns(q, segments, correction, scale, strength)
    if columns is None:
        return None
    q_cols, key_columns = columns
    batch, heads, n_q, dim = q.shape
    dv = v_cur.shape[-1]
    offsets, extra = {}, 0
    for kind, cols in q_cols.items():
        offsets[kind] = dim + extra
        extra += cols.shape[-1]
    width = max(dim + extra, dv)
    total = sum(seg.k.shape[-2] for seg in segments) + k_cur.shape[-2]
    k_aug = q.new_zeros(batch, heads, total, width)  # (B, H, K_total, E): [k, bias key columns]
    v_pad = q.new_zeros(batch, heads, total, width)  # (B, H, K_total, E): [v, zeros]
    start = 0
    for seg in segments:
        n = seg.k.shape[-2]
        k_aug[:, :, start : start + n, :dim] = seg.k
        v_pad[:, :, start : start + n, :dv] = seg.v
        if seg.steps is not None:
            cols = key_columns(seg.steps)  # (B, H, K_i, C_kind)
            col = offsets[_step_kind(seg.steps)]
            k_aug[:, :, start : start + n, col : col + cols.shape[-1]] = cols
        start += n
    k_aug[:, :, start:, :dim] = k_cur
    v_pad[:, :, start:, :dv] = v_cur
    q_aug = q.new_zeros(batch, heads, n_q, width)  # (B, H, Q, E)
    q_aug[..., :dim] = q
    for kind, cols in q_cols.items():
        q_aug[..., offsets[kind] : offsets[kind] + cols.shape[-1]] = cols
    return q_aug, k_aug, v_pad


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
