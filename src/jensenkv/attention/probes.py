"""Attention diagnostics of one layer call: how much mass the (quantized) cache takes.

Compares the quantized (+ corrected) attention with the full-precision reference cache (the
segments' k_ref / v_ref; the keys/values themselves where absent). Every batch element and head is
handled at once, over query tiles sized so that one (B, H, tile, K_total) score matrix stays within
``TILE_ELEMENTS``. Sums are accumulated on the inputs' device and read back once at the end, so a call
costs one host sync for the results (plus one for the exact bias's series/elementwise choice).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Sequence

import torch

from jensenkv.attention._inputs import TILE_ELEMENTS, Strength, current_visible, strength_view
from jensenkv.attention.cpu import write_segments
from jensenkv.attention.registry import Capabilities, check_call
from jensenkv.attention.second_order import second_order_scores
from jensenkv.cache import Segment
from jensenkv.correction import (
    _SERIES_TERMS_GROUP,
    SERIES_MAX_ARG,
    bias_basis_query,
    exact_group_bias_split,
    exact_series_columns,
    query_group_sq_norms,
)

PROBE_KEYS = (
    "p_s", "p_r", "p_s_ref", "delta_p_s", "jsd", "out_mse", "out_rel_err", "bias_mean",
    "p_s_head_median", "delta_p_s_head_median",
)
# the probes see full score rows: they take the second-order term and the causal mask as the backends that do
PROBE_CAPABILITIES = Capabilities(kv_heads=False, second_order=True, causal=True)
_LOG2 = math.log(2.0)
_HIDDEN = -1e9  # the score of a current token a causal query may not see: far below any real score


def attention_probes(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str = "none",
    scale: float | None = None,
    strength: Strength = 1.0,
    query_tile: int = 1024,
    second_order: bool = False,
    attended: torch.Tensor | None = None,
    causal: bool = False,
) -> dict[str, float]:
    """Probe statistics (all float; float32 work, float64 for float64 input), keys ``PROBE_KEYS``:

    p_s / p_r: softmax mass on cached / current keys of the quantized (+ corrected) attention, mean
    over batch, heads and queries; p_s_ref: the same with the full-precision cache and no bias;
    delta_p_s = p_s - p_s_ref; jsd: mean over rows of the Jensen-Shannon divergence (natural log, in
    [0, log 2]) between quantized and reference rows; out_mse, out_rel_err: attention output vs the
    reference output (mean squared error, ||o - o_ref|| / ||o_ref||); strength: a float or a (H,) tensor of
    per-head strengths; bias_mean: mean (strength-weighted) bias subtracted on
    step-carrying cached keys (0 without correction); *_head_median: median over heads of the
    per-head mean (over batch and queries). ``second_order``: the quantized attention uses the scores
    s_hat - b (1 - pi) the attention backends use (``jensenkv.attention.second_order``), and bias_mean is the
    mean of b (1 - pi), the amount actually subtracted.
    q: (B, H, Q, D); k_cur, v_cur: (B, H, R, D), (B, H, R, Dv). query_tile caps the rows per tile.
    ``attended``: the output (B, H, Q, Dv) the attention call already computed from these very inputs, used as
    the quantized output instead of recomputing it (used only in the work dtype: a lower-precision output
    would move out_mse); the scores of the current chunk's keys, equal on both sides, are computed once.
    ``causal``: as in the attention paths, the current chunk's later tokens are hidden from each query (a causal
    LM); p_r is then the mass on the current tokens each query sees.
    """
    scale = check_call(PROBE_CAPABILITIES, "probes", q, k_cur, v_cur, segments, correction, scale, strength,
                       second_order, causal)
    if query_tile < 1:
        raise ValueError(f"query_tile={query_tile} is not allowed: it must be >= 1")
    expected = (*q.shape[:-1], v_cur.shape[-1])
    if attended is not None and tuple(attended.shape) != expected:
        raise ValueError(f"attended with shape {tuple(attended.shape)} is not allowed: expected {expected} "
                         "(B, H, Q, Dv), the attention output of these inputs")
    batch, heads, n_q, _ = q.shape
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    device = q.device
    reuse = attended is not None and attended.dtype == work
    # cached keys (2, B, H, K_cached, D); values (2, B, H, K_total, Dv), or the reference's alone (1, ...) when the
    # quantized output is reused: index -1 is the reference either way
    keys, values = _stacked_pair(segments, k_cur, v_cur, work, quantized_values=not reuse)
    n_cached = keys.shape[-2]
    n_total = n_cached + k_cur.shape[-2]
    qw = q.to(work)  # (B, H, Q, D)
    biases = _segment_biases(qw, segments, correction, scale, strength) if correction != "none" else []
    bias_count = sum(batch * heads * n_q * seg.num_tokens for seg in segments if seg.has_steps)

    acc = torch.float64 if device.type == "cpu" or work == torch.float64 else torch.float32
    head_p_s = torch.zeros(2, heads, dtype=acc, device=device)  # quantized, reference
    sums = torch.zeros(4, dtype=acc, device=device)  # jsd, squared error, squared reference, bias
    budget = TILE_ELEMENTS.get(device.type, TILE_ELEMENTS["cpu"])
    tile = max(1, min(query_tile, budget // max(1, 2 * batch * heads * n_total)))
    cached_keys_t = keys.transpose(-1, -2)  # (2, B, H, D, K_cached)
    current_keys_t = k_cur.to(work).transpose(-1, -2)  # (B, H, D, R): the same on both sides
    hidden = ~current_visible(n_q, k_cur.shape[2], device) if causal else None  # (Q, R): later current tokens
    for start in range(0, n_q, tile):
        rows = slice(start, start + tile)
        q_tile = qw[:, :, rows]  # (B, H, t, D)
        both = q_tile.new_empty(2, batch, heads, q_tile.shape[2], n_total)  # (2, B, H, t, K_total)
        both[..., :n_cached] = scale * q_tile @ cached_keys_t  # quantized (+ bias below), reference
        both[..., n_cached:] = scale * q_tile @ current_keys_t  # (B, H, t, R) broadcast to both
        if hidden is not None:  # finite, so the fast JSD applies: exp underflows to exactly 0 on both sides, and
            both[..., n_cached:].masked_fill_(hidden[rows], _HIDDEN)  # each hidden term weighs < 1e-29
        scores = both[0]  # (B, H, t, K_total), a view
        full_bias = torch.zeros_like(scores) if second_order and biases else None  # (B, H, t, K_total)
        for offset, width, bias_of in biases:
            bias = bias_of(rows)  # (B, H, t, K_i)
            scores[..., offset : offset + width] -= bias
            sums[3] += bias.sum()
            if full_bias is not None:
                full_bias[..., offset : offset + width] = bias
        if full_bias is not None:  # s_hat - b (1 - pi): b pi added back, so b pi leaves the subtracted sum
            raised = second_order_scores(scores, full_bias)
            sums[3] -= (raised - scores).sum()
            both[0] = raised
        log_both = torch.log_softmax(both, dim=-1)  # (2, B, H, t, K_total)
        p_both = log_both.exp()
        head_p_s += p_both[..., :n_cached].sum((1, 3, 4))  # (2, H)
        sums[0] += _jensen_shannon_finite(p_both[0], p_both[1], log_both[0], log_both[1]).sum()
        if reuse:
            out, out_ref = attended[:, :, rows], p_both[1] @ values[-1]  # (B, H, t, Dv) each
        else:
            out, out_ref = p_both @ values  # (B, H, t, Dv) each: quantized, reference
        sums[1] += (out - out_ref).square().sum()
        sums[2] += out_ref.square().sum()
    rows_total = batch * n_q
    head_p_s, head_p_s_ref = head_p_s[0] / rows_total, head_p_s[1] / rows_total  # (H,) per-head means
    stats = torch.cat([sums, head_p_s.mean()[None], head_p_s_ref.mean()[None], head_p_s.median()[None],
                       (head_p_s - head_p_s_ref).median()[None]]).tolist()  # the one read-back
    jsd_sum, sq_err_sum, sq_ref_sum, bias_sum, p_s, p_s_ref, p_s_median, delta_median = stats
    return {
        "p_s": p_s,
        "p_r": 1.0 - p_s,
        "p_s_ref": p_s_ref,
        "delta_p_s": p_s - p_s_ref,
        "jsd": jsd_sum / (rows_total * heads),
        "out_mse": sq_err_sum / (rows_total * heads * v_cur.shape[-1]),
        "out_rel_err": (sq_err_sum / max(sq_ref_sum, torch.finfo(torch.float64).tiny)) ** 0.5,
        "bias_mean": bias_sum / bias_count if bias_count and correction != "none" else 0.0,
        "p_s_head_median": p_s_median,
        "delta_p_s_head_median": delta_median,
    }


def _segment_biases(q: torch.Tensor, segments: Sequence[Segment], correction: str, scale: float,
                    strength: Strength) -> list[tuple[int, int, Callable[[slice], torch.Tensor]]]:
    """(column offset, width, rows -> strength * bias (B, H, t, K_i)) per step-carrying segment.

    The query factors are computed once for all rows; the exact bias's series-or-elementwise choice is
    made once per call for all segments (one host read), not per tile.
    """
    entries, offset = [], 0
    for seg in segments:
        width = seg.num_tokens  # a cache view's stored shape: reading seg.k would dequantize the chunk again
        if seg.has_steps:
            entries.append((offset, width, seg.steps))
        offset += width
    if not entries:
        return []
    strength = strength_view(strength, q)  # float or (1, H, 1, 1): every bias below is (B, H, ...)
    out = []
    if correction == "taylor":  # adjacent segments of one (G, rotation) share the query factor: one product
        runs: list[list] = []  # [offset, width, steps, [step (B, H, K_i, G), ...]]
        for offset, width, steps in entries:
            last = runs[-1] if runs else None
            if last and last[0] + last[1] == offset and _same_kind(last[2], steps):
                last[1] += width
                last[3].append(steps.step)
            else:
                runs.append([offset, width, steps, [steps.step]])
        for offset, width, steps, parts in runs:
            step = torch.cat(parts, dim=2).to(q.dtype) if len(parts) > 1 else parts[0].to(q.dtype)  # (B, H, K, G)
            qn2 = query_group_sq_norms(bias_basis_query(q, steps), step.shape[-1]) \
                * (strength * scale * scale / 24.0)  # (B, H, Q, G)
            k_cols = step.square().transpose(-1, -2)  # (B, H, G, K)
            out.append((offset, width, lambda rows, a=qn2, b=k_cols: a[:, :, rows] @ b))
        return out
    based = [bias_basis_query(q, steps) for _, _, steps in entries]  # (B, H, Q, D) each
    steps_w = [steps.step.to(q.dtype) for _, _, steps in entries]  # (B, H, K_i, G) each
    q_maxes = torch.stack([qb.abs().amax() for qb in based])  # (S,)
    bounds = 0.5 * scale * q_maxes * torch.stack([step.abs().amax() for step in steps_w])
    use_series = ((q_maxes == 0) | (bounds <= SERIES_MAX_ARG)).tolist()  # one host read for all segments
    for (offset, width, _), qb, step, q_max, series in zip(entries, based, steps_w, q_maxes, use_series):
        if series:
            # (B, H, Q, G*N), (B, H, K_i, G*N)
            q_cols, k_cols = exact_series_columns(qb, step, scale, q_max, _SERIES_TERMS_GROUP)
            k_t = k_cols.transpose(-1, -2) * strength
            out.append((offset, width, lambda rows, a=q_cols, b=k_t: a[:, :, rows] @ b))
        else:
            out.append((offset, width,
                        lambda rows, a=qb, b=step: strength * exact_group_bias_split(a[:, :, rows], b, scale)))
    return out


def _stacked_pair(segments: Sequence[Segment], k_cur: torch.Tensor, v_cur: torch.Tensor, work: torch.dtype,
                  quantized_values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached keys (2, B, H, K_cached, D) and [cached..., current] values (2, B, H, K_total, Dv) in ``work``: index
    0 the (quantized) cache, 1 its full-precision reference, so that both attentions run as one batched op each.
    ``quantized_values=False``: the reference's values alone, (1, B, H, K_total, Dv) (the caller reuses the
    quantized output, so the quantized values would be dequantized for nothing). The current keys, the same on
    both sides, are the caller's.

    Cache views are dequantized from their stored form as the attention paths do (``cpu.write_segments``: chunks
    of one RTN layout in one pass), without building the view's own per-chunk copies."""
    batch, heads, current, dv = v_cur.shape
    n_cached = sum(seg.num_tokens for seg in segments)
    dim = k_cur.shape[-1]
    keys = v_cur.new_empty(2, batch, heads, n_cached, dim, dtype=work)  # (2, B, H, K_cached, D)
    sides = 2 if quantized_values else 1
    values = v_cur.new_empty(sides, batch, heads, n_cached + current, dv, dtype=work)  # (sides, B, H, K_total, Dv)
    for name, out in (("k", keys), ("v", values)):
        quantized = out[0] if out.shape[0] == 2 else None  # (B, H, K, D) or None
        if quantized is not None and work == torch.float32:  # the stored form dequantizes to float32, as seg.k / seg.v would
            write_segments(segments, name, quantized[:, :, :n_cached])
        start = 0
        for seg in segments:
            width = seg.num_tokens
            if quantized is not None and work != torch.float32:
                quantized[:, :, start : start + width] = seg.dequantized(name)
            out[-1, :, :, start : start + width] = seg.reference(name)
            start += width
    values[:, :, :, n_cached:] = v_cur
    return keys, values


