"""RTN quantization: the D/2 error bound with the STORED step, exact byte counts, group layouts, rotation."""
from __future__ import annotations

import itertools

import pytest
import torch

from jensenkv.quant import FullPrecisionTensor, QuantConfig, RandomHadamard, RTNTensor, make_quantizer

GRANULARITIES = ["tensor", "token", "token_group", "channel"]


def keys_like(b=1, h=2, s=40, d=64, seed=0) -> torch.Tensor:
    """(B, H, S, D) with per-channel offsets and a few outlier channels, like post-RoPE keys."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, s, d, generator=gen)
    x = x + 3 * torch.randn(1, h, 1, d, generator=gen)  # channel offsets: many groups do not straddle 0
    x[..., 5] *= 20  # outlier channel
    return x


def elementwise_step(t: RTNTensor) -> torch.Tensor:
    """(B, H, S, D) the stored step of every element."""
    return t.layout.to_elements(t.step.float())


def assert_within_half_step(x_hat, x, step):
    assert torch.isfinite(x_hat).all()
    assert ((x_hat - x).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all(), ((x_hat - x).abs() / step).max()


@pytest.mark.parametrize(
    "granularity, bits, symmetric, zero_dtype",
    list(itertools.product(GRANULARITIES, [2, 3, 4, 8], [False, True], ["int8", "uint8", "float16"])),
)
def test_error_within_half_stored_step(granularity, bits, symmetric, zero_dtype):
    x = keys_like()
    cfg = QuantConfig(bits=bits, granularity=granularity, group_size=16, symmetric=symmetric, zero_dtype=zero_dtype)
    t = make_quantizer(cfg, 64).quantize(x)
    assert_within_half_step(t.dequantize(), x, elementwise_step(t))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("symmetric, zero_dtype", [(False, "int8"), (False, "uint8"), (False, "float16"), (True, "int8")])
def test_constant_groups_are_exact_and_finite(granularity, symmetric, zero_dtype):
    x = torch.zeros(1, 2, 8, 32)
    x[:, 1] = 2.5  # head 1 constant nonzero, head 0 all zeros
    cfg = QuantConfig(granularity=granularity, group_size=8, symmetric=symmetric, zero_dtype=zero_dtype)
    t = make_quantizer(cfg, 32).quantize(x)
    x_hat = t.dequantize()
    if granularity == "tensor":  # one group spans both heads: not constant, only the bound applies
        assert_within_half_step(x_hat, x, elementwise_step(t))
    else:
        assert torch.equal(x_hat, x)
    assert torch.isfinite(t.group_steps().step).all() and (t.group_steps().step > 0).all()


def test_asymmetric_float_zero_keeps_offset_groups_precise():
    # All values in [50, 52]: a uint8 zero must widen the range to include 0, a float zero need not.
    x = 50 + 2 * torch.rand(1, 1, 16, 32, generator=torch.Generator().manual_seed(1))
    int_zero = make_quantizer(QuantConfig(bits=4), 32).quantize(x)
    float_zero = make_quantizer(QuantConfig(bits=4, zero_dtype="float16"), 32).quantize(x)
    assert_within_half_step(int_zero.dequantize(), x, elementwise_step(int_zero))
    assert_within_half_step(float_zero.dequantize(), x, elementwise_step(float_zero))
    assert float_zero.step.float().max() < int_zero.step.float().min() / 10


def test_int8_zero_does_not_widen_groups_away_from_zero():
    # All values in [3, 5]: round(-min/D) fits int8, so the step is the group's own (max-min)/3;
    # a uint8 zero cannot be negative and must widen the range to [0, 5].
    x = 3 + 2 * torch.rand(1, 1, 16, 32, generator=torch.Generator().manual_seed(2))
    signed = make_quantizer(QuantConfig(bits=2, zero_dtype="int8"), 32).quantize(x)
    unsigned = make_quantizer(QuantConfig(bits=2, zero_dtype="uint8"), 32).quantize(x)
    assert_within_half_step(signed.dequantize(), x, elementwise_step(signed))
    assert_within_half_step(unsigned.dequantize(), x, elementwise_step(unsigned))
    group_range = x.view(1, 1, 16, 1, 32).amax(-1) - x.view(1, 1, 16, 1, 32).amin(-1)  # (1, 1, 16, 1)
    assert torch.allclose(signed.step.float(), group_range / 3, rtol=1e-3)
    assert (unsigned.step.float() > 2 * signed.step.float()).all()


def test_nbytes_hand_count_int2_g32():
    x = torch.randn(1, 1, 64, 128)
    t = make_quantizer(QuantConfig(bits=2, group_size=32), 128).quantize(x)
    assert t.step.dtype == torch.float16 and t.zero.dtype == torch.uint8
    assert t.packed.dtype == torch.uint8
    assert t.nbytes == 64 * 128 // 4 + 64 * 4 * (2 + 1)


@pytest.mark.parametrize(
    "overrides, shape, expected",
    [
        # INT3 per token: 3 bits per code, one fp16 step + uint8 zero per token
        ({"bits": 3, "granularity": "token"}, (1, 2, 64, 128), 2 * 64 * 128 * 3 // 8 + 2 * 64 * 3),
        # symmetric: no zero points stored
        ({"bits": 2, "symmetric": True}, (1, 1, 64, 128), 64 * 128 // 4 + 64 * 4 * 2),
        # KIVI keys, groups of 32 tokens, S=70 -> 3 token groups (the last one short) per channel
        ({"bits": 2, "granularity": "channel"}, (1, 1, 70, 128), 70 * 128 // 4 + 3 * 128 * 3),
        # per tensor: one step + one zero
        ({"bits": 4, "granularity": "tensor"}, (2, 2, 8, 64), 2 * 2 * 8 * 64 // 2 + 3),
        # float32 steps and float16 zeros
        ({"bits": 8, "scale_dtype": "float32", "zero_dtype": "float16"}, (1, 1, 4, 64), 4 * 64 + 4 * 2 * 6),
        # INT3 codes that do not fill a 3-byte unit: 5 codes -> 3 bytes
        ({"bits": 3, "granularity": "tensor"}, (1, 1, 1, 5), 3 + 3),
    ],
)
def test_nbytes_counts_every_stored_tensor(overrides, shape, expected):
    head_dim = shape[-1]
    overrides = {"group_size": 32, **overrides}
    t = make_quantizer(QuantConfig(**overrides), head_dim).quantize(torch.randn(shape))
    assert t.nbytes == expected


def test_group_steps_token_group():
    x = keys_like(s=10, d=64)
    t = make_quantizer(QuantConfig(group_size=16), 64).quantize(x)
    steps = t.group_steps()
    assert steps.rotation is None
    assert steps.step.shape == (1, 2, 10, 4) and steps.step.dtype == torch.float32
    assert torch.equal(steps.step, t.step.float())
    # the steps really are the ones used: expanding them gives the per-element bound
    assert_within_half_step(t.dequantize(), x, steps.step.repeat_interleave(16, dim=-1))


def test_group_steps_channel_each_token_gets_its_token_groups_step():
    x = keys_like(s=70, d=64)
    t = make_quantizer(QuantConfig(granularity="channel", group_size=32), 64).quantize(x)
    steps = t.group_steps().step
    assert t.step.shape == (1, 2, 3, 64)  # ceil(70 / 32) token groups per channel
    assert steps.shape == (1, 2, 70, 64)
    token_group = torch.arange(70) // 32
    assert torch.equal(steps, t.step.float()[:, :, token_group])
    assert_within_half_step(t.dequantize(), x, steps)


@pytest.mark.parametrize("granularity", ["tensor", "token"])
def test_group_steps_single_group(granularity):
    x = keys_like(s=12)
    t = make_quantizer(QuantConfig(granularity=granularity), 64).quantize(x)
    steps = t.group_steps().step
    assert steps.shape == (1, 2, 12, 1)
    assert_within_half_step(t.dequantize(), x, steps.expand_as(x))
    if granularity == "tensor":
        assert (steps == steps.flatten()[0]).all()


def test_symmetric_int2_uses_three_codes():
    t = make_quantizer(QuantConfig(bits=2, symmetric=True), 64).quantize(keys_like())
    assert t.zero is None
    assert set(t.codes().unique().tolist()) <= {1, 2, 3}


def test_hadamard_rotation_dequantizes_to_original_basis_with_rotated_steps():
    x = keys_like()
    cfg = QuantConfig(bits=4, rotation="hadamard", rotation_seed=3, group_size=16)
    t = make_quantizer(cfg, 64).quantize(x)
    steps = t.group_steps()
    assert isinstance(steps.rotation, RandomHadamard) and steps.rotation.seed == 3
    rot = steps.rotation
    # the bound holds in the rotated basis, where the codes live
    assert_within_half_step(rot.apply(t.dequantize()), rot.apply(x), steps.step.repeat_interleave(16, dim=-1))
    # and dequantize() is in the original basis: far closer to x than to its rotation
    assert (t.dequantize() - x).pow(2).mean() < 0.01 * (rot.apply(x) - x).pow(2).mean()


def test_hadamard_shrinks_per_token_error_with_an_outlier_channel():
    # QuaRot's setting: one scale per token; the outlier sets every token's range unless spread out.
    x = torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(2))
    x[..., 7] += 20
    cfg = QuantConfig(bits=2, granularity="token")
    plain = make_quantizer(cfg, 64).quantize(x)
    rotated = make_quantizer(QuantConfig.from_dict({**cfg.__dict__, "rotation": "hadamard"}), 64).quantize(x)
    assert (rotated.dequantize() - x).pow(2).mean() < 0.85 * (plain.dequantize() - x).pow(2).mean()


def test_accepts_bf16_input_and_rejects_bad_shapes():
    q = make_quantizer(QuantConfig(), 64)
    x = keys_like().bfloat16()
    assert q.quantize(x).dequantize().dtype == torch.float32
    with pytest.raises(ValueError, match=r"D=head_dim=64"):
        q.quantize(torch.randn(1, 2, 8, 32))
    with pytest.raises(ValueError, match=r"\(B, H, S, D\)"):
        q.quantize(torch.randn(2, 8, 64))
    with pytest.raises(ValueError, match=r"floating point"):
        q.quantize(torch.ones(1, 1, 2, 64, dtype=torch.int64))


@pytest.mark.parametrize("store_dtype, size", [("float32", 4), ("bfloat16", 2), ("float16", 2)])
def test_method_none_stores_as_is(store_dtype, size):
    x = keys_like()
    t = make_quantizer(QuantConfig(method="none", store_dtype=store_dtype), 64).quantize(x)
    assert isinstance(t, FullPrecisionTensor) and t.group_steps() is None
    assert t.nbytes == x.numel() * size
    assert torch.equal(t.dequantize(), x.to(t.data.dtype).float())
    x.add_(1)  # the stored copy must not alias the caller's tensor
    assert not torch.equal(t.dequantize(), x.to(t.data.dtype).float())


def test_quantizer_counts_calls():
    q = make_quantizer(QuantConfig(), 64)
    for _ in range(3):
        q.quantize(keys_like())
    assert q.num_calls == 3


@pytest.mark.parametrize("bits, group_size, effective", [(2, 32, 2.75), (2, 128, 2.1875), (4, 64, 4.375)])
def test_effective_bits_match_the_paper(bits, group_size, effective):
    # paper: B + 24 / g bits per element (16-bit step + 8-bit zero per group)
    x = torch.randn(1, 2, 32, 128)
    t = make_quantizer(QuantConfig(bits=bits, group_size=group_size), 128).quantize(x)
    assert t.nbytes * 8 / x.numel() == effective


FLOAT_ZERO_DTYPES = ["float16", "bfloat16", "float32"]


@pytest.mark.parametrize("zero_dtype", FLOAT_ZERO_DTYPES)
@pytest.mark.parametrize("granularity", ["token_group", "channel"])
@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("offset", [1e4, -3e4, 5000.0])
def test_float_zero_keeps_the_bound_at_large_offsets(zero_dtype, granularity, bits, offset):
    """Channels at a large constant offset plus small noise: |min / step| is far above float16's 2048 integers,
    yet every element stays within half its stored step (up to float32 rounding of the values themselves)."""
    gen = torch.Generator().manual_seed(bits)
    x = offset + 0.05 * torch.randn(1, 2, 40, 64, generator=gen)  # (B, H, S, D)
    x[..., :8] = 0.3 * torch.randn(1, 2, 40, 8, generator=gen)  # some channels near zero
    cfg = QuantConfig(bits=bits, granularity=granularity, group_size=16, zero_dtype=zero_dtype)
    t = make_quantizer(cfg, 64).quantize(x)
    step = elementwise_step(t)
    err = (t.dequantize() - x).abs()
    assert torch.isfinite(err).all()
    float32_rounding = 2 * torch.finfo(torch.float32).eps * x.abs()
    assert (err <= step / 2 * (1 + 1e-5) + float32_rounding).all(), float((err / step).max())
    assert t.zero.dtype == cfg.torch_zero_dtype  # stored in the stated dtype: nbytes counts what is kept
    assert t.nbytes == t.packed.numel() + t.step.numel() * 2 + t.zero.numel() * t.zero.element_size()
