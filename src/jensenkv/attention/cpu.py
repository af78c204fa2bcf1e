"""Fast CPU cached attention: one SDPA call over a shared workspace, the bias folded in as extra columns.

Cached chunks are dequantized on every call into one workspace buffer (``attention.workspace``: one
per device and dtype, shared by all layers, grown to the widest window seen), never kept.
- none:   SDPA on [cached..., current] K/V written into the workspace.
- taylor: the bias strength * scale^2/24 * sum_j qn2_j step_j^2 is a dot product over G extra
  columns, so SDPA sees q_aug = [q, -strength*scale/24 * qn2] and k_aug = [k, step^2] (zeros for
  the current chunk and for segments without steps) with ``scale`` passed explicitly. A (H,) tensor of
  per-head strengths multiplies the query columns head by head (a (1, H, 1, 1) view). Values are
  zero-padded to the same width so the flash kernel applies. Segments with different (G, rotation)
  get their own columns. The key columns come from the stored steps at each call (no stored bytes).
- exact:  while every |x| <= SERIES_MAX_ARG, the series form of the bias folded in the same way (G
  columns per series term); otherwise the elementwise bias from ``group_bias`` as an additive float
  attn_mask: memory (Q, K).
- second_order (taylor / exact): b (1 - pi) depends on the row's softmax, which no single SDPA call can
  express; ``second_order_attention`` tiles the queries and works on full score rows (memory per tile
  bounded by ``_inputs.TILE_ELEMENTS``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Sequence

import torch
import torch.nn.functional as F

from jensenkv.attention._inputs import TILE_ELEMENTS, Strength, causal_additive, strength_view
from jensenkv.attention.registry import Capabilities, register_backend
from jensenkv.attention.second_order import second_order_scores
from jensenkv.attention.workspace import (
    batch_key,
    carve,
    dequantize_into,
    dequantize_many_into,
    workspace,
)
from jensenkv.cache import Segment
from jensenkv.correction import (
    SERIES_MAX_ARG,
    exact_series_key_columns,
    exact_series_query_columns,
    group_bias,
    query_group_sq_norms,
    series_terms_for,
)
from jensenkv.quant.rtn import RTNTensor
from jensenkv.quant.steps import step_max


def write_segments(segments: Sequence[Segment], name: str, out: torch.Tensor) -> None:
    """Dequantize the segments' "k" or "v", in order, into ``out`` (B, H, sum K_i, D): cache views from their
    stored form, consecutive chunks of one RTN layout in one pass (``workspace.dequantize_many_into``)."""
    start, run, run_start, run_key = 0, [], 0, None

    def flush() -> None:
        if run:
            dequantize_many_into(run, out[:, :, run_start:start])

    for seg in segments:
        n = seg.shape(name)[2]
        stored = seg.stored(name)
        key = batch_key(stored)
        if key is None or key != run_key:
            flush()
            run, run_start, run_key = [], start, key
        if key is not None:
            run.append(stored)
        else:
            dequantize_into(stored, out[:, :, start : start + n])
        start += n
    flush()


def token_steps(seg: Segment) -> tuple[torch.Tensor, object]:
    """(steps (B, H, K_i, G), rotation) of a step-carrying segment: stored per-token RTN steps as they are
    (no copy), else its GroupSteps."""
    stored = seg.stored_k
    if isinstance(stored, RTNTensor) and stored.layout.granularity in ("token", "token_group"):
        return stored.step, stored.rotation
    return seg.steps.step, seg.steps.rotation


def step_kind(seg: Segment) -> tuple[int, int]:
    """Segments sharing group count and rotation object share bias columns."""
    step, rotation = token_steps(seg)
    return step.shape[-1], id(rotation)


@register_backend("cached", Capabilities(kv_heads=False, second_order=True, causal=True))
def cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
    second_order: bool,
    causal: bool,
) -> torch.Tensor:
    """Same contract as ``reference_attention``: q (B, H, Q, D), k_cur/v_cur (B, H, R, D/Dv) -> (B, H, Q, Dv).
    ``causal`` (a causal LM): the current chunk's later tokens are masked, an additive (Q, K_total) mask."""
    corrected = correction != "none" and any(seg.has_steps for seg in segments)
    mask = None  # (Q, K_total) additive, a causal call only (the video paths pay nothing for it)
    if causal:
        n_cached = sum(seg.num_tokens for seg in segments)
        mask = causal_additive(q.shape[2], n_cached, k_cur.shape[2], q.dtype, q.device)
    if corrected and second_order:
        return second_order_attention(q, k_cur, v_cur, segments, correction, scale, strength, causal=causal)
    if corrected:
        split = _split_current(q, k_cur, v_cur) and not causal
        current = (k_cur[:, :, :0], v_cur[:, :, :0]) if split else (k_cur, v_cur)  # (B, H, 0 or R, D/Dv)
        augmented = augmented_inputs(q, *current, segments, correction, scale, strength)
        if augmented is not None:
            q_aug, k_aug, v_pad = augmented
            if split:
                return _merge(_FLASH(q_aug, k_aug, v_pad, scale=scale), _FLASH(q, k_cur, v_cur, scale=scale), q.dtype)
            out = F.scaled_dot_product_attention(q_aug, k_aug, v_pad, attn_mask=mask, scale=scale)  # (B, H, Q, E)
            # contiguous like every other path's output: a strided (B, H, Q, Dv) view sends the caller's
            # head merge and output projection down slower paths (mm + add instead of addmm)
            return out[..., : v_cur.shape[-1]].contiguous()
    keys, values = stacked_inputs(q, k_cur, v_cur, segments)  # (B, H, K_total, D), (B, H, K_total, Dv)
    if not corrected:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    bias = exact_bias_mask(q, k_cur, segments, scale, strength)  # (B, H, Q, K_total): large-|x| exact
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias if mask is None else bias + mask,
                                          scale=scale)


