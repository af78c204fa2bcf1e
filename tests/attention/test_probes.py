"""attention_probes against direct full-matrix computations built on the oracle."""
from __future__ import annotations

import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attention_testkit import make_case
from jensenkv.attention import PROBE_KEYS, attention_probes, jensen_shannon, reference_attention
from jensenkv.correction import bias_basis_query, expand_group_steps, jensen_bias


def _attention_rows(case, segments, correction: str) -> torch.Tensor:
    """Softmax rows (B, H, Q, K_total) in float64, bias by the reference jensen_bias."""
    scale = 1 / math.sqrt(case.q.shape[-1])
    q = case.q.double()
    blocks = []
    for seg in segments:
        s = scale * q @ seg.k.double().transpose(-1, -2)
        if correction != "none" and seg.steps is not None:
            step = expand_group_steps(seg.steps, q.shape[-1]).double()  # (B, H, K, D)
            s = s - jensen_bias(bias_basis_query(q, seg.steps), step, correction)
        blocks.append(s)
    blocks.append(scale * q @ case.k_cur.double().transpose(-1, -2))
    return torch.softmax(torch.cat(blocks, -1), -1)


def _reference_segments(case):
    return [s.replace(k=s.k_ref, v=s.v_ref, steps=None) for s in case.segments]


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_probes_equal_direct_computation(correction: str) -> None:
    case = make_case(4, True, seed=21)
    probes = attention_probes(case.q, case.k_cur, case.v_cur, case.segments, correction, query_tile=4)
    assert set(probes) == set(PROBE_KEYS) and all(isinstance(v, float) for v in probes.values())
    n_cached = sum(s.k.shape[-2] for s in case.segments)
    rows = _attention_rows(case, case.segments, correction)
    rows_ref = _attention_rows(case, _reference_segments(case), "none")
    p_s, p_s_ref = rows[..., :n_cached].sum(-1), rows_ref[..., :n_cached].sum(-1)  # (B, H, Q)
    assert probes["p_s"] == pytest.approx(p_s.mean().item(), abs=1e-6)
    assert probes["p_r"] == pytest.approx(1 - p_s.mean().item(), abs=1e-6)
    assert probes["p_s_ref"] == pytest.approx(p_s_ref.mean().item(), abs=1e-6)
    assert probes["delta_p_s"] == pytest.approx((p_s - p_s_ref).mean().item(), abs=1e-6)
    jsd = jensenshannon(rows.flatten(0, 2).numpy(), rows_ref.flatten(0, 2).numpy(), axis=1) ** 2  # scipy: sqrt, nats
    assert probes["jsd"] == pytest.approx(jsd.mean(), rel=1e-4, abs=1e-8)
    out = reference_attention(case.q.double(), case.k_cur, case.v_cur, case.segments, correction)
    out_ref = reference_attention(case.q.double(), case.k_cur, case.v_cur, _reference_segments(case), "none")
    assert probes["out_mse"] == pytest.approx((out - out_ref).square().mean().item(), rel=1e-4)
    assert probes["out_rel_err"] == pytest.approx(((out - out_ref).norm() / out_ref.norm()).item(), rel=1e-4)
    per_head = (p_s - p_s_ref).mean((0, 2))  # (H,)
    assert probes["delta_p_s_head_median"] == pytest.approx(per_head.median().item(), abs=1e-6)
    if correction == "none":
        assert probes["bias_mean"] == 0.0
    else:
        q = case.q.double()
        biases = [
            jensen_bias(bias_basis_query(q, s.steps), expand_group_steps(s.steps, 128).double(), correction)
            for s in case.segments if s.steps is not None
        ]
        expected_bias = torch.cat([b.flatten() for b in biases]).mean().item()
        assert probes["bias_mean"] == pytest.approx(expected_bias, rel=1e-5)


def test_probes_vanish_when_quantized_equals_reference() -> None:
    case = make_case(4, False, seed=22)
    same = [s.replace(k_ref=None, v_ref=None) for s in case.segments]
    probes = attention_probes(case.q, case.k_cur, case.v_cur, same, "none")
    assert probes["delta_p_s"] == pytest.approx(0.0, abs=1e-7)
    assert probes["jsd"] == pytest.approx(0.0, abs=1e-7)
    assert probes["out_mse"] == pytest.approx(0.0, abs=1e-12)
    assert probes["p_s"] == probes["p_s_ref"]


def test_query_tiling_does_not_change_the_probes() -> None:
    case = make_case(128, False, seed=23)
    whole = attention_probes(case.q, case.k_cur, case.v_cur, case.segments, "exact")
    tiled = attention_probes(case.q, case.k_cur, case.v_cur, case.segments, "exact", query_tile=1)
    assert tiled == pytest.approx(whole, rel=1e-5, abs=1e-9)


