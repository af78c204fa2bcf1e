"""The second-order correction b (1 - pi): fast path against the oracle, its limits, and its effect on peaky data."""
from __future__ import annotations


import pytest
import torch

import jensenkv.attention.probes as probes_module
from attention_testkit import make_case, relative_error
from jensenkv.attention import (
    ATTENTION_BACKENDS,
    attention_probes,
    cached_attention,
    flex_cached_attention,
    reference_attention,
)
from jensenkv.attention.cpu import second_order_attention
from jensenkv.attention.second_order import second_order_scores
from jensenkv.cache import CacheConfig, Segment, ChunkedKVCache
from jensenkv.correction import GroupSteps, expand_group_steps, jensen_bias
from jensenkv.quant import QuantConfig, make_quantizer

BIAS = ("taylor", "exact")


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("groups", [1, 4, 128])  # 128 = D: per-channel steps
@pytest.mark.parametrize("correction", BIAS)
def test_cached_matches_oracle(correction: str, groups: int, rotated: bool) -> None:
    """Quantized / full-precision / quantized segments (12, 7, 5 keys) and a current chunk of 4."""
    case = make_case(groups, rotated, seed=groups + 10 * rotated)
    args = (case.q, case.k_cur, case.v_cur, case.segments, correction)
    expected = reference_attention(*args, strength=0.8, second_order=True)
    actual = cached_attention(*args, strength=0.8, second_order=True)
    assert actual.shape == (2, 2, 6, 64) and actual.dtype == torch.float32
    assert relative_error(actual, expected) <= 1e-4
    # the term is large enough here that the first-order output could not pass the check above
    assert relative_error(reference_attention(*args, strength=0.8), expected) > 1e-2


D = 64
CACHES = {  # real cache views: packed codes dequantized at each call
    "int2-g32": dict(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(bits=2, group_size=32)),
    "quarot-int2-sink": dict(key=QuantConfig(bits=2, group_size=32, rotation="hadamard"),
                             value=QuantConfig(bits=2, group_size=32, rotation="hadamard"), sink_chunks=1),
    "kivi-per-channel": dict(key=QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
                             value=QuantConfig(bits=2, group_size=32, zero_dtype="float16")),
    "int2-dither": dict(key=QuantConfig(bits=2, group_size=32, dither="subtractive"),
                        value=QuantConfig(bits=2, group_size=32, dither="subtractive", dither_seed=1)),
}


def filled(name: str, lengths=(12, 9, 16, 5)) -> ChunkedKVCache:
    """Several chunks of ragged lengths (no tile size divides them)."""
    cache = ChunkedKVCache(CacheConfig(**CACHES[name]), head_dim=D)
    gen = torch.Generator().manual_seed(0)
    for n in lengths:
        cache.commit(torch.randn(2, 2, n, D, generator=gen) + 1.0, torch.randn(2, 2, n, D, generator=gen))
    return cache


@pytest.mark.parametrize("correction", BIAS)
@pytest.mark.parametrize("name", list(CACHES))
def test_cached_matches_oracle_on_cache_views_with_ragged_query_tiles(name: str, correction: str) -> None:
    cache = filled(name)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 7, D, generator=gen) * 3 for _ in range(3))  # (B, H, Q, D)
    expected = reference_attention(q, k, v, cache.segments(), correction, second_order=True)
    assert relative_error(cached_attention(q, k, v, cache.segments(), correction, second_order=True), expected) <= 1e-4
    for tile in (1, 3):  # 7 queries: tiles of 3, 3 and a ragged 1
        tiled = second_order_attention(q, k, v, cache.segments(), correction, D**-0.5, 1.0, query_tile=tile)
        assert relative_error(tiled, expected) <= 1e-4
    assert relative_error(reference_attention(q, k, v, cache.segments(), correction), expected) > 1e-3


def test_cached_matches_oracle_when_the_exact_bias_leaves_its_series_range() -> None:
    """|x| up to ~40: the exact bias is elementwise per query tile, not columns."""
    case = make_case(4, False, seed=3, step_range=(50.0, 200.0))
    args = (case.q, case.k_cur, case.v_cur, case.segments, "exact")
    expected = reference_attention(*args, scale=0.3, second_order=True)
    assert relative_error(cached_attention(*args, scale=0.3, second_order=True), expected) <= 1e-4


