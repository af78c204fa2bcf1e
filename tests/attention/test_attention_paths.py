"""The fast CPU path and the flex path against the oracle, and the oracle's own defining properties."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attention_testkit import make_case, relative_error
from jensenkv.attention import cached_attention, flex_cached_attention, reference_attention
from jensenkv.correction import GroupSteps

CORRECTIONS = ("none", "taylor", "exact")
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
GROUPS = (1, 4, 128)


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("correction", CORRECTIONS)
def test_cached_attention_matches_oracle_float32(correction: str, groups: int, rotated: bool) -> None:
    case = make_case(groups, rotated, seed=groups + 10 * rotated)
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    expected = reference_attention(*args, strength=0.8)
    actual = cached_attention(*args, strength=0.8)
    assert actual.shape == (2, 2, 6, 64) and actual.dtype == torch.float32
    assert relative_error(actual, expected) <= 1e-5
    if correction != "none":  # the bias is large enough that dropping it could not pass the check above
        uncorrected = reference_attention(case.q, case.k_cur, case.v_cur, case.segments, "none")
        assert relative_error(uncorrected, expected) > 1e-2


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_cached_attention_matches_oracle_with_large_steps(correction: str) -> None:
    """Steps large enough that the exact bias leaves its series branch (|x| up to ~40)."""
    case = make_case(4, False, seed=3, step_range=(50.0, 200.0))
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    assert relative_error(cached_attention(*args, scale=0.3), reference_attention(*args, scale=0.3)) <= 1e-5


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_cached_attention_bfloat16_close_to_oracle(correction: str) -> None:
    case = make_case(4, True, seed=5, dtype=torch.bfloat16)
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    actual = cached_attention(*args)
    assert actual.dtype == torch.bfloat16
    assert relative_error(actual, reference_attention(*args)) <= 2e-2  # bf16 keeps ~8 mantissa bits


def test_segments_with_distinct_group_counts_get_their_own_columns() -> None:
    case = make_case(4, False, seed=6)
    other = make_case(1, True, seed=7)
    segments = case.segments + [other.segments[0]]
    for correction in ("taylor", "exact"):
        args = (case.q, case.k_cur, case.v_cur, segments, correction)
        assert relative_error(cached_attention(*args), reference_attention(*args)) <= 1e-5


def test_oracle_without_correction_is_plain_softmax_attention() -> None:
    case = make_case(4, False, seed=8)
    keys = torch.cat([s.k for s in case.segments] + [case.k_cur], dim=-2)
    values = torch.cat([s.v for s in case.segments] + [case.v_cur], dim=-2)
    expected = torch.softmax(case.q @ keys.transpose(-1, -2) / 128**0.5, dim=-1) @ values
    actual = reference_attention(case.q, case.k_cur, case.v_cur, case.segments, "none")
    assert relative_error(actual, expected) <= 1e-6
    only_current = reference_attention(case.q, case.k_cur, case.v_cur, [], "taylor")
    assert relative_error(only_current, F.scaled_dot_product_attention(case.q, case.k_cur, case.v_cur)) <= 1e-6


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_oracle_bias_hits_quantized_cached_columns_only(correction: str) -> None:
    """Zero steps: no bias. Huge steps: the quantized segments lose all mass, while the current chunk
    and the full-precision segment keep their scores (the bias never touches them)."""
    case = make_case(4, False, seed=9)
    args = (case.q, case.k_cur, case.v_cur)
    def with_steps(shift: float, factor: float) -> list:
        return [
            s.replace(steps=GroupSteps(shift + factor * s.steps.step)) if s.steps else s
            for s in case.segments
        ]

    zero = with_steps(0.0, 0.0)
    assert relative_error(reference_attention(*args, zero, correction), reference_attention(*args, zero, "none")) <= 1e-12
    huge = with_steps(1e4, 1.0)
    full_precision_only = [s for s in case.segments if s.steps is None]
    expected = reference_attention(*args, full_precision_only, "none")
    for attend in (reference_attention, cached_attention):
        assert relative_error(attend(*args, huge, correction), expected) <= 1e-5
    # strength 0 switches the correction off
    switched_off = reference_attention(*args, huge, correction, strength=0.0)
    assert relative_error(switched_off, reference_attention(*args, huge, "none")) <= 1e-12


@EAGER_FLEX
@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("correction", CORRECTIONS)
def test_flex_matches_oracle_on_cpu(correction: str, groups: int, rotated: bool) -> None:
    """FlexAttention runs eager (unfused) on CPU at these sizes; G = 128 takes the augmented-column form."""
    case = make_case(groups, rotated, seed=groups + 10 * rotated, batch=1, n_q=4)
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    actual = flex_cached_attention(*args, strength=0.8, compile_kernel=False)
    assert relative_error(actual, reference_attention(*args, strength=0.8)) <= 1e-5


@EAGER_FLEX
def test_flex_augmented_columns_match_unrolled_score_mod() -> None:
    case = make_case(4, True, seed=11, batch=1, n_q=4)
    args = (case.q, case.k_cur, case.v_cur, case.segments, "taylor")
    unrolled = flex_cached_attention(*args, compile_kernel=False)
    augmented = flex_cached_attention(*args, max_unrolled=1, compile_kernel=False)
    assert relative_error(augmented, unrolled) <= 1e-5
    assert relative_error(unrolled, reference_attention(*args)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("correction", CORRECTIONS)
def test_flex_compiled_on_cuda_matches_oracle(correction: str, groups: int) -> None:
    case = make_case(groups, True, seed=12, n_q=64)
    to_cuda = lambda t: t.cuda()  # noqa: E731
    segments = [
        s.replace(k=to_cuda(s.k), v=to_cuda(s.v), k_ref=None, v_ref=None,
            steps=dataclasses.replace(s.steps, step=to_cuda(s.steps.step)) if s.steps else None,
        )
        for s in case.segments
    ]
    args = (to_cuda(case.q), to_cuda(case.k_cur), to_cuda(case.v_cur), segments, correction)
    expected = reference_attention(*args)
    assert relative_error(flex_cached_attention(*args), expected) <= 1e-4  # TF32-free fp32 kernel
    bf16 = [s.replace(k=s.k.bfloat16(), v=s.v.bfloat16()) for s in segments]
    actual = flex_cached_attention(args[0].bfloat16(), args[1].bfloat16(), args[2].bfloat16(), bf16, correction)
    assert relative_error(actual, expected) <= 3e-2


def _first_segment(case, **changes) -> dict:
    return dict(segments=[case.segments[0].replace(**changes)])


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda c: dict(correction="quadratic"), r"correction='quadratic'.*'none', 'taylor', 'exact'"),
        (lambda c: dict(q=c.q[0]), r"q.shape=\(2, 6, 128\)"),
        (lambda c: dict(k_cur=c.k_cur[..., :64]), r"k_cur.shape=\(2, 2, 4, 64\)"),
        (lambda c: dict(v_cur=c.v_cur[:, :, :3]), r"v_cur.shape=\(2, 2, 3, 64\)"),
        (lambda c: _first_segment(c, v=c.segments[0].v[:, :, :5]), r"segments\[0\].v.shape"),
        (lambda c: _first_segment(c, k=c.segments[0].k[:, :1]), r"segments\[0\].k.shape"),
        (
            lambda c: _first_segment(c, steps=GroupSteps(c.segments[0].steps.step[:, :, :3])),
            r"segments\[0\].steps.step.shape=\(2, 2, 3, 4\).*one step row per cached key",
        ),
        (
            lambda c: _first_segment(c, steps=GroupSteps(torch.ones(2, 2, 12, 3))),
            r"segments\[0\].steps.step.shape\[-1\]=3.*must divide head_dim",
        ),
        (lambda c: dict(strength=float("nan")), r"strength=nan"),
        (lambda c: dict(segments=[], k_cur=c.k_cur[:, :, :0], v_cur=c.v_cur[:, :, :0]), r"at least one key"),
    ],
)
@pytest.mark.parametrize("attend", [reference_attention, cached_attention, flex_cached_attention])
def test_bad_input_raises_value_error_naming_it(attend, change, pattern: str) -> None:
    case = make_case(4, False)
    kwargs = dict(q=case.q, k_cur=case.k_cur, v_cur=case.v_cur, segments=case.segments, correction="taylor")
    kwargs.update(change(case))
    with pytest.raises(ValueError, match=pattern):
        attend(**kwargs)
