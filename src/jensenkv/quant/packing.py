"""Bit packing of integer codes into uint8: real storage for INT2/3/4/8.

Layout (one rule for every width): the codes, flattened in C order, form a little-endian bit
stream; code i occupies bits [i*B, (i+1)*B) of that stream, least significant bit first.
Concretely: INT8 one code per byte; INT4 two per byte (code 2j in the low nibble of byte j);
INT2 four per byte (code 4j+i in bits 2i..2i+1); INT3 eight codes in three bytes (the 24-bit
little-endian word of bytes 3j..3j+2 holds code 8j+i in bits 3i..3i+2). The stream is padded with
zero codes to a whole unit (1 byte, or 3 bytes for INT3), so INT3 may carry up to 2 pad bytes.
"""
from __future__ import annotations

import math
import sys

import torch

PACK_BITS = (2, 3, 4, 8)


def _unit(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole packing unit for `bits`-bit codes."""
    if bits not in PACK_BITS:
        raise ValueError(f"bits={bits!r} is not allowed for packing: must be one of {PACK_BITS}")
    codes_per_unit = 8 // math.gcd(8, bits)
    return codes_per_unit, codes_per_unit * bits // 8


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes `pack_codes` uses for `numel` codes."""
    codes_per_unit, bytes_per_unit = _unit(bits)
    return -(-numel // codes_per_unit) * bytes_per_unit


def pack_codes(codes: torch.Tensor, bits: int, check: bool = True) -> torch.Tensor:
    """Pack integer codes in [0, 2^bits) (any shape) into a flat uint8 tensor (layout: module docstring).

    check: verify the range first. It reads one value back from the codes' device (a sync on a GPU), and
    none for uint8 codes at bits=8; callers that clamp the codes themselves may pass False.
    """
    codes_per_unit, bytes_per_unit = _unit(bits)
    flat = codes.reshape(-1)  # (N,)
    if check and flat.numel():
        _check_range(flat, bits)
    pad = -flat.numel() % codes_per_unit
    if pad:
        flat = torch.cat((flat, flat.new_zeros(pad)))
    if bytes_per_unit == 1:  # INT2/4/8: or the codes into one byte directly in uint8 (10x faster)
        units = flat.to(torch.uint8).view(-1, codes_per_unit)  # (U, codes per byte)
        out = units[:, 0].clone()
        for i in range(1, codes_per_unit):
            out |= units[:, i] << (i * bits)
        return out
    units = flat.to(torch.int64).view(-1, codes_per_unit)  # (U, codes per unit)
    shifts = torch.arange(codes_per_unit, device=flat.device) * bits
    words = (units << shifts).sum(-1)  # (U,) disjoint bit fields, so sum == bitwise or
    byte_shifts = torch.arange(bytes_per_unit, device=flat.device) * 8
    return ((words[:, None] >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)  # (U * bytes per unit,)


def _check_range(flat: torch.Tensor, bits: int) -> None:
    """Raise ValueError unless every code lies in [0, 2^bits); at most one host read."""
    if flat.dtype == torch.bool or flat.is_floating_point() or flat.is_complex():
        raise ValueError(f"codes dtype={flat.dtype} is not allowed: use an integer dtype")
    if flat.dtype == torch.uint8:
        if bits == 8:  # every uint8 value is a valid 8-bit code
            return
        bad = int(flat.max()) >= 1 << bits
    else:
        low, high = torch.aminmax(flat)
        low, high = torch.stack((low, high)).tolist()  # one read for both ends
        bad = low < 0 or high >= 1 << bits
    if bad:
        raise ValueError(f"codes must lie in [0, {(1 << bits) - 1}] for bits={bits}")


def unpack_codes(packed: torch.Tensor, bits: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """Inverse of `pack_codes`: a uint8 tensor of codes with the given shape."""
    codes_per_unit, bytes_per_unit = _unit(bits)
    numel = math.prod(shape)
    if packed.dtype != torch.uint8 or packed.numel() != packed_nbytes(numel, bits):
        raise ValueError(
            f"packed must be uint8 with {packed_nbytes(numel, bits)} bytes for {numel} {bits}-bit codes, "
            f"got {packed.dtype} with {packed.numel()}"
        )
    if bytes_per_unit == 1:  # INT2/4/8: every byte holds whole codes
        return unpack_bytes(packed.reshape(-1), bits)[:numel].reshape(shape)
    units = packed.reshape(-1, bytes_per_unit).to(torch.int64)  # (U, bytes per unit)
    byte_shifts = torch.arange(bytes_per_unit, device=packed.device) * 8
    words = (units << byte_shifts).sum(-1)  # (U,)
    shifts = torch.arange(codes_per_unit, device=packed.device) * bits
    codes = (words[:, None] >> shifts) & ((1 << bits) - 1)  # (U, codes per unit)
    return codes.reshape(-1)[:numel].to(torch.uint8).reshape(shape)


# One packed byte -> its 8 // bits codes as the bytes of one integer (INT2: int32, INT4: int16), little-endian.
_WORD = {2: torch.int32, 4: torch.int16}
_TABLES: dict[tuple[int, torch.device], torch.Tensor] = {}


def _byte_table(bits: int, device: torch.device) -> torch.Tensor:
    """(256,) integers whose in-memory bytes (little-endian) are the codes of each byte value, in stream order."""
    key = (bits, device)
    if key not in _TABLES:
        per = 8 // bits
        byte = torch.arange(256, dtype=torch.int64)
        codes = (byte[:, None] >> (bits * torch.arange(per))) & ((1 << bits) - 1)  # (256, per): code i at bits i*B
        _TABLES[key] = (codes << (8 * torch.arange(per))).sum(-1).to(_WORD[bits]).to(device)  # byte i = code i
    return _TABLES[key]


def unpack_bytes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 bytes (..., n) of 2-, 4- or 8-bit codes -> uint8 codes (..., n * 8 // bits) in stream order.

    One table gather per byte (a (256,) table whose entries' bytes are the codes) instead of a broadcast
    shift and mask, which runs a 4-wide inner loop and is about 3x slower on the CPU; big-endian hosts
    shift and mask.
    """
    if bits == 8:
        return packed
    if bits not in _WORD:
        raise ValueError(f"bits={bits!r} is not allowed for whole-byte unpacking: use 2, 4 or 8")
    if sys.byteorder == "little":
        words = _byte_table(bits, packed.device).index_select(0, packed.reshape(-1).int())  # (n_total,)
        return words.view(torch.uint8).view(*packed.shape[:-1], -1)
    mask = (1 << bits) - 1
    codes = torch.stack([(packed >> (i * bits)) & mask for i in range(8 // bits)], -1)  # (..., n, per)
    return codes.flatten(-2)