# Only the cached keys need the bias columns. CPU SDPA pays ~7% (d = 128) to ~15% (d = 64) for them
# however few (its gemm tiles the head dim), so when the current chunk holds at least this many scores
# B*H*Q*R it gets its own call at the plain width, and the two parts merge by log-sum-exp (a few
# (B, H, Q, Dv) ops, which would outweigh the saving on small calls).
_SPLIT_MIN_SCORES = 1 << 20
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (out, logsumexp (B, H, Q) in float32/64)


def _split_current(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor) -> bool:
    """Whether the current chunk gets its own SDPA call (CPU flash kernel, equal head dims, enough scores)."""
    return (q.device.type == "cpu" and v_cur.shape[-1] == q.shape[-1]
            and q.shape[0] * q.shape[1] * q.shape[2] * k_cur.shape[2] >= _SPLIT_MIN_SCORES)


def _merge(cached: tuple[torch.Tensor, torch.Tensor], current: tuple[torch.Tensor, torch.Tensor],
           dtype: torch.dtype) -> torch.Tensor:
    """Softmax attention over both key sets from each part's (output (B, H, Q, E), logsumexp (B, H, Q)):
    each output weighted by its share exp(lse_part - lse_all) of the whole partition sum -> (B, H, Q, Dv)."""
    (o_1, lse_1), (o_2, lse_2) = cached, current
    lse = torch.logaddexp(lse_1, lse_2)  # (B, H, Q)
    w_1, w_2 = (torch.exp(part - lse).unsqueeze(-1) for part in (lse_1, lse_2))  # (B, H, Q, 1)
    return torch.addcmul(o_2 * w_2, o_1[..., : o_2.shape[-1]], w_1).to(dtype)


def stacked_inputs(
    q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor, segments: Sequence[Segment]
) -> tuple[torch.Tensor, torch.Tensor]:
    """[cached..., current] keys (B, H, K_total, D) and values (B, H, K_total, Dv) in the shared workspace."""
    batch, heads, _, dim = q.shape
    dv = v_cur.shape[-1]
    total = sum(seg.num_tokens for seg in segments) + k_cur.shape[-2]
    flat = workspace(batch * heads * total * (dim + dv), q.device, q.dtype)
    keys, values = carve(flat, (batch, heads, total, dim), (batch, heads, total, dv))
    start = total - k_cur.shape[-2]
    write_segments(segments, "k", keys[:, :, :start])
    write_segments(segments, "v", values[:, :, :start])
    keys[:, :, start:] = k_cur
    values[:, :, start:] = v_cur
    return keys, values


