"""A growing buffer that holds a cache's chunks of one stored layout back to back (``ChunkStore``).

A layer's cache keeps its keys in one store and its values in another (and its full-precision sink chunks in
two more). ``append`` copies a freshly quantized chunk into the buffers at the end of the live range (once,
at commit) and rebinds the chunk's fields to views of them: RTN packed codes (B, H, S, D * bits / 8), steps
and zeros (B, H, S_groups, G), and for per-channel (KIVI) layouts a per-token table of stat rows; or a
full-precision tensor (B, H, S, D). Consecutive chunks are therefore adjacent in memory, so a run of them (a
window, the chunks a kv-range limit keeps, one video's rows) is one strided view, and attention reads it in
place. ``release`` frees the oldest chunk (a sliding window).

When a chunk does not fit, the live chunks are re-laid from the front of fresh buffers of twice their size
(capacity doubling as the cache grows; under a sliding window, about once per window of tokens, so at most
~2 bytes moved per byte appended). The stored bytes of a chunk
(``nbytes`` of its views) are what the cache counts; ``held_nbytes`` is the capacity the buffers hold, the
stored bytes plus the slack. ``reserve`` sets the capacity up front (no slack when the size is known): while
the live chunks fit in the reservation, a re-lay makes buffers of exactly that size (under a sliding window
reserved at window + 1 chunks, one re-lay of the window per commit once it is full).
"""
from __future__ import annotations

import torch

from jensenkv.quant.rtn import RTNTensor
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor

STORED_BITS = (2, 4, 8)  # whole codes per byte: every token's codes start on a byte
_TOKEN_LAYOUTS = ("token", "token_group")  # one stat row per token
_MIN_CAPACITY = 16  # tokens


def _signature(t: QuantizedTensor) -> tuple | None:
    """What chunks must share to live in one store; None for forms a store does not hold (QVG, smoothing,
    tensor granularity, INT3, dithered chunks: their stored forms stay per chunk)."""
    if isinstance(t, FullPrecisionTensor):
        return ("full", t.data.dtype, tuple(t.shape[:2]), t.shape[3])
    if type(t) is not RTNTensor or t.bits not in STORED_BITS or t.dither is not None:
        return None
    if t.layout.granularity not in (*_TOKEN_LAYOUTS, "channel") or t.packed.ndim != 1:
        return None
    zero = None if t.zero is None else (t.zero.dtype, t.zero_point)
    return ("rtn", t.bits, t.layout.granularity, t.layout.group_size, t.step.dtype, zero, id(t.rotation),
            tuple(t.shape[:2]), t.shape[3], t.step.shape[3])