def _same_kind(a, b) -> bool:
    """Two segments' GroupSteps share the bias's query factor: equal group count, the same rotation object."""
    return a.step.shape[-1] == b.step.shape[-1] and a.rotation is b.rotation


def evenly_spaced(total: int, count: int | None) -> tuple[int, ...]:
    """``count`` indices out of range(total), evenly spaced with the first and last included (all when count
    is None or >= total): the layers / denoising steps to probe on a large model, e.g. 4 of 30 layers ->
    (0, 10, 19, 29), 5 of 30 steps -> (0, 7, 14, 22, 29), 5 of 4 steps -> (0, 1, 2, 3)."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"total={total!r} is not allowed: it must be an integer >= 1")
    if count is None or count >= total:
        return tuple(range(total))
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count={count!r} is not allowed: it must be null (all) or an integer >= 1")
    if count == 1:
        return (0,)
    return tuple(sorted({round(i * (total - 1) / (count - 1)) for i in range(count)}))


def _jensen_shannon_finite(p: torch.Tensor, r: torch.Tensor, log_p: torch.Tensor,
                           log_r: torch.Tensor) -> torch.Tensor:
    """``jensen_shannon_log`` for finite log-probabilities (finite scores), given their exponentials too.

    With d = log r - log p and s = log(1 + r/p) = log(p + r) - log p: log p - log m = log 2 - s and
    log r - log m = log 2 - s + d, so 2 JSD = sum (p + r)(log 2 - s) + r d: one log per element (softplus(d)
    would cost an exp and a log1p). Where p + r underflows to 0 both terms vanish; the clamp keeps the log finite.
    """
    d = log_r - log_p  # (..., K)
    m = (p + r).clamp_min_(torch.finfo(p.dtype).tiny)  # a clamped element weighs <= tiny * |log 2 - s|: nothing
    terms = torch.log(m).sub_(log_p).neg_().add_(_LOG2).mul_(m).addcmul_(r, d)  # (p + r)(log 2 - s) + r d, in place
    return (0.5 * terms.sum(-1)).clamp(0.0, _LOG2)


def jensen_shannon_log(log_p: torch.Tensor, log_r: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence in nats from log-probabilities: (..., K), (..., K) -> (...).

    Worked in log space: log m = logaddexp(log p, log r) - log 2 never underflows where one side is tiny
    and the other zero, and each term p (log p - log m) <= p log 2, so the result lies in [0, log 2].
    """
    log_m = torch.logaddexp(log_p, log_r) - _LOG2
    zero = torch.zeros((), dtype=log_p.dtype, device=log_p.device)
    kl_p = torch.where(log_p > -math.inf, log_p.exp() * (log_p - log_m), zero).sum(-1)
    kl_r = torch.where(log_r > -math.inf, log_r.exp() * (log_r - log_m), zero).sum(-1)
    return (0.5 * (kl_p + kl_r)).clamp(0.0, _LOG2)


def jensen_shannon(p: torch.Tensor, p_ref: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence in nats: (..., K), (..., K) -> (...), in [0, log 2]."""
    return jensen_shannon_log(p.log(), p_ref.log())
