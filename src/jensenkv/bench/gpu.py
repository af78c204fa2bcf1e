"""Correction overhead of the GPU path (jensenkv.attention.flex_cached_attention) at Wan2.1-1.3B shapes.

Runs only where CUDA and the flex path exist; otherwise it returns no rows and a reason, so the
report says what was skipped instead of showing a number that was not measured.
"""
from __future__ import annotations

import torch

from jensenkv.bench.attention_overhead import AttentionShape, build_inputs
from jensenkv.bench.rows import BenchRow, time_ratio_row, time_row
from jensenkv.bench.timing import Timing

# Wan2.1-1.3B / Self-Forcing: 12 heads of 128, 3-frame chunks of 1560 tokens, 7 cached chunks.
WAN_1_3B = AttentionShape(heads=12, queries=4680, cached=7 * 4680)


def gpu_unavailable_reason() -> str | None:
    """Why the GPU benchmark cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    import jensenkv.attention as attention

    if not hasattr(attention, "flex_cached_attention"):
        return "jensenkv.attention has no flex_cached_attention"
    return None


def _to_gpu(t: torch.Tensor) -> torch.Tensor:
    return t.to("cuda", torch.bfloat16)


def _cuda_interleaved(variants: dict, repeats: int, warmup: int) -> dict[str, Timing]:
    """Like time_interleaved, timed with CUDA events (seconds), rotating the order each repetition."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            variants[name]()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3)
    return {n: Timing(tuple(s)) for n, s in samples.items()}


def gpu_overhead_rows(
    shapes: list[AttentionShape] | None = None, repeats: int = 20, warmup: int = 3, quant: str = "rtn-int2-g32"
) -> list[BenchRow]:
    """flex_cached_attention in bf16 on CUDA: seconds per correction and the ratio against "none"."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"GPU benchmark cannot run: {reason}")
    from jensenkv.attention import flex_cached_attention

    rows: list[BenchRow] = []
    for shape in shapes or [WAN_1_3B]:
        q, k_cur, v_cur, segments = build_inputs(shape, quant)
        q, k_cur, v_cur = _to_gpu(q), _to_gpu(k_cur), _to_gpu(v_cur)
        for seg in segments:  # the segments belong to a throw-away cache: moving them is safe
            seg.k, seg.v = _to_gpu(seg.k), _to_gpu(seg.v)
            if seg.steps is not None:
                seg.steps.step = seg.steps.step.to("cuda")

        def call(correction: str):
            def run() -> None:
                with torch.inference_mode():
                    flex_cached_attention(q, k_cur, v_cur, segments, correction=correction)

            return run

        timings = _cuda_interleaved({c: call(c) for c in ("none", "taylor", "exact")}, repeats, warmup)
        for c, t in timings.items():
            rows.append(time_row("gpu_attention_time", f"{quant}+{c}", shape.label(), t,
                                 note="flex_cached_attention, CUDA bf16"))
        for c in ("taylor", "exact"):
            rows.append(
                time_ratio_row("gpu_correction_overhead_ratio", c, shape.label(), timings[c], timings["none"],
                               note=f"flex_cached_attention {c} / none")
            )
    return rows
