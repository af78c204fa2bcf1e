"""Fused Triton attention over the packed INT2/INT4/INT8 cache with the Jensen-bias correction.

Same contract as ``reference_attention`` plus GQA: q (B, Hq, Q, D); k_cur, v_cur (B, Hkv, R, D/Dv) with Hkv
dividing Hq (query head h reads KV head h // (Hq / Hkv)); segments from ``ChunkedKVCache.segments()`` with
their KV heads as stored (never expanded). A flash-attention kernel, one program per (block of queries,
batch x query head):

1. the quantized cached chunks: packed codes, steps and zeros are read in place (the cache's per-layer
   buffers, ``quant.store``: consecutive chunks are one strided view, so a window, sinks or a kv-range limit
   is a range of it), dequantized in registers to the dot dtype, scored by a tensor-core dot against the
   query (the rotated query for Hadamard-rotated keys), the Jensen bias subtracted, online softmax:
   - taylor: a G-wide dot of the query group norms strength * scale^2/24 * ||q_g||^2 (computed once per
     call, proportional to the queries) and the keys' squared steps, fused into the score tile;
   - exact: per tile, on the device, the series sum_n a_n sum_j (sum_{c in j} r_c^(2n)) u_j^(2n) (a G-wide
     dot per term; a fixed number of terms chosen from the query dtype's resolution and |strength|, so no
     host read and no recompile per call) while every |x| = scale/2 |q_c| step <= SERIES_MAX_ARG, else
     log(sinh x / x) channel by channel;
2. the same online softmax over the full-precision keys (cached sinks / BF16 chunks, then the current
   chunk, read where they are): never corrected.
Values quantized with a rotation accumulate separately and are un-rotated after the kernel.

A call allocates only what is proportional to the queries (bias columns, outputs); the cache is read where
it is stored. Any list of stored chunks is read: chunks not laid out back to back (hand-built, one left out,
reordered, or from different caches) are concatenated per call, their per-channel (KIVI) stat rows renumbered
to the concatenation; one storage layout per launch, and the launches merge by log-sum-exp. QVG chunks,
dithered chunks and INT3 codes are refused. On a GPU the block sizes, warps and stages are autotuned per (head
dim, dtype, bits, bias) from a small list (the first call per key times them); ``TRITON_INTERPRET=1`` runs the
kernel on the CPU (tests, dry runs; 16 x 16 tiles), taking effect when set before the first call. The
interpreter's bf16 dots are wrong (it multiplies bit patterns), so bf16 queries take float32 operands there
and operands="bfloat16" is refused; float32 and float16 operands run as on a GPU.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from jensenkv.attention._inputs import Strength, strength_view
from jensenkv.attention.registry import Capabilities, register_backend
from jensenkv.attention.triton_packing import (
    KERNEL_BITS,
    PackedRun,
    RunMember,
    joined,
    last_contiguous,
    pack_run,
    segment_operands,
)
from jensenkv.cache import Segment
from jensenkv.correction import (
    SERIES_MAX_ARG,
    exact_series_terms,
    log_sinhc_series_coefficients,
    query_group_sq_norms,
    series_tolerance,
)

BIAS_NONE, BIAS_TAYLOR, BIAS_EXACT = 0, 1, 2  # as in _triton_device
OPERANDS = {"float32": 0, "bfloat16": 1, "float16": 2}  # the dots' operand dtype -> the kernel's DOT
_SMALL_TERMS = 8  # log(sinh x / x) series terms below |x| = 0.5 (as correction.log_sinhc)
_MIN_DOT = 16  # tensor-core dots need every dimension >= 16: the bias columns are zero-padded to it
_LOG2E = 1.0 / math.log(2.0)
_INTERPRETED_BLOCKS = (16, 16)  # (BLOCK_M, BLOCK_N) under TRITON_INTERPRET when none is given
# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried by the autotuner on a GPU, per TUNE_KEY
# (spill-free at head dims 64 and 128 for INT2/4/8 on sm_90: python -m jensenkv.attention.triton_aot; 64 x 64 on 4
# warps spills at d = 128 with INT4 codes)
TUNE_CONFIGS = ((128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 2))
TUNE_KEY = ("DIM", "DV", "GROUP", "KBITS", "VBITS", "KG", "BIAS", "TERMS", "DOT")
_KERNELS: dict[tuple[bool, bool], object] = {}
_CONSTANTS: dict[torch.device, tuple[torch.Tensor, ...]] = {}

assert SERIES_MAX_ARG == 1.5, "update SERIES_MAX_ARG in _triton_device.py"


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel(tuned: bool):
    """The jitted kernel, loaded on first use per mode: ``triton.jit`` reads TRITON_INTERPRET when it
    decorates, so the device module is loaded once for the interpreter and once for the compiler. ``tuned``
    wraps it in ``triton.autotune`` (the launch then takes the block sizes from the tuned config)."""
    mode = _interpret()
    if (mode, tuned) not in _KERNELS:
        name = f"jensenkv.attention._triton_device_{'interpreted' if mode else 'compiled'}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_triton_device.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        kernel = module.cached_attention_kernel
        if tuned:
            import triton

            configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                       for m, n, w, s in TUNE_CONFIGS]
            kernel = triton.autotune(configs=configs, key=list(TUNE_KEY))(kernel)
        _KERNELS[mode, tuned] = kernel
    return _KERNELS[mode, tuned]


def _constants(device: torch.device) -> tuple[torch.Tensor, ...]:
    """Per device, made once (a per-call torch.tensor from a list would copy to the device every call):
    the log(sinh x / x) series coefficients, and dummies for pointers a launch does not read."""
    if device not in _CONSTANTS:
        coef = torch.tensor(log_sinhc_series_coefficients(_SMALL_TERMS), dtype=torch.float32, device=device)
        _CONSTANTS[device] = (coef, torch.zeros(1, dtype=torch.uint8, device=device),
                              torch.zeros(1, dtype=torch.float32, device=device),
                              torch.zeros(1, dtype=torch.int32, device=device))
    return _CONSTANTS[device]


def series_terms_fixed(dim: int, dtype: torch.dtype, strength: Strength) -> int:
    """The exact bias's series length for queries of ``dtype``: the fewest terms whose truncation error at the
    series' largest argument (SERIES_MAX_ARG, every |q_c / max|q|| = 1: the data-free worst case) times
    |strength| stays below the dtype's resolution. A (H,) strength takes the longest series (reading it would
    be a host sync). Depends on no tensor value: one compiled kernel per (dim, dtype)."""
    if isinstance(strength, torch.Tensor):
        return exact_series_terms(SERIES_MAX_ARG, lambda m: float(dim), 0.0)
    peak = abs(float(strength))
    tol = series_tolerance(dtype) / peak if peak else math.inf
    return exact_series_terms(SERIES_MAX_ARG, lambda m: float(dim), tol)


def device_refusal(device: str) -> str | None:
    """Why backend=triton cannot run on ``device`` (model.device, resolved), or None: the kernel needs the triton
    package and a CUDA device, or TRITON_INTERPRET=1 to run it on the CPU (slowly)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if not str(device).startswith("cuda") and not _interpret():
        return f"it needs a CUDA device and model.device={device!r} (TRITON_INTERPRET=1 runs it on the CPU, slowly)"
    return None


