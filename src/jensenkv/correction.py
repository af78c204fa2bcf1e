"""The Jensen bias of quantized cached keys and its correction.

A cached key k_hat = k + e with e_c ~ U(-D_c/2, D_c/2) (D_c the rounding step of channel c) gives
the score error q.e * scale with mean 0, but E[exp(s + err)] > exp(s) (Jensen): the cached block
steals softmax mass. Subtracting b = log E[exp(scale * q.e)] from the cached scores removes it:

- exact:  b = sum_c log(sinh(x_c) / x_c),  x_c = scale * q_c * D_c / 2
- taylor: b = sum_c (scale * q_c * D_c)^2 / 24   (= Var / 2, the second-order term; b_taylor >= b_exact)

``jensen_bias`` is the reference form on per-channel steps; ``group_bias`` is the compact form on
``GroupSteps`` (one step per group of g contiguous channels) that the fast attention paths use.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from jensenkv.quant.steps import GroupSteps  # defined in quant (no import cycle); re-exported here

BIAS_METHODS = ("taylor", "exact")
CORRECTIONS = ("none", *BIAS_METHODS)  # the one list of correction options (config, attention, probes)

# |x| below this uses the power series of log(sinh x / x); above, the asymptotic form (both are
# accurate to float64 rounding there: the series' error ~ (0.5/pi)^16, the other form's cancellation
# loses < 4 bits at x = 0.5).
_SERIES_SWITCH = 0.5
_SERIES_TERMS_SMALL = 8
# group_bias(exact) uses the series as matmuls while scale/2 * max|q| * max D <= this bound.
SERIES_MAX_ARG = 1.5
_SERIES_TERMS_GROUP = 14  # truncation error ~ (1.5/pi)^28 / 14 ~ 1e-10 at the bound
# the exact bias's elementwise pairs: elements per chunk (bounds their memory)
_TILE_ELEMENTS = 1 << 22


def validate_method(method: str, argument: str = "method") -> None:
    """Raise ValueError unless ``method`` names a bias form."""
    if method not in BIAS_METHODS:
        raise ValueError(f"{argument}={method!r} is not allowed: use one of {BIAS_METHODS}")


def _default_scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32) is evaluated in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@lru_cache(maxsize=None)
def log_sinhc_series_coefficients(terms: int) -> tuple[float, ...]:
    """a_n, n = 1..terms, of log(sinh x / x) = sum_n a_n x^(2n): a_n = 2^(2n) B_(2n) / (2n (2n)!)."""
    from sympy import bernoulli, factorial  # exact rationals; imported lazily (slow import)

    return tuple(
        float(2 ** (2 * n) * bernoulli(2 * n) / (2 * n * factorial(2 * n))) for n in range(1, terms + 1)
    )


def log_sinhc(x: torch.Tensor) -> torch.Tensor:
    """log(sinh(x) / x), elementwise, finite for every finite x (even function, 0 at x = 0)."""
    ax = x.abs()
    small = ax < _SERIES_SWITCH
    # series on |x| < 0.5: x^2 (a_1 + x^2 (a_2 + ...)) by Horner
    xs = torch.where(small, ax, torch.zeros_like(ax))
    x2 = xs * xs
    acc = torch.zeros_like(x2)
    for a_n in reversed(log_sinhc_series_coefficients(_SERIES_TERMS_SMALL)):
        acc = (acc + a_n) * x2
    # asymptotic form: log((e^x - e^-x) / 2x) = |x| - log(2|x|) + log1p(-e^(-2|x|))
    xl = torch.where(small, torch.ones_like(ax), ax)
    large = xl - torch.log(2 * xl) + torch.log1p(-torch.exp(-2 * xl))
    return torch.where(small, acc, large)


def log_sinhc_nonnegative(x: torch.Tensor) -> torch.Tensor:
    """``log_sinhc`` for x >= 0 in fewer passes (the exact bias's elementwise pairs): the asymptotic form on
    x > 0.5, the series below with as many terms as x's dtype resolves (float32: 5, (0.5/pi)^10 ~ 1e-8 relative)."""
    y = x.clamp_min(_SERIES_SWITCH)
    large = torch.exp(y * -2.0).neg_().log1p_().add_(y).sub_(torch.log(y * 2.0))  # y - log 2y + log1p(-e^-2y)
    x2 = x.clamp_max(_SERIES_SWITCH).square_()
    terms = _SERIES_TERMS_SMALL if x.dtype == torch.float64 else 5
    acc = torch.zeros_like(x2)
    for a_n in reversed(log_sinhc_series_coefficients(terms)):
        acc.add_(a_n).mul_(x2)
    return torch.where(x > _SERIES_SWITCH, large, acc)


def jensen_bias(
    q: torch.Tensor, step: torch.Tensor, method: str = "taylor", scale: float | None = None
) -> torch.Tensor:
    """Reference Jensen bias on per-channel steps (builds the (..., Q, K, d) tensor: test sizes only).

    q: (..., Q, d) queries; step: (..., K, d) quantization step of each channel of each cached key
    (leading dims broadcast). Returns b: (..., Q, K), to subtract from ``scale * q.k``.
    ``scale`` defaults to 1/sqrt(d).
    """
    validate_method(method)
    if q.ndim < 2 or step.ndim < 2:
        raise ValueError(
            f"q.shape={tuple(q.shape)}, step.shape={tuple(step.shape)}: both need at least 2 dims (..., N, d)"
        )
    if q.shape[-1] != step.shape[-1]:
        raise ValueError(
            f"step.shape={tuple(step.shape)} does not match q.shape={tuple(q.shape)}: "
            "the last dims (channels d) must be equal"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], step.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"step.shape={tuple(step.shape)} and q.shape={tuple(q.shape)}: leading dims must broadcast"
        ) from err
    dtype = _work_dtype(torch.promote_types(q.dtype, step.dtype))
    scale = _default_scale(scale, q.shape[-1])
    # x = scale * q_c * D_kc / 2 for every (query, key, channel)
    x = 0.5 * scale * q.to(dtype).unsqueeze(-2) * step.to(dtype).unsqueeze(-3)  # (..., Q, K, d)
    if method == "taylor":
        return (x * x / 6.0).sum(-1)  # (scale q D)^2 / 24 = x^2 / 6
    return log_sinhc(x).sum(-1)


