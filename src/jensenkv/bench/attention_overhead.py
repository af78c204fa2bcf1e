"""Cost of the Jensen-bias correction on the fast CPU attention path (jensenkv.attention.cached_attention).

For each shape, the same queries, current chunk and quantized cache segments are attended with
correction "none" and with the correction(s) under test, interleaved within every repetition; the
overhead ratio is median(corrected) / median(none). Dequantization happens once, when the segments
are built, so the ratio isolates the attention call itself.

The exact bias has two forms in jensenkv.correction: a series of small matmuls while every argument
|x| = scale/2 * |q_c| * step <= SERIES_MAX_ARG, else an elementwise (Q, K, D) evaluation. Both cost a
multiple of the attention itself, so "exact" is timed only on shapes up to ``exact_max_scores``
scores, and its elementwise form (``exact-fallback``, inputs with outlier channels) on tiny shapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from jensenkv.attention import cached_attention
from jensenkv.bench.data import synthetic_heads
from jensenkv.bench.quant_configs import key_value_configs
from jensenkv.bench.rows import BenchRow, overall_median_row, time_ratio_row, time_row
from jensenkv.bench.timing import time_interleaved
from jensenkv.cache import CacheConfig, CacheSegment, ChunkedKVCache
from jensenkv.correction import SERIES_MAX_ARG


@dataclass(frozen=True)
class AttentionShape:
    """Batch-1 attention of one chunk over its cache: ``queries`` tokens (the current chunk, also its
    own keys) against ``cached`` tokens stored in chunks of ``queries`` tokens."""

    heads: int
    queries: int
    cached: int
    head_dim: int = 128

    def __post_init__(self) -> None:
        for key in ("heads", "queries", "cached", "head_dim"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} is not allowed: it must be an integer >= 1")

    @property
    def scores(self) -> int:
        """Scores per call over all heads (cached and current keys)."""
        return self.heads * self.queries * (self.cached + self.queries)

    def label(self) -> str:
        return f"H{self.heads} Q{self.queries} K{self.cached} D{self.head_dim}"


def build_inputs(
    shape: AttentionShape, quant: str, seed: int = 0, outlier_channels: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[CacheSegment]]:
    """q, k_cur, v_cur (1, H, Q, D) and the cache segments (chunks of Q tokens, the last one shorter if needed).

    ``outlier_channels`` > 0 scales that many channels by 8 (see synthetic_heads); the exact bias then
    leaves its series form for the elementwise one.
    """
    key_cfg, value_cfg = key_value_configs(quant)
    cache = ChunkedKVCache(CacheConfig(key=key_cfg, value=value_cfg), shape.head_dim)
    heads, dim, extra = shape.heads, shape.head_dim, outlier_channels
    filled, chunk = 0, 0
    with torch.inference_mode():
        while filled < shape.cached:
            tokens = min(shape.queries, shape.cached - filled)
            k = synthetic_heads(1, heads, tokens, dim, seed + 10 + 2 * chunk, extra)  # (1, H, S, D)
            v = synthetic_heads(1, heads, tokens, dim, seed + 11 + 2 * chunk, extra)  # (1, H, S, D)
            cache.commit(k, v)
            filled, chunk = filled + tokens, chunk + 1
        segments = cache.segments()
    q = synthetic_heads(1, heads, shape.queries, dim, seed + 1, extra)  # (1, H, Q, D)
    k_cur = synthetic_heads(1, heads, shape.queries, dim, seed + 2, extra)  # (1, H, Q, D)
    v_cur = synthetic_heads(1, heads, shape.queries, dim, seed + 3, extra)  # (1, H, Q, D)
    return q, k_cur, v_cur, segments


def exact_argument_bound(q: torch.Tensor, segments: list[CacheSegment]) -> float:
    """Upper bound of |x| = scale/2 * |q_c| * step over all (query, key, channel): decides the exact form."""
    steps = [seg.steps.step.abs().amax().item() for seg in segments if seg.steps is not None]
    return 0.5 / math.sqrt(q.shape[-1]) * q.abs().amax().item() * max(steps, default=0.0)


def _attention_call(q, k_cur, v_cur, segments, correction: str):
    def run() -> None:
        with torch.inference_mode():
            cached_attention(q, k_cur, v_cur, segments, correction=correction)

    return run


def time_corrections(
    shape: AttentionShape,
    corrections: tuple[str, ...],
    repeats: int,
    warmup: int,
    quant: str,
    outlier_channels: int = 0,
    config_names: dict[str, str] | None = None,
) -> list[BenchRow]:
    """Rows for one shape: seconds per correction (and "none"), and each correction's ratio against "none"."""
    names = config_names or {}
    q, k_cur, v_cur, segments = build_inputs(shape, quant, outlier_channels=outlier_channels)
    bound = exact_argument_bound(q, segments)
    exact_form = "series" if bound <= SERIES_MAX_ARG else "elementwise"
    variants = {c: _attention_call(q, k_cur, v_cur, segments, c) for c in ("none", *corrections)}
    timings = time_interleaved(variants, repeats=repeats, warmup=warmup)
    rows = []
    for c, t in timings.items():
        rows.append(time_row("attention_time", f"{quant}+{names.get(c, c)}", shape.label(), t,
                             note="cached_attention on CPU, float32"))
    for c in corrections:
        note = f"cached_attention {c} / none on {quant} segments"
        if c == "exact":
            note += f"; exact bias in its {exact_form} form (max |x| <= {bound:.3g})"
        rows.append(time_ratio_row("correction_overhead_ratio", names.get(c, c), shape.label(),
                                   timings[c], timings["none"], note=note))
    return rows


def correction_overhead_rows(
    shapes: list[AttentionShape],
    repeats: int,
    warmup: int = 1,
    quant: str = "rtn-int2-g32",
    exact_max_scores: int = 1 << 27,
    fallback_shapes: tuple[AttentionShape, ...] = (),
    fallback_repeats: int = 2,
) -> list[BenchRow]:
    """Per shape: attention seconds per correction and the ratio against "none"; then the median ratio
    over shapes for "taylor" and "exact"; then the exact bias's elementwise form on ``fallback_shapes``."""
    rows: list[BenchRow] = []
    for shape in shapes:
        corrections = ("taylor", "exact") if shape.scores <= exact_max_scores else ("taylor",)
        print(f"[bench] attention {shape.label()}: none, {', '.join(corrections)}", flush=True)
        rows += time_corrections(shape, corrections, repeats, warmup, quant)
    for c in ("taylor", "exact"):
        per_shape = [r for r in rows if r.benchmark == "correction_overhead_ratio" and r.config == c]
        if per_shape:
            rows.append(overall_median_row("correction_overhead_ratio", c, per_shape))
    for shape in fallback_shapes:
        rows += time_corrections(shape, ("exact",), fallback_repeats, warmup, quant, outlier_channels=4,
                                 config_names={"exact": "exact-fallback", "none": "none-outliers"})
    return rows
