"""The second-order Jensen correction: subtract b_i (1 - pi_i) instead of b_i from each cached key's score.

Why. A cached score is s_i + e_i with E[exp(e_i)] = exp(b_i) (b: ``jensen_bias``, Taylor or exact). Subtracting
b_i makes every exp(s_i) unbiased, so the partition sum Z = sum_i exp(s_i) (cached + current keys) is corrected
in expectation. But the softmax divides by Z: what the mass P_S and every output depend on is log Z, and
log is concave. With pi_i = exp(s_i) / Z and d = sum_i pi_i (exp(e_i) - 1):

    E[log Z_hat] = log Z + E[d] - E[d^2] / 2 + ...,  E[d] ~ sum_i pi_i b_i,  E[d^2] ~ sum_i pi_i^2 Var(e_i)
                 = log Z + sum_i pi_i b_i - sum_i pi_i^2 b_i        (Var(e_i) = 2 b_i to leading order)

Subtracting c_i from score i moves log Z by about -sum_i pi_i c_i, so c_i = b_i (1 - pi_i) cancels both terms:
log Z (and so log P_R, P_S and the current chunk's weights) is corrected to second order, where subtracting
b_i over-corrects by sum_i pi_i^2 b_i. That is negligible while attention is flat (pi_i ~ 1/K) and large when a
few cached keys dominate a row (peaky attention): there b_i (1 - pi_i) -> b_i as pi -> 0.

Which scores give pi. The true pi is unknown; a kernel has the scores of the dequantized keys. It uses the
first-order-corrected scores s_hat_i - b_i (b_i = 0 on the current chunk and on unquantized keys):
E[exp(s_hat_i - b_i)] = exp(s_i), so numerator and denominator of that softmax are unbiased, while the
uncorrected scores inflate every quantized key's weight by exp(b_i) on average. Both choices agree to the order
kept above (they differ by O(b^2 pi)). On peaky data (tests/attention/test_second_order.py, RTN INT2 g32 with
subtractive dither, q.k scaled x3 / x5, 100 dither draws) the first-order-corrected pi leaves the smaller log Z
shift: +0.008 / -0.014, against +0.034 / +0.178 with uncorrected pi (first order: -0.17 / -0.70).

What it does not target: the expected mass E[P_S] (and the expected output) is linear in 1/Z_hat, not in log Z;
the same expansion gives E[1/Z_hat] ~ (1/Z)(1 - sum_i pi_i b_i + 2 sum_i pi_i^2 b_i), whose second-order
correction is b_i (1 - 2 pi_i). So on E[dP_S] this term removes about half of first order's overshoot there
(-0.049 -> -0.025 at x3, -0.147 -> -0.091 at x5; uncorrected +0.073 / +0.091); the uncorrected pi, being larger,
happens to do better on it (-0.018 / -0.042), and b (1 - 2 pi) better still at x3 (-0.004).

Per query row, on a full row of scores: pass 1 softmax of the first-order scores (pi), pass 2 the corrected
scores s_hat - b + b pi, softmax, @ v. Backends that fold the bias into one fused kernel cannot see the row's
softmax; they are registered without it (``Capabilities.second_order``), so the call is refused before them.
"""
from __future__ import annotations

import torch

from jensenkv.correction import BIAS_METHODS

def check_second_order(second_order: object, correction: str) -> None:
    """Raise ValueError naming attention.second_order, its value and what is allowed."""
    if not isinstance(second_order, bool):
        raise ValueError(f"attention.second_order={second_order!r} is not allowed: it must be true or false")
    if second_order and correction not in BIAS_METHODS:
        raise ValueError(f"attention.second_order=True is not allowed with correction={correction!r}: "
                         f"it needs a correction in {BIAS_METHODS}")


def second_order_scores(scores: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """s_hat - b (1 - pi) from the first-order scores s_hat - b.

    scores: (..., K_total) first-order-corrected scores of full rows (cached + current keys); bias: (..., K_total)
    the bias b already subtracted (0 on columns without steps). pi = softmax(scores) over the row.
    Returns (..., K_total), a new tensor.
    """
    return scores + bias * torch.softmax(scores, dim=-1)
