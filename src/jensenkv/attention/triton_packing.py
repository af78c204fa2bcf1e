"""The Triton kernel's operands from a list of cached segments: what ``triton_kernel`` launches on.

The cache's stored chunks are read where they are: consecutive chunks of one layer buffer (``quant.store``) are
one strided view; chunks not back to back (hand-built, one left out, reordered, from different caches) are
concatenated, their per-channel (KIVI) stat rows renumbered to the concatenation. Chunks are grouped by storage
layout (one launch each, merged by log-sum-exp in ``triton_kernel``); full-precision chunks (sinks, BF16
caches, hand-built ones without steps) are joined into one run read by every launch's last. What the kernel
cannot read (QVG, dithered, INT3 codes, hand-built quantized segments) is refused in one line naming it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jensenkv.cache import GivenTensor, Segment
from jensenkv.quant.config import fixed_point_frac_bits
from jensenkv.quant.rtn import RTNTensor, zero_offset
from jensenkv.quant.store import back_to_back
from jensenkv.quant.tensors import FullPrecisionTensor

KERNEL_BITS = (2, 4, 8)  # the code widths the kernel unpacks


def last_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The kernel reads rows through strides but needs unit stride along the last dim."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


@dataclass
class PackedRun:
    """One storage layout's chunks, back to back: what the kernel reads for K or V."""

    codes: torch.Tensor  # (B, H, N, D * bits / 8) uint8, last dim contiguous (a view of the cache's buffer)
    step: torch.Tensor  # (B, H, R, G) stored dtype, last dim contiguous
    zero: torch.Tensor | None  # (B, H, R, G) stored dtype, strides of step; None when symmetric
    rows: torch.Tensor | None  # (N,) int32 stat row of each token (per-channel and tensor layouts), else None
    bits: int
    groups: int
    zero_kind: int  # 0 symmetric, 1 integer, 2 fixed point, 3 min aligned (as _triton_device.load_quantized)
    zero_offset: float
    zero_scale: float
    rotation: object


def layout_key(t: RTNTensor) -> tuple:
    zero = None if t.zero is None else (t.zero.dtype, t.zero_point)
    return (t.bits, t.layout.granularity, t.layout.group_size, t.step.dtype, zero, id(t.rotation))


def joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The parts as one tensor along ``dim``: a view when they lie back to back, else a concatenation."""
    view = back_to_back(parts, dim)
    return view if view is not None else torch.cat([p.contiguous() for p in parts], dim=dim)


def _codes_view(t: RTNTensor, batch: int, heads: int) -> torch.Tensor:
    """(B, H, S, D * bits / 8) uint8: a store's view as it is, a chunk's own flat codes viewed so."""
    if t.packed.ndim == 4:
        return t.packed
    return t.packed.view(batch, heads, t.shape[2], t.shape[3] * t.bits // 8)


def _chunk_rows(t: RTNTensor, first_row: int, as_stored: bool) -> torch.Tensor:
    """(S,) int32 stat rows of a chunk's tokens: ``as_stored``, a store's table as it is (absolute rows of its
    buffer: no per-call copy), else relative to the steps the kernel is handed, the chunk's first at ``first_row``."""
    stored = getattr(t, "stat_rows", None)
    if stored is not None:
        return stored if as_stored else stored - stored[:1] + first_row  # (stored[:1]: no host read)
    s, device = t.shape[2], t.packed.device
    if t.layout.granularity == "tensor":
        return torch.full((s,), first_row, dtype=torch.int32, device=device)
    return (torch.arange(s, device=device) // t.layout.token_span + first_row).to(torch.int32)


def pack_run(tensors: list[RTNTensor], batch: int, heads: int) -> PackedRun:
    """The chunks of one layout as the kernel reads them: views of their buffer when they lie back to back."""
    first = tensors[0]
    per_token = first.layout.granularity in ("token", "token_group")
    codes = joined([_codes_view(t, batch, heads) for t in tensors], dim=2)
    if first.layout.granularity == "tensor":  # (1, 1, 1, 1) stats: one row per chunk, every (b, h)
        steps = [t.step.expand(batch, heads, 1, 1) for t in tensors]
        zeros = None if first.zero is None else [t.zero.expand(batch, heads, 1, 1) for t in tensors]
    else:
        steps = [t.step for t in tensors]
        zeros = None if first.zero is None else [t.zero for t in tensors]
    in_place = back_to_back(steps, dim=2) is not None  # one store's consecutive chunks
    step = joined(steps, dim=2)  # (B, H, R, G)
    zero = None if zeros is None else joined(zeros, dim=2)
    if zero is not None and zero.stride() != step.stride():  # one view and one copy: both copies
        step, zero = step.contiguous(), zero.contiguous()
    rows = None
    if not per_token:
        # The kernel reads token n's stats at row rows[n] - rows[0] of ``step``. Consecutive chunks of one
        # store: its absolute table holds that as it is. Otherwise (a chunk left out, reordered, from another
        # cache) ``step`` is a concatenation: each chunk's rows restart at its own place in it.
        parts, first_row = [], 0
        for t, s in zip(tensors, steps):
            parts.append(_chunk_rows(t, first_row, as_stored=in_place))
            first_row += s.shape[2]
        rows = joined(parts, dim=0)  # (N,) int32
    kind, offset, scale = _zero_convention(first)
    return PackedRun(codes, step, zero, rows, first.bits, step.shape[-1], kind, offset, scale, first.rotation)


def _zero_convention(t: RTNTensor) -> tuple[int, float, float]:
    """(kind, offset, scale) of the kernel's dequantizer for the stored zeros (``rtn.code_zero``'s cases)."""
    if t.zero is None:
        return 0, float(1 << (t.bits - 1)), 1.0
    if t.zero_point == "min_aligned":
        return 3, 0.0, 1.0
    if t.zero_point == "fixed_point":
        return 2, 0.0, 1.0 / (1 << fixed_point_frac_bits(t.bits))
    return 1, float(zero_offset(t.zero.dtype, t.bits)), 1.0


def _readable(seg: Segment, index: int, name: str) -> RTNTensor | None:
    """The RTN form the kernel reads for the segment's keys or values, None when they are full precision;
    ValueError for a form it cannot read."""
    stored = seg.stored(name)
    if isinstance(stored, GivenTensor):
        if name == "k" and seg.has_steps:
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


def _full_precision(seg: Segment, name: str) -> torch.Tensor:
    """(B, H, K, D) full-precision keys or values of a segment as stored (no dequantized copy): the ones
    ``_readable`` returned None for, a FullPrecisionTensor or a GivenTensor without steps."""
    stored = seg.stored(name)
    assert isinstance(stored, (FullPrecisionTensor, GivenTensor)), type(stored)
    return stored.data


# A run's keys with their values: RTN values, or a (B, Hkv, K_i, Dv) tensor of full-precision ones (values=none)
RunMember = tuple[RTNTensor, "RTNTensor | torch.Tensor"]


@dataclass
class CacheOperands:
    """The cached segments as the kernel reads them."""

    runs: list[list[RunMember]]  # per (key layout, value layout): its chunks' keys and values, in segment order
    full_k: torch.Tensor | None  # (B, Hkv, NF, D) the full-precision cached keys, last dim contiguous; None: none
    full_v: torch.Tensor | None  # (B, Hkv, NF, Dv)


def segment_operands(segments: Sequence[Segment]) -> CacheOperands:
    """Group the segments' stored chunks into the kernel's runs and join the full-precision ones."""
    quantized: dict[tuple, list[RunMember]] = {}
    full_k, full_v = [], []
    for i, seg in enumerate(segments):
        sk, sv = _readable(seg, i, "k"), _readable(seg, i, "v")
        if sk is None and sv is None:
            full_k.append(_full_precision(seg, "k"))
            full_v.append(_full_precision(seg, "v"))
        elif sk is None:
            raise ValueError(
                f"segments[{i}] has full-precision keys and quantized values: backend=triton reads quantized keys "
                "with quantized or full-precision values (cache.values=none), or both full precision"
            )
        elif sv is None:  # cache.values=none: quantized keys, full-precision values read as stored
            v_full = _full_precision(seg, "v")
            quantized.setdefault((layout_key(sk), ("full", v_full.dtype)), []).append((sk, v_full))
        else:
            quantized.setdefault((layout_key(sk), layout_key(sv)), []).append((sk, sv))
    if full_k and len({t.dtype for t in full_k + full_v}) > 1:  # mixed dtypes (sinks and hand-built): one
        full_k, full_v = [t.float() for t in full_k], [t.float() for t in full_v]
    kf = last_contiguous(joined(full_k, dim=2)) if full_k else None  # (B, Hkv, NF, D)
    vf = last_contiguous(joined(full_v, dim=2)) if full_v else None  # (B, Hkv, NF, Dv)
    return CacheOperands(list(quantized.values()), kf, vf)
