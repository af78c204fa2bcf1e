"""Checks and helpers shared by every attention path (reference, CPU, flex, probes)."""
from __future__ import annotations

import math
from typing import Sequence, Union

import torch

from jensenkv.cache import GivenTensor, Segment
from jensenkv.correction import CORRECTIONS, validate_group_steps  # noqa: F401 - re-exported




# Elements of one (B, H, tile, K_total) score matrix of a full-row path (probes, second-order attention); a
# handful of them live at once per tile. Large tiles keep a GPU busy; on the CPU smaller ones stay in cache.
TILE_ELEMENTS = {"cuda": 1 << 25, "cpu": 1 << 21}


def check_causal(causal: object, n_q: int, n_cur: int) -> None:
    """Raise ValueError unless ``causal`` is a bool and, when true, the Q queries can be the last Q of the R
    current tokens (R >= Q): a causal LM's teacher-forced or decoding call."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r} is not allowed: it must be true or false")
    if causal and n_cur < n_q:
        raise ValueError(f"causal=True with Q={n_q} queries and R={n_cur} current tokens is not allowed: the "
                         "queries are the last Q of the current tokens, so R >= Q")


def current_visible(n_q: int, n_cur: int, device: torch.device | str) -> torch.Tensor:
    """(Q, R) bool: query i sees current token j iff j <= i + R - Q (the queries are the current chunk's last Q
    tokens: bottom-right aligned, as flash-attention's causal mask)."""
    rows = torch.arange(n_q, device=device).unsqueeze(1) + (n_cur - n_q)  # (Q, 1): each query's own position
    return torch.arange(n_cur, device=device).unsqueeze(0) <= rows  # (Q, R)


def causal_additive(n_q: int, n_cached: int, n_cur: int, dtype: torch.dtype,
                    device: torch.device | str) -> torch.Tensor:
    """(Q, K_cached + R) additive mask: 0 where visible (every cached key; current keys up to the query's own
    position), -inf on the current chunk's later tokens."""
    mask = torch.zeros(n_q, n_cached + n_cur, dtype=dtype, device=device)  # (Q, K_total)
    mask[:, n_cached:].masked_fill_(~current_visible(n_q, n_cur, device), float("-inf"))
    return mask


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(D) unless given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


Strength = Union[float, torch.Tensor]  # a global float, or a (H,) tensor of per-query-head strengths


def check_strength(strength: Strength, heads: int) -> None:
    """Raise ValueError unless ``strength`` is a finite number or a real (H=heads,) tensor of finite strengths.

    Signed values are allowed (a negative strength adds the bias). A tensor's values are checked where that
    costs no device sync: on the CPU; a device tensor is the caller's to check where it is made
    (``jensenkv.calibration`` checks a calibration file's on load).
    """
    if isinstance(strength, torch.Tensor):
        if strength.ndim != 1 or strength.shape[0] != heads or not strength.dtype.is_floating_point:
            raise ValueError(
                f"strength has shape {tuple(strength.shape)} and dtype {strength.dtype}: a per-head strength must "
                f"be a floating tensor of shape (H,) = ({heads},), one finite value per query head, or a float"
            )
        if strength.device.type == "cpu" and not bool(torch.isfinite(strength).all()):
            raise ValueError(f"strength={strength.tolist()} is not allowed: every per-head strength must be finite")
        return
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
        raise ValueError(f"strength={strength!r} is not allowed: it must be a finite number or a (H,) tensor "
                         "of finite per-head strengths")


def strength_view(strength: Strength, like: torch.Tensor, dtype: torch.dtype | None = None) -> Strength:
    """A float as it is; a (H,) tensor as a (1, H, 1, 1) view on ``like``'s device (in ``dtype``, default
    ``like``'s), to multiply (B, H, ...) bias factors head by head."""
    if isinstance(strength, torch.Tensor):
        return strength.to(device=like.device, dtype=dtype or like.dtype).view(1, -1, 1, 1)
    return strength


def validate_attention_inputs(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    strength: Strength = 1.0,
) -> None:
    """Raise ValueError naming the argument, its value and what is allowed."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r} is not allowed: use one of {CORRECTIONS}")
    if q.ndim != 4:
        raise ValueError(f"q.shape={tuple(q.shape)} is not allowed: q must be (B, H, Q, D)")
    check_strength(strength, q.shape[1])
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
        k_shape, v_shape = seg.k_shape, seg.v_shape
        if len(k_shape) != 4 or k_shape[:2] != (batch, heads) or k_shape[-1] != dim:
            raise ValueError(
                f"segments[{i}].k.shape={k_shape} does not fit q.shape={tuple(q.shape)}: "
                f"it must be (B={batch}, H={heads}, K, D={dim})"
            )
        if len(v_shape) != 4 or v_shape[:3] != k_shape[:3] or v_shape[-1] != value_dim:
            raise ValueError(
                f"segments[{i}].v.shape={v_shape} does not fit segments[{i}].k.shape="
                f"{k_shape}: it must be (B, H, K, Dv={value_dim})"
            )
        total += k_shape[2]
        for name, ref, own in (("k_ref", seg.k_ref, k_shape), ("v_ref", seg.v_ref, v_shape)):
            if ref is not None and tuple(ref.shape) != own:
                raise ValueError(
                    f"segments[{i}].{name}.shape={tuple(ref.shape)} must equal the shape "
                    f"{own} of the quantized tensor"
                )
        # steps handed over with a hand-built segment are checked; a stored form's are consistent by construction
        if isinstance(seg.stored_k, GivenTensor) and seg.has_steps:
            validate_group_steps(q, seg.steps, argument=f"segments[{i}].steps")
            if seg.steps.step.shape[2] != k_shape[2]:
                raise ValueError(
                    f"segments[{i}].steps.step.shape={tuple(seg.steps.step.shape)} does not fit "
                    f"segments[{i}].k.shape={k_shape}: one step row per cached key"
                )
    if total == 0:
        raise ValueError("segments=[] and k_cur has R=0 tokens: attention needs at least one key")
