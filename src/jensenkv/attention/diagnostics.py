"""Error-model diagnostics: does the cached key error behave as the correction assumes?

The correction assumes e = k_hat - k ~ U(-D/2, D/2) per element, independent of k. Then the cached score
error delta = scale * q . e has mean 0 and only its second-order (Jensen) term inflates the cached partition
sum Z_S. These numbers say, per call, which of that holds:

- mean_err = mean(e / D), in steps: 0 under the model. A constant offset or a grid that rounds one way shows
  here (the centred statistics below cannot see it). Per channel group: mean_err_small over channels whose
  magnitude is below one step (RMS over tokens of k < its mean step: the small channels of a group whose range
  an outlier sets, where rounding is nearly deterministic), mean_err_large over the others, small_fraction the share
  of small channels; mean_err_abs = mean over channels of |mean over tokens of e / D| (offsets of opposite sign
  in different channels do not cancel).
- slope = Cov(k, e) / Var(k) (per channel centred, pooled): the error's regression on the key, 0 under the
  model; its scale is a gain: a grid that shrinks k by 20% gives -0.2, rounding a channel to 0 gives -1.
  (It replaces theta = Cov(k, e) / Var(e), whose scale depends on how small the error is: a 20% shrink
  gives about -2.8 or -5.) corr = Cov(k, e) / sqrt(Var(k) Var(e)), in [-1, 1], the same sign.
- var_ratio = Var(e) / mean(D^2 / 12): 1 under the model (dithered grids: exactly 1).
- log_zs_shift = log Z_S(k_hat) - log Z_S(k), split into first_order = sum_j pi_j delta_j (zero under the
  model) and jensen = the rest (the convexity term the correction targets), with pi the reference softmax
  over cached keys. predicted_taylor = sum_j pi_j b_j is what subtracting b removes to first order;
  predicted_jensen = sum_j pi_j (1 - pi_j) b_j is what the model predicts for the Jensen term itself: to second
  order, jensen = sum pi delta^2 / 2 - (sum pi delta)^2 / 2, and with independent zero-mean delta_j of variance
  2 b_j its expectation is sum pi b - sum pi^2 b. So b exceeding the Jensen term by sum pi^2 b is the model's
  own prediction, not evidence against it.
- n_eff = 1 / sum_j pi_j^2: how many cached keys a query really attends to (small: peaky attention, where
  correcting Z_S in expectation overshoots P_S).

Averages are over batch, heads and queries (the element statistics pool every element). Computed in float64:
a probe, not a hot path.
"""
from __future__ import annotations

import torch

from jensenkv.correction import GroupSteps, expand_group_steps, group_bias


def error_model_diagnostics(q: torch.Tensor, k_ref: torch.Tensor, k_hat: torch.Tensor, steps: GroupSteps,
                            scale: float | None = None) -> dict[str, float]:
    """q (B, H, Q, D) queries; k_ref, k_hat (B, H, K, D) reference and dequantized cached keys (original basis);
    steps: their quantization steps (B, H, K, G). Returns the diagnostics above as floats."""
    if k_ref.shape != k_hat.shape or q.shape[:2] != k_ref.shape[:2] or q.shape[-1] != k_ref.shape[-1]:
        raise ValueError(f"shapes q={tuple(q.shape)}, k_ref={tuple(k_ref.shape)}, k_hat={tuple(k_hat.shape)} "
                         "are not allowed: expected q (B, H, Q, D) and keys (B, H, K, D) with the same B, H, D")
    q, k_ref, k_hat = (t.double() for t in (q, k_ref, k_hat))
    d = q.shape[-1]
    scale = d ** -0.5 if scale is None else float(scale)
    err = k_hat - k_ref  # (B, H, K, D)

    # element statistics in the basis the steps live in
    rot = steps.rotation
    k_b, e_b = (k_ref, err) if rot is None else (rot.apply(k_ref), rot.apply(err))
    step = expand_group_steps(GroupSteps(steps.step.double(), rot), d)  # (B, H, K, D)
    element = element_statistics(k_b, e_b, step)

    # score-level decomposition of the cached partition's shift
    s = scale * q @ k_ref.transpose(-1, -2)  # (B, H, Q, K)
    delta = scale * q @ err.transpose(-1, -2)  # (B, H, Q, K)
    pi = torch.softmax(s, dim=-1)
    log_zs_shift = torch.logsumexp(s + delta, dim=-1) - torch.logsumexp(s, dim=-1)  # (B, H, Q)
    first_order = (pi * delta).sum(-1)
    b = group_bias(q, GroupSteps(steps.step.double(), rot), "taylor", scale)  # (B, H, Q, K)
    predicted = (pi * b).sum(-1)
    predicted_jensen = (pi * (1 - pi) * b).sum(-1)  # E[jensen] under the model (module docstring)
    n_eff = 1.0 / pi.square().sum(-1)
    return {
        **element,
        "log_zs_shift": float(log_zs_shift.mean()),
        "first_order": float(first_order.mean()),
        "jensen": float((log_zs_shift - first_order).mean()),
        "predicted_taylor": float(predicted.mean()),
        "predicted_jensen": float(predicted_jensen.mean()),
        "n_eff": float(n_eff.mean()),
        "n_eff_fraction": float(n_eff.mean() / s.shape[-1]),
    }


