"""Fast CPU cached attention: one SDPA call over a shared workspace, the bias folded in as extra columns.

Cached chunks are dequantized on every call into one workspace buffer (``attention.workspace``: one
per device and dtype, shared by all layers, grown to the widest window seen), never kept.
- none:   SDPA on [cached..., current] K/V written into the workspace.
- taylor: the bias strength * scale^2/24 * sum_j qn2_j step_j^2 is a dot product over G extra
  columns, so SDPA sees q_aug = [q, -strength*scale/24 * qn2] and k_aug = [k, step^2] (zeros for
  the current chunk and for segments without steps) with ``scale`` passed explicitly. Values are
  zero-padded to the same width so the flash kernel applies. Segments with different (G, rotation)
  get their own columns. The key columns come from the stored steps at each call (no stored bytes).
- exact:  while every |x| <= SERIES_MAX_ARG, the series form of the bias folded in the same way (G
  columns per series term); otherwise the elementwise bias from ``group_bias`` as an additive float
  attn_mask: memory (Q, K).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Sequence

import torch
import torch.nn.functional as F

from jensenkv.attention._inputs import (
    SegmentLike,
    resolve_scale,
    segment_has_steps,
    segment_shape,
    validate_attention_inputs,
)
from jensenkv.attention.workspace import carve, dequantize_into, workspace
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


def write_segment(seg: SegmentLike, name: str, out: torch.Tensor) -> None:
    """Dequantize a segment's "k" or "v" into ``out`` (B, H, K_i, D): from the stored form for cache views."""
    stored = getattr(seg, f"stored_{name}", None)
    if stored is not None:
        dequantize_into(stored, out)
    else:
        out.copy_(getattr(seg, name))


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
    corrected = correction != "none" and any(segment_has_steps(seg) for seg in segments)
    if corrected:
        augmented = augmented_inputs(q, k_cur, v_cur, segments, correction, scale, strength)
        if augmented is not None:
            q_aug, k_aug, v_pad = augmented
            return F.scaled_dot_product_attention(q_aug, k_aug, v_pad, scale=scale)[..., : v_cur.shape[-1]]
    keys, values = stacked_inputs(q, k_cur, v_cur, segments)  # (B, H, K_total, D), (B, H, K_total, Dv)
    if not corrected:
        return F.scaled_dot_product_attention(q, keys, values, scale=scale)
    mask = exact_bias_mask(q, k_cur, segments, scale, strength)  # (B, H, Q, K_total): large-|x| exact
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)


def stacked_inputs(
    q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor, segments: Sequence[SegmentLike]
) -> tuple[torch.Tensor, torch.Tensor]:
    """[cached..., current] keys (B, H, K_total, D) and values (B, H, K_total, Dv) in the shared workspace."""
    batch, heads, _, dim = q.shape
    dv = v_cur.shape[-1]
    total = sum(segment_shape(seg, "k")[2] for seg in segments) + k_cur.shape[-2]
    flat = workspace(batch * heads * total * (dim + dv), q.device, q.dtype)
    keys, values = carve(flat, (batch, heads, total, dim), (batch, heads, total, dv))
    start = 0
    for seg in segments:
        n = segment_shape(seg, "k")[2]
        write_segment(seg, "k", keys[:, :, start : start + n])
        write_segment(seg, "v", values[:, :, start : start + n])
        start += n
    keys[:, :, start:] = k_cur
    values[:, :, start:] = v_cur
    return keys, values


def _step_kind(steps: GroupSteps) -> tuple[int, int]:
    """Segments sharing group count and rotation object share augmented columns."""
    return steps.step.shape[-1], id(steps.rotation)