def test_bfloat16_close_to_oracle() -> None:
    case = make_case(4, True, seed=5, dtype=torch.bfloat16)
    args = (case.q, case.k_cur, case.v_cur, case.segments, "taylor")
    actual = cached_attention(*args, second_order=True)
    assert actual.dtype == torch.bfloat16
    assert relative_error(actual, reference_attention(*args, second_order=True)) <= 2e-2


def test_without_quantized_segments_it_is_plain_attention() -> None:
    case = make_case(4, False, seed=6)
    plain = [s.replace(steps=None) for s in case.segments]
    args = (case.q, case.k_cur, case.v_cur, plain, "taylor")
    expected = reference_attention(*args[:4], "none")
    assert relative_error(cached_attention(*args, second_order=True), expected) <= 1e-5
    assert relative_error(reference_attention(*args, second_order=True), expected) <= 1e-12


def _flat_case(n_keys: int) -> tuple:
    """Every cached key's score is 0 (keys 0) while its bias is O(1): attention spreads over ~n_keys keys."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 4, D, generator=gen, dtype=torch.float64) * 2  # (B, H, Q, D)
    step = 2 + 2 * torch.rand(1, 2, n_keys, 4, generator=gen, dtype=torch.float64)  # (B, H, K, G)
    seg = Segment.from_tensors(k=torch.zeros(1, 2, n_keys, D, dtype=torch.float64),
                       v=torch.randn(1, 2, n_keys, D, generator=gen, dtype=torch.float64), steps=GroupSteps(step))
    k_cur = torch.randn(1, 2, 3, D, generator=gen, dtype=torch.float64)
    return q, k_cur, torch.randn(1, 2, 3, D, generator=gen, dtype=torch.float64), [seg]


@pytest.mark.parametrize("correction", BIAS)
def test_flat_attention_gives_the_first_order_correction(correction: str) -> None:
    """b (1 - pi) -> b as pi -> 0: the mean subtracted bias is b's up to a fraction ~ the weights (~1/K), and the
    output's gap to first order shrinks as K grows."""
    gaps = []
    for n_keys in (64, 1024):
        args = _flat_case(n_keys)
        first = reference_attention(*args, correction)
        second = reference_attention(*args, correction, second_order=True)
        gaps.append(relative_error(second, first))
        assert relative_error(cached_attention(*args, correction, second_order=True), second) <= 1e-10
        kept = attention_probes(*args, correction, second_order=True)["bias_mean"] / \
            attention_probes(*args, correction)["bias_mean"]  # mean b (1 - pi) / mean b
        assert 1 - 2 / n_keys < kept < 1
    assert gaps[1] < gaps[0] / 4 and gaps[1] < 2e-3


def test_probes_report_the_mass_the_second_order_attention_gives_the_cache() -> None:
    """Values 1 on cached keys and 0 on the current chunk: the attention output is each row's P_S."""
    case = make_case(4, True, seed=12)
    ones = [s.replace(v=torch.ones_like(s.v[..., :1]), v_ref=None) for s in case.segments]
    zero = torch.zeros_like(case.v_cur[..., :1])
    for second_order in (False, True):
        mass = cached_attention(case.q, case.k_cur, zero, ones, "taylor", second_order=second_order).mean()
        probes = attention_probes(case.q, case.k_cur, case.v_cur, case.segments, "taylor", second_order=second_order)
        assert probes["p_s"] == pytest.approx(mass.item(), abs=1e-6)
    assert attention_probes(case.q, case.k_cur, case.v_cur, case.segments, "taylor")["p_s"] != \
        pytest.approx(probes["p_s"], abs=1e-3)