def storage_refusal(key, value) -> str | None:
    """Why backend=triton cannot read a cache whose keys and values are quantized by ``key`` / ``value``
    (QuantConfigs), or None: what ``_check_storage`` would refuse at the first cached call, known from the
    settings alone (the config checks it before any model loads)."""
    for name, cfg in (("key", key), ("value", value)):
        if cfg.method == "none":
            continue
        what = (f"quant.method={cfg.method!r}" if cfg.method != "rtn"
                else f"quant.bits={cfg.bits}" if cfg.bits not in KERNEL_BITS
                else "quant.dither=subtractive" if cfg.dither != "none"
                else "quant.smoothing=channel_mean" if cfg.smoothing != "none" else None)
        if what is not None:
            return f"it reads RTN codes with bits in {KERNEL_BITS}, no dither and no smoothing, not {what} ({name}s)"
    if key.method == "none" and value.method != "none":
        return "it reads quantized keys with quantized or full-precision values, not full-precision keys alone"
    return None


def _operand_code(q: torch.Tensor, operands: str | None) -> int:
    """The kernel's DOT code. Under TRITON_INTERPRET the dots run in numpy, whose bf16 ``tl.dot`` multiplies
    raw bit patterns (a Triton interpreter limitation: |out| ~ 1e9, no error): bf16 queries take float32
    operands there, and bfloat16 operands asked for are refused."""
    name = operands or ("float32" if q.dtype in (torch.float32, torch.float64) else str(q.dtype).split(".")[-1])
    if name not in OPERANDS:
        raise ValueError(f"operands={operands!r} is not allowed for q.dtype={q.dtype}: use one of {tuple(OPERANDS)} "
                         "(None: the query's dtype)")
    if name == "bfloat16" and _interpret():
        if operands is not None:
            raise ValueError("operands='bfloat16' is not allowed under TRITON_INTERPRET=1 (its bf16 dots are wrong): "
                             "use float32 or float16 (None: float32 for bf16 queries)")
        name = "float32"
    return OPERANDS[name]