def _bias_columns(
    q: torch.Tensor, segments: Sequence[SegmentLike], correction: str, scale: float, strength: float
) -> tuple[dict, Callable[[GroupSteps, torch.Tensor], None]] | None:
    """Per step kind: query columns (B, H, Q, C_kind) pre-divided by -scale/strength, and a function writing
    a segment's key columns (B, H, K_i, C_kind) into a view, so that scale * q_cols.k_cols = -strength * bias.

    Taylor: C = G, q_cols ~ qn2, k_cols = step^2. Exact: the series form, C = G * N terms; None when
    some |x| may exceed SERIES_MAX_ARG (the caller then uses the elementwise bias as a mask).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    kinds: dict[tuple[int, int], list[GroupSteps]] = {}
    for seg in segments:
        if segment_has_steps(seg):
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

    def key_columns(steps: GroupSteps, out: torch.Tensor) -> None:
        """Write a segment's key columns (B, H, K_i, C_kind), derived from its steps, into ``out``."""
        if correction == "taylor":
            out.copy_(steps.step)
            out.square_()
            return
        q_max, terms = key_params[_step_kind(steps)]
        out.copy_(exact_series_key_columns(steps.step.to(work), scale, q_max, terms))

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
    """q_aug (B, H, Q, E), k_aug (B, H, K_total, E), v_pad (B, H, K_total, E) with E = max(D + C, Dv),
    views of the shared workspace (valid until the next attention call).

    scale * q_aug.k_aug = scale*q.k - b: C extra columns (per (G, rotation) kind of step-carrying
    segment: G for Taylor, G x series terms for exact) hold the bias's query and key factors; zeros for
    the current chunk and unquantized segments. Values are zero-padded to the same width because CPU
    SDPA's flash kernel needs E == Ev (otherwise it falls back to materialised (Q, K) scores, ~2x
    slower); the caller slices the output back to Dv.
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
    total = sum(segment_shape(seg, "k")[2] for seg in segments) + k_cur.shape[-2]
    flat = workspace(batch * heads * (2 * total + n_q) * width, q.device, q.dtype)
    k_aug, v_pad, q_aug = carve(flat, (batch, heads, total, width), (batch, heads, total, width),
                                (batch, heads, n_q, width))  # [k, bias key columns], [v, zeros], [q, bias query columns]
    start = 0
    for seg in segments:
        n = segment_shape(seg, "k")[2]
        rows = slice(start, start + n)
        write_segment(seg, "k", k_aug[:, :, rows, :dim])
        write_segment(seg, "v", v_pad[:, :, rows, :dv])
        v_pad[:, :, rows, dv:] = 0
        k_aug[:, :, rows, dim:] = 0
        if segment_has_steps(seg):
            col = offsets[_step_kind(seg.steps)]
            key_columns(seg.steps, k_aug[:, :, rows, col : col + q_cols[_step_kind(seg.steps)].shape[-1]])
        start += n
    k_aug[:, :, start:, :dim] = k_cur
    k_aug[:, :, start:, dim:] = 0
    v_pad[:, :, start:, :dv] = v_cur
    v_pad[:, :, start:, dv:] = 0
    q_aug[..., :dim] = q
    q_aug[..., dim:] = 0
    for kind, cols in q_cols.items():
        q_aug[..., offsets[kind] : offsets[kind] + cols.shape[-1]] = cols
    return q_aug, k_aug, v_pad


def bias_column_tables(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str,
    scale: float,
    strength: float,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Only the bias's factors: q_coef (B, H, Q, C) and k_cols (B, H, K_total, C) with
    strength * bias = q_coef . k_cols on cached step-carrying keys (k_cols zero elsewhere), C the bias
    columns of every step kind. None when the exact bias has no column form for these inputs."""
    columns = _bias_columns(q, segments, correction, scale, strength)
    if columns is None:
        return None
    q_cols, key_columns = columns
    offsets, width = {}, 0
    for kind, cols in q_cols.items():
        offsets[kind] = width
        width += cols.shape[-1]
    batch, heads, n_q, _ = q.shape
    total = sum(segment_shape(seg, "k")[2] for seg in segments) + k_cur.shape[-2]
    work = q_cols[next(iter(q_cols))].dtype
    k_cols = q.new_zeros(batch, heads, total, width, dtype=work)  # (B, H, K_total, C)
    q_coef = q.new_empty(batch, heads, n_q, width, dtype=work)  # (B, H, Q, C)
    start = 0
    for seg in segments:
        n = segment_shape(seg, "k")[2]
        if segment_has_steps(seg):
            kind = _step_kind(seg.steps)
            key_columns(seg.steps, k_cols[:, :, start : start + n, offsets[kind] : offsets[kind] + q_cols[kind].shape[-1]])
        start += n
    for kind, cols in q_cols.items():
        q_coef[..., offsets[kind] : offsets[kind] + cols.shape[-1]] = -scale * cols
    return q_coef, k_cols


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
        if not segment_has_steps(seg):
            blocks.append(q.new_zeros(*q.shape[:-1], segment_shape(seg, "k")[2]))  # (B, H, Q, K_i)
        else:
            blocks.append(-group_bias(q, seg.steps, "exact", scale, strength).to(q.dtype))
    blocks.append(q.new_zeros(*q.shape[:-1], k_cur.shape[-2]))  # (B, H, Q, R): current chunk, no bias
    return torch.cat(blocks, dim=-1)
