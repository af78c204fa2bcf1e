"""The ``kernel`` group of `make gpu-check`: the ``triton`` backend against SDPA flash on BF16 K/V, as time
ratios (CUDA events, warm-up, interleaved repeats, median) judged against the GPU targets, and
``torch.cuda.max_memory_allocated`` per variant.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from jensenkv.bench.gpu import _sdpa_flash
from jensenkv.bench.gpu_check_shapes import kernel_shapes, oracle_shapes
from jensenkv.bench.gpu_check_context import CheckContext
from jensenkv.bench.gpu_check_inputs import CORRECTIONS, attention_inputs, backend_call

# Targets of issue 21 (GPU benchmarks): the fused Taylor bias against the kernel's own no-bias time, and the
# kernel against SDPA flash on BF16 K/V at the SkyReels shape.
TAYLOR_OVER_NONE = 1.05
KERNEL_OVER_FLASH = 1.3
MIB = float(1 << 20)


def _times(calls: dict[str, Callable[[], object]], ctx: CheckContext, warmup: int, repeats: int) -> dict[str, list]:
    """Seconds per call of each variant: CUDA events on a GPU (wall clock on the CPU), every repetition running
    each variant once in a rotating order, after ``warmup`` untimed rounds."""
    names = list(calls)
    with torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                calls[name]()
        ctx.sync()
        events: dict[str, list] = {name: [] for name in names}
        for rep in range(repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                if ctx.device == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    calls[name]()
                    end.record()
                    events[name].append((start, end))
                else:
                    started = time.perf_counter()
                    calls[name]()
                    events[name].append(time.perf_counter() - started)
        ctx.sync()
    if ctx.device == "cuda":
        return {name: [s.elapsed_time(e) / 1e3 for s, e in pairs] for name, pairs in events.items()}
    return events


def _peak_mib(build: Callable[[], Callable[[], object]], ctx: CheckContext) -> float:
    """max_memory_allocated while one variant's inputs are held and it runs once, over what was allocated
    before they were made (the random chunks made on the way to the stored form do not count)."""
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    call = build()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del call
    return peak / MIB


def kernel(ctx: CheckContext) -> None:
    warmup, repeats = (1, 2) if ctx.dry_run else (3, 15)
    # the dry run's toy SkyReels shapes would differ only in their cached chunks: one of each model is enough
    for shape in ctx.shapes(oracle_shapes() if ctx.dry_run else kernel_shapes()):
        what = shape.describe()

        def sdpa() -> Callable[[], object]:
            q, k, v, _ = attention_inputs(shape, ctx, quantized=False)
            return lambda: _sdpa_flash(q, k, v)

        def triton(correction: str) -> Callable[[], Callable[[], object]]:
            def build() -> Callable[[], object]:
                q, k_cur, v_cur, segments = attention_inputs(shape, ctx, quantized=True)
                return lambda: backend_call("triton", q, k_cur, v_cur, segments, correction)
            return build

        builders = {"sdpa bf16": sdpa, **{f"triton {c}": triton(c) for c in CORRECTIONS}}

        def memory() -> None:
            peaks = {}
            for name, build in builders.items():
                peaks[name] = _peak_mib(build, ctx)
                ctx.add("kernel", f"{what}: {name}", "measured", peaks[name], "MiB peak allocated",
                        detail="torch.cuda.max_memory_allocated: inputs held + one call")
            ctx.add("kernel", f"{what}: triton taylor / sdpa bf16", "measured",
                    peaks["triton taylor"] / peaks["sdpa bf16"], "peak memory ratio")

        if ctx.device == "cuda":
            ctx.run("kernel", f"{what}: peak memory", memory)
        else:
            ctx.add("kernel", f"{what}: peak memory", "skipped", detail="no CUDA allocator on the CPU")

        def timing() -> None:
            started = time.perf_counter()
            calls = {name: build() for name, build in builders.items()}
            seconds = _times(calls, ctx, warmup, repeats)
            median = {name: statistics.median(s) for name, s in seconds.items()}
            elapsed = time.perf_counter() - started
            ctx.add("kernel", f"{what}: sdpa bf16", "measured", 1e3 * median["sdpa bf16"], "ms",
                    detail=f"median of {repeats}", seconds=elapsed)
            skyreels = shape.name.startswith("skyreels")
            for num, den, bound in (("triton none", "sdpa bf16", KERNEL_OVER_FLASH if skyreels else None),
                                    ("triton taylor", "sdpa bf16", None), ("triton exact", "sdpa bf16", None),
                                    ("triton taylor", "triton none", TAYLOR_OVER_NONE),
                                    ("triton exact", "triton none", None)):
                ratio = median[num] / median[den]
                status = "measured" if bound is None or ctx.dry_run else ("met" if ratio <= bound else "missed")
                ctx.add("kernel", f"{what}: {num} / {den}", status, ratio, "time ratio",
                        "" if bound is None else f"<= {bound:g}", f"medians of {repeats} interleaved calls")

        ctx.run("kernel", f"{what}: time", timing)
        if ctx.device == "cuda":
            torch.cuda.empty_cache()