def test_a_key_that_takes_all_the_mass_is_not_corrected() -> None:
    """pi -> 1: b (1 - pi) -> 0, so the output is the uncorrected one (first order would move mass away)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 1, D, generator=gen, dtype=torch.float64)
    k = 40 * q / q.norm()  # score 40 / sqrt(D) * |q| ~ 40: every other key is ~e^-40 behind
    seg = Segment.from_tensors(k=k, v=torch.randn(1, 1, 1, D, generator=gen, dtype=torch.float64),
                       steps=GroupSteps(torch.full((1, 1, 1, 2), 3.0, dtype=torch.float64)))
    k_cur = torch.randn(1, 1, 5, D, generator=gen, dtype=torch.float64) * 0.1
    args = (q, k_cur, torch.randn(1, 1, 5, D, generator=gen, dtype=torch.float64), [seg], "taylor")
    uncorrected = reference_attention(*args[:4], "none")
    assert relative_error(reference_attention(*args, second_order=True), uncorrected) <= 1e-8
    assert relative_error(cached_attention(*args, second_order=True), uncorrected) <= 1e-8


# --- peaky attention, Monte Carlo over dither draws ---------------------------------------------------------------
PEAKY_KEYS, PEAKY_CURRENT, PEAKY_QUERIES, PEAKY_HEADS, DRAWS = 64, 32, 16, 2, 100


def _peaky_draws(factor: float, correction: str = "taylor"):
    """Gaussian keys (two cached chunks of 32 and a current chunk of 32), q scaled by ``factor`` (the q.k norm
    product: scaling k instead gives the same scores and, dithered, the same relative noise). The keys are fixed;
    every draw re-quantizes them (RTN INT2 g32, subtractive dither: a fresh offset per call, so the error is
    uniform and independent as the bias assumes). Yields (q, k_cur, v_cur, segments) per draw."""
    gen = torch.Generator().manual_seed(1)
    shape = (1, PEAKY_HEADS)
    q = factor * torch.randn(*shape, PEAKY_QUERIES, D, generator=gen)  # (B, H, Q, D)
    keys = [torch.randn(*shape, n, D, generator=gen) for n in (32, 32)]  # (B, H, K_i, D)
    values = [torch.randn(*shape, n, D, generator=gen) for n in (32, 32)]
    k_cur = torch.randn(*shape, PEAKY_CURRENT, D, generator=gen)
    v_cur = torch.randn(*shape, PEAKY_CURRENT, D, generator=gen)
    quantizer = make_quantizer(QuantConfig(method="rtn", bits=2, granularity="token_group", group_size=32,
                                           dither="subtractive"), D)
    for _ in range(DRAWS):
        segments = []
        for k, v in zip(keys, values):
            stored = quantizer.quantize(k)
            segments.append(Segment.from_tensors(k=stored.dequantize(), v=v, steps=stored.group_steps(), k_ref=k, v_ref=v))
        yield q, k_cur, v_cur, segments


def _mean_delta_p_s(factor: float, second_order: bool, correction: str = "taylor") -> float:
    """E[P_S(quantized, corrected) - P_S(full precision)] over the draws, through ``attention_probes``."""
    shifts = [attention_probes(*draw, correction, second_order=second_order)["delta_p_s"]
              for draw in _peaky_draws(factor, correction)]
    return sum(shifts) / len(shifts)


def _log_z_shifts(factor: float) -> dict[str, float]:
    """E[log Z_hat - log Z] (row partition sums over cached + current keys) for first order, and second order
    with pi from the first-order-corrected and from the uncorrected scores; float64."""
    sums = {"first": 0.0, "second": 0.0, "second_pi_uncorrected": 0.0}
    for q, k_cur, _, segments in _peaky_draws(factor):
        q64, scale = q.double(), D**-0.5
        exact = scale * q64 @ torch.cat([s.k_ref for s in segments] + [k_cur], 2).double().transpose(-1, -2)
        s_hat = scale * q64 @ torch.cat([s.k for s in segments] + [k_cur], 2).double().transpose(-1, -2)
        bias = torch.cat([jensen_bias(q64, expand_group_steps(s.steps, D).double(), "taylor", scale)
                          for s in segments] + [torch.zeros_like(s_hat[..., -PEAKY_CURRENT:])], -1)  # (B, H, Q, K)
        scores = {"first": s_hat - bias, "second": second_order_scores(s_hat - bias, bias),
                  "second_pi_uncorrected": s_hat - bias * (1 - torch.softmax(s_hat, -1))}
        for name, s in scores.items():
            sums[name] += (torch.logsumexp(s, -1) - torch.logsumexp(exact, -1)).mean().item() / DRAWS
    return sums


@pytest.mark.parametrize("factor", [3.0, 5.0])
def test_second_order_removes_most_of_the_overshoot_on_peaky_attention(factor: float) -> None:
    """Measured (100 draws): E[dP_S] +0.073 uncorrected, -0.049 first order, -0.025 second order at x3;
    +0.091, -0.147, -0.091 at x5 (standard error ~0.002). E[log Z shift]: -0.17 -> +0.008, -0.70 -> -0.014."""
    first, second = _mean_delta_p_s(factor, False), _mean_delta_p_s(factor, True)
    assert first < -0.03  # first order over-corrects here: the regime the term is for
    assert abs(second) < 0.7 * abs(first)
    shifts = _log_z_shifts(factor)
    assert abs(shifts["second"]) < 0.2 * abs(shifts["first"])  # log Z: what the term corrects


def test_the_peaky_check_fails_without_the_pi_term(monkeypatch) -> None:
    """Replacing (1 - pi) by 1 in the probes' scores makes second order equal first order: the check above fails."""
    monkeypatch.setattr(probes_module, "second_order_scores", lambda scores, bias: scores)
    first, second = _mean_delta_p_s(3.0, False), _mean_delta_p_s(3.0, True)
    assert not abs(second) < 0.7 * abs(first)