# the fused online softmax never holds a row's weights (no second order) and has no causal mask
@register_backend("triton", Capabilities(kv_heads=True, second_order=False, causal=False,
                                         storage_refusal=storage_refusal, device_refusal=device_refusal))
def triton_cached_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    segments: Sequence[Segment],
    correction: str,
    scale: float,
    strength: Strength,
    second_order: bool,
    causal: bool,
    block_m: int | None = None,
    block_n: int | None = None,
    operands: str | None = None,
) -> torch.Tensor:
    """Fused attention over the packed cache: q (B, Hq, Q, D), k_cur/v_cur (B, Hkv, R, D/Dv) -> (B, Hq, Q, Dv).

    ``strength``: a float or a (Hq,) tensor of per-query-head strengths, folded into the query-side bias
    columns before launch (the elementwise exact bias reads it per head in the kernel). ``operands``: the dots'
    operand dtype, "float32" | "bfloat16" | "float16" (None: the query's; float32 runs IEEE dots, for the
    oracle). ``block_m`` / ``block_n``: fixed tile sizes (None: autotuned on a GPU, 16 under the interpreter).
    ``second_order`` and ``causal`` are refused before the call (its capabilities): ValueError naming the
    backends that take them.
    """
    heads_kv = k_cur.shape[1]
    dim, dv = q.shape[-1], v_cur.shape[-1]
    for name, value in (("head_dim", dim), ("value_dim", dv), ("block_m", block_m), ("block_n", block_n)):
        if value is not None and (value < 16 or value & (value - 1)):
            raise ValueError(f"{name}={value} is not allowed for backend=triton: it must be a power of two >= 16")
    dot = _operand_code(q, operands)
    cache = segment_operands(segments)  # per storage layout its chunks, and the full-precision ones joined
    kf, vf = cache.full_k, cache.full_v
    current = (last_contiguous(k_cur), last_contiguous(v_cur))  # (B, Hkv, R, D/Dv), read in place
    if isinstance(strength, torch.Tensor):
        strength = strength.to(device=q.device, dtype=torch.float32)  # (Hq,)
    q_in = last_contiguous(q)
    parts = []
    groups = cache.runs or [None]
    for index, members in enumerate(groups):
        last = index == len(groups) - 1
        parts.append(_launch(q_in, members, (kf, vf) if last else (None, None), current if last else None,
                             correction, scale, strength, heads_kv, (block_m, block_n), dot))
    if len(parts) == 1:
        out = parts[0][0]
    else:
        lse = torch.stack([p[1] for p in parts])  # (P, B, Hq, Q)
        weights = torch.softmax(lse, dim=0)  # each launch's share of the softmax mass
        out = sum(w[..., None] * p[0] for w, p in zip(weights, parts))
    return out.to(q.dtype)  # (B, Hq, Q, Dv)


@dataclass(frozen=True)
class Layout:
    """What the kernel is compiled for about one packed operand (K or V)."""

    bits: int = 8
    groups: int = 1
    zero_kind: int = 0  # as PackedRun.zero_kind
    zero_offset: float = 0.0
    zero_scale: float = 1.0
    rows: bool = False  # a per-token stat-row table (per-channel layouts)
    full: bool = False  # not quantized: the values of cache.values=none, read as stored


