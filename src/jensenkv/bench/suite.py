"""The benchmark suite behind `make bench`: what is measured at which sizes, and the report it writes.

``full_plan()`` is sized to finish within 15 minutes on 2 CPU cores; ``quick_plan()`` is a smoke run of
a few seconds with the same code paths (used by the tests).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from jensenkv.bench.attention_overhead import AttentionShape, correction_overhead_rows
from jensenkv.bench.cache_bytes import ChunkShape, cache_bytes_rows
from jensenkv.bench.machine import machine_info
from jensenkv.bench.quantize_throughput import commit_timings, quantize_throughput_rows
from jensenkv.bench.report import write_csv, write_markdown
from jensenkv.bench.rows import BenchRow

BYTES_CONFIGS = [
    "bf16",
    "rtn-int2-g32",
    "rtn-int2-g64",
    "rtn-int2-g128",
    "rtn-int4-g32",
    "rtn-int4-g64",
    "rtn-int4-g128",
    "kivi-int2-g32",
    "qvg-int2",
]
BENCHMARKS = ("cache_bytes", "quantize", "attention", "e2e", "gpu")
DESCRIPTIONS = {
    "cache_bytes_per_token": "Measured bytes per cached token (one layer, all heads) = nbytes / tokens; "
    "`theory` from the bits-per-element formula. `K` = keys only, `K+V` = keys and values.",
    "cache_bytes_ratio": "Measured bytes per token over BF16's (2 bytes x head_dim per head and tensor); "
    "`theory` = theoretical bits per element / 16.",
    "commit_time": "Seconds of ChunkedKVCache.commit(k, v) for one chunk (K and V quantized).",
    "quantize_throughput": "Quantize-on-commit throughput: tokens of one layer (all heads, K and V) per second, "
    "and GB/s of float32 K+V input.",
    "attention_time": "Seconds per jensenkv.attention.cached_attention call (CPU, float32) over the current chunk "
    "and the quantized cache segments; config = cache quantizer + correction.",
    "correction_overhead_ratio": "Attention time with the correction over without it, same inputs, interleaved. "
    "`overall` = median over shapes. `exact` runs on the shapes up to 2^27 scores (H x Q x (K + Q)) only; "
    "`exact-fallback` times the exact bias's elementwise form (inputs with outlier channels) at a tiny shape.",
    "e2e_time": "Seconds per generated video (generate_video) of the built-in model per cache configuration; "
    "`bf16` = keys and values stored in bfloat16, unquantized.",
    "e2e_time_ratio": "End-to-end generation time over the BF16 (full-precision) cache's, interleaved.",
    "commit_quantize_share": "Share of the chunks' generation time spent quantizing on commit "
    "(generate_video timings: quantize_s / sum of per-chunk seconds; dequantization is not included).",
    "gpu_attention_time": "Seconds per flex_cached_attention call on CUDA (bf16).",
    "gpu_correction_overhead_ratio": "GPU attention time with the correction over without it.",
}


@dataclass(frozen=True)
class BenchPlan:
    """Sizes and repetition counts of one suite run."""

    attention_shapes: list[AttentionShape]
    attention_repeats: int
    bytes_shape: ChunkShape
    throughput_shape: ChunkShape
    throughput_repeats: int
    e2e_repeats: int
    e2e_quick: bool  # fewer chunks / steps of the built-in model
    exact_max_scores: int = 1 << 27  # "exact" is timed only on shapes with at most this many scores
    fallback_shapes: tuple[AttentionShape, ...] = ()  # the exact bias's elementwise form, on outlier inputs
    bytes_configs: list[str] = field(default_factory=lambda: list(BYTES_CONFIGS))
    throughput_configs: list[str] = field(default_factory=lambda: list(BYTES_CONFIGS))
    warmup: int = 1


def full_plan() -> BenchPlan:
    """Realistic shapes: head dim 128, 4 heads, 1k-4k queries per chunk, 4k-32k cached tokens."""
    grid = [(1024, 4096), (1024, 16384), (2048, 8192), (2048, 32768), (4096, 16384), (4096, 32768)]
    return BenchPlan(
        attention_shapes=[AttentionShape(heads=4, queries=q, cached=k) for q, k in grid],
        attention_repeats=5,
        bytes_shape=ChunkShape(batch=1, heads=12, tokens=4680, head_dim=128),
        throughput_shape=ChunkShape(batch=1, heads=12, tokens=4680, head_dim=128),
        throughput_repeats=5,
        e2e_repeats=5,
        e2e_quick=False,
        fallback_shapes=(AttentionShape(heads=1, queries=256, cached=1024),),
    )


def quick_plan() -> BenchPlan:
    """Tiny shapes, 2 repetitions: exercises every code path in seconds (numbers are not meaningful)."""
    return BenchPlan(
        attention_shapes=[AttentionShape(heads=2, queries=64, cached=256),
                          AttentionShape(heads=2, queries=128, cached=256)],
        attention_repeats=2,
        bytes_shape=ChunkShape(batch=1, heads=2, tokens=512, head_dim=128),
        throughput_shape=ChunkShape(batch=1, heads=2, tokens=512, head_dim=128),
        throughput_repeats=2,
        e2e_repeats=2,
        e2e_quick=True,
        fallback_shapes=(AttentionShape(heads=1, queries=16, cached=64),),
    )


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _lookup(rows: list[BenchRow], benchmark: str, config: str, shape: str | None = None) -> BenchRow | None:
    for r in rows:
        if r.benchmark == benchmark and r.config == config and (shape is None or r.shape == shape):
            return r
    return None


def targets(rows: list[BenchRow]) -> list[tuple[str, str]]:
    """(target, measured verdict) lines for the report; a target whose benchmark did not run says so."""
    out: list[tuple[str, str]] = []
    missing = "not measured in this run"

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    taylor = _lookup(rows, "correction_overhead_ratio", "taylor", "overall")
    out.append(("attention with Taylor correction / without (CPU, median over shapes) <= 1.03",
                missing if taylor is None else f"{taylor.value:.3f} ({verdict(taylor.value <= 1.03)})"))
    exact = _lookup(rows, "correction_overhead_ratio", "exact", "overall")
    if exact is not None:
        out.append(("attention with exact correction / without (CPU, median over shapes), no target",
                    f"{exact.value:.3f}"))
    byte_rows = [r for r in rows if r.benchmark == "cache_bytes_ratio"]
    if not byte_rows:
        out.append(("measured cache bytes within 1% of theory; INT2 g=32 <= 2.75/16 of BF16", missing))
    else:
        worst = max(byte_rows, key=lambda r: abs(r.value / r.theory - 1))
        dev = abs(worst.value / worst.theory - 1)
        out.append(("measured cache bytes within 1% of theory (every config, K and K+V)",
                    f"worst {100 * dev:.2f}% ({worst.config}, {worst.shape.split()[0]}) ({verdict(dev <= 0.01)})"))
        for r in byte_rows:
            if r.config == "rtn-int2-g32":
                out.append((f"INT2 g=32 cache <= 2.75/16 = {2.75 / 16:.4f} of BF16 ({r.shape.split()[0]})",
                            f"{r.value:.4f} ({verdict(r.value <= 2.75 / 16 + 1e-12)})"))
    e2e = _lookup(rows, "e2e_time_ratio", "rtn-int2-g32+taylor")
    out.append(("end-to-end INT2 + Taylor / BF16 (built-in model) <= 1.10",
                missing if e2e is None else f"{e2e.value:.3f} ({verdict(e2e.value <= 1.10)})"))
    return out


def run_suite(
    plan: BenchPlan,
    out_dir: Path,
    only: tuple[str, ...] = BENCHMARKS,
    gpu: bool = False,
) -> list[BenchRow]:
    """Run the selected benchmarks, write ``bench.csv`` and ``bench.md`` into ``out_dir``, return the rows."""
    for name in only:
        if name not in BENCHMARKS:
            raise ValueError(f"only contains {name!r}: allowed are {BENCHMARKS}")
    machine = machine_info()
    notes: list[str] = []
    rows: list[BenchRow] = []
    started = time.perf_counter()
    if "cache_bytes" in only:
        _log(f"cache bytes: {len(plan.bytes_configs)} configs at {plan.bytes_shape.label()}")
        rows += cache_bytes_rows(plan.bytes_configs, plan.bytes_shape)
    if "quantize" in only:
        _log(f"quantize-on-commit: {len(plan.throughput_configs)} configs at {plan.throughput_shape.label()}")
        timings = commit_timings(plan.throughput_configs, plan.throughput_shape, plan.throughput_repeats, plan.warmup)
        rows += quantize_throughput_rows(plan.throughput_configs, plan.throughput_shape, timings)
    if "attention" in only:
        _log(f"correction overhead: {len(plan.attention_shapes)} shapes x {plan.attention_repeats} repeats")
        rows += correction_overhead_rows(plan.attention_shapes, plan.attention_repeats, plan.warmup,
                                         exact_max_scores=plan.exact_max_scores,
                                         fallback_shapes=plan.fallback_shapes)
    if "e2e" in only:
        from jensenkv.bench.tiny_e2e import tiny_adapters
        from jensenkv.bench.end_to_end import end_to_end_rows

        adapters, baseline, prompt, generation, shape = tiny_adapters(plan.e2e_quick)
        _log(f"end-to-end: {len(adapters)} variants x {plan.e2e_repeats} repeats ({shape})")
        rows += end_to_end_rows(adapters, baseline, plan.e2e_repeats, prompt, generation=generation,
                                warmup=plan.warmup, shape=shape)
    if gpu and "gpu" in only:
        from jensenkv.bench.gpu import gpu_overhead_rows, gpu_unavailable_reason

        reason = gpu_unavailable_reason()
        if reason is None:
            _log("GPU flex path at Wan2.1-1.3B shapes")
            rows += gpu_overhead_rows()
        else:
            notes.append(f"`--gpu` was given but the GPU benchmark was skipped: {reason}.")
    if not any(r.benchmark.startswith("gpu_") for r in rows):
        why = "it was run without `--gpu`" if torch.cuda.is_available() else "this machine has no CUDA device"
        notes.append(
            f"No GPU numbers: {why}. The GPU part (FlexAttention / Triton paths at "
            "Wan2.1-1.3B and MAGI-1 shapes) comes back in a later issue; `scripts/bench.py --gpu` times "
            "jensenkv.attention.flex_cached_attention where CUDA is available."
        )
    elapsed = time.perf_counter() - started
    machine["load average (1/5/15 min, at end)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    machine["suite wall time"] = f"{elapsed:.0f} s"
    notes += [
        "Times are medians over interleaved repetitions (each repetition runs every compared variant once, "
        "in a rotating order); a ratio's `value` is median(numerator) / median(denominator), its `median` "
        "and `iqr` describe the per-repetition paired ratios.",
        "Cache bytes are per token of one attention layer over all heads; `K` counts keys only, `K+V` keys "
        "and values. BF16 = 2 bytes x head_dim per head and tensor. Theory = B + (16-bit step + 8-bit zero)/g "
        "bits per element (KIVI: float16 zero points, so 32 bits per group; QVG adds its float16 centroids "
        "and uint8 cluster ids per chunk).",
        "Attention inputs are synthetic N(0, 1) (no outlier channels, so the exact bias takes its series "
        "form), except the `exact-fallback` rows (4 channels x 8); the cached segments are rtn-int2-g32 keys "
        "and values, dequantized once before timing.",
    ]
    if plan.e2e_quick:
        notes.append("Quick smoke run (`--quick`): tiny sizes, numbers are not meaningful.")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / "bench.csv")
    write_markdown(rows, out_dir / "bench.md", machine, targets(rows), notes, DESCRIPTIONS)
    _log(f"wrote {out_dir / 'bench.csv'} and {out_dir / 'bench.md'} ({len(rows)} rows, {elapsed:.0f} s)")
    return rows