def element_statistics(k: torch.Tensor, e: torch.Tensor, step: torch.Tensor) -> dict[str, float]:
    """The element-level keys of ``error_model_diagnostics`` (mean_err*, small_fraction, slope, corr,
    var_ratio) from keys k, errors e and their steps, all (B, H, K, D) in the basis the steps live in."""
    nan = float("nan")
    rel = e / step.clamp_min(torch.finfo(step.dtype).tiny)  # (B, H, K, D): error in steps
    channel_mean = rel.mean(dim=2)  # (B, H, D): per channel, over tokens
    e_c = e - e.mean(dim=2, keepdim=True)  # centred over tokens, per (batch, head, channel)
    k_c = k - k.mean(dim=2, keepdim=True)
    # small channels: magnitude below one step (an outlier set the group's range), so rounding is nearly
    # deterministic there: the grid, not the key, decides their error
    small = k.square().mean(dim=2).sqrt() < step.mean(dim=2)  # (B, H, D)

    def mean_over(mask: torch.Tensor) -> float:
        return float(channel_mean[mask].mean()) if bool(mask.any()) else nan

    var_e, var_k, cov = e_c.square().sum(), k_c.square().sum(), (k_c * e_c).sum()
    return {
        "mean_err": float(rel.mean()),
        "mean_err_small": mean_over(small),
        "mean_err_large": mean_over(~small),
        "mean_err_abs": float(channel_mean.abs().mean()),
        "small_fraction": float(small.double().mean()),
        "slope": float(cov / var_k) if var_k > 0 else nan,
        "corr": float(cov / (var_k * var_e).sqrt()) if var_k > 0 and var_e > 0 else nan,
        "var_ratio": float(e_c.square().mean() / (step.square().mean() / 12)),
    }


def segment_diagnostics(q: torch.Tensor, segments, scale: float | None = None) -> dict[str, float]:
    """``error_model_diagnostics`` over the quantized cached segments of one attention call (the ones with
    steps and a full-precision reference; sinks and unquantized keys carry no error). q: (B, H, Q, D).
    Empty dict when no segment qualifies. Keys are prefixed ``em_`` in probe records."""
    quantized = [s for s in segments if s.steps is not None and s.k_ref is not None]
    if not quantized:
        return {}
    rotation = quantized[0].steps.rotation
    k_ref = torch.cat([s.k_ref for s in quantized], dim=2)  # (B, H, K, D)
    k_hat = torch.cat([s.k for s in quantized], dim=2)
    step = torch.cat([s.steps.step for s in quantized], dim=2)  # (B, H, K, G)
    if k_ref.shape[1] != q.shape[1]:  # GQA: each KV head serves q.shape[1] / kv_heads query heads
        groups = q.shape[1] // k_ref.shape[1]
        k_ref, k_hat, step = (t.repeat_interleave(groups, dim=1) for t in (k_ref, k_hat, step))
    out = error_model_diagnostics(q, k_ref, k_hat, GroupSteps(step, rotation), scale)
    return {f"em_{k}": v for k, v in out.items()}