def test_jensen_shannon_is_bounded_and_symmetric() -> None:
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    r = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    assert jensen_shannon(p, r).tolist() == pytest.approx([math.log(2), 0.0])
    assert torch.equal(jensen_shannon(p, r), jensen_shannon(r, p))


def test_probes_bad_input() -> None:
    case = make_case(4, False)
    with pytest.raises(ValueError, match="query_tile=0"):
        attention_probes(case.q, case.k_cur, case.v_cur, case.segments, "taylor", query_tile=0)
    with pytest.raises(ValueError, match=r"segments\[0\].k_ref.shape"):
        bad = [case.segments[0].replace(k_ref=case.segments[0].k[:, :, :2])]
        attention_probes(case.q, case.k_cur, case.v_cur, bad, "taylor")


def _peaky_case(dtype: torch.dtype = torch.float32):
    """One cached key whose quantized score sits ~103.5 below the current key's (softmax mass ~1e-45, a float32
    denormal) while the reference score sits 200 below (mass exactly 0 in float32)."""
    from jensenkv.cache import Segment

    d = 4
    q = torch.zeros(1, 1, 1, d, dtype=dtype)
    q[..., 0] = 2.0  # scale 1/2: score = q . k / 2 = k_0
    k_cur = torch.zeros(1, 1, 1, d, dtype=dtype)
    k = torch.zeros(1, 1, 1, d, dtype=dtype)
    k[..., 0] = -103.5
    k_ref = torch.zeros_like(k)
    k_ref[..., 0] = -200.0
    v = torch.ones(1, 1, 1, d, dtype=dtype)
    return q, k_cur, v, [Segment.from_tensors(k=k, v=v, steps=None, k_ref=k_ref, v_ref=v)]


def test_jsd_stays_finite_and_bounded_when_attention_is_peaky() -> None:
    q, k_cur, v_cur, segments = _peaky_case()
    probes = attention_probes(q, k_cur, v_cur, segments, "none")
    assert math.isfinite(probes["jsd"]) and 0.0 <= probes["jsd"] <= 1e-30  # ~ exp(-103.5) log(2) / 2
    # less peaky, still p_ref = 0 in float32: rows [1 - e, e] vs [1, 0] have JSD = e log(2) / 2 + O(e^2)
    segments[0].k[..., 0] = -20.0
    probes = attention_probes(q, k_cur, v_cur, segments, "none")
    e = math.exp(-20.0) / (1 + math.exp(-20.0))
    assert probes["jsd"] == pytest.approx(0.5 * e * math.log(2), rel=1e-3)
    p = torch.tensor([[1.0, 1.4e-45], [1.0, 0.0]])  # a float32 denormal against an exact zero
    r = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    js = jensen_shannon(p, r)
    assert torch.isfinite(js).all() and (js >= 0).all() and (js <= math.log(2)).all()


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_probes_on_large_steps_match_direct_computation(correction: str) -> None:
    """Steps large enough that the exact bias leaves its series form (the elementwise fallback)."""
    case = make_case(4, False, seed=24, step_range=(20.0, 40.0))
    probes = attention_probes(case.q, case.k_cur, case.v_cur, case.segments, correction, query_tile=2)
    rows = _attention_rows(case, case.segments, correction)
    n_cached = sum(s.k.shape[-2] for s in case.segments)
    assert probes["p_s"] == pytest.approx(rows[..., :n_cached].sum(-1).mean().item(), abs=1e-6)


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_probes_read_back_from_the_device_at_most_twice(host_reads, correction: str) -> None:
    """Every host read of a tensor (.item, .tolist, bool/float/int) is a device sync on a GPU: the probes
    may read once for the results and once for the exact bias's form, however many heads and tiles."""
    case = make_case(4, True, seed=25, heads=3, n_q=16)
    host_reads.clear()  # count only the call below
    reads = host_reads
    attention_probes(case.q, case.k_cur, case.v_cur, case.segments, correction, query_tile=2)
    assert len(reads) <= (2 if correction == "exact" else 1), reads


def test_evenly_spaced_probe_indices() -> None:
    from jensenkv.attention.probes import evenly_spaced

    assert evenly_spaced(30, 4) == (0, 10, 19, 29)
    assert evenly_spaced(30, 5) == (0, 7, 14, 22, 29)
    assert evenly_spaced(4, 5) == (0, 1, 2, 3) and evenly_spaced(4, None) == (0, 1, 2, 3)
    assert evenly_spaced(30, 1) == (0,)
    with pytest.raises(ValueError, match="count=0"):
        evenly_spaced(30, 0)