def _layout(p: PackedRun | None) -> Layout:
    """The compile-time description of a packed run (the defaults when there is none)."""
    if p is None:
        return Layout()
    return Layout(p.bits, p.groups, p.zero_kind, p.zero_offset, p.zero_scale, p.rows is not None)


def kernel_constants(dim: int, dv: int, group: int, k: Layout, v: Layout, bias: int, terms: int, dot: int,
                     v_rotated: bool) -> dict:
    """The kernel's compile-time arguments (one compiled kernel per distinct dict; block sizes apart)."""
    return dict(DIM=dim, DV=dv, GROUP=group,
                KBITS=k.bits, KG=k.groups, KZKIND=k.zero_kind, KZOFF=k.zero_offset, KZSCALE=k.zero_scale, KROWS=k.rows,
                VBITS=v.bits, VG=v.groups, VZKIND=v.zero_kind, VZOFF=v.zero_offset, VZSCALE=v.zero_scale, VROWS=v.rows,
                VFULL=v.full,
                BIAS=bias, TERMS=terms, SMALL_TERMS=_SMALL_TERMS, GP=max(_MIN_DOT, k.groups), DOT=dot,
                V_ROT=v_rotated)


def _series_query_columns(qr: torch.Tensor, groups: int, q_max: torch.Tensor, terms: int,
                          weight: Strength) -> torch.Tensor:
    """``correction.exact_series_query_columns`` times strength and log2 e, (B, Hq, Q, G*N) float32, built in
    place: two query-sized float32 temporaries whatever the series length (the shared helper makes one per term)."""
    batch, heads, n_q, dim = qr.shape
    r2 = (qr.float() / q_max.clamp_min(torch.finfo(torch.float32).tiny)).square_()  # (B, Hq, Q, D), each in [0, 1]
    r2 = r2.unflatten(-1, (groups, dim // groups))  # (B, Hq, Q, G, g)
    power = r2.clone()
    out = torch.empty(batch, heads, n_q, terms, groups, device=qr.device)  # term-major columns n*G + j
    for n, a_n in enumerate(log_sinhc_series_coefficients(terms)):
        torch.sum(power, dim=-1, out=out[:, :, :, n])
        out[:, :, :, n].mul_(a_n)
        if n + 1 < terms:
            power.mul_(r2)
    out = out.flatten(-2)
    return out.mul_(weight * _LOG2E) if isinstance(weight, torch.Tensor) else out.mul_(float(weight) * _LOG2E)


def _strides(t: torch.Tensor | None, dims: int = 3) -> tuple[int, ...]:
    return (0,) * dims if t is None else tuple(t.stride()[:dims])


def _launch(
    q: torch.Tensor,
    members: list[RunMember] | None,
    full: tuple[torch.Tensor | None, torch.Tensor | None],
    current: tuple[torch.Tensor, torch.Tensor] | None,
    correction: str,
    scale: float,
    strength: Strength,
    heads_kv: int,
    blocks: tuple[int | None, int | None],
    dot: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel launch over one storage layout's chunks (``members``, from ``triton_packing.segment_operands``;
    None: no quantized chunk), the cached full-precision keys and values ``full`` ((B, Hkv, NF, D/Dv) or None
    each) and the current chunk ``current`` ((B, Hkv, R, D/Dv) each, or None). q (B, Hq, Q, D); ``scale`` the
    softmax scale; ``strength`` a float or (Hq,) float32 tensor on q's device; ``blocks`` (BLOCK_M, BLOCK_N) or
    None for the autotuner; ``dot`` the operand code (``OPERANDS``). Returns the normalized output (B, Hq, Q, Dv)
    float32 and the log-sum-exp (B, Hq, Q) of its scores."""
    import triton

    batch, heads_q, n_q, dim = q.shape
    device = q.device
    coef, dummy_u8, dummy_f, dummy_i = _constants(device)
    kf, vf = full
    kx, vx = current if current is not None else (None, None)
    dv = (vx if vx is not None else vf if vf is not None else members[0][1]).shape[-1]
    bias_mode, terms, qb, q_max, qr = BIAS_NONE, 1, dummy_f, dummy_f, q
    head_strength = dummy_f
    if members is not None:
        kp = pack_run([m[0] for m in members], batch, heads_kv)
        if isinstance(members[0][1], torch.Tensor):  # full-precision values: one view (or a concatenation)
            vp, v_full = None, last_contiguous(joined([m[1] for m in members], dim=2))  # (B, Hkv, N, Dv)
        else:
            vp, v_full = pack_run([m[1] for m in members], batch, heads_kv), None
        if kp.rotation is not None:
            qr = kp.rotation.apply(q.float())  # (B, Hq, Q, D): rotated keys need only the rotated query
        weight = strength_view(strength, q, torch.float32)  # float or (1, Hq, 1, 1)
        if correction == "taylor":
            bias_mode = BIAS_TAYLOR
            qb = (weight * (_LOG2E * scale * scale / 24.0)) * query_group_sq_norms(qr.float(), kp.groups)  # (B, Hq, Q, G)
        elif correction == "exact":
            bias_mode = BIAS_EXACT
            terms = series_terms_fixed(dim, q.dtype, strength)
            q_max = qr.float().abs().amax()  # () on the device: read by the kernel, never by the host
            qb = _series_query_columns(qr, kp.groups, q_max, terms, weight)  # (B, Hq, Q, G*N)
            head_strength = (strength if isinstance(strength, torch.Tensor)
                             else torch.full((heads_q,), float(strength), dtype=torch.float32, device=device))
        n = kp.codes.shape[2]
        if kp.groups & (kp.groups - 1):  # tl.arange over the groups (D / g with D a power of two: always)
            raise ValueError(f"{kp.groups} step groups per key are not allowed for backend=triton: "
                             "use a power of two")
    else:
        kp = vp = v_full = None
        n = 0
    qr = last_contiguous(qr)
    qb = qb.contiguous()
    v_rotation = vp.rotation if vp is not None else None
    out_q = torch.empty(batch, heads_q, n_q, dv, device=device)  # (B, Hq, Q, Dv)
    out_f = torch.empty_like(out_q) if v_rotation is not None else dummy_f
    lse = torch.empty(batch, heads_q, n_q, device=device)  # (B, Hq, Q)

    def packed_args(p: PackedRun | None) -> list:
        if p is None:
            return [dummy_u8, 0, 0, 0, dummy_f, 0, 0, 0, dummy_f, dummy_i]
        return [p.codes, *_strides(p.codes), p.step, *_strides(p.step),
                p.zero if p.zero is not None else dummy_f, p.rows if p.rows is not None else dummy_i]

    def full_args(t: torch.Tensor | None) -> list:
        return [t if t is not None else dummy_f, *_strides(t)]

    args = [q, *_strides(q), qr, *_strides(qr), qb, qb.shape[-1] if qb.ndim == 4 else 1, q_max,
            *packed_args(kp), *(packed_args(vp) if v_full is None else full_args(v_full) + packed_args(None)[4:]), n,
            *full_args(kf), *full_args(vf), kf.shape[2] if kf is not None else 0,
            *full_args(kx), *full_args(vx), kx.shape[2] if kx is not None else 0,
            coef, head_strength, out_q, out_f, lse, heads_q, n_q, scale * _LOG2E, 0.5 * scale]
    constants = kernel_constants(dim, dv, heads_q // heads_kv, _layout(kp),
                                 _layout(vp) if v_full is None else Layout(full=True), bias_mode, terms, dot,
                                 v_rotation is not None)
    block_m, block_n = blocks
    if block_m is None and block_n is None and not _interpret():
        grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads_q)  # noqa: E731
        _kernel(tuned=True)[grid](*args, **constants)
    else:
        block_m = block_m or _INTERPRETED_BLOCKS[0]
        block_n = block_n or _INTERPRETED_BLOCKS[1]
        _kernel(tuned=False)[(triton.cdiv(n_q, block_m), batch * heads_q)](*args, **constants, BLOCK_M=block_m,
                                                                           BLOCK_N=block_n)
    if v_rotation is not None:
        out_q = v_rotation.inverse(out_q) + out_f  # values were accumulated in their rotated basis
    return out_q, lse