HEAD_MOMENT_KEYS = ("hm_count", "hm_bias", "hm_shift", "hm_bias_sq", "hm_bias_shift", "hm_shift_sq")
_MOMENT_TILE = 1 << 22  # elements of one (B, H, tile, K) score matrix


def head_shift_moments(q: torch.Tensor, segments, correction: str, scale: float | None = None) -> dict[str, list]:
    """Per-head sums behind a fitted strength s with s * <b> ~ delta (``jensenkv.calibration.fit``), over one call's
    queries: for each query, over every cached key i (quantized or not; unquantized ones have b_i = 0),

    - delta = log Z_S(k_hat) - log Z_S(k): the realized shift of the cached log-partition (dequantized vs
      full-precision keys, both without bias);
    - <b> = sum_i pi_hat_i b_i / sum_i pi_hat_i: the correction's bias (``correction``, strength 1) averaged
      under the dequantized softmax over cached keys, so that subtracting s * b lowers log Z_S(k_hat) by
      s * <b> to first order.

    q: (B, H, Q, D). Returns lists of H floats under HEAD_MOMENT_KEYS: count (queries x batch), sum <b>,
    sum delta, sum <b>^2, sum <b> delta, sum delta^2. Empty dict when no segment carries steps or the
    correction is "none". Float64, query-tiled (a probe, not a hot path).
    """
    if correction == "none" or not any(s.steps is not None for s in segments):
        return {}
    q = q.double()
    d = q.shape[-1]
    scale = d ** -0.5 if scale is None else float(scale)
    heads = q.shape[1]
    k_hat = torch.cat([s.k for s in segments], dim=2).double()  # (B, Hk, K, D)
    k_ref = torch.cat([s.k if s.k_ref is None else s.k_ref for s in segments], dim=2).double()
    groups = heads // k_hat.shape[1]

    def per_query_heads(x: torch.Tensor) -> torch.Tensor:  # (B, Hk, ...) -> (B, H, ...)
        return x if groups == 1 else x.repeat_interleave(groups, dim=1)

    k_hat, k_ref = per_query_heads(k_hat), per_query_heads(k_ref)
    sums = torch.zeros(len(HEAD_MOMENT_KEYS), heads, dtype=torch.float64, device=q.device)
    tile = max(1, _MOMENT_TILE // max(1, q.shape[0] * heads * k_hat.shape[2]))
    for start in range(0, q.shape[2], tile):
        q_t = q[:, :, start:start + tile]  # (B, H, t, D)
        blocks = []
        for seg in segments:
            if seg.steps is None:
                blocks.append(q_t.new_zeros(*q_t.shape[:-1], seg.k.shape[2]))  # (B, H, t, K_i): b = 0
            else:
                steps = GroupSteps(per_query_heads(seg.steps.step.double()), seg.steps.rotation)
                blocks.append(group_bias(q_t, steps, correction, scale))  # (B, H, t, K_i)
        bias = torch.cat(blocks, dim=-1)  # (B, H, t, K)
        s_hat = scale * q_t @ k_hat.transpose(-1, -2)  # (B, H, t, K)
        s_ref = scale * q_t @ k_ref.transpose(-1, -2)
        delta = torch.logsumexp(s_hat, dim=-1) - torch.logsumexp(s_ref, dim=-1)  # (B, H, t)
        mean_b = (torch.softmax(s_hat, dim=-1) * bias).sum(-1)  # (B, H, t)
        ones = torch.ones_like(delta)
        stacked = torch.stack([ones, mean_b, delta, mean_b.square(), mean_b * delta, delta.square()])  # (6, B, H, t)
        sums += stacked.sum(dim=(1, 3))
    return dict(zip(HEAD_MOMENT_KEYS, sums.tolist()))
