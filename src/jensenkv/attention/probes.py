"""Attention diagnostics of one layer call: how much mass the (quantized) cache takes.

Compares the quantized (+ corrected) attention with the full-precision reference cache (the
segments' k_ref / v_ref; the keys/values themselves where absent) one head and one query tile at a
time, so at most one (tile, K_total) score matrix exists at once.
"""
from __future__ import annotations

from typing import Sequence

import torch

from jensenkv.attention._inputs import SegmentLike, resolve_scale, validate_attention_inputs
from jensenkv.correction import GroupSteps, group_bias

PROBE_KEYS = (
    "p_s", "p_r", "p_s_ref", "delta_p_s", "jsd", "out_mse", "out_rel_err", "bias_mean",
    "p_s_head_median", "delta_p_s_head_median",
)


def attention_probes(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str = "none",
    scale: float | None = None,
    strength: float = 1.0,
    query_tile: int = 1024,
) -> dict[str, float]:
    """Probe statistics (all float, evaluated in float32), keys ``PROBE_KEYS``:

    p_s / p_r: softmax mass on cached / current keys of the quantized (+ corrected) attention, mean
    over batch, heads and queries; p_s_ref: the same with the full-precision cache and no bias;
    delta_p_s = p_s - p_s_ref; jsd: mean over rows of the Jensen-Shannon divergence (natural log)
    between quantized and reference rows; out_mse, out_rel_err: attention output vs the reference
    output (mean squared error, ||o - o_ref|| / ||o_ref||); bias_mean: mean bias subtracted on
    step-carrying cached keys (0 without correction); *_head_median: median over heads of the
    per-head mean (over batch and queries).
    q: (B, H, Q, D); k_cur, v_cur: (B, H, R, D), (B, H, R, Dv).
    """
    validate_attention_inputs(q, k_cur, v_cur, segments, correction, strength)
    if query_tile < 1:
        raise ValueError(f"query_tile={query_tile} is not allowed: it must be >= 1")
    scale = resolve_scale(scale, q.shape[-1])
    batch, heads, n_q, _ = q.shape
    n_cached = sum(seg.k.shape[-2] for seg in segments)
    head_p_s = torch.zeros(heads, dtype=torch.float64)
    head_p_s_ref = torch.zeros(heads, dtype=torch.float64)
    jsd_sum = sq_err_sum = sq_ref_sum = bias_sum = 0.0
    bias_count = 0
    for b in range(batch):
        for h in range(heads):
            keys = torch.cat([seg.k[b, h] for seg in segments] + [k_cur[b, h]]).float()  # (K_total, D)
            values = torch.cat([seg.v[b, h] for seg in segments] + [v_cur[b, h]]).float()  # (K_total, Dv)
            keys_ref = torch.cat([_ref(seg, "k")[b, h] for seg in segments] + [k_cur[b, h]]).float()
            values_ref = torch.cat([_ref(seg, "v")[b, h] for seg in segments] + [v_cur[b, h]]).float()
            for start in range(0, n_q, query_tile):
                q_tile = q[b, h, start : start + query_tile].float()  # (t, D)
                scores = scale * q_tile @ keys.T  # (t, K_total)
                if correction != "none":
                    offset = 0
                    for seg in segments:
                        width = seg.k.shape[-2]
                        if seg.steps is not None:
                            head_steps = GroupSteps(seg.steps.step[b : b + 1, h : h + 1], seg.steps.rotation)
                            bias = group_bias(q_tile[None, None], head_steps, correction, scale, strength)[0, 0]
                            scores[:, offset : offset + width] -= bias  # (t, K_i)
                            bias_sum += bias.double().sum().item()
                            bias_count += bias.numel()
                        offset += width
                probs = torch.softmax(scores, dim=-1)  # (t, K_total)
                probs_ref = torch.softmax(scale * q_tile @ keys_ref.T, dim=-1)  # (t, K_total)
                head_p_s[h] += probs[:, :n_cached].sum().item()
                head_p_s_ref[h] += probs_ref[:, :n_cached].sum().item()
                jsd_sum += jensen_shannon(probs, probs_ref).double().sum().item()
                out, out_ref = probs @ values, probs_ref @ values_ref  # (t, Dv)
                sq_err_sum += (out - out_ref).double().square().sum().item()
                sq_ref_sum += out_ref.double().square().sum().item()
    rows = batch * n_q
    head_p_s, head_p_s_ref = head_p_s / rows, head_p_s_ref / rows  # (H,) per-head means
    p_s, p_s_ref = head_p_s.mean().item(), head_p_s_ref.mean().item()
    return {
        "p_s": p_s,
        "p_r": 1.0 - p_s,
        "p_s_ref": p_s_ref,
        "delta_p_s": p_s - p_s_ref,
        "jsd": jsd_sum / (rows * heads),
        "out_mse": sq_err_sum / (rows * heads * v_cur.shape[-1]),
        "out_rel_err": (sq_err_sum / max(sq_ref_sum, torch.finfo(torch.float64).tiny)) ** 0.5,
        "bias_mean": bias_sum / bias_count if bias_count else 0.0,
        "p_s_head_median": head_p_s.median().item(),
        "delta_p_s_head_median": (head_p_s - head_p_s_ref).median().item(),
    }


def _ref(seg: SegmentLike, name: str) -> torch.Tensor:
    """The segment's full-precision k/v if kept, else its (possibly quantized) own."""
    ref = getattr(seg, f"{name}_ref", None)
    return getattr(seg, name) if ref is None else ref


def jensen_shannon(p: torch.Tensor, p_ref: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence in nats: (..., K), (..., K) -> (...), in [0, log 2]."""
    mid = 0.5 * (p + p_ref)
    kl_p = (torch.xlogy(p, p) - torch.xlogy(p, mid)).sum(-1)
    kl_ref = (torch.xlogy(p_ref, p_ref) - torch.xlogy(p_ref, mid)).sum(-1)
    return (0.5 * (kl_p + kl_ref)).clamp_min(0.0)
