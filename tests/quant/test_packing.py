"""Bit packing: exact round trips on every code value and position, the documented layout, byte counts."""
from __future__ import annotations

import pytest
import torch

from jensenkv.quant import pack_codes, packed_nbytes, packing, unpack_codes

UNIT = {2: (4, 1), 3: (8, 3), 4: (2, 1), 8: (1, 1)}  # bits -> (codes, bytes) per packing unit


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_every_value_at_every_position_round_trips(bits):
    n, _ = UNIT[bits]
    values = 1 << bits
    gen = torch.Generator().manual_seed(bits)
    # One unit per (value, position): that position holds the value, the others random codes.
    units = torch.randint(0, values, (values, n, n), generator=gen)  # (value, position, unit slot)
    idx = torch.arange(n)
    units[:, idx, idx] = torch.arange(values)[:, None]
    codes = units.reshape(-1).to(torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(codes.numel(), bits)
    assert torch.equal(unpack_codes(packed, bits, codes.shape), codes)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_every_byte_pattern_round_trips(bits):
    packed = torch.arange(256, dtype=torch.uint8)
    codes = unpack_codes(packed, bits, (256 * 8 // bits,))
    assert torch.equal(pack_codes(codes, bits), packed)


def test_int3_every_three_byte_pattern_of_one_byte_round_trips():
    # All 2^24 words are too many; cover every value of each of the three bytes with the others random.
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (3 * 256, 3), generator=gen, dtype=torch.uint8)
    for byte in range(3):
        packed[byte * 256 : (byte + 1) * 256, byte] = torch.arange(256, dtype=torch.uint8)
    packed = packed.reshape(-1)
    codes = unpack_codes(packed, 3, (packed.numel() * 8 // 3,))
    assert torch.equal(pack_codes(codes, 3), packed)


@pytest.mark.parametrize("bits, numel", [(2, 7), (3, 13), (4, 5), (8, 3), (3, 1)])
def test_shapes_that_do_not_fill_a_unit(bits, numel):
    codes = torch.randint(0, 1 << bits, (numel,), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    n, nbytes = UNIT[bits]
    assert packed.numel() == -(-numel // n) * nbytes
    assert torch.equal(unpack_codes(packed, bits, (numel,)), codes)


def test_documented_layout():
    # INT4: code 2j in the low nibble; INT2: code 4j+i in bits 2i..2i+1; INT3: 24-bit little-endian word.
    assert pack_codes(torch.tensor([1, 2]), 4).tolist() == [0x21]
    assert pack_codes(torch.tensor([1, 2, 3, 0]), 2).tolist() == [1 | 2 << 2 | 3 << 4]
    word = sum(c << (3 * i) for i, c in enumerate([1, 2, 3, 4, 5, 6, 7, 0]))
    assert pack_codes(torch.tensor([1, 2, 3, 4, 5, 6, 7, 0]), 3).tolist() == [
        word & 0xFF,
        (word >> 8) & 0xFF,
        word >> 16,
    ]


def test_multidimensional_shape_round_trips():
    codes = torch.randint(0, 8, (2, 3, 5, 16), dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes, 3), 3, codes.shape), codes)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"bits=5"):
        pack_codes(torch.zeros(4, dtype=torch.uint8), 5)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        pack_codes(torch.tensor([4]), 2)
    with pytest.raises(ValueError, match=r"2 bytes"):
        unpack_codes(torch.zeros(3, dtype=torch.uint8), 2, (8,))


@pytest.mark.parametrize("bits,dtype,limit", [(2, torch.uint8, 1), (3, torch.int64, 1), (4, torch.int32, 1),
                                              (8, torch.uint8, 0)])
def test_range_check_reads_the_device_at_most_once(host_reads, bits, dtype, limit):
    """Each host read is a sync on a GPU: the range check needs at most one (none for uint8 at 8 bits)."""
    codes = torch.randint(0, 1 << bits, (64,)).to(dtype)
    host_reads.clear()  # count only the call below
    reads = host_reads
    packed = pack_codes(codes, bits)
    assert len(reads) <= limit, reads
    reads.clear()
    assert torch.equal(pack_codes(codes, bits, check=False), packed) and not reads


@pytest.mark.parametrize("codes", [torch.tensor([0, 4], dtype=torch.uint8), torch.tensor([0, -1]),
                                   torch.tensor([3, 5], dtype=torch.int32)])
def test_out_of_range_codes_are_rejected(codes):
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 3\] for bits=2"):
        pack_codes(codes, 2)


@pytest.mark.parametrize("byteorder", ["little", "big"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_unpack_bytes_gives_every_byte_value_its_codes_in_stream_order(bits, byteorder, monkeypatch):
    """The table gather (little-endian hosts) and the shift-and-mask fallback both read code i of a byte
    from bits [i*B, (i+1)*B), for all 256 byte values, keeping leading dims."""
    monkeypatch.setattr(packing.sys, "byteorder", byteorder)
    per = 8 // bits
    byte = torch.arange(256, dtype=torch.uint8).view(2, 4, 32)  # (2, 4, 32): leading dims kept
    expected = torch.stack([(byte.long() >> (i * bits)) & ((1 << bits) - 1) for i in range(per)], -1)
    codes = packing.unpack_bytes(byte, bits)
    assert codes.dtype == torch.uint8 and codes.shape == (2, 4, 32 * per)
    assert torch.equal(codes.long(), expected.flatten(-2))


def test_unpack_bytes_refuses_codes_that_straddle_bytes():
    with pytest.raises(ValueError, match="bits=3.*2, 4 or 8"):
        packing.unpack_bytes(torch.zeros(3, dtype=torch.uint8), 3)
