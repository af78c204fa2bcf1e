"""Per-head moments of the realized cached log-partition shift against the correction's bias: what
``jensenkv.calibration.fit`` fits strengths from."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_testkit import make_case
from jensenkv.attention.diagnostics import HEAD_MOMENT_KEYS, head_shift_moments
from jensenkv.calibration.fit import fit_strengths
from jensenkv.correction import group_bias


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_head_shift_moments_match_a_direct_computation(correction: str) -> None:
    """delta = log Z_S(k_hat) - log Z_S(k_ref) and <b> = pi_hat-weighted bias over all cached keys (b = 0 on the
    unquantized middle segment), summed per head."""
    case = make_case(4, False, seed=2, heads=3, n_q=5)
    moments = head_shift_moments(case.q, case.segments, correction)
    assert set(moments) == set(HEAD_MOMENT_KEYS) and all(len(v) == 3 for v in moments.values())
    q = case.q.double()
    scale = q.shape[-1] ** -0.5
    k_hat = torch.cat([s.k for s in case.segments], dim=2).double()  # (B, H, K, D)
    k_ref = torch.cat([s.k_ref for s in case.segments], dim=2).double()
    bias = torch.cat([group_bias(q, s.steps, correction, scale) if s.steps is not None
                      else q.new_zeros(*q.shape[:-1], s.k.shape[2]) for s in case.segments], dim=-1)  # (B, H, Q, K)
    s_hat, s_ref = scale * q @ k_hat.transpose(-1, -2), scale * q @ k_ref.transpose(-1, -2)
    delta = torch.logsumexp(s_hat, -1) - torch.logsumexp(s_ref, -1)  # (B, H, Q)
    mean_b = (torch.softmax(s_hat, -1) * bias).sum(-1)
    for h in range(3):
        x, y = mean_b[:, h].flatten(), delta[:, h].flatten()
        expected = [x.numel(), x.sum(), y.sum(), (x * x).sum(), (x * y).sum(), (y * y).sum()]
        assert moments["hm_count"][h] == x.numel()
        assert [moments[k][h] for k in HEAD_MOMENT_KEYS] == pytest.approx([float(e) for e in expected], rel=1e-9)
    assert head_shift_moments(case.q, case.segments, "none") == {}


def test_fitted_strength_cancels_the_realized_shift_better_than_the_paper() -> None:
    """Per head, the fitted s lowers sum (delta - s <b>)^2 below s = 1 (the paper's) and s = 0 (uncorrected)."""
    case = make_case(4, False, seed=4, heads=3, n_q=16, step_range=(3.0, 8.0))
    m = {k: np.array(v) for k, v in head_shift_moments(case.q, case.segments, "taylor").items()}
    moments = np.stack([m[k] for k in HEAD_MOMENT_KEYS], axis=-1)[None, :, None]  # (1, H, 1, 6)
    s = fit_strengths(moments).strengths[0]

    def sse(strength):
        return m["hm_shift_sq"] - 2 * strength * m["hm_bias_shift"] + strength ** 2 * m["hm_bias_sq"]

    assert (sse(s) <= sse(1.0)).all() and (sse(s) <= sse(0.0)).all()