class ChunkStore:
    """Back-to-back storage of one layer's chunks of one layout (module docstring)."""

    def __init__(self, signature: tuple):
        self.signature = signature
        self._buffers: dict[str, torch.Tensor] = {}  # name -> (B, H, capacity, width) or (capacity,) rows
        self._chunks: list[list] = []  # live chunks, oldest first: [tensor, token start, row start, tokens, rows]
        self._lo = [0, 0]  # (token, row) start of the live range
        self._hi = [0, 0]  # (token, row) end of the live range
        self._reserved = 0

    @staticmethod
    def accepts(t: QuantizedTensor) -> tuple | None:
        """The store signature of a stored chunk, or None when it stays per chunk."""
        return _signature(t)

    @property
    def held_nbytes(self) -> int:
        """Bytes the buffers hold (capacity): the stored bytes plus the slack."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def reserve(self, tokens: int) -> None:
        """Hold at least ``tokens`` tokens from the first append on (capacity doubling then starts there)."""
        self._reserved = max(self._reserved, int(tokens))

    # per kind: the tensor's parts as (name, axis-2 source of width w, kind "token" | "row")
    @staticmethod
    def _parts(t: QuantizedTensor) -> list[tuple[str, torch.Tensor, str]]:
        if isinstance(t, FullPrecisionTensor):
            return [("data", t.data, "token")]
        b, h, s, d = t.shape
        parts = [("codes", t.packed.view(b, h, s, d * t.bits // 8), "token"), ("step", t.step, "row")]
        if t.zero is not None:
            parts.append(("zero", t.zero, "row"))
        return parts

    def _rows_needed(self, t: QuantizedTensor) -> int:
        return 0 if isinstance(t, FullPrecisionTensor) else t.step.shape[2]

    def _capacity(self) -> tuple[int, int]:
        tokens = next((b.shape[2] for n, b in self._buffers.items() if n in ("data", "codes")), 0)
        rows = self._buffers["step"].shape[2] if "step" in self._buffers else 0
        return tokens, rows

    def append(self, t: QuantizedTensor) -> None:
        """Copy ``t`` (a chunk of this store's signature) to the end of the live range and rebind its fields to
        views of the buffers; ``t.nbytes`` is unchanged."""
        if _signature(t) != self.signature:
            raise ValueError(f"a chunk with store signature {_signature(t)} cannot join a store of {self.signature}")
        tokens, rows = t.shape[2], self._rows_needed(t)
        cap_t, cap_r = self._capacity()
        if not self._buffers or self._hi[0] + tokens > cap_t or self._hi[1] + rows > cap_r:
            self._make_room(t, tokens, rows)
        start_t, start_r = self._hi
        for name, source, axis in self._parts(t):
            start, n = (start_t, tokens) if axis == "token" else (start_r, rows)
            self._buffers[name][:, :, start:start + n].copy_(source)
        if "rows" in self._buffers:  # per-channel layout: each token's stat row, absolute in the buffer
            span = t.layout.token_span
            self._buffers["rows"][start_t:start_t + tokens] = (
                torch.arange(tokens, device=t.packed.device, dtype=torch.int32) // span + start_r)
        self._hi = [start_t + tokens, start_r + rows]
        self._chunks.append([t, start_t, start_r, tokens, rows])
        self._bind(self._chunks[-1])

    def release(self, t: QuantizedTensor) -> None:
        """Forget the oldest live chunk (it must be ``t``): its bytes become slack until the buffer is re-laid."""
        if not self._chunks or self._chunks[0][0] is not t:
            raise ValueError("ChunkStore.release frees the oldest live chunk only")
        _, start_t, start_r, tokens, rows = self._chunks.pop(0)
        self._lo = [start_t + tokens, start_r + rows] if self._chunks else [0, 0]
        if not self._chunks:
            self._hi = [0, 0]

    def _make_room(self, t: QuantizedTensor, tokens: int, rows: int) -> None:
        """Re-lay the live range from the front of fresh buffers with room for ``tokens`` / ``rows`` more: twice
        the live size (doubling as the cache grows; a sliding window re-lays every ~window tokens). Fresh, not
        in place: views handed out earlier keep reading what they were given."""
        live_t, live_r = self._hi[0] - self._lo[0], self._hi[1] - self._lo[1]
        if self._reserved >= live_t + tokens:  # the final size is known: exactly that, no doubling
            new_t = self._reserved
            new_r = max(live_r + rows, -(-new_t * rows // max(tokens, 1))) if rows else 0
        else:
            new_t = max(2 * (live_t + tokens), _MIN_CAPACITY)
            new_r = max(2 * (live_r + rows), -(-new_t * rows // max(tokens, 1))) if rows else 0
        fresh = {}
        for name, source, axis in self._parts(t):
            fresh[name] = source.new_empty(*source.shape[:2], new_t if axis == "token" else new_r, source.shape[3])
        if isinstance(t, RTNTensor) and t.layout.granularity == "channel":
            fresh["rows"] = torch.empty(new_t, dtype=torch.int32, device=t.packed.device)
        for name, buffer in self._buffers.items():
            lo, hi = (self._lo[1], self._hi[1]) if name in ("step", "zero") else (self._lo[0], self._hi[0])
            if name == "rows":
                fresh[name][: hi - lo] = buffer[lo:hi] - self._lo[1]
            else:
                fresh[name][:, :, : hi - lo] = buffer[:, :, lo:hi]
        self._buffers = fresh  # the old buffers are freed once no view of them is held
        self._shift_live()

    def _shift_live(self) -> None:
        """After the live range moved to the buffers' front: new offsets, every live chunk rebound."""
        lo_t, lo_r = self._lo
        for chunk in self._chunks:
            chunk[1] -= lo_t
            chunk[2] -= lo_r
            self._bind(chunk)
        self._hi = [self._hi[0] - lo_t, self._hi[1] - lo_r]
        self._lo = [0, 0]

    def _bind(self, chunk: list) -> None:
        """Point a live chunk's fields at its place in the buffers."""
        t, start_t, start_r, tokens, rows = chunk
        if isinstance(t, FullPrecisionTensor):
            t.data = self._buffers["data"][:, :, start_t:start_t + tokens]  # (B, H, S, D)
            return
        t.packed = self._buffers["codes"][:, :, start_t:start_t + tokens]  # (B, H, S, D * bits / 8)
        t.step = self._buffers["step"][:, :, start_r:start_r + rows]  # (B, H, S_groups, G)
        if t.zero is not None:
            t.zero = self._buffers["zero"][:, :, start_r:start_r + rows]
        if "rows" in self._buffers:
            t.stat_rows = self._buffers["rows"][start_t:start_t + tokens]  # (S,) int32, absolute rows


def back_to_back(parts: list[torch.Tensor], dim: int) -> torch.Tensor | None:
    """One strided view over tensors that lie one after another along ``dim`` in one buffer (consecutive
    chunks of a cache's store), or None when they do not (the caller concatenates)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset() + first.shape[dim] * first.stride(dim)
    for part in parts[1:]:
        if (part.untyped_storage().data_ptr() != storage or part.stride() != first.stride()
                or part.shape[:dim] != first.shape[:dim] or part.shape[dim + 1:] != first.shape[dim + 1:]
                or part.storage_offset() != offset):
            return None
        offset += part.shape[dim] * part.stride(dim)
    size = list(first.shape)
    size[dim] = sum(part.shape[dim] for part in parts)
    return first.as_strided(size, first.stride(), first.storage_offset())