def _bias_columns(
    q: torch.Tensor, segments: Sequence[Segment], correction: str, scale: float, strength: Strength
) -> tuple[dict, Callable[[torch.Tensor, tuple, torch.Tensor], None]] | None:
    """Per step kind: query columns (B, H, Q, C_kind) pre-divided by -scale/strength, and a function writing
    key columns (B, H, K, C_kind) of token steps (B, H, K, G) into a view, so that
    scale * q_cols.k_cols = -strength * bias.

    Taylor: C = G, q_cols ~ qn2, k_cols = step^2. Exact: the series form, C = G * N terms; None when
    some |x| may exceed SERIES_MAX_ARG (the caller then uses the elementwise bias as a mask).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    weight = strength_view(strength, q, work)  # float or (1, H, 1, 1): multiplies the query columns per head
    kinds: dict[tuple[int, int], list[tuple[torch.Tensor, object]]] = {}
    for seg in segments:
        if seg.has_steps:
            kinds.setdefault(step_kind(seg), []).append(token_steps(seg))
    q_cols, key_params = {}, {}
    for kind, members in kinds.items():
        groups, rotation = kind[0], members[0][1]
        qb = q.to(work) if rotation is None else rotation.apply(q.to(work))  # (B, H, Q, D) in the steps' basis
        if correction == "taylor":
            q_cols[kind] = -(weight * scale / 24.0) * query_group_sq_norms(qb, groups)  # (B, H, Q, G)
            continue
        q_max = qb.abs().amax()
        bound = float(0.5 * scale * q_max * max(float(step_max(step)) for step, _ in members))
        if bound > SERIES_MAX_ARG:
            return None
        terms = series_terms_for(qb, q_max, bound, strength, q.dtype)  # below the resolution of q's dtype
        q_cols[kind] = -(weight / scale) * exact_series_query_columns(qb, groups, q_max, terms)  # (B, H, Q, G*N)
        key_params[kind] = (q_max, terms)

    def key_columns(step: torch.Tensor, kind: tuple, out: torch.Tensor) -> None:
        """Write the key columns (B, H, K, C_kind) derived from token steps (B, H, K, G) into ``out``."""
        if correction == "taylor":
            out.copy_(step)
            out.square_()
            return
        q_max, terms = key_params[kind]
        out.copy_(exact_series_key_columns(step.to(work), scale, q_max, terms))

    return q_cols, key_columns


def _column_runs(segments: Sequence[Segment]) -> list[tuple[int, int, tuple, torch.Tensor]]:
    """(start, end, kind, token steps (B, H, end - start, G)) for each run of consecutive step-carrying
    segments of one kind, their steps concatenated (one write per run instead of one per chunk)."""
    runs, start, current = [], 0, None
    for seg in segments:
        n = seg.num_tokens
        kind = step_kind(seg) if seg.has_steps else None
        if kind is not None and current is not None and current[2] == kind and current[1] == start:
            current[1] = start + n
            current[3].append(token_steps(seg)[0])
        else:
            if current is not None:
                runs.append(current)
            current = [start, start + n, kind, [token_steps(seg)[0]]] if kind is not None else None
        start += n
    if current is not None:
        runs.append(current)
    return [(a, b, kind, steps[0] if len(steps) == 1 else torch.cat(steps, dim=2)) for a, b, kind, steps in runs]


def augmented_inputs(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
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
    total = sum(seg.num_tokens for seg in segments) + k_cur.shape[-2]
    flat = workspace(batch * heads * (2 * total + n_q) * width, q.device, q.dtype)
    k_aug, v_pad, q_aug = carve(flat, (batch, heads, total, width), (batch, heads, total, width),
                                (batch, heads, n_q, width))  # [k, bias key columns], [v, zeros], [q, bias query columns]
    start = total - k_cur.shape[-2]
    write_segments(segments, "k", k_aug[:, :, :start, :dim])
    write_segments(segments, "v", v_pad[:, :, :start, :dv])
    k_aug[..., dim:] = 0
    v_pad[..., dv:] = 0
    for first, end, kind, step in _column_runs(segments):
        col = offsets[kind]
        key_columns(step, kind, k_aug[:, :, first:end, col : col + q_cols[kind].shape[-1]])
    k_aug[:, :, start:, :dim] = k_cur
    v_pad[:, :, start:, :dv] = v_cur
    q_aug[..., :dim] = q
    q_aug[..., dim:] = 0
    for kind, cols in q_cols.items():
        q_aug[..., offsets[kind] : offsets[kind] + cols.shape[-1]] = cols
    return q_aug, k_aug, v_pad


def bias_column_tables(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
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
    total = sum(seg.num_tokens for seg in segments) + k_cur.shape[-2]
    work = q_cols[next(iter(q_cols))].dtype
    k_cols = q.new_zeros(batch, heads, total, width, dtype=work)  # (B, H, K_total, C)
    q_coef = q.new_empty(batch, heads, n_q, width, dtype=work)  # (B, H, Q, C)
    for first, end, kind, step in _column_runs(segments):
        key_columns(step, kind, k_cols[:, :, first:end, offsets[kind] : offsets[kind] + q_cols[kind].shape[-1]])
    for kind, cols in q_cols.items():
        q_coef[..., offsets[kind] : offsets[kind] + cols.shape[-1]] = -scale * cols
    return q_coef, k_cols


def exact_bias_mask(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    segments: Sequence[Segment],
    scale: float,
    strength: Strength,
) -> torch.Tensor:
    """Additive mask (B, H, Q, K_total) in q's dtype: -exact bias on step-carrying cached columns, else 0."""
    weight = strength_view(strength, q)  # float or (1, H, 1, 1)
    blocks = []
    for seg in segments:
        if not seg.has_steps:
            blocks.append(q.new_zeros(*q.shape[:-1], seg.num_tokens))  # (B, H, Q, K_i)
        else:
            blocks.append(-(weight * group_bias(q, seg.steps, "exact", scale)).to(q.dtype))
    blocks.append(q.new_zeros(*q.shape[:-1], k_cur.shape[-2]))  # (B, H, Q, R): current chunk, no bias
    return torch.cat(blocks, dim=-1)


