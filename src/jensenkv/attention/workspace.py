"""One attention workspace per (device, dtype), shared by every layer, and dequantization into it.

The cache holds only the stored form (packed codes, steps, zero points, centroids, full-precision
sinks). An attention call dequantizes the visible chunks into views of this one flat buffer; the
buffer grows to the largest request seen and is then reused, so its size is that of one layer's
widest window, not one copy per layer or per chunk. ``release_workspace`` frees it.
"""
from __future__ import annotations

import torch

from jensenkv.quant.rtn import RTNTensor
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


_SHIFTS: dict[tuple[int, torch.device], torch.Tensor] = {}
_PIECE = 2048  # tokens per scratch piece when dequantizing into a strided view


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
    their packed codes and statistics are concatenated (the size of the stored form), unpacked by
    shift-and-mask and rebuilt with one addcmul, evaluated in float32 and rounded once into ``out``."""
    first = stored[0]
    b, h, _, d = first.shape
    bits, span = first.bits, first.layout.channel_span
    per = 8 // bits

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    packed = cat([t.packed.view(b, h, t.shape[2], d // per) for t in stored])  # (B, H, N, D / per) uint8
    step = cat([t.step for t in stored]).float()  # (B, H, N, G)
    shift = cat([t.code_zero() for t in stored]) * -step  # (B, H, N, G): x = code * step + shift
    mask = (1 << bits) - 1
    if bits != 8:
        key = (bits, packed.device)
        if key not in _SHIFTS:
            _SHIFTS[key] = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)  # (per,)
    n_total = packed.shape[2]
    # A broadcasting addcmul into a strided view (the workspace rows are wider than D) is several times
    # slower than into contiguous memory: strided targets go through a scratch of at most _PIECE tokens.
    scratch = not out.is_contiguous()
    piece = _PIECE if scratch else max(n_total, 1)
    for start in range(0, n_total, piece):
        rows = slice(start, min(n_total, start + piece))
        p = packed[:, :, rows]
        codes = p if bits == 8 else (p.unsqueeze(-1) >> _SHIFTS[key]) & mask  # (B, H, n, D / per, per)
        target = torch.empty((b, h, rows.stop - start, d), dtype=out.dtype, device=out.device) if scratch \
            else out[:, :, rows]
        torch.addcmul(shift[:, :, rows, :, None], codes.reshape(b, h, -1, d).unflatten(-1, (-1, span)),
                      step[:, :, rows, :, None], out=target.unflatten(-1, (-1, span)))  # (B, H, n, G, g)
        if scratch:
            out[:, :, rows] = target


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
    once into ``out`` (no (B, H, S, D) float temporaries: only the unpacked uint8 codes)."""
    codes = stored.codes()  # (B, H, S, D) uint8
    step = stored.step.float()  # (b, h, S_groups, D_groups)
    shift = stored.code_zero() * -step  # every zero-point convention: x = code * step + shift
    layout = stored.layout
    if layout.granularity == "channel":  # stats per (g tokens, channel): split the token axis
        span, tokens = layout.token_span, layout.shape[2]
        n = tokens // span
        if n:
            full = n * span
            o = out[:, :, :full].unflatten(2, (n, span))  # (B, H, S_g, g, D)
            c = codes[:, :, :full].unflatten(2, (n, span))
            torch.addcmul(shift[:, :, :n, None], c, step[:, :, :n, None], out=o)
        if n * span < tokens:  # the short last group
            torch.addcmul(shift[:, :, -1:], codes[:, :, n * span :], step[:, :, -1:], out=out[:, :, n * span :])
        return
    # token / token_group: stats per token and channel group
    span = layout.channel_span
    o = out.unflatten(-1, (-1, span))  # (B, H, S, G, g)
    torch.addcmul(shift[..., None], codes.unflatten(-1, (-1, span)), step[..., None], out=o)
