"""Checks and helpers shared by every attention path (reference, CPU, flex, probes)."""
from __future__ import annotations

import math
from typing import Protocol, Sequence

import torch

from jensenkv.correction import CORRECTIONS, GroupSteps, validate_group_steps  # noqa: F401 - re-exported


class SegmentLike(Protocol):
    """What the attention paths read from a cached chunk (``jensenkv.cache.CacheSegment``)."""

    k: torch.Tensor  # (B, H, K, D) dequantized keys, original basis
    v: torch.Tensor  # (B, H, K, Dv)
    steps: GroupSteps | None  # None: full-precision keys, never corrected
    k_ref: torch.Tensor | None  # (B, H, K, D) full-precision keys (probes only)
    v_ref: torch.Tensor | None  # (B, H, K, Dv)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(D) unless given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def validate_attention_inputs(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str,
    strength: float = 1.0,
) -> None:
    """Raise ValueError naming the argument, its value and what is allowed."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r} is not allowed: use one of {CORRECTIONS}")
    if not math.isfinite(strength):
        raise ValueError(f"strength={strength} is not allowed: it must be a finite number")
    if q.ndim != 4:
        raise ValueError(f"q.shape={tuple(q.shape)} is not allowed: q must be (B, H, Q, D)")
    batch, heads, _, dim = q.shape
    if k_cur.ndim != 4 or k_cur.shape[:2] != (batch, heads) or k_cur.shape[-1] != dim:
        raise ValueError(
            f"k_cur.shape={tuple(k_cur.shape)} does not fit q.shape={tuple(q.shape)}: "
            f"k_cur must be (B={batch}, H={heads}, R, D={dim})"
        )
    if v_cur.ndim != 4 or v_cur.shape[:3] != k_cur.shape[:3]:
        raise ValueError(
            f"v_cur.shape={tuple(v_cur.shape)} does not fit k_cur.shape={tuple(k_cur.shape)}: "
            "v_cur must be (B, H, R, Dv) with the same B, H, R"
        )
    value_dim = v_cur.shape[-1]
    total = k_cur.shape[2]
    for i, seg in enumerate(segments):
        if seg.k.ndim != 4 or seg.k.shape[:2] != (batch, heads) or seg.k.shape[-1] != dim:
            raise ValueError(
                f"segments[{i}].k.shape={tuple(seg.k.shape)} does not fit q.shape={tuple(q.shape)}: "
                f"it must be (B={batch}, H={heads}, K, D={dim})"
            )
        if seg.v.ndim != 4 or seg.v.shape[:3] != seg.k.shape[:3] or seg.v.shape[-1] != value_dim:
            raise ValueError(
                f"segments[{i}].v.shape={tuple(seg.v.shape)} does not fit segments[{i}].k.shape="
                f"{tuple(seg.k.shape)}: it must be (B, H, K, Dv={value_dim})"
            )
        for name in ("k_ref", "v_ref"):
            ref = getattr(seg, name, None)
            own = seg.k if name == "k_ref" else seg.v
            if ref is not None and ref.shape != own.shape:
                raise ValueError(
                    f"segments[{i}].{name}.shape={tuple(ref.shape)} must equal the shape "
                    f"{tuple(own.shape)} of the quantized tensor"
                )
        if seg.steps is not None:
            validate_group_steps(q, seg.steps, argument=f"segments[{i}].steps")
            if seg.steps.step.shape[2] != seg.k.shape[2]:
                raise ValueError(
                    f"segments[{i}].steps.step.shape={tuple(seg.steps.step.shape)} does not fit "
                    f"segments[{i}].k.shape={tuple(seg.k.shape)}: one step row per cached key"
                )
        total += seg.k.shape[2]
    if total == 0:
        raise ValueError("segments=[] and k_cur has R=0 tokens: attention needs at least one key")
