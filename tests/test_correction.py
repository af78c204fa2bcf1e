"""The Jensen bias: stable log(sinh x / x), unbiasedness, Taylor vs exact, compact == reference forms."""
from __future__ import annotations

import math
from unittest import mock

import mpmath
import pytest
import torch

from jensenkv import correction
from jensenkv.correction import (
    GroupSteps,
    bias_basis_query,
    exact_series_key_columns,
    exact_series_query_columns,
    exact_series_terms,
    expand_group_steps,
    group_bias,
    jensen_bias,
    log_sinhc,
    log_sinhc_series_coefficients,
    series_tolerance,
)
from jensenkv.quant.hadamard import RandomHadamard


def test_series_coefficients_are_those_of_log_sinhc() -> None:
    a = log_sinhc_series_coefficients(4)
    assert a == pytest.approx([1 / 6, -1 / 180, 1 / 2835, -1 / 37800], rel=1e-14)


def test_log_sinhc_matches_high_precision_in_float64() -> None:
    points = [0.0, 1e-8, 1e-4, 0.01, 0.3, 0.4999, 0.5, 0.5001, 0.9, 1.5, 3.0, 20.0, 300.0, 1e4]
    x = torch.tensor(points, dtype=torch.float64)
    mpmath.mp.dps = 40
    expected = [0.0] + [float(mpmath.log(mpmath.sinh(p) / p)) for p in points[1:]]
    actual = log_sinhc(x)
    assert actual.tolist() == pytest.approx(expected, rel=1e-13, abs=1e-300)
    assert log_sinhc(-x).tolist() == actual.tolist()  # even


def test_log_sinhc_is_finite_and_monotone_from_zero_to_1e4_in_float32() -> None:
    x = torch.cat([torch.zeros(1), torch.logspace(-6, 4, 2001)])  # float32
    y = log_sinhc(x)
    assert torch.isfinite(y).all() and y[0] == 0
    assert (y.diff() >= 0).all()
    assert y[-1].item() == pytest.approx(1e4 - math.log(2e4), rel=1e-6)
    # float32 agrees with float64 to float32 precision
    assert torch.allclose(y.double(), log_sinhc(x.double()), rtol=1e-6, atol=1e-12)


def test_taylor_reference_is_the_closed_form() -> None:
    gen = torch.Generator().manual_seed(0)
    q, step = torch.randn(2, 3, 5, 16, generator=gen), torch.rand(2, 3, 7, 16, generator=gen)
    expected = (q.square() @ step.square().transpose(-1, -2)) / 16 / 24  # default scale 1/sqrt(16)
    assert torch.allclose(jensen_bias(q, step), expected, rtol=1e-5)
    assert torch.allclose(jensen_bias(q, step, scale=0.5), expected * 16 * 0.25, rtol=1e-5)


def test_taylor_bounds_exact_from_above_and_both_vanish_with_the_step() -> None:
    gen = torch.Generator().manual_seed(1)
    q = 3 * torch.randn(4, 6, 32, generator=gen)
    step = torch.rand(4, 9, 32, generator=gen)
    for size in (1e3, 30.0, 3.0, 0.3):
        taylor, exact = jensen_bias(q, size * step, "taylor"), jensen_bias(q, size * step, "exact")
        assert (exact > 0).all() and (taylor >= exact).all()
    for size in (1e-2, 1e-4):
        taylor, exact = jensen_bias(q, size * step, "taylor"), jensen_bias(q, size * step, "exact")
        assert taylor.max() < 2 * size**2 and torch.allclose(exact, taylor, rtol=1e-2 * size)
    zero = torch.zeros_like(step)
    assert (jensen_bias(q, zero, "taylor") == 0).all() and (jensen_bias(q, zero, "exact") == 0).all()