@pytest.mark.parametrize("factor", [3.0, 5.0])
def test_pi_from_first_order_scores_corrects_log_z_best(factor: float) -> None:
    """The choice of scores for pi: the first-order-corrected ones (unbiased exp-scores) leave a smaller log Z
    shift than the uncorrected ones. Measured: +0.008 vs +0.034 at x3, -0.014 vs +0.178 at x5 (first order:
    -0.17, -0.70). (On E[dP_S] the uncorrected pi does better: see jensenkv.attention.second_order.)"""
    shifts = _log_z_shifts(factor)
    assert abs(shifts["second"]) < 0.6 * abs(shifts["second_pi_uncorrected"])


# --- bad input and refusing backends --------------------------------------------------------------------------------
@pytest.mark.parametrize("attend", [reference_attention, cached_attention, attention_probes])
def test_bad_second_order_arguments_are_refused(attend) -> None:
    case = make_case(4, False)
    args = (case.q, case.k_cur, case.v_cur, case.segments)
    with pytest.raises(ValueError, match=r"attention.second_order=True is not allowed with correction='none'.*"
                                         r"'taylor', 'exact'"):
        attend(*args, "none", second_order=True)
    with pytest.raises(ValueError, match=r"attention.second_order='yes' is not allowed: it must be true or false"):
        attend(*args, "taylor", second_order="yes")


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_refuses_second_order_and_names_the_backends_that_have_it() -> None:
    case = make_case(4, False)
    args = (case.q, case.k_cur, case.v_cur, case.segments, "taylor")
    with pytest.raises(ValueError, match=r"attention.second_order=True is not allowed with backend='flex'.*"
                                         r"\('cached', 'reference'\)"):
        flex_cached_attention(*args, compile_kernel=False, second_order=True)
    first = flex_cached_attention(*args, compile_kernel=False, second_order=False)  # first order unchanged
    assert relative_error(first, reference_attention(*args)) <= 1e-5


def test_triton_refuses_second_order_and_names_the_backends_that_have_it(monkeypatch) -> None:
    pytest.importorskip("triton")
    from jensenkv.attention.triton_kernel import triton_cached_attention

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cache = filled("int2-g32")
    q = torch.randn(2, 2, 7, D)
    with pytest.raises(ValueError, match=r"attention.second_order=True is not allowed with backend='triton'.*"
                                         r"\('cached', 'reference'\)"):
        triton_cached_attention(q, q, q, cache.segments(), "taylor", second_order=True)


@pytest.mark.parametrize("name", ["cached", "reference"])
def test_registered_backends_take_the_option(name: str) -> None:
    case = make_case(4, False, seed=11)
    args = (case.q, case.k_cur, case.v_cur, case.segments)
    out = ATTENTION_BACKENDS[name](*args, correction="exact", strength=0.7, second_order=True)
    expected = reference_attention(*args, correction="exact", strength=0.7, second_order=True)
    assert relative_error(out, expected) <= 1e-4
