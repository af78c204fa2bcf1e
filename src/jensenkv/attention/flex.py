"""GPU cached attention with FlexAttention: the Jensen bias as a ``score_mod``.

Keys and values are dequantized into the shared workspace (``attention.workspace``); only the bias's
factors are built besides: q_coef (B, H, Q, C) and k_cols (B, H, K_total, C) from
``cpu.bias_column_tables`` (Taylor: C = G columns, strength * scale^2/24 * qn2 and step^2; exact:
the series form, G x terms columns), zeros on the current chunk and on segments without steps. The
score_mod subtracts sum_c q_coef[b, h, q_idx, c] * k_cols[b, h, kv_idx, c], unrolled over the C
columns when C <= ``max_unrolled``. Wider (per-channel steps, C = D; long series) folds the columns
into q and k (``cpu.augmented_inputs``), and an exact bias outside the series' range becomes a
captured (B, H, Q, K_total) table. Compiled on CUDA (the eager path is unfused and O(Q K) memory);
eager elsewhere, for tests.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from jensenkv.attention._inputs import Strength
from jensenkv.attention.cpu import augmented_inputs, bias_column_tables, exact_bias_mask, stacked_inputs
from jensenkv.attention.registry import Capabilities, register_backend
from jensenkv.cache import Segment

_compiled_flex: Callable | None = None


def _flex(compile_kernel: bool) -> Callable:
    global _compiled_flex
    # imported here: flex_attention pulls in sympy and torch.fx (0.3 s) that no other backend needs
    from torch.nn.attention.flex_attention import flex_attention

    if not compile_kernel:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


# the score_mod cannot see a row's softmax (second order) and the kernel has no causal mask
@register_backend("flex", Capabilities(kv_heads=False, second_order=False, causal=False))
def flex_cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
    second_order: bool,
    causal: bool,
    max_unrolled: int = 16,
    compile_kernel: bool | None = None,
) -> torch.Tensor:
    """Same contract as ``reference_attention``: q (B, H, Q, D), k_cur/v_cur (B, H, R, D/Dv) -> (B, H, Q, Dv).

    ``compile_kernel`` defaults to True on CUDA tensors, False otherwise. ``strength``: a float or a (H,)
    tensor of per-head strengths, folded into q_coef (or the bias table) before the kernel. ``second_order`` and
    ``causal`` are refused before the call (its capabilities): ValueError naming the backends that take them.
    """
    if max_unrolled < 1:
        raise ValueError(f"max_unrolled={max_unrolled} is not allowed: it must be >= 1")
    attend = _flex(q.is_cuda if compile_kernel is None else compile_kernel)
    if correction == "none" or not any(seg.has_steps for seg in segments):
        keys, values = stacked_inputs(q, k_cur, v_cur, segments)  # (B, H, K_total, D), (B, H, K_total, Dv)
        return attend(q, keys, values, scale=scale)
    tables = bias_column_tables(q.float(), k_cur, segments, correction, scale, strength)
    if tables is None:  # exact bias beyond the series' range: a captured table
        bias = -exact_bias_mask(q.float(), k_cur.float(), segments, scale, strength)  # (B, H, Q, K_total)
        keys, values = stacked_inputs(q, k_cur, v_cur, segments)

        def table_mod(score, b, h, q_idx, kv_idx):
            return score - bias[b, h, q_idx, kv_idx]

        return attend(q, keys, values, score_mod=table_mod, scale=scale)
    q_coef, k_cols = tables  # (B, H, Q, C), (B, H, K_total, C)
    columns = q_coef.shape[-1]
    if columns > max_unrolled:
        q_aug, k_aug, v_pad = augmented_inputs(q, k_cur, v_cur, segments, correction, scale, strength)
        return attend(q_aug, k_aug, v_pad, scale=scale)[..., : v_cur.shape[-1]]
    keys, values = stacked_inputs(q, k_cur, v_cur, segments)

    def column_mod(score, b, h, q_idx, kv_idx):
        bias = q_coef[b, h, q_idx, 0] * k_cols[b, h, kv_idx, 0]
        for c in range(1, columns):
            bias = bias + q_coef[b, h, q_idx, c] * k_cols[b, h, kv_idx, c]
        return score - bias

    return attend(q, keys, values, score_mod=column_mod, scale=scale)