def test_exact_bias_makes_the_monte_carlo_partition_sum_unbiased() -> None:
    """E[exp(scale q.(k + e) - b_exact)] = exp(scale q.k) for e ~ U(-D/2, D/2) per channel.

    100,000 seeded draws; steps sized so the uncorrected inflation is ~10%, the Monte Carlo
    standard error ~0.15%: within 1% corrected, more than 3% off uncorrected.
    """
    gen = torch.Generator().manual_seed(2)
    dim, n_q, n_k = 16, 4, 8
    q = torch.randn(n_q, dim, generator=gen, dtype=torch.float64)  # (Q, d)
    k = torch.randn(n_k, dim, generator=gen, dtype=torch.float64)  # (K, d)
    step = 0.8 + 0.8 * torch.rand(n_k, dim, generator=gen, dtype=torch.float64)  # (K, d)
    scale = 1 / math.sqrt(dim)
    bias = jensen_bias(q, step, "exact")  # (Q, K)
    assert 0.05 < bias.mean() < 0.2
    total = torch.zeros(n_q, n_k, dtype=torch.float64)
    draws, batch = 100_000, 10_000
    for _ in range(draws // batch):
        noise = (torch.rand(batch, n_k, dim, generator=gen, dtype=torch.float64) - 0.5) * step  # (N, K, d)
        scores = scale * torch.einsum("qd,nkd->nqk", q, k + noise)  # (N, Q, K)
        total += scores.exp().sum(0)
    inflation = total / draws / (scale * q @ k.T).exp()  # E[exp(s_hat)] / exp(s)
    corrected = inflation / bias.exp()
    assert (corrected - 1).abs().max() < 0.01
    assert (inflation - 1).min() > 0.03  # the error the correction removes is 3x the tolerance or more
    assert (inflation / jensen_bias(q, step, "taylor").exp() <= corrected).all()  # Taylor over-corrects


def _random_steps(
    groups: int, rotated: bool, size: float, seed: int, head_dim: int = 128
) -> tuple[torch.Tensor, GroupSteps]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 5, head_dim, generator=gen)  # (B, H, Q, D)
    step = size * (0.5 + torch.rand(2, 3, 7, groups, generator=gen))  # (B, H, K, G)
    return q, GroupSteps(step, RandomHadamard(head_dim, seed) if rotated else None)


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("groups", [1, 4, 128])
@pytest.mark.parametrize("method", ["taylor", "exact"])
def test_group_bias_equals_reference_on_expanded_steps(method: str, groups: int, rotated: bool) -> None:
    q, steps = _random_steps(groups, rotated, size=4.0, seed=groups)
    expected = jensen_bias(bias_basis_query(q.double(), steps), expand_group_steps(steps, 128).double(), method)
    actual = group_bias(q, steps, method, strength=0.7)
    assert actual.shape == (2, 3, 5, 7) and actual.dtype == torch.float32
    assert torch.allclose(actual.double(), 0.7 * expected, rtol=1e-5, atol=1e-7)
    assert expected.mean() > 0.1  # a bias that matters
    if rotated:  # the rotated basis changes the group norms, so ignoring the rotation would be caught
        plain = jensen_bias(q.double(), expand_group_steps(steps, 128).double(), method)
        assert not torch.allclose(plain, expected, rtol=1e-3) or groups == 1


@pytest.mark.parametrize(("size", "branch"), [(4.0, "series"), (0.0, "series"), (60.0, "split"), (3e4, "split")])
@pytest.mark.parametrize("groups", [1, 4, 128])
def test_exact_group_bias_branches_equal_reference(size: float, branch: str, groups: int, monkeypatch) -> None:
    """The series (matmul) branch up to |x| <= 1.5; beyond, the split form (series on the channels where it
    converges, elementwise on the rest, in several chunks of pairs)."""
    q, steps = _random_steps(groups, False, size=size, seed=3)
    monkeypatch.setattr(correction, "_TILE_ELEMENTS", 2 * 7 * 3)  # chunks of 2 (query, channel) pairs
    with mock.patch.object(correction, "exact_group_bias_split", wraps=correction.exact_group_bias_split) as split:
        actual = group_bias(q, steps, "exact")
    assert split.called == (branch == "split")
    expected = jensen_bias(q.double(), expand_group_steps(steps, 128).double(), "exact")
    assert torch.isfinite(actual).all()
    assert torch.allclose(actual.double(), expected, rtol=1e-5, atol=1e-6)


def test_exact_series_branch_is_accurate_at_its_bound() -> None:
    """Scale the steps so that max |x| sits just under the series bound of 1.5."""
    q, steps = _random_steps(4, False, size=1.0, seed=4)
    bound = 0.5 / math.sqrt(128) * q.abs().max() * steps.step.max()
    steps = GroupSteps(steps.step * (1.49 / bound))
    expected = jensen_bias(q.double(), expand_group_steps(steps, 128).double(), "exact")
    assert torch.allclose(group_bias(q.double(), steps, "exact"), expected, rtol=1e-9)


FP32_HALF_EPS = 2.0**-24  # the stated bound on the series' truncation for float32 attention, written out


@pytest.mark.parametrize("arg_bound", [0.3, 0.6, 1.0, correction.SERIES_MAX_ARG])
@pytest.mark.parametrize("edge_channels", [128, 1])
def test_exact_series_truncation_within_half_an_fp32_epsilon_at_the_bound(arg_bound: float, edge_channels: int) -> None:
    """Every step at its largest and ``edge_channels`` channels per query at max|q| (the rest at a tenth): those
    x_c sit on the bound, where the alternating series' remainder is largest. The terms chosen for float32 keep
    the truncation of the whole bias within eps/2, and one term fewer does not (a looser rule fails here)."""
    dim, groups, scale, q_max = 128, 4, 128**-0.5, 3.0
    q = torch.full((1, 1, 2, dim), 0.1 * q_max, dtype=torch.float64)  # (B, H, Q, D)
    q[..., :edge_channels] = q_max
    q[:, :, 1] *= -1  # the bias is even in q
    step = torch.full((1, 1, 3, groups), arg_bound / (0.5 * scale * q_max), dtype=torch.float64)  # (B, H, K, G)
    r_sq = (q / q_max).square()
    terms = exact_series_terms(arg_bound, lambda m: float(r_sq.pow(m).sum(-1).amax()),
                               series_tolerance(torch.float32))
    exact = jensen_bias(q, expand_group_steps(GroupSteps(step), dim), "exact", scale)  # (B, H, Q, K) float64

    def truncation_error(n: int) -> float:
        q_cols = exact_series_query_columns(q, groups, torch.tensor(q_max, dtype=torch.float64), n)  # (B, H, Q, G*n)
        k_cols = exact_series_key_columns(step, scale, torch.tensor(q_max, dtype=torch.float64), n)  # (B, H, K, G*n)
        return float((q_cols @ k_cols.transpose(-1, -2) - exact).abs().max())

    assert series_tolerance(torch.float32) == FP32_HALF_EPS
    assert truncation_error(terms) <= FP32_HALF_EPS
    assert terms == 1 or truncation_error(terms - 1) > FP32_HALF_EPS


