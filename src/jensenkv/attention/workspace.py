"""One attention workspace per (device, dtype), shared by every layer, and dequantization into it.

The cache holds only the stored form (packed codes, steps, zero points, centroids, full-precision
sinks). An attention call dequantizes the visible chunks into views of this one flat buffer; the
buffer grows to the largest request seen and is then reused, so its size is that of one layer's
widest window, not one copy per layer or per chunk. ``release_workspace`` frees it.
"""
from __future__ import annotations

import torch

from jensenkv.quant.packing import unpack_bytes
from jensenkv.quant.rtn import RTNTensor, code_zero
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor

_BUFFERS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def workspace(numel: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A flat (numel,) view of the shared buffer for (device, dtype); contents are undefined.

    Valid until the next call for the same (device, dtype): callers carve all their tensors from
    one request and never keep them past the attention call.
    """
    key = (torch.device(device), dtype)
    buffer = _BUFFERS.get(key)
    if buffer is None or buffer.numel() < numel:
        _BUFFERS.pop(key, None)  # free the smaller buffer before allocating the larger one
        buffer = torch.empty(numel, device=device, dtype=dtype)
        _BUFFERS[key] = buffer
    return buffer[:numel]


def workspace_nbytes() -> int:
    """Bytes held by all workspaces (one buffer per device and dtype)."""
    return sum(b.numel() * b.element_size() for b in _BUFFERS.values())


def release_workspace() -> None:
    """Free every workspace buffer (the next attention call allocates again)."""
    _BUFFERS.clear()


def carve(flat: torch.Tensor, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Consecutive contiguous tensors of the given shapes from the front of a flat buffer."""
    out, start = [], 0
    for shape in shapes:
        n = 1
        for s in shape:
            n *= s
        out.append(flat[start : start + n].view(shape))
        start += n
    return out


_PIECE = 2048  # tokens unpacked at a time: the uint8 / int32 code temporaries stay O(B * H * _PIECE * D) bytes


def batch_key(stored: QuantizedTensor) -> tuple | None:
    """Chunks with equal keys are dequantized together by ``dequantize_many_into``; None: one at a time.

    Batched: unrotated RTN with statistics per token (granularity token / token_group) and bits that pack
    whole codes into bytes (2, 4, 8).
    """
    if not isinstance(stored, RTNTensor) or stored.rotation is not None or stored.bits not in (2, 4, 8) \
            or stored.dither is not None:
        return None
    if stored.layout.granularity not in ("token", "token_group"):
        return None
    zero = None if stored.zero is None else (stored.zero.dtype, stored.zero_point)
    return stored.bits, stored.layout.channel_span, stored.step.dtype, zero, stored.shape[:2], stored.shape[3]


def dequantize_many_into(stored: list[RTNTensor], out: torch.Tensor) -> None:
    """Dequantize consecutive chunks sharing one ``batch_key`` into ``out`` (B, H, sum S_i, D) in one pass:
    their packed codes and statistics are concatenated (the size of the stored form), unpacked by one
    byte-table gather (``packing.unpack_bytes``) and rebuilt in place (``_affine_into``)."""
    first = stored[0]
    b, h, _, d = first.shape
    bits, span = first.bits, first.layout.channel_span
    per = 8 // bits

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    packed = cat([t.packed.view(b, h, t.shape[2], d // per) for t in stored])  # (B, H, N, D / per) uint8
    stored_step = cat([t.step for t in stored])  # (B, H, N, G) in the scale dtype
    step = stored_step.float()
    zero = None if first.zero is None else cat([t.zero for t in stored])  # one convention (the batch key)
    shift = code_zero(zero, stored_step, bits, first.zero_point) * -step  # (B, H, N, G): x = code * step + shift
    for start in range(0, packed.shape[2], _PIECE):  # pieces bound the code temporaries, whatever the window
        rows = slice(start, start + _PIECE)
        _affine_into(unpack_bytes(packed[:, :, rows], bits), step[:, :, rows], shift[:, :, rows], span, out[:, :, rows])


def _affine_into(codes: torch.Tensor, step: torch.Tensor, shift: torch.Tensor, span: int, out: torch.Tensor) -> None:
    """out = codes * step + shift per group of ``span`` channels: codes (B, H, N, D) uint8, step/shift (B, H, N, G).

    The codes are first cast into ``out`` (exact small integers), then rebuilt in place by one addcmul
    evaluated in float32 and rounded once: a uint8 operand in addcmul takes a slow casting loop (~3x), and
    ``out`` (a workspace view, possibly with rows wider than D) is already allocated, so no float temporary.
    """
    out.copy_(codes)
    o = out.unflatten(-1, (-1, span))  # (B, H, N, G, g)
    torch.addcmul(shift[..., None], o, step[..., None], out=o)


def dequantize_into(stored: QuantizedTensor, out: torch.Tensor) -> None:
    """Write ``stored.dequantize()`` (original basis) into ``out`` (B, H, S, D), which may be a strided view.

    RTN without rotation is rebuilt group by group with broadcasting, so the only temporaries are the
    unpacked uint8 codes and per-group statistics; other forms go through ``dequantize()``.
    """
    if isinstance(stored, FullPrecisionTensor):
        out.copy_(stored.data)
        return
    if isinstance(stored, RTNTensor) and stored.rotation is None and stored.layout.granularity != "tensor" \
            and stored.dither is None:
        _rtn_into(stored, out)
        return
    out.copy_(stored.dequantize())


def _rtn_into(stored: RTNTensor, out: torch.Tensor) -> None:
    """x = code * step - zero * step, broadcast over each group's elements, evaluated in float32 and rounded
    once into ``out`` (no (B, H, S, D) float temporaries: only the unpacked uint8 codes, cast into ``out`` first)."""
    codes = stored.codes()  # (B, H, S, D) uint8
    step = stored.step.float()  # (b, h, S_groups, D_groups)
    shift = stored.code_zero() * -step  # every zero-point convention: x = code * step + shift
    layout = stored.layout
    if layout.granularity == "channel":  # stats per (g tokens, channel): split the token axis
        span, tokens = layout.token_span, layout.shape[2]
        n = tokens // span
        out.copy_(codes)  # cast first, rebuild in place (as ``_affine_into``)
        if n:
            o = out[:, :, : n * span].unflatten(2, (n, span))  # (B, H, S_g, g, D)
            torch.addcmul(shift[:, :, :n, None], o, step[:, :, :n, None], out=o)
        if n * span < tokens:  # the short last group
            o = out[:, :, n * span :]  # (B, H, S - n g, D)
            torch.addcmul(shift[:, :, -1:], o, step[:, :, -1:], out=o)
        return
    # token / token_group: stats per token and channel group
    _affine_into(codes, step, shift, layout.channel_span, out)