def expand_group_steps(steps: GroupSteps, head_dim: int) -> torch.Tensor:
    """Per-channel steps (B, H, K, D) from group steps (B, H, K, G): each group's step repeated g times."""
    _validate_group_count(steps.step.shape[-1], head_dim)
    return steps.step.repeat_interleave(head_dim // steps.step.shape[-1], dim=-1)  # (B, H, K, D)


def bias_basis_query(q: torch.Tensor, steps: GroupSteps) -> torch.Tensor:
    """The query in the basis the steps live in: rotation.apply(q) when the keys were rotated."""
    return q if steps.rotation is None else steps.rotation.apply(q)


def query_group_sq_norms(q: torch.Tensor, groups: int) -> torch.Tensor:
    """Squared norm of each group of g = D // groups contiguous channels: (B, H, Q, D) -> (B, H, Q, G)."""
    _validate_group_count(groups, q.shape[-1])
    return q.unflatten(-1, (groups, q.shape[-1] // groups)).square().sum(-1)  # (B, H, Q, G)


def _validate_group_count(groups: int, head_dim: int) -> None:
    if groups < 1 or head_dim % groups:
        raise ValueError(
            f"steps.step.shape[-1]={groups} (groups G) is not allowed for head_dim={head_dim}: "
            "G must divide head_dim"
        )


def validate_group_steps(q: torch.Tensor, steps: GroupSteps, argument: str = "steps") -> None:
    """Raise ValueError unless ``steps`` fits queries q (B, H, Q, D)."""
    step = steps.step
    if q.ndim != 4:
        raise ValueError(f"q.shape={tuple(q.shape)} is not allowed: q must be (B, H, Q, D)")
    if step.ndim != 4 or step.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"{argument}.step.shape={tuple(step.shape)} does not fit q.shape={tuple(q.shape)}: "
            "it must be (B, H, K, G) with the same B and H as q"
        )
    groups = step.shape[-1]
    if groups < 1 or q.shape[-1] % groups:
        raise ValueError(
            f"{argument}.step.shape[-1]={groups} (groups G) is not allowed for head_dim={q.shape[-1]}: "
            "G must divide head_dim"
        )
    if steps.rotation is not None and steps.rotation.dim != q.shape[-1]:
        raise ValueError(
            f"{argument}.rotation.dim={steps.rotation.dim} does not match head_dim={q.shape[-1]}"
        )


def group_bias(
    q: torch.Tensor,
    steps: GroupSteps,
    method: str = "taylor",
    scale: float | None = None,
    strength: float = 1.0,
) -> torch.Tensor:
    """Compact Jensen bias, never materializing a (Q, K, D) tensor.

    q: (B, H, Q, D) queries in the original basis; steps.step: (B, H, K, G). Returns
    strength * b: (B, H, Q, K), equal to ``jensen_bias`` on the expanded per-channel steps (of the
    rotated query when ``steps.rotation`` is set). Evaluated in float32 (float64 for float64 input).
    """
    validate_method(method)
    validate_group_steps(q, steps)
    if not math.isfinite(strength):
        raise ValueError(f"strength={strength} is not allowed: it must be a finite number")
    dtype = _work_dtype(q.dtype)
    scale = _default_scale(scale, q.shape[-1])
    qb = bias_basis_query(q.to(dtype), steps)  # (B, H, Q, D)
    step = steps.step.to(dtype)  # (B, H, K, G)
    if method == "taylor":
        qn2 = query_group_sq_norms(qb, step.shape[-1])  # (B, H, Q, G)
        bias = (scale * scale / 24.0) * (qn2 @ step.square().transpose(-1, -2))  # (B, H, Q, K)
    else:
        bias = _exact_group_bias(qb, step, scale)
    return bias * strength if strength != 1.0 else bias


def _exact_group_bias(qb: torch.Tensor, step: torch.Tensor, scale: float) -> torch.Tensor:
    """Exact bias: series matmuls when every |x| <= SERIES_MAX_ARG, else the split form (series on the channels
    where it converges, elementwise on the few (query, channel) pairs that need it)."""
    q_max = qb.abs().amax()
    arg_bound = 0.5 * scale * q_max * step.abs().amax()  # >= max |x| over all (query, key, channel)
    # the one host read (a device sync) of the call: which form is exact for these inputs
    if bool((q_max == 0) | (arg_bound <= SERIES_MAX_ARG)):
        return _exact_group_bias_series(qb, step, scale, q_max)
    return exact_group_bias_split(qb, step, scale)


def _split_series_limit(dtype: torch.dtype) -> float:
    """The largest |w| the split form's 14-term series takes. Its truncation error per channel is below
    |a_15| limit^30: 2.0 -> 9e-8, under float32's resolution of a bias (real networks' pairs between 1.5 and 2
    are as many as those above 2, so this halves the elementwise work); float64 keeps SERIES_MAX_ARG (1e-10)."""
    return SERIES_MAX_ARG if dtype == torch.float64 else 2.0


def exact_group_bias_split(qb: torch.Tensor, step: torch.Tensor, scale: float) -> torch.Tensor:
    """The exact bias for any |x|, qb (B, H, Q, D) in the steps' basis, step (B, H, K, G) -> (B, H, Q, K).

    Real networks' queries have a few outlier channels: there x_c = scale/2 q_c D_kj reaches 2-12 (SmolLM2)
    and the series of log(sinh x / x), which converges for |x| < pi, cannot serve the whole row. Per (batch,
    head) and group j, with Dmax_j the largest step of group j over the keys, write x = w_c u_kj, w_c =
    scale/2 q_c Dmax_j and u_kj = D_kj / Dmax_j in [0, 1]:
    - channels with |w_c| <= the series' limit (``_split_series_limit``; every key's |x| is then within it): the
      series, as one matmul of bounded factors, a_n sum_c w_c^(2n) against u_kj^(2n) (no overflow, whatever the
      scale of q or D);
    - the other (query, channel) pairs, few: log_sinhc elementwise over the keys, added to their query's row
      (tiles of at most _TILE_ELEMENTS elements).
    Keys whose steps repeat in runs (KIVI's per-channel keys share a step over each group of tokens) are computed
    once per run and the columns repeated. Equal to ``jensen_bias`` (every element elementwise) to float rounding,
    at a small share of its cost.
    """
    runs, counts = torch.unique_consecutive(step, dim=-2, return_counts=True)  # (B, H, K_runs, G)
    if runs.shape[-2] < step.shape[-2]:
        return exact_group_bias_split(qb, runs, scale).repeat_interleave(counts, dim=-1)  # (B, H, Q, K)
    batch, heads, n_q, dim = qb.shape
    n_k, groups = step.shape[-2:]
    width = dim // groups
    d_max = step.abs().amax(dim=-2, keepdim=True)  # (B, H, 1, G)
    unit = step / d_max.clamp_min(torch.finfo(step.dtype).tiny)  # (B, H, K, G) in [0, 1]
    w = 0.5 * scale * qb * d_max.repeat_interleave(width, dim=-1)  # (B, H, Q, D)
    large = w.abs() > _split_series_limit(qb.dtype)  # (B, H, Q, D): pairs the series cannot serve
    w_small = w.masked_fill(large, 0.0).square().unflatten(-1, (groups, width))  # (B, H, Q, G, g)
    q_cols, k_cols, w_pow, u_sq = [], [], w_small, unit.square()
    u_pow = u_sq
    # below the floor: 0, so that no product in the matmul is subnormal (x86 runs those ~100x slower); the
    # dropped terms are < floor * a_1 per channel, far below any dtype's resolution of the bias
    floor = 1e-18 if qb.dtype != torch.float64 else 1e-150
    for a_n in log_sinhc_series_coefficients(_SERIES_TERMS_GROUP):
        q_cols.append(a_n * w_pow.sum(-1))  # (B, H, Q, G)
        k_cols.append(u_pow)  # (B, H, K, G)
        w_pow, u_pow = w_pow * w_small, u_pow * u_sq
        w_pow.masked_fill_(w_pow < floor, 0.0)
        u_pow.masked_fill_(u_pow < floor, 0.0)
    bias = torch.cat(q_cols, dim=-1) @ torch.cat(k_cols, dim=-1).transpose(-1, -2)  # (B, H, Q, K)
    where = large.nonzero()  # (P, 4): b, h, query, channel of each large pair
    if len(where):
        rows = bias.view(-1, n_k)  # (B*H*Q, K)
        row_index = (where[:, 0] * heads + where[:, 1]) * n_q + where[:, 2]  # (P,)
        chunk = max(1, _TILE_ELEMENTS // max(1, n_k))
        for start in range(0, len(where), chunk):
            part = where[start : start + chunk]
            w_part = w[part[:, 0], part[:, 1], part[:, 2], part[:, 3]]  # (p,)
            u_part = unit[part[:, 0], part[:, 1], :, part[:, 3] // width]  # (p, K)
            x = w_part.abs().unsqueeze(-1) * u_part  # (p, K), >= 0: log(sinh x / x) is even
            rows.index_add_(0, row_index[start : start + chunk], log_sinhc_nonnegative(x))
    return bias


def series_tolerance(dtype: torch.dtype) -> float:
    """Truncation tolerance of the exact bias's series, in score units, for attention run in ``dtype``.

    Softmax weights see a score only through exp(s - max): an absolute score error delta scales that
    weight by exp(-delta) ~ 1 - delta. Half the dtype's machine epsilon keeps the relative change of
    every weight below half an ulp, i.e. below the rounding of the weight itself in that dtype (fp32:
    6.0e-8, where CPU SDPA's own exp is accurate to ~20 ulp; bf16: 3.9e-3).
    """
    return 0.5 * torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps


def series_truncation_bound(arg_bound: float, terms: int, power_sum: float) -> float:
    """Upper bound of |exact bias - its N-term series| summed over channels.

    The series of log(sinh x / x) alternates, with terms shrinking for |x| < pi, so dropping the terms
    n > N errs by at most the first dropped one: |a_(N+1)| x_c^(2N+2) per channel. With
    |x_c| <= arg_bound * |r_c| (r_c = q_c / max|q|, |r_c| <= 1) the sum over channels is at most
    |a_(N+1)| * arg_bound^(2N+2) * power_sum, power_sum = max over queries of sum_c r_c^(2N+2) (<= D).
    """
    a_next = abs(log_sinhc_series_coefficients(terms + 1)[terms])
    return a_next * float(arg_bound) ** (2 * terms + 2) * power_sum


def exact_series_terms(arg_bound: float, power_sum: Callable[[int], float], tol: float) -> int:
    """Fewest series terms N (at most _SERIES_TERMS_GROUP) with ``series_truncation_bound`` <= tol.

    power_sum(m): max over queries of sum_c (q_c / max|q|)^(2m), which is >= 1 (the largest channel),
    so N is first raised on the data-free bound and the data is read only for the last few candidates.
    """
    if arg_bound <= 0 or not math.isfinite(tol):
        return 1
    terms = 1
    while terms < _SERIES_TERMS_GROUP and series_truncation_bound(arg_bound, terms, 1.0) > tol:
        terms += 1
    while terms < _SERIES_TERMS_GROUP and series_truncation_bound(arg_bound, terms, power_sum(terms + 1)) > tol:
        terms += 1
    return terms


def series_terms_for(qb: torch.Tensor, q_max: torch.Tensor, arg_bound: float, strength, dtype: torch.dtype) -> int:
    """Series terms for the exact bias of queries qb (B, H, Q, D) in attention run in ``dtype``.

    The one rule every backend uses: the fewest terms whose truncation error, scaled by the largest
    |strength| (a float or a per-head tensor), stays below ``series_tolerance(dtype)``.
    """
    r_sq = (qb / q_max.clamp_min(torch.finfo(qb.dtype).tiny)).square()  # (B, H, Q, D), each in [0, 1]
    peak = float(torch.as_tensor(strength).abs().max())
    tol = series_tolerance(dtype) / peak if peak else math.inf
    return exact_series_terms(arg_bound, lambda m: float(r_sq.pow(m).sum(-1).amax()), tol)


def exact_series_query_columns(qb: torch.Tensor, groups: int, q_max: torch.Tensor, terms: int) -> torch.Tensor:
    """(B, H, Q, G*N): a_n * sum_{c in j} (q_c / max|q|)^(2n), term-major (column n*G + j).

    q is normalized by max|q| (folded into the key columns) so that q^(2n) cannot overflow.
    """
    q_sq = (qb / q_max.clamp_min(torch.finfo(qb.dtype).tiny)).square().unflatten(-1, (groups, -1))  # (B, H, Q, G, g)
    cols, q_pow = [], q_sq
    for a_n in log_sinhc_series_coefficients(terms):
        cols.append(a_n * q_pow.sum(-1))  # (B, H, Q, G)
        q_pow = q_pow * q_sq
    return torch.cat(cols, dim=-1)


def exact_series_key_columns(step: torch.Tensor, scale: float, q_max: torch.Tensor, terms: int) -> torch.Tensor:
    """(B, H, K, G*N): u_kj^(2n) with u = scale/2 * max|q| * D_kj, term-major like the query columns."""
    u_sq = (0.5 * scale * q_max * step).square()  # (B, H, K, G)
    return torch.cat([u_sq.pow(n) for n in range(1, terms + 1)], dim=-1)


def exact_series_columns(
    qb: torch.Tensor, step: torch.Tensor, scale: float, q_max: torch.Tensor, terms: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Factor the exact bias (series form) into columns: bias = q_cols @ k_cols^T, one matmul (or extra
    SDPA columns) instead of N passes over (Q, K)."""
    groups = step.shape[-1]
    return (exact_series_query_columns(qb, groups, q_max, terms),
            exact_series_key_columns(step, scale, q_max, terms))


def _exact_group_bias_series(
    qb: torch.Tensor, step: torch.Tensor, scale: float, q_max: torch.Tensor
) -> torch.Tensor:
    """sum_n a_n (scale D_kj / 2)^(2n) sum_{c in j} q_c^(2n) as one (Q, G*N) x (G*N, K) matmul."""
    q_cols, k_cols = exact_series_columns(qb, step, scale, q_max, _SERIES_TERMS_GROUP)
    return q_cols @ k_cols.transpose(-1, -2)  # (B, H, Q, K)
