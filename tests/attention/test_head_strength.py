"""Per-head correction strengths: a (H,) tensor acts on head h exactly as the float strength[h] does, on every
backend; bad shapes and values are refused with the argument, the shape and what is allowed."""
from __future__ import annotations

import pytest
import torch

from attention_testkit import make_case, relative_error
from jensenkv.attention import attention_probes, get_backend
from jensenkv.cache import CacheConfig, Segment, ChunkedKVCache
from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig

STRENGTH = torch.tensor([0.7, -1.3, 0.0])  # (H,): signed, and one head uncorrected
# (2, 6): the exact bias has a series form; (40, 60): beyond SERIES_MAX_ARG, the elementwise bias
STEP_RANGES = {"series": (2.0, 6.0), "elementwise": (40.0, 60.0)}


def case(steps: str = "series"):
    return make_case(4, False, seed=3, heads=3, n_q=5, step_range=STEP_RANGES[steps])


def head_by_head(fn, q, k_cur, v_cur, segments, correction) -> torch.Tensor:
    """Head h of fn(..., strength=float(STRENGTH[h])) for every h, stacked: (B, H, Q, Dv)."""
    outs = [fn(q, k_cur, v_cur, segments, correction=correction, strength=float(s))[:, h]
            for h, s in enumerate(STRENGTH)]
    return torch.stack(outs, dim=1)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["reference", "cached", "flex"])
@pytest.mark.parametrize(("correction", "steps"), [("taylor", "series"), ("exact", "series"),
                                                    ("exact", "elementwise")])
def test_head_strengths_equal_a_loop_of_float_strengths(name: str, correction: str, steps: str) -> None:
    c = case(steps)
    fn = get_backend(name)
    actual = fn(c.q, c.k_cur, c.v_cur, c.segments, correction=correction, strength=STRENGTH)
    expected = head_by_head(fn, c.q, c.k_cur, c.v_cur, c.segments, correction)
    assert relative_error(actual, expected) <= 1e-5
    # the heads really differ: one global strength (their mean) gives another output
    mean = fn(c.q, c.k_cur, c.v_cur, c.segments, correction=correction, strength=float(STRENGTH.mean()))
    assert relative_error(mean, expected) > 1e-3


def test_cached_backend_reads_head_strengths_from_stored_cache_views() -> None:
    """Cache views (packed codes, stored steps) take the per-token step path of the column method."""
    cache = ChunkedKVCache(CacheConfig(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(bits=2, group_size=32),
                                       keep_reference=True), head_dim=128)
    gen = torch.Generator().manual_seed(5)
    for n in (9, 6):
        cache.commit(torch.randn(1, 3, n, 128, generator=gen) + 0.5, torch.randn(1, 3, n, 128, generator=gen))
    q, k, v = (torch.randn(1, 3, m, 128, generator=gen) * 2 for m in (7, 4, 4))  # (B, H, Q|R, D)
    fn = get_backend("cached")
    actual = fn(q, k, v, cache.segments(), correction="taylor", strength=STRENGTH)
    assert relative_error(actual, head_by_head(fn, q, k, v, cache.segments(), "taylor")) <= 1e-5


def head_slice(c, h: int):
    """Head h of a case as a one-head case (B, 1, ...)."""
    def one(x):
        return None if x is None else x[:, h:h + 1]

    segments = [Segment.from_tensors(k=one(s.k), v=one(s.v), k_ref=one(s.k_ref), v_ref=one(s.v_ref),
                             steps=None if s.steps is None else GroupSteps(one(s.steps.step), s.steps.rotation))
                for s in c.segments]
    return one(c.q), one(c.k_cur), one(c.v_cur), segments


@pytest.mark.parametrize(("correction", "steps"), [("taylor", "series"), ("exact", "series"),
                                                    ("exact", "elementwise")])
def test_probes_with_head_strengths_average_the_heads_probed_alone(correction: str, steps: str) -> None:
    c = case(steps)
    probes = attention_probes(c.q, c.k_cur, c.v_cur, c.segments, correction, strength=STRENGTH)
    alone = [attention_probes(*head_slice(c, h), correction, strength=float(s)) for h, s in enumerate(STRENGTH)]
    for key in ("p_s", "delta_p_s", "jsd", "out_mse", "bias_mean"):  # means with equal weight per head
        assert probes[key] == pytest.approx(sum(a[key] for a in alone) / len(alone), rel=1e-5, abs=1e-9), key
    assert alone[2]["bias_mean"] == 0.0 and alone[1]["bias_mean"] < 0 < alone[0]["bias_mean"]


@pytest.mark.parametrize("bad", [torch.ones(2), torch.ones(4), torch.ones(1, 3), torch.ones(3, dtype=torch.int64),
                                 torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([1.0, 0.0, float("inf")])])
@pytest.mark.parametrize("name", ["reference", "cached"])
def test_bad_head_strengths_are_refused(bad: torch.Tensor, name: str) -> None:
    c = case()
    with pytest.raises(ValueError, match=r"strength.*(\(H,\) = \(3,\)|finite)"):
        get_backend(name)(c.q, c.k_cur, c.v_cur, c.segments, correction="taylor", strength=bad)
    with pytest.raises(ValueError, match=r"strength"):
        attention_probes(c.q, c.k_cur, c.v_cur, c.segments, "taylor", strength=bad)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), "1.0", True])
def test_bad_float_strengths_are_refused(bad) -> None:
    c = case()
    with pytest.raises(ValueError, match=r"strength=.* is not allowed: it must be a finite number"):
        get_backend("cached")(c.q, c.k_cur, c.v_cur, c.segments, correction="taylor", strength=bad)


def test_negative_strength_adds_the_bias() -> None:
    """Signed strengths: -s moves the cached mass the other way from +s (P_S up instead of down)."""
    c = case()
    p_s = {s: attention_probes(c.q, c.k_cur, c.v_cur, c.segments, "taylor", strength=s)["p_s"] for s in (-1.0, 0.0, 1.0)}
    assert p_s[1.0] < p_s[0.0] < p_s[-1.0]


@pytest.mark.parametrize("name", ["reference", "cached"])
@pytest.mark.parametrize(("correction", "steps"), [("taylor", "series"), ("exact", "series"),
                                                    ("exact", "elementwise")])
def test_head_strengths_with_the_second_order_term_equal_a_loop_of_float_strengths(
        name: str, correction: str, steps: str) -> None:
    c = case(steps)
    fn = get_backend(name)
    actual = fn(c.q, c.k_cur, c.v_cur, c.segments, correction=correction, strength=STRENGTH, second_order=True)
    expected = torch.stack([fn(c.q, c.k_cur, c.v_cur, c.segments, correction=correction, strength=float(s),
                               second_order=True)[:, h] for h, s in enumerate(STRENGTH)], dim=1)
    assert relative_error(actual, expected) <= 1e-5
    first = fn(c.q, c.k_cur, c.v_cur, c.segments, correction=correction, strength=STRENGTH)
    assert relative_error(first, expected) > 1e-4  # the term matters on this case