def second_order_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
    query_tile: int | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(s_hat - b (1 - pi)) V, q (B, H, Q, D) -> (B, H, Q, Dv) in q's dtype; float32 work (float64 input:
    float64). ``jensenkv.attention.second_order`` derives the term; pi is the row's softmax of s_hat - b.

    Query tiles of t rows each hold full (B, H, t, K_total) rows: pass 1 the first-order scores s_hat - b and
    their softmax pi, pass 2 s_hat - b + b pi, softmax and @ V. t keeps one score matrix within
    ``_inputs.TILE_ELEMENTS`` (``query_tile`` caps it further). b comes from the bias's factor tables
    (``bias_column_tables``), or the elementwise exact bias per tile when it has no column form.
    """
    batch, heads, n_q, _ = q.shape
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    keys, values = stacked_inputs(q, k_cur, v_cur, segments)  # (B, H, K_total, D), (B, H, K_total, Dv)
    keys_t = keys.to(work).transpose(-1, -2)  # (B, H, D, K_total)
    values = values.to(work)
    tables = bias_column_tables(q, k_cur, segments, correction, scale, strength)
    if tables is not None:
        q_coef, k_cols = tables  # (B, H, Q, C), (B, H, K_total, C)
        k_cols_t = k_cols.transpose(-1, -2)  # (B, H, C, K_total)
    total = keys_t.shape[-1]
    budget = TILE_ELEMENTS.get(q.device.type, TILE_ELEMENTS["cpu"])
    tile = max(1, min(query_tile or n_q, budget // max(1, batch * heads * total)))
    out = q.new_empty(batch, heads, n_q, values.shape[-1])  # (B, H, Q, Dv)
    n_cur = k_cur.shape[2]
    hidden = causal_additive(n_q, total - n_cur, n_cur, work, q.device) if causal else None  # (Q, K_total)
    for start in range(0, n_q, tile):
        rows = slice(start, start + tile)
        q_tile = q[:, :, rows].to(work)  # (B, H, t, D)
        if tables is not None:
            bias = q_coef[:, :, rows] @ k_cols_t  # (B, H, t, K_total), 0 off step-carrying columns
        else:
            bias = -exact_bias_mask(q_tile, k_cur, segments, scale, strength)
        first = scale * q_tile @ keys_t - bias  # (B, H, t, K_total): first-order-corrected scores
        if hidden is not None:
            first = first + hidden[rows]
        scores = second_order_scores(first, bias)  # (B, H, t, K_total)
        out[:, :, rows] = (torch.softmax(scores, dim=-1) @ values).to(q.dtype)
    return out
