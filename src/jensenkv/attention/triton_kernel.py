"""Fused Triton attention over the packed INT2/INT4/INT8 cache with the Jensen-bias correction.

Same contract as ``reference_attention`` plus GQA: q (B, Hq, Q, D); k_cur, v_cur (B, Hkv, R, D/Dv)
with Hkv dividing Hq (query head h reads KV head h // (Hq / Hkv)); segments from
``ChunkedKVCache.segments()``. One program per (block of queries, batch x query head):

1. loop over the cached tiles of the quantized chunks: load the packed codes, steps and zero points
   (token-group layout: stats per token and channel group; per-channel KIVI layout: stats per token
   group and channel), dequantize in registers, score against the query (the rotated query for
   Hadamard-rotated keys), subtract the Jensen bias, online softmax;
   - taylor: sum_j coef_j(q) * step_j^2, a G-wide dot product per score (unrolled for G <= 8,
     a tl.dot otherwise); coef_j = strength * scale^2/24 * ||q_rot group j||^2 is computed once per call;
   - exact: the series sum_n sum_j a_n sum_{c in j} q_c^(2n) (scale step_j / 2)^(2n) while every
     |x| <= SERIES_MAX_ARG, else log(sinh x / x) channel by channel;
2. continue the same online softmax over the full-precision keys (sink chunks, then the current chunk
   and in-flight chunks): never corrected.
Values quantized with a rotation accumulate separately and are un-rotated after the kernel.

Chunks with different storage layouts are run as separate launches and merged by log-sum-exp; the
only per-call copies are the concatenated stored tensors (as large as the stored form) and the
full-precision keys (sinks + current chunk). QVG chunks and INT3 codes are not supported here.
The kernel computes in float32 (dots in IEEE fp32). ``TRITON_INTERPRET=1`` runs it on the CPU (tests); it
takes effect when set before the first call, even when triton itself was imported earlier.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from jensenkv.attention._inputs import (
    SegmentLike,
    Strength,
    check_strength,
    resolve_scale,
    segment_has_steps,
    strength_view,
    validate_attention_inputs,
)
from jensenkv.attention.second_order import refuse_second_order
from jensenkv.correction import (
    SERIES_MAX_ARG,
    exact_series_query_columns,
    log_sinhc_series_coefficients,
    query_group_sq_norms,
    series_terms_for,
)
from jensenkv.quant.rtn import RTNTensor
from jensenkv.quant.tensors import FullPrecisionTensor

BIAS_NONE, BIAS_TAYLOR, BIAS_SERIES, BIAS_ELEMENTWISE = 0, 1, 2, 3  # as in _triton_device
KERNEL_BITS = (2, 4, 8)
_UNROLL_GROUPS = 8  # bias groups up to this are unrolled; more use a tl.dot over the group columns
_SMALL_TERMS = 8  # log(sinh x / x) series terms below |x| = 0.5 (as correction.log_sinhc)
_KERNELS: dict[bool, object] = {}


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel():
    """The jitted kernel, loaded on first use per mode: ``triton.jit`` reads TRITON_INTERPRET when it
    decorates, so the device module is loaded once for the interpreter and once for the compiler."""
    mode = _interpret()
    if mode not in _KERNELS:
        name = f"jensenkv.attention._triton_device_{'interpreted' if mode else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_triton_device.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _KERNELS[mode] = module.cached_attention_kernel
    return _KERNELS[mode]


@dataclass
class _Packed:
    """One storage layout's chunks, concatenated along tokens: what the kernel reads for K or V."""

    codes: torch.Tensor  # (B, H, N, D * bits / 8) uint8
    step: torch.Tensor  # (B, H, R, G) stored dtype
    zero: torch.Tensor | None  # (B, H, R, G) stored dtype, None when symmetric
    row: torch.Tensor  # (N,) int32: stat row of each token
    bits: int
    groups: int
    zero_offset: float
    rotation: object


def _layout_key(t: RTNTensor) -> tuple:
    return (t.bits, t.layout.granularity, t.layout.group_size, t.step.dtype, id(t.rotation))


