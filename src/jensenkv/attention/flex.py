"""GPU cached attention with FlexAttention: the Jensen bias as a ``score_mod``.

Taylor: score_mod subtracts sum_j qcoef[b, h, q_idx, j] * step2[b, h, kv_idx, j] with captured
qcoef = strength * scale^2/24 * qn2 (B, H, Q, C) and step2 (B, H, K_total, C) (zeros on the current
chunk and on segments without steps), unrolled over the C columns when C <= ``max_unrolled``; wider
(per-channel steps, C = D) uses the augmented-column form of ``cpu.augmented_inputs``.
Exact: a captured (B, H, Q, K_total) bias table from ``group_bias``. No correction: plain flex.
Compiled on CUDA (the eager path is unfused and O(Q K) memory); eager elsewhere, for tests.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.nn.attention.flex_attention import flex_attention

from jensenkv.attention._inputs import SegmentLike, resolve_scale, validate_attention_inputs
from jensenkv.attention.cpu import augmented_inputs, exact_bias_mask

_compiled_flex: Callable | None = None


def _flex(compile_kernel: bool) -> Callable:
    global _compiled_flex
    if not compile_kernel:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


def flex_cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str = "none",
    scale: float | None = None,
    strength: float = 1.0,
    max_unrolled: int = 16,
    compile_kernel: bool | None = None,
) -> torch.Tensor:
    """Same contract as ``reference_attention``: q (B, H, Q, D), k_cur/v_cur (B, H, R, D/Dv) -> (B, H, Q, Dv).

    ``compile_kernel`` defaults to True on CUDA tensors, False otherwise.
    """
    validate_attention_inputs(q, k_cur, v_cur, segments, correction, strength)
    if max_unrolled < 1:
        raise ValueError(f"max_unrolled={max_unrolled} is not allowed: it must be >= 1")
    scale = resolve_scale(scale, q.shape[-1])
    attend = _flex(q.is_cuda if compile_kernel is None else compile_kernel)
    keys = torch.cat([seg.k.to(q.dtype) for seg in segments] + [k_cur], dim=-2)  # (B, H, K_total, D)
    values = torch.cat([seg.v.to(v_cur.dtype) for seg in segments] + [v_cur], dim=-2)  # (B, H, K_total, Dv)
    if correction == "none" or all(seg.steps is None for seg in segments):
        return attend(q, keys, values, scale=scale)
    if correction == "exact":
        bias = -exact_bias_mask(q.float(), k_cur.float(), segments, scale, strength)  # (B, H, Q, K_total)

        def exact_mod(score, b, h, q_idx, kv_idx):
            return score - bias[b, h, q_idx, kv_idx]

        return attend(q, keys, values, score_mod=exact_mod, scale=scale)
    # taylor: reuse the augmented columns, either as columns or as captured tables
    q_aug, k_aug, v_pad = augmented_inputs(q.float(), k_cur.float(), v_cur.float(), segments, "taylor", scale, strength)
    dim, dv = q.shape[-1], v_cur.shape[-1]
    if q_aug.shape[-1] - dim > max_unrolled:
        out = attend(q_aug.to(q.dtype), k_aug.to(q.dtype), v_pad.to(v_cur.dtype), scale=scale)
        return out[..., :dv]
    qcoef = -scale * q_aug[..., dim:].contiguous()  # (B, H, Q, C): strength * scale^2/24 * qn2
    step2 = k_aug[..., dim:].contiguous()  # (B, H, K_total, C): step^2, zeros where uncorrected
    columns = qcoef.shape[-1]

    def taylor_mod(score, b, h, q_idx, kv_idx):
        bias = qcoef[b, h, q_idx, 0] * step2[b, h, kv_idx, 0]
        for j in range(1, columns):
            bias = bias + qcoef[b, h, q_idx, j] * step2[b, h, kv_idx, j]
        return score - bias

    return attend(q, keys, values, score_mod=taylor_mod, scale=scale)