def test_exact_series_terms_follow_the_dtype_and_the_query_spread() -> None:
    """Coarser dtypes need fewer terms; a query whose mass sits in one channel needs no more than a flat one."""
    flat, peaked = (lambda m: 128.0), (lambda m: 1.0)
    by_dtype = [exact_series_terms(1.0, flat, series_tolerance(d)) for d in (torch.bfloat16, torch.float16,
                                                                           torch.float32, torch.float64)]
    assert by_dtype == sorted(by_dtype) and by_dtype[0] < by_dtype[2] < by_dtype[3]
    assert exact_series_terms(1.0, peaked, FP32_HALF_EPS) < exact_series_terms(1.0, flat, FP32_HALF_EPS)
    assert exact_series_terms(0.0, flat, FP32_HALF_EPS) == 1


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda q, s: jensen_bias(q, s.step, "quadratic"), r"method='quadratic'.*'taylor', 'exact'"),
        (lambda q, s: group_bias(q, s, "cubic"), r"method='cubic'.*'taylor', 'exact'"),
        (
            lambda q, s: jensen_bias(q, torch.ones(2, 3, 7, 64)),
            r"step.shape=\(2, 3, 7, 64\).*q.shape=\(2, 3, 5, 128\)",
        ),
        (lambda q, s: jensen_bias(q, torch.ones(4, 3, 7, 128)), r"step.shape=\(4, 3, 7, 128\).*broadcast"),
        (
            lambda q, s: group_bias(q, GroupSteps(torch.ones(2, 3, 7, 3))),
            r"steps.step.shape\[-1\]=3.*head_dim=128.*divide",
        ),
        (lambda q, s: expand_group_steps(GroupSteps(torch.ones(2, 3, 7, 5)), 128), r"=5.*head_dim=128.*divide"),
        (lambda q, s: group_bias(q, GroupSteps(torch.ones(2, 1, 7, 4))), r"steps.step.shape=\(2, 1, 7, 4\).*q.shape"),
        (lambda q, s: group_bias(q[0], s), r"q.shape=\(3, 5, 128\)"),
        (lambda q, s: group_bias(q, GroupSteps(s.step, RandomHadamard(64))), r"steps.rotation.dim=64.*head_dim=128"),
        (lambda q, s: group_bias(q, s, strength=math.inf), r"strength=inf"),
    ],
)
def test_bad_input_raises_value_error_naming_it(call, pattern: str) -> None:
    q, steps = _random_steps(4, False, size=1.0, seed=5)
    with pytest.raises(ValueError, match=pattern):
        call(q, steps)


@pytest.mark.parametrize("step_size", [0.1, 50.0])  # series form / elementwise form
def test_exact_group_bias_reads_the_device_once_per_call(step_size: float, host_reads) -> None:
    """Choosing the exact bias's form is the only host read (a sync on a GPU) of a group_bias call."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 3, 8, generator=gen)
    steps = GroupSteps(torch.full((1, 2, 4, 2), step_size))
    host_reads.clear()  # count only the call below
    reads = host_reads
    group_bias(q, steps, "exact")
    assert len(reads) == 1, reads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("groups", [1, 2, 64])
def test_exact_split_equals_elementwise_on_outlier_queries(dtype: torch.dtype, groups: int) -> None:
    """A real network's queries: most channels small, a few 10-30x larger (|x| up to ~10 there). The split form
    equals the elementwise exact bias everywhere, and the pairs it sends to the elementwise form are few."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 40, 64, generator=gen, dtype=dtype)
    q[..., 5] *= 30.0
    q[..., 17] *= -12.0
    step = (torch.rand(2, 3, 50, groups, generator=gen, dtype=dtype) * 0.8 + 0.05)
    split = correction.exact_group_bias_split(q, step, 0.125)
    elementwise = jensen_bias(q, expand_group_steps(GroupSteps(step), 64), "exact", 0.125)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    assert torch.allclose(split, elementwise, rtol=tol, atol=tol)
    w = 0.0625 * q * step.amax(dim=-2, keepdim=True).repeat_interleave(64 // groups, dim=-1)
    assert 0 < (w.abs() > correction._split_series_limit(dtype)).float().mean() < 0.1
