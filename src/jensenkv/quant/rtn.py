"""Integer round-to-nearest (RTN) quantization with packed storage, for every granularity.

Asymmetric: x_q = clamp(round(x / D) + z, 0, 2^B - 1), x_hat = (x_q - z) * D with D and z from the
group's [min, max]. Symmetric: D = max|x| / (2^(B-1) - 1), levels -(2^(B-1)-1) .. 2^(B-1)-1 stored
with the fixed offset 2^(B-1) (no zero point stored; INT2 uses 3 of its 4 codes).

Groups (a statistic tensor of shape (b, h, S_groups, D_groups) describes them):
  tensor      one (D, z) for the whole (B, H, S, D) tensor         stats (1, 1, 1, 1)
  token       one per token (all D channels)                       stats (B, H, S, 1)
  token_group one per token and g contiguous channels              stats (B, H, S, D / g)
  channel     one per channel and g consecutive tokens (KIVI keys) stats (B, H, ceil(S / g), D)

Exactness: the step is rounded UP into `scale_dtype` (float16 / bfloat16 / float32 / fp8 e4m3) and the
zero point is computed from that stored step, so dequantization uses exactly the stored values and
|x_hat - x| <= D_stored / 2 for every zero-point convention (`zero_point`, one definition each):
- integer: z = round(-min / D) in zero_dtype (uint8, the default; or int8, stored centred as
  z - 2^(B-1)); a grid level sits at exactly 0. Since round is odd-symmetric, round(x/D) + z lands on
  [0, 2^B - 1] for the group's min and max with no widening; only groups whose z does not fit the dtype
  (|min| > 127 steps from 0 for int8, or min > 0 for uint8) fall back to a range widened to include 0.
  Cost: 1 byte per group.
- fixed_point: z = round(-min / D * 2^F) / 2^F stored as an int8 with F = 7 - B fractional bits
  (INT2: F = 5, z in [-4, 4)); x_hat = (code - z) * D, so code 0 lies within D / 2^(F+1) of the minimum.
  Groups with z out of range widen to include 0, as integer ones do. Cost: 1 byte per group.
- min_aligned: the group minimum itself (KIVI, HF quanto), rounded down into a float dtype, and
  x_hat = code * D + min: the step spans [stored min, max], so the bound holds at any offset (a large
  offset costs resolution, not the bound). Cost: the float dtype's bytes per group.
Subtractive dither (min_aligned only): code = round((x - min) / D + u) with u ~ U[-1/2, 1/2) regenerated
from a stored (seed, counter), x_hat = (code - u) * D + min: nothing clamps, so the error is exactly
uniform on [-D/2, D/2) and independent of x (Schuchman). Cost: 16 bytes per tensor.
Constant groups get the step |value| (1 at zero): finite, and exact when |value| is representable
in scale_dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from jensenkv.quant.config import FIXED_POINT_MAX_BITS, ZERO_POINTS, fixed_point_frac_bits
from jensenkv.quant.packing import pack_codes, unpack_codes
from jensenkv.quant.steps import GroupSteps
from jensenkv.quant.tensors import QuantizedTensor, tensor_nbytes

if TYPE_CHECKING:
    from jensenkv.quant.dither import DitherDraw
    from jensenkv.quant.hadamard import RandomHadamard

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}


@dataclass(frozen=True)
class GroupLayout:
    """Where the quantization groups of a (B, H, S, D) tensor lie, and how stats map back to elements."""

    granularity: str
    group_size: int
    shape: tuple[int, int, int, int]

    @property
    def token_span(self) -> int:
        """Tokens per group (the last channel-granularity group may be shorter)."""
        return {"tensor": self.shape[2], "token": 1, "token_group": 1, "channel": self.group_size}[self.granularity]

    @property
    def channel_span(self) -> int:
        """Channels per group."""
        return {"tensor": self.shape[3], "token": self.shape[3], "token_group": self.group_size, "channel": 1}[
            self.granularity
        ]

    def group_min_max(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-group min and max of x (B, H, S, D), each shaped like the stats (b, h, S_groups, D_groups)."""
        b, h, s, d = self.shape
        ts, cs = self.token_span, self.channel_span
        s_groups = -(-s // ts)
        if s_groups * ts != s:  # short last token group: repeat the last token (min/max unchanged)
            x = x[:, :, torch.arange(s_groups * ts, device=x.device).clamp(max=s - 1)]
        grouped = x.reshape(b, h, s_groups, ts, d // cs, cs)  # (B, H, S_groups, ts, D_groups, cs)
        mn, mx = grouped.amin(dim=(3, 5)), grouped.amax(dim=(3, 5))  # (B, H, S_groups, D_groups)
        if self.granularity == "tensor":
            mn, mx = mn.amin(dim=(0, 1), keepdim=True), mx.amax(dim=(0, 1), keepdim=True)  # (1, 1, 1, 1)
        return mn, mx

    def to_tokens(self, stat: torch.Tensor) -> torch.Tensor:
        """Stats (b, h, S_groups, D_groups) -> (B, H, S, D_groups): each token gets its group's value."""
        b, h, s, _ = self.shape
        per_token = stat.repeat_interleave(self.token_span, dim=2)[:, :, :s]
        return per_token.expand(b, h, s, stat.shape[3])

    def to_elements(self, stat: torch.Tensor) -> torch.Tensor:
        """Stats (b, h, S_groups, D_groups) -> (B, H, S, D): each element gets its group's value."""
        return self.to_tokens(stat).repeat_interleave(self.channel_span, dim=3)


def round_up_to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive float32 x -> the smallest value of `dtype` that is >= x (so a stored step never shrinks)."""
    stored = x.to(dtype)
    if dtype == torch.float32:
        return stored
    if bool((x > torch.finfo(dtype).max).any()):  # fp8 saturates instead of overflowing: the bound would break
        raise ValueError(f"a quantization step of {float(x.max()):.4g} does not fit scale_dtype={dtype} "
                         f"(max {torch.finfo(dtype).max}): choose a wider quant.scale_dtype")
    too_small = stored.float() < x
    # Positive floats are ordered like their bit patterns: +1 on the integer view is the next value up.
    bumped = (stored.view(_INT_VIEW[stored.element_size()]) + 1).view(dtype)
    return torch.where(too_small, bumped, stored)


def round_down_to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 x -> the largest value of `dtype` that is <= x (so a stored group minimum never exceeds the group's)."""
    stored = x.to(dtype)
    if dtype == torch.float32:
        return stored
    if bool((x < -torch.finfo(dtype).max).any()):  # fp8 saturates: the stored minimum would exceed the group's
        raise ValueError(f"a group minimum of {float(x.min()):.4g} does not fit dtype={dtype} "
                         f"(min {-torch.finfo(dtype).max}): choose a wider quant.scale_dtype / zero_dtype")
    too_big = stored.float() > x
    bits = stored.view(_INT_VIEW[stored.element_size()])
    sign = torch.iinfo(bits.dtype).min  # the sign bit alone: -0.0
    # One value toward -inf on the integer view: a positive value's magnitude shrinks (bits - 1), a negative
    # value's grows (bits + 1, the sign bit stays set), and a zero becomes the smallest negative subnormal.
    down = torch.where(stored.float() > 0, bits - 1, torch.where(stored.float() == 0, torch.full_like(bits, sign + 1),
                                                                   bits + 1))
    return torch.where(too_big, down.view(dtype), stored)


class RTNTensor(QuantizedTensor):
    """RTN-quantized (B, H, S, D) tensor: packed codes + stored steps (+ zero points when asymmetric).

    ``packed`` is the flat code stream, or, for a chunk held in a cache's store (``quant.store``), a
    (B, H, S, D * bits / 8) view of the store's buffer (the same bytes, token by token); such a per-channel
    chunk also carries ``stat_rows``, its tokens' stat rows in the store's buffer.
    """

    stat_rows: torch.Tensor | None = None  # (S,) int32, set by a store for per-channel layouts

    def __init__(
        self,
        packed: torch.Tensor,
        step: torch.Tensor,
        zero: torch.Tensor | None,
        bits: int,
        layout: GroupLayout,
        rotation: RandomHadamard | None = None,
        zero_point: str | None = None,
        dither: DitherDraw | None = None,
    ):
        self.packed = packed  # (ceil(B*H*S*D*bits/8),) uint8, or a store's (B, H, S, D*bits/8) view
        self.step = step  # (b, h, S_groups, D_groups) in scale_dtype
        # like step; None when symmetric. integer: the zero point in codes (int8 stored centred); fixed_point:
        # int8 zero * 2^F; min_aligned: the group minimum itself (the value code 0 stands for), in a float dtype.
        self.zero = zero
        self.zero_point = zero_point if zero is not None else None
        if zero is not None and zero_point is None:  # the convention the dtype implies (older call sites)
            self.zero_point = "min_aligned" if zero.dtype.is_floating_point else "integer"
        self.bits = bits
        self.layout = layout
        self.shape = layout.shape
        self.rotation = rotation
        self.dither = dither  # (seed, counter) that regenerate the subtracted offsets; None: no dither

    @property
    def nbytes(self) -> int:
        dither = self.dither.nbytes if self.dither is not None else 0
        return tensor_nbytes(self.packed, self.step, self.zero) + dither

    def codes(self) -> torch.Tensor:
        """(B, H, S, D) uint8 codes."""
        return unpack_codes(self.packed, self.bits, self.shape)

    def _dequantize_rotated(self) -> torch.Tensor:
        step = self.layout.to_elements(self.step.float())  # (B, H, S, D)
        codes = self.codes().float()  # (B, H, S, D)
        if self.zero_point == "min_aligned":
            if self.dither is not None:
                codes = codes - self.dither.offsets(self.shape, codes.device)  # subtract the same offset
            return codes * step + self.layout.to_elements(self.zero.float())  # code 0 = group minimum
        if self.zero is None:
            zero = torch.tensor(float(1 << (self.bits - 1)), device=step.device)
        elif self.zero_point == "fixed_point":
            zero = self.layout.to_elements(self.zero.float() / (1 << fixed_point_frac_bits(self.bits)))
        else:
            zero = self.layout.to_elements(self.zero.float() + zero_offset(self.zero.dtype, self.bits))  # (B, H, S, D)
        return (codes - zero) * step

    def token_steps(self) -> torch.Tensor:
        """(B, H, S, G) float32 steps: each token's step per channel group (rotated basis)."""
        return self.layout.to_tokens(self.step.float()).contiguous()

    def code_zero(self) -> torch.Tensor:
        """(b, h, S_groups, D_groups) float32 zero in code units, whatever the convention: x_hat = (code - z) * step.

        What fused dequantizers (the attention workspace, the Triton kernel) read. Dithered tensors have no
        per-group form (the offset is per element): they raise, and callers use ``dequantize()``."""
        if self.dither is not None:
            raise ValueError("a dithered tensor has no per-group zero: its offset is per element; use dequantize()")
        return code_zero(self.zero, self.step, self.bits, self.zero_point)

    def group_steps(self) -> GroupSteps:
        """The stored steps: every convention here (integer, min-aligned, fixed-point zero, symmetric, dithered)
        keeps |error| <= step / 2, and with dither the error is exactly U(-step/2, step/2)."""
        return GroupSteps(step=self.token_steps(), rotation=self.rotation)


def code_zero(zero: torch.Tensor | None, step: torch.Tensor, bits: int, zero_point: str | None) -> torch.Tensor:
    """``RTNTensor.code_zero`` on stored zeros and steps of one convention (e.g. several chunks' stats
    concatenated): float32 zero in code units, shaped like ``step``."""
    if zero is None:  # symmetric: codes are stored shifted by 2^(B-1)
        return torch.full_like(step, float(1 << (bits - 1)), dtype=torch.float32)
    if zero_point == "min_aligned":  # x_hat = code * step + min
        return -zero.float() / step.float()
    if zero_point == "fixed_point":
        return zero.float() / (1 << fixed_point_frac_bits(bits))
    return zero.float() + zero_offset(zero.dtype, bits)


def zero_offset(zero_dtype: torch.dtype, bits: int) -> int:
    """An int8 zero point is stored centred (z - 2^(B-1)) so that every z in [0, 2^B - 1] fits."""
    return 1 << (bits - 1) if zero_dtype == torch.int8 else 0


def _check_convention(zero_point: str, zero_dtype: torch.dtype, symmetric: bool, bits: int,
                      dither: DitherDraw | None) -> None:
    if zero_point not in ZERO_POINTS:
        raise ValueError(f"zero_point={zero_point!r} is not allowed: must be one of {ZERO_POINTS}")
    if (zero_point == "min_aligned") != zero_dtype.is_floating_point:
        raise ValueError(f"zero_point={zero_point!r} is not allowed with zero_dtype={zero_dtype}: min_aligned stores "
                         "the minimum in a float dtype, integer and fixed_point zeros an integer one")
    if zero_point == "fixed_point" and (zero_dtype != torch.int8 or bits > FIXED_POINT_MAX_BITS):
        raise ValueError(f"zero_point='fixed_point' is not allowed with zero_dtype={zero_dtype}, bits={bits}: "
                         f"it is an int8 with 7 - bits fractional bits, bits <= {FIXED_POINT_MAX_BITS}")
    if dither is not None and (symmetric or zero_point != "min_aligned"):
        raise ValueError(f"dither is not allowed with symmetric={symmetric}, zero_point={zero_point!r}: "
                         "subtractive dither needs the asymmetric min-aligned grid")


def rtn_quantize(
    x: torch.Tensor,
    bits: int,
    granularity: str,
    group_size: int,
    symmetric: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    zero_dtype: torch.dtype = torch.int8,
    rotation: RandomHadamard | None = None,
    zero_point: str | None = None,
    dither: DitherDraw | None = None,
) -> RTNTensor:
    """Quantize x (B, H, S, D) (already rotated if `rotation` is given, which is only recorded).

    zero_point: None derives it from zero_dtype (float: min_aligned, integer: integer). dither: the draw whose
    offsets are added before rounding (min-aligned grid only).
    """
    x = x.float()
    if zero_point is None:
        zero_point = "min_aligned" if zero_dtype.is_floating_point else "integer"
    _check_convention(zero_point, zero_dtype, symmetric, bits, dither)
    layout = GroupLayout(granularity, group_size, tuple(x.shape))
    mn, mx = layout.group_min_max(x)  # (b, h, S_groups, D_groups)
    levels = (1 << bits) - 1
    lattice = not symmetric and zero_point != "min_aligned"  # integer / fixed-point zero: z in units of 1 / res
    res = 1 << fixed_point_frac_bits(bits) if zero_point == "fixed_point" else 1
    offset = zero_offset(zero_dtype, bits) if zero_point == "integer" else 0
    if not symmetric and not lattice:
        # A float zero stores the group minimum (KIVI, HF quanto) rounded DOWN into zero_dtype: the range from
        # the stored minimum still covers the group, the step below absorbs the rounding, and the bound holds
        # at any offset (a zero point -min/step in float16 loses it once |min/step| > 2048).
        mn = round_down_to_dtype(mn, zero_dtype).float()
    # Constant group (zero range): a step of |value| (1 at 0) puts the value on a code exactly.
    constant = mn == mx
    constant_step = torch.where(mn != 0, mn.abs(), torch.ones_like(mn))
    if symmetric:
        step = torch.maximum(-mn, mx) / ((1 << (bits - 1)) - 1)
    else:
        step = (mx - mn) / levels
        if lattice:
            # Groups whose zero point would not fit the integer dtype: widen their range to include 0.
            info = torch.iinfo(zero_dtype)
            z = torch.round(-mn / round_up_to_dtype(step, scale_dtype).float() * res) - offset
            bad = (z < info.min) | (z > info.max)
            mn = torch.where(bad, mn.clamp(max=0.0), mn)
            mx = torch.where(bad, mx.clamp(min=0.0), mx)
            step = (mx - mn) / levels
    step = round_up_to_dtype(torch.where(constant, constant_step, step), scale_dtype)
    step_f = step.float()

    if symmetric:
        zero, zero_f = None, float(1 << (bits - 1))
    elif lattice:
        # |z / res + min / step| <= 1 / (2 res): code 0 sits within step / 2 of the minimum, so the bound holds.
        info = torch.iinfo(zero_dtype)
        zero = (torch.round(-mn / step_f * res) - offset).clamp(info.min, info.max).to(zero_dtype)
        zero_f = (zero.float() + offset) / res
    else:
        zero = mn.to(zero_dtype)  # exact: mn was rounded into zero_dtype above
        zero_f = mn
    step_e = layout.to_elements(step_f)  # (B, H, S, D)
    zero_e = layout.to_elements(zero_f) if isinstance(zero_f, torch.Tensor) else zero_f
    if symmetric or zero_point == "integer":
        codes = torch.round(x / step_e) + zero_e
    elif lattice:
        codes = torch.round(x / step_e + zero_e)  # a fractional zero: shift before rounding
    else:
        t = (x - zero_e) / step_e  # in [0, 2^B - 1]: (x - stored minimum) spans at most 2^B - 1 stored steps
        if dither is not None:
            t = t + dither.offsets(tuple(x.shape), x.device)  # in [-1/2, 2^B - 1/2): rounds inside the grid
        codes = torch.round(t)
    codes = codes.clamp(0, levels).to(torch.uint8)  # (B, H, S, D)
    return RTNTensor(pack_codes(codes, bits), step, zero, bits, layout, rotation, zero_point, dither)