def _pack(tensors: list[RTNTensor], batch: int, heads: int) -> _Packed:
    first = tensors[0]
    bits, dim = first.bits, first.shape[-1]
    codes, steps, zeros, rows = [], [], [], []
    row_offset = 0
    for t in tensors:
        s = t.shape[2]
        codes.append(t.packed.view(batch, heads, s, dim * bits // 8))
        step = t.step.expand(batch, heads, *t.step.shape[2:])  # tensor granularity: (1, 1, 1, 1) stats
        steps.append(step)
        zero = t.code_zero()  # float32 zero in code units, any convention: x = (code - z) * step
        zeros.append(zero.expand(batch, heads, *zero.shape[2:]))
        rows.append(torch.arange(s, device=t.packed.device) // t.layout.token_span + row_offset
                    if t.layout.granularity != "tensor" else torch.full((s,), row_offset, device=t.packed.device))
        row_offset += step.shape[2]

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=2)

    return _Packed(cat(codes), cat(steps), cat(zeros), torch.cat(rows).to(torch.int32),
                   bits, first.step.shape[-1], 0.0, first.rotation)


def _check_storage(seg: SegmentLike, index: int, name: str):
    stored = getattr(seg, f"stored_{name}", None)
    if stored is None:
        if name == "k" and segment_has_steps(seg):
            raise ValueError(
                f"segments[{index}] carries steps but no stored form: backend=triton reads packed codes, so "
                "quantized segments must come from ChunkedKVCache.segments()"
            )
        return None
    if isinstance(stored, FullPrecisionTensor):
        return None
    if not isinstance(stored, RTNTensor) or stored.bits not in KERNEL_BITS:
        what = type(stored).__name__ if not isinstance(stored, RTNTensor) else f"{stored.bits}-bit RTN"
        raise ValueError(
            f"segments[{index}].stored_{name} is {what}: backend=triton supports RTN storage with bits in "
            f"{KERNEL_BITS} and full precision; use backend=cached for it"
        )
    if stored.dither is not None:
        raise ValueError(f"segments[{index}].stored_{name} is dithered (quant.dither=subtractive): its offset is per "
                         "element and backend=triton reads per-group zeros; use backend=cached for it")
    return stored


def triton_cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[SegmentLike],
    correction: str = "none",
    scale: float | None = None,
    strength: Strength = 1.0,
    block_m: int = 16,
    block_n: int = 16,
    second_order: bool = False,
) -> torch.Tensor:
    """Fused attention over the packed cache: q (B, Hq, Q, D), k_cur/v_cur (B, Hkv, R, D/Dv) -> (B, Hq, Q, Dv).

    ``strength``: a float or a (Hq,) tensor of per-query-head strengths, folded into the query-side bias
    columns before launch (the elementwise exact bias reads it per head in the kernel). ``second_order`` is
    refused (the fused online softmax never holds a row's weights): ValueError naming the backends that
    implement it.
    """
    refuse_second_order(second_order, "triton")
    if q.ndim != 4 or k_cur.ndim != 4:
        raise ValueError(f"q.shape={tuple(q.shape)}, k_cur.shape={tuple(k_cur.shape)}: both must be (B, H, S, D)")
    heads_q, heads_kv = q.shape[1], k_cur.shape[1]
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(
            f"k_cur.shape={tuple(k_cur.shape)} has {heads_kv} KV heads for q.shape={tuple(q.shape)}: "
            f"the {heads_q} query heads must be a multiple of the KV heads"
        )
    check_strength(strength, heads_q)  # per query head (the check below sees the KV heads' view of q)
    validate_attention_inputs(q[:, :heads_kv], k_cur, v_cur, segments, correction)
    dim, dv = q.shape[-1], v_cur.shape[-1]
    for name, value in (("head_dim", dim), ("value_dim", dv), ("block_m", block_m), ("block_n", block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name}={value} is not allowed for backend=triton: it must be a power of two >= 16")
    scale = resolve_scale(scale, dim)
    quantized: dict[tuple, list[tuple[RTNTensor, RTNTensor]]] = {}
    full_k, full_v = [], []
    for i, seg in enumerate(segments):
        sk, sv = _check_storage(seg, i, "k"), _check_storage(seg, i, "v")
        if sk is None and sv is None:
            full_k.append(seg.stored_k.dequantize() if hasattr(seg, "stored_k") else seg.k)
            full_v.append(seg.stored_v.dequantize() if hasattr(seg, "stored_v") else seg.v)
        elif sk is None or sv is None:
            raise ValueError(
                f"segments[{i}] has one of K and V quantized and the other full precision: backend=triton needs "
                "both quantized (RTN) or both full precision"
            )
        else:
            quantized.setdefault((_layout_key(sk), _layout_key(sv)), []).append((sk, sv))
    kf = torch.cat([t.float() for t in full_k] + [k_cur.float()], dim=2).contiguous()  # (B, Hkv, NF, D)
    vf = torch.cat([t.float() for t in full_v] + [v_cur.float()], dim=2).contiguous()  # (B, Hkv, NF, Dv)
    q32 = q.float().contiguous()  # (B, Hq, Q, D)
    if isinstance(strength, torch.Tensor):
        strength = strength.to(device=q.device, dtype=torch.float32)  # (Hq,)
    parts = []
    groups = list(quantized.values()) or [None]
    for index, members in enumerate(groups):
        with_full = index == len(groups) - 1
        parts.append(_launch(q32, members, kf if with_full else kf[:, :, :0], vf if with_full else vf[:, :, :0],
                             correction, scale, strength, heads_kv, block_m, block_n))
    if len(parts) == 1:
        out = parts[0][0]
    else:
        lse = torch.stack([p[1] for p in parts])  # (P, B, Hq, Q)
        weights = torch.softmax(lse, dim=0)  # each launch's share of the softmax mass
        out = sum(w[..., None] * p[0] for w, p in zip(weights, parts))
    return out.to(q.dtype)  # (B, Hq, Q, Dv)


def _launch(q32, members, kf, vf, correction, scale, strength, heads_kv, block_m, block_n):
    """One kernel launch over one storage layout's chunks (or none) and the given full-precision keys.

    Returns the normalized output (B, Hq, Q, Dv) and the log-sum-exp (B, Hq, Q) of its scores.
    """
    import triton

    batch, heads_q, n_q, dim = q32.shape
    dv = vf.shape[-1]
    device = q32.device
    dummy_u8 = torch.zeros(1, dtype=torch.uint8, device=device)
    dummy_f = torch.zeros(1, dtype=torch.float32, device=device)
    dummy_i = torch.zeros(1, dtype=torch.int32, device=device)
    bias_mode, terms, u_scale, qb, qr = BIAS_NONE, 1, 0.0, dummy_f, q32
    if members is not None:
        kp = _pack([m[0] for m in members], batch, heads_kv)
        vp = _pack([m[1] for m in members], batch, heads_kv)
        if kp.rotation is not None:
            qr = kp.rotation.apply(q32).contiguous()  # (B, Hq, Q, D): rotated keys need only the rotated query
        if correction == "taylor":
            bias_mode = BIAS_TAYLOR
            weight = strength_view(strength, qr)  # float or (1, Hq, 1, 1)
            qb = (weight * scale * scale / 24.0) * query_group_sq_norms(qr, kp.groups)  # (B, Hq, Q, G)
        elif correction == "exact":
            q_max = qr.abs().amax()
            bound = float(0.5 * scale * q_max * kp.step.float().abs().amax())
            if bound <= SERIES_MAX_ARG:
                bias_mode, terms = BIAS_SERIES, series_terms_for(qr, q_max, bound, strength, q32.dtype)  # the kernel computes in fp32
                u_scale = float(0.5 * scale * q_max)
                columns = exact_series_query_columns(qr, kp.groups, q_max, terms)  # (B, Hq, Q, G * terms)
                qb = strength_view(strength, qr) * columns
            else:
                bias_mode = BIAS_ELEMENTWISE
        n, rk, rv = kp.codes.shape[2], kp.step.shape[2], vp.step.shape[2]
        kc, ks, kz, krow = kp.codes, kp.step, kp.zero if kp.zero is not None else dummy_f, kp.row
        vc, vs, vz, vrow = vp.codes, vp.step, vp.zero if vp.zero is not None else dummy_f, vp.row
        kbits, kg, kzero, kzoff = kp.bits, kp.groups, kp.zero is not None, kp.zero_offset
        vbits, vg, vzero, vzoff = vp.bits, vp.groups, vp.zero is not None, vp.zero_offset
        v_rotation = vp.rotation
    else:
        n = rk = rv = 0
        kc, ks, kz, krow = dummy_u8, dummy_f, dummy_f, dummy_i
        vc, vs, vz, vrow = dummy_u8, dummy_f, dummy_f, dummy_i
        kbits = vbits = 8
        kg = vg = 1
        kzero = vzero = False
        kzoff = vzoff = 0.0
        v_rotation = None
    qb = qb.contiguous()
    # (Hq,) per-head strength: only the elementwise exact bias reads it in the kernel (the others carry it in qb)
    head_strength = (strength if isinstance(strength, torch.Tensor)
                     else torch.full((heads_q,), float(strength), dtype=torch.float32, device=device)).contiguous()
    coef = torch.tensor(log_sinhc_series_coefficients(_SMALL_TERMS), dtype=torch.float32, device=device)
    out_q = torch.empty(batch, heads_q, n_q, dv, device=device)
    out_f = torch.empty_like(out_q)
    lse = torch.empty(batch, heads_q, n_q, device=device)
    unroll = kg <= _UNROLL_GROUPS
    if not unroll and (kg < 16 or kg & (kg - 1)):
        raise ValueError(f"{kg} step groups per key are not allowed for backend=triton: use <= {_UNROLL_GROUPS} "
                         "or a power of two >= 16")
    grid = (triton.cdiv(n_q, block_m), batch * heads_q)
    _kernel()[grid](
        q32, qr, qb, kc, ks, kz, krow, vc, vs, vz, vrow, kf, vf, coef, out_q, out_f, lse,
        heads_q, heads_kv, n_q, n, rk, rv, kf.shape[2], qb.shape[-1] if qb.ndim == 4 else 1,
        scale, u_scale, 0.5 * scale, head_strength,
        DIM=dim, DV=dv, GROUP=heads_q // heads_kv,
        KBITS=kbits, KG=kg, K_HAS_ZERO=kzero, KZOFF=kzoff,
        VBITS=vbits, VG=vg, V_HAS_ZERO=vzero, VZOFF=vzoff,
        BIAS=bias_mode, TERMS=terms, SMALL_TERMS=_SMALL_TERMS, UNROLL=unroll,
        BLOCK_M=block_m, BLOCK_N=block_n,
    )
    if v_rotation is not None:
        out_q = v_rotation.inverse(out_q)  # values were accumulated in their rotated basis
    return out_q + out_f, lse
