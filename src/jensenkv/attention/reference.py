"""The oracle: plain softmax attention over [cached chunks, current chunk] with an explicit bias.

Readable rather than fast: float64 throughout, the full (Q, K) score matrix and the per-channel
reference bias ``jensen_bias`` (which builds (Q, K, D)). Every fast path is tested against it.
"""
from __future__ import annotations

from typing import Sequence

import torch

from jensenkv.attention._inputs import Strength, current_visible, strength_view
from jensenkv.attention.registry import Capabilities, register_backend
from jensenkv.cache import Segment
from jensenkv.correction import bias_basis_query, expand_group_steps, jensen_bias


@register_backend("reference", Capabilities(kv_heads=False, second_order=True, causal=True))
def reference_attention(
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
    """softmax(scale * q K^T - bias) V over the cached segments followed by the current chunk.

    q: (B, H, Q, D); k_cur, v_cur: (B, H, R, D), (B, H, R, Dv); segments: cached chunks, oldest
    first. The bias (``correction`` in "none" | "taylor" | "exact", times ``strength``: a float, or a (H,)
    tensor of per-head strengths) is subtracted from the columns of segments that carry steps only, never
    from the current chunk. ``second_order`` subtracts bias * (1 - pi) instead, pi the row's softmax of the
    first-order-corrected scores (``jensenkv.attention.second_order``). ``causal``: the queries are the last Q
    of the R current tokens and query i sees current token j only if j <= i + R - Q (a causal LM; every cached
    key stays visible). ``scale``: the softmax scale (None: 1/sqrt(D)).
    Returns (B, H, Q, Dv) in q's dtype.
    """
    q64 = q.double()  # (B, H, Q, D)
    weight = strength_view(strength, q64)  # float or (1, H, 1, 1)
    scores, values, biases = [], [], []
    for seg in segments:
        s = scale * q64 @ seg.k.double().transpose(-1, -2)  # (B, H, Q, K_i)
        raw = s
        if correction != "none" and seg.steps is not None:
            step = expand_group_steps(seg.steps, q.shape[-1]).double()  # (B, H, K_i, D)
            s = s - weight * jensen_bias(bias_basis_query(q64, seg.steps), step, correction, scale)
        scores.append(s)
        biases.append(raw - s)  # (B, H, Q, K_i): the bias this segment's columns got (0 without steps)
        values.append(seg.v.double())  # (B, H, K_i, Dv)
    current = scale * q64 @ k_cur.double().transpose(-1, -2)  # (B, H, Q, R): never corrected
    if causal:
        current = current.masked_fill(~current_visible(q.shape[2], k_cur.shape[2], q.device), float("-inf"))
    scores.append(current)
    values.append(v_cur.double())
    logits = torch.cat(scores, dim=-1)  # (B, H, Q, K_total): first-order-corrected scores
    if second_order:  # s_hat - b (1 - pi): add back b * pi, pi = softmax of the first-order scores
        bias = torch.cat(biases + [torch.zeros_like(scores[-1])], dim=-1)  # (B, H, Q, K_total)
        logits = logits + bias * torch.softmax(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)  # (B, H, Q, K_total)
    return (probs @ torch.cat(values, dim=-2)).to(q.dtype)  # (B, H, Q, Dv)
