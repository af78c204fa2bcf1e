"""The CPU path's split form: cached keys (with the bias columns) and the current chunk in two SDPA calls,
merged by log-sum-exp, against the oracle."""
from __future__ import annotations

import pytest
import torch

from attention_testkit import make_case, relative_error
from jensenkv.attention import cached_attention, reference_attention
from jensenkv.attention import cpu


@pytest.fixture
def flash_calls(monkeypatch) -> list:
    """Split every corrected call (no size threshold) and record the flash kernel calls."""
    calls, flash = [], cpu._FLASH

    def spy(*args, **kwargs):
        calls.append(args[1].shape[2])  # keys in this call
        return flash(*args, **kwargs)

    monkeypatch.setattr(cpu, "_SPLIT_MIN_SCORES", 0)
    monkeypatch.setattr(cpu, "_FLASH", spy)
    return calls


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_split_current_chunk_matches_oracle(correction: str, rotated: bool, flash_calls: list) -> None:
    case = make_case(4, rotated, seed=21 + rotated, value_dim=128)
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    actual = cached_attention(*args, strength=0.8)
    assert flash_calls == [12 + 7 + 5, 4]  # the cached keys, then the current chunk alone
    assert actual.shape == case.q.shape and actual.dtype == torch.float32
    assert relative_error(actual, reference_attention(*args, strength=0.8)) <= 1e-5


def test_split_current_chunk_in_bfloat16(flash_calls: list) -> None:
    case = make_case(4, False, seed=23, value_dim=128, dtype=torch.bfloat16)
    args = (case.q, case.k_cur, case.v_cur, case.segments, "taylor")
    actual = cached_attention(*args)
    assert len(flash_calls) == 2 and actual.dtype == torch.bfloat16
    assert relative_error(actual, reference_attention(*args)) <= 2e-2  # bf16 keeps ~8 mantissa bits


def test_no_split_when_value_width_differs_or_below_the_threshold(flash_calls: list, monkeypatch) -> None:
    """Values narrower than the keys cannot go through the flash kernel alone; small calls stay one call."""
    case = make_case(4, False, seed=24, value_dim=64)
    cached_attention(case.q, case.k_cur, case.v_cur, case.segments, "taylor")
    monkeypatch.setattr(cpu, "_SPLIT_MIN_SCORES", 1 << 20)
    wide = make_case(4, False, seed=25, value_dim=128)
    cached_attention(wide.q, wide.k_cur, wide.v_cur, wide.segments, "taylor")
    assert flash_calls == []


@pytest.mark.parametrize("value_dim", [64, 128])
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_output_is_contiguous(correction: str, value_dim: int) -> None:
    """Like SDPA's own output: the padded-value form is sliced back to Dv and must not stay a strided view."""
    case = make_case(4, False, seed=26, value_dim=value_dim)
    out = cached_attention(case.q, case.k_cur, case.v_cur, case.segments, correction)
    assert out.shape == (*case.q.shape[:3], value_dim) and out.is_contiguous()
