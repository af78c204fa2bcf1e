"""The benchmarks of `make bench` and the report they write (results/bench.csv and results/bench.md).

Every number is measured side by side in one run: timings interleave the compared variants within each
repetition (``timing``), memory is measured in fresh processes (``memory``). A row is
(benchmark, config, value, unit, iqr, repeats); a timing ratio's value is the median of the paired
per-repetition ratios and iqr their interquartile range, in CPU time (unit "ratio") and in wall time
(unit "ratio (wall)"); the targets read the CPU-time rows, which other tenants of a shared machine
perturb far less than the wall clock. Each row also carries the commit it measured and the date (``commit``,
``measured``; "unknown" for rows written before they existed). A run of some benchmarks (``--only``) replaces
those benchmarks' rows in bench.csv and keeps every other row.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from jensenkv.bench.memory import LAYER_SHAPE, measure
from jensenkv.bench.presets import label, preset
from jensenkv.bench.timing import paired_ratio, time_interleaved
from jensenkv.store.files import atomic_write

BENCHMARKS = ("cache_bytes_ratio", "held_memory_ratio", "generation_peak_memory_saving",
              "correction_overhead_ratio", "correction_overhead_floor", "e2e_time_ratio", "batch_throughput",
              "probe_overhead", "worldplay_cache_memory")
COLUMNS = ("benchmark", "config", "value", "unit", "iqr", "repeats", "commit", "measured")
UNKNOWN = "unknown"  # commit / date of a row measured before rows carried them
GPU_BENCHMARK = "gpu_kernel"  # its own file, results/bench_gpu.csv, only where CUDA is visible (bench.gpu)
INT2 = {"bits": 2, "group_size": 32}
BYTES_PRESETS = (("bf16", {}), ("rtn", INT2), ("rtn", {"bits": 4, "group_size": 32}), ("kivi", INT2),
                 ("quarot", INT2), ("qvg", INT2))
MIB = float(1 << 20)
QVG_PAPER_SPAN = 49_920  # tokens QVG clusters together in its paper's setting (d = 128): 7.05x / 5.20x


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions of one run (``quick``: a smoke run whose numbers mean nothing)."""

    quick: bool = False
    repeats: int = 7
    e2e_repeats: int = 5
    long_repeats: int = 3
    bytes_shape: tuple[int, int, int, int] = LAYER_SHAPE
    held: tuple[str, ...] = ()  # extra arguments of `python -m jensenkv.bench.memory held`
    overhead_shapes: tuple[tuple[int, int, int], ...] = ((4, 1024, 4096), (4, 1024, 16384), (4, 2048, 8192),
                                                          (4, 4096, 16384))  # (heads, queries, cached)
    long_floor_shape: tuple[int, int, int, int] = (2, 4096, 16384, 64)  # (heads, queries, cached, d): long-context
    exact_max_scores: int = 1 << 27
    batch_videos: int = 16  # videos per repetition of batch_throughput: one batch of them against one at a time
    worldplay: tuple[str, ...] = ()  # extra arguments of `python -m jensenkv.bench.worldplay_memory held`
    fresh_processes: bool = True  # memory rows from a fresh process each; False (quick): in this process
    notes: list[str] = field(default_factory=list)


def quick_plan() -> Plan:
    return Plan(quick=True, repeats=2, e2e_repeats=1, long_repeats=1, bytes_shape=(1, 2, 256, 128),
                held=("--layers", "2", "--commits", "2", "--shape", "1", "2", "256", "128", "--queries", "32"),
                overhead_shapes=((2, 64, 256), (2, 128, 512)), long_floor_shape=(2, 64, 256, 64), batch_videos=2,
                worldplay=("--toy",), fresh_processes=False)  # a child each costs ~15 s of imports


def row(benchmark: str, config: str, value: float, unit: str, iqr: float = float("nan"), repeats: int = 1) -> dict:
    return {"benchmark": benchmark, "config": config, "value": float(value), "unit": unit, "iqr": iqr,
            "repeats": repeats}


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cache_bytes_rows(plan: Plan) -> list[dict]:
    """Stored bytes of one committed chunk (K and V) over the same tokens in BF16, per preset."""
    from jensenkv.cache import ChunkedKVCache

    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(*plan.bytes_shape, generator=gen) for _ in range(2))  # (B, H, S, D)
    rows = []
    for quant, overrides in BYTES_PRESETS:
        cache = ChunkedKVCache(preset(quant, plan.bytes_shape[-1], **overrides), plan.bytes_shape[-1])
        with torch.inference_mode():
            cache.commit(k, v)
        rows.append(row("cache_bytes_ratio", f"{label(quant, **overrides)} {_shape(plan.bytes_shape)}",
                        cache.nbytes / cache.bf16_nbytes, "ratio"))
    rows += qvg_paper_span_rows(plan)
    return rows


def qvg_paper_span_rows(plan: Plan) -> list[dict]:
    """QVG and QVG-Pro as published (configs/quant/qvg*.yaml) over one span of the paper's 49,920 tokens:
    real stored bytes of a quantized (1, 1, S, 128) tensor against BF16 (quick: 4,096 tokens)."""
    from jensenkv.quant import make_quantizer

    span = 4096 if plan.quick else QVG_PAPER_SPAN
    x = torch.randn(1, 1, span, 128, generator=torch.Generator().manual_seed(0))  # (B, H, S, D)
    rows = []
    for quant in ("qvg", "qvg_pro"):
        key = preset(quant, 128, qvg_span=span).key
        with torch.inference_mode():
            stored = make_quantizer(key, 128).quantize(x)
        ratio = stored.nbytes / (x.numel() * 2)
        rows.append(row("cache_bytes_ratio", f"{quant}-paper-span (S={span}, d=128)", ratio, "ratio"))
        rows.append(row("cache_bytes_ratio", f"{quant}-paper-span (S={span}, d=128)", 1 / ratio, "x compression"))
    return rows


def held_memory_rows(plan: Plan) -> list[dict]:
    result = measure("held", *plan.held, in_process=not plan.fresh_processes)
    stored = result["stored"]
    config = "rtn bits=2 group_size=32 + taylor, 8 layers x 6 chunks of (1, 12, 4680, 128)" if not plan.held \
        else "rtn bits=2 group_size=32 + taylor, " + " ".join(plan.held)
    plan.notes.append(f"held memory: stored {stored / MIB:.1f} MiB, one layer's workspace "
                      f"{result['workspace'] / MIB:.1f} MiB (target <= 1.25 + {result['workspace'] / stored:.3f})")
    return [row("held_memory_ratio", f"{config}: RSS growth / stored", result["rss_growth"] / stored, "ratio"),
            row("held_memory_ratio", f"{config}: live tensor bytes / stored", result["live"] / stored, "ratio"),
            row("held_memory_ratio", f"{config}: target", 1.25 + result["workspace"] / stored, "ratio")]


def generation_rows(plan: Plan) -> list[dict]:
    quick = ("--quick",) if plan.quick else ()
    here = not plan.fresh_processes
    bf16 = measure("generation", "bf16", *quick, in_process=here)
    int2 = measure("generation", "int2", *quick, in_process=here)
    saving = (bf16["peak"] - int2["peak"]) / bf16["stored"]
    config = "long-context SkyReels-V2 (random), INT2 g=32 + taylor vs BF16"
    return [row("generation_peak_memory_saving", f"{config}: (peak BF16 - peak INT2) / BF16 cache", saving,
                "fraction"),
            row("generation_peak_memory_saving", f"{config}: peak BF16", bf16["peak"] / MIB, "MiB"),
            row("generation_peak_memory_saving", f"{config}: peak INT2", int2["peak"] / MIB, "MiB"),
            row("generation_peak_memory_saving", f"{config}: BF16 cache", bf16["stored"] / MIB, "MiB")]


def _overhead_inputs(heads: int, queries: int, cached: int):
    from jensenkv.cache import ChunkedKVCache

    gen = torch.Generator().manual_seed(0)
    cache = ChunkedKVCache(preset("rtn", 128, **INT2), 128)
    filled = 0
    while filled < cached:
        n = min(queries, cached - filled)
        cache.commit(torch.randn(1, heads, n, 128, generator=gen), torch.randn(1, heads, n, 128, generator=gen))
        filled += n
    q, k, v = (torch.randn(1, heads, queries, 128, generator=gen) for _ in range(3))  # (1, H, Q, D)
    return cache, q, k, v


def correction_overhead_rows(plan: Plan) -> list[dict]:
    """cached_attention with Taylor / exact over without (INT2 g=32 cache, dequantized per call as in a run)."""
    from jensenkv.attention import cached_attention

    rows, per_shape = [], {"taylor": [], "exact": []}
    for heads, queries, cached in plan.overhead_shapes:
        cache, q, k, v = _overhead_inputs(heads, queries, cached)
        corrections = ("taylor", "exact") if heads * queries * (cached + queries) <= plan.exact_max_scores \
            else ("taylor",)

        def call(correction: str):
            def run() -> None:
                with torch.inference_mode():
                    cached_attention(q, k, v, cache.segments(), correction=correction)
            return run

        wall, cpu = time_interleaved({c: call(c) for c in ("none", *corrections)}, plan.repeats)
        shape = f"H{heads} Q{queries} K{cached}"
        for c in corrections:
            for samples, unit in ((cpu, "ratio"), (wall, "ratio (wall)")):
                median, iqr = paired_ratio(samples[c], samples["none"])
                rows.append(row("correction_overhead_ratio", f"{c} / none, {shape}", median, unit, iqr, plan.repeats))
                if unit == "ratio":
                    per_shape[c].append(median)
        _log(f"overhead {shape}: " + ", ".join(f"{c} {per_shape[c][-1]:.3f}" for c in corrections))
    rows += _median_rows("correction_overhead_ratio", {f"{c} / none": v for c, v in per_shape.items()})
    return rows


def _median_rows(benchmark: str, per_shape: dict[str, list[float]]) -> list[dict]:
    rows = []
    for what, values in per_shape.items():
        if values:
            rows.append(row(benchmark, f"{what}, median over shapes", statistics.median(values), "ratio",
                            repeats=len(values)))
            rows.append(row(benchmark, f"{what}, worst shape", max(values), "ratio", repeats=len(values)))
    return rows


def correction_overhead_floor_rows(plan: Plan) -> list[dict]:
    """What SDPA alone costs for each bias form, over SDPA on the plain head dim d (same keys, nothing else):
    - columns: one call at d + G over all keys (the column method's floor);
    - split: the cached keys at d + G, the current chunk at d, merged by log-sum-exp (what the CPU path
      runs for Taylor on large calls);
    - exact: one call at d + G*N, N the series terms the CPU path picks for these inputs;
    plus the column floor at the long-context model's head dim (d = 64, G = 2)."""
    import torch.nn.functional as F

    from jensenkv.attention import cpu as cpu_path

    rows, per_shape, long_floor = [], {}, float("nan")
    shapes = [(h, nq, c, 128) for h, nq, c in plan.overhead_shapes] + [plan.long_floor_shape]
    for i, (heads, queries, cached, dim) in enumerate(shapes):
        long = i == len(shapes) - 1
        gen = torch.Generator().manual_seed(0)
        groups = dim // INT2["group_size"]
        q, keys = torch.randn(1, heads, queries, dim, generator=gen), torch.randn(1, heads, cached + queries, dim,
                                                                                   generator=gen)  # (1, H, Q/K, d)

        def wide(t: torch.Tensor, extra: int) -> torch.Tensor:
            return F.pad(t, (0, extra))  # (1, H, *, d + extra)

        q_g, k_g = wide(q, groups), wide(keys, groups)
        cur = keys[:, :, cached:]  # (1, H, Q, d): the current chunk
        variants = {"sdpa d": lambda: F.scaled_dot_product_attention(q, keys, keys),
                    "columns": lambda: F.scaled_dot_product_attention(q_g, k_g, k_g)}
        if not long:
            k_c = k_g[:, :, :cached]  # (1, H, K, d + G)
            variants["split"] = lambda: cpu_path._merge(cpu_path._FLASH(q_g, k_c, k_c),
                                                        cpu_path._FLASH(q, cur, cur), q.dtype)
            cache, q_in, _, _ = _overhead_inputs(heads, queries, cached)
            with torch.inference_mode():
                cols = cpu_path._bias_columns(q_in, cache.segments(), "exact", dim**-0.5, 1.0)
            if cols is not None:
                extra = sum(c.shape[-1] for c in cols[0].values())
                q_x, k_x = wide(q, extra), wide(keys, extra)
                variants[f"exact ({extra // groups} terms)"] = lambda: F.scaled_dot_product_attention(q_x, k_x, k_x)
        with torch.inference_mode():
            wall, cpu = time_interleaved(variants, plan.repeats if not long else plan.long_repeats)
        shape = f"H{heads} Q{queries} K{cached}" + (f" d{dim} (long-context heads)" if long else "")
        for name in list(variants)[1:]:
            what = {"columns": f"columns SDPA(d+{groups}) / SDPA(d)",
                    "split": f"split SDPA(cached, d+{groups}) + SDPA(current, d) + merge / SDPA(d)"}.get(
                name, f"{name} SDPA(d+G*N) / SDPA(d)")
            for samples, unit in ((cpu, "ratio"), (wall, "ratio (wall)")):
                median, iqr = paired_ratio(samples[name], samples["sdpa d"])
                rows.append(row("correction_overhead_floor", f"{what}, {shape}", median, unit, iqr,
                                len(samples[name])))
                if unit == "ratio" and not long:
                    per_shape.setdefault(name.split(" (")[0], []).append(median)
                elif unit == "ratio":
                    long_floor = median
        _log(f"floor {shape}: " + ", ".join(f"{r['config'].split(' SDPA')[0]} {r['value']:.3f}"
                                            for r in rows[-2 * (len(variants) - 1):] if r["unit"] == "ratio"))
    rows += _median_rows("correction_overhead_floor", per_shape)
    if all(per_shape.get(name) for name in ("columns", "split", "exact")):
        plan.notes.append(
            f"correction overhead floors (SDPA alone, median over shapes): bias columns at d+G "
            f"{statistics.median(per_shape['columns']):.3f}, split form {statistics.median(per_shape['split']):.3f}, "
            f"exact series at d+G*N {statistics.median(per_shape['exact']):.3f}; the CPU path runs the split form for "
            f"calls whose current chunk holds >= 2^20 scores. SDPA's gemms tile the head dim in blocks of 8-16 floats, "
            f"so G extra columns cost like a whole extra block (long-context heads, d=64: {long_floor:.3f}); "
            f"what would reach the Taylor target is a kernel adding the G-wide bias inside its softmax pass "
            f"(G MACs per score, G/(2d) = 1.6% at d=128, g=32), e.g. the Triton backend on a GPU.")
    return rows


def e2e_rows(plan: Plan) -> list[dict]:
    """Generation time with an INT2 g=32 + Taylor cache over a BF16 cache, built-in and long-context models."""
    from jensenkv.bench.subjects import LONG_CONTEXT, LONG_FRAME, PROMPT, describe, long_context_adapter, tiny_adapter
    from jensenkv.generate import generate_video

    rows = []
    for name, build, repeats, warmup in (("built-in model", tiny_adapter, plan.e2e_repeats, 1),
                                         ("long-context", long_context_adapter, plan.long_repeats, 0)):
        head_dim = 128 if build is tiny_adapter else LONG_CONTEXT["attention_head_dim"]
        bf16, generation = build(preset("bf16", head_dim), "none", quick=plan.quick)
        int2, _ = build(preset("rtn", head_dim, **INT2), "taylor", quick=plan.quick)

        def run(adapter):
            def call() -> None:
                with torch.inference_mode():
                    generate_video(adapter, PROMPT, 0, generation)
            return call

        wall, cpu = time_interleaved({"bf16": run(bf16), "int2": run(int2)}, repeats, warmup)
        what = f"{name} ({describe(generation, LONG_FRAME, LONG_CONTEXT['patch_size'])})" \
            if build is long_context_adapter and not plan.quick else name
        for samples, unit in ((cpu, "ratio"), (wall, "ratio (wall)")):
            median, iqr = paired_ratio(samples["int2"], samples["bf16"])
            rows.append(row("e2e_time_ratio", f"INT2 g=32 + taylor / BF16, {what}", median, unit, iqr, repeats))
        _log(f"e2e {name}: {rows[-2]['value']:.3f} CPU, {rows[-1]['value']:.3f} wall "
             f"(BF16 median {statistics.median(wall['bf16']):.2f} s wall)")
    return rows


def batch_throughput_rows(plan: Plan) -> list[dict]:
    """Videos per second per core on the built-in model (INT2 g=32 + taylor, 1 thread), interleaved: one batch
    of ``batch_videos`` against one video at a time, and against one at a time with a forward per CFG branch
    (the generator before batching); then the peak RSS growth during one batch against one video (fresh
    processes, 1 thread) and each video's cache bytes."""
    from jensenkv.bench.subjects import PROMPT, tiny_adapter
    from jensenkv.generate import generate_videos

    n = plan.batch_videos
    adapter, generation = tiny_adapter(preset("rtn", 128, **INT2), "taylor", quick=plan.quick)
    per_branch, _ = tiny_adapter(preset("rtn", 128, **INT2), "taylor", quick=plan.quick)
    per_branch.batches_branches = False  # one forward per CFG branch
    prompts, seeds = [PROMPT] * n, list(range(n))

    def one_at_a_time(which):
        def call() -> None:
            with torch.inference_mode():
                for i in range(n):
                    generate_videos(which, prompts[i:i + 1], seeds[i:i + 1], generation)
        return call

    def batched() -> None:
        with torch.inference_mode():
            generate_videos(adapter, prompts, seeds, generation)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per core
    try:
        wall, cpu = time_interleaved({"batch": batched, "one": one_at_a_time(adapter),
                                      "per_branch": one_at_a_time(per_branch)}, plan.e2e_repeats, 1)
    finally:
        torch.set_num_threads(threads)
    rows = []
    for name, what in (("batch", f"batch of {n}"), ("one", "batch 1"), ("per_branch", "batch 1, a forward per branch")):
        rows.append(row("batch_throughput", f"built-in model, {what}: videos / CPU s (1 thread)",
                        n / statistics.median(cpu[name]), "videos/s/core", repeats=plan.e2e_repeats))
    for base, what in (("one", "batch 1"), ("per_branch", "batch 1, a forward per branch")):
        for samples, unit in ((cpu, "speedup"), (wall, "speedup (wall)")):
            median, iqr = paired_ratio(samples[base], samples["batch"])
            rows.append(row("batch_throughput", f"batch of {n} over {what}", median, unit, iqr, plan.e2e_repeats))
    quick = ("--quick",) if plan.quick else ()
    torch.set_num_threads(1)  # measure() passes this thread count to the fresh processes
    try:
        here = not plan.fresh_processes
        alone, many = (measure("batch", size, *quick, in_process=here) for size in ("1", str(n)))
    finally:
        torch.set_num_threads(threads)
    growth = {size: result["peak"] - result["peak_before"] for size, result in ((1, alone), (n, many))}
    rows += [row("batch_throughput", "peak RSS growth during generation, batch 1", growth[1] / MIB, "MiB"),
             row("batch_throughput", f"peak RSS growth during generation, batch of {n}", growth[n] / MIB, "MiB")]
    if growth[1] > 0:
        rows.append(row("batch_throughput", f"peak RSS growth per video, batch of {n} / batch 1",
                        growth[n] / n / growth[1], "ratio"))
    else:
        plan.notes.append("batch_throughput: one video set no new RSS peak (the process's start-up peak is higher)")
    rows += [row("batch_throughput", "cache bytes per video, batch 1", alone["cache_bytes_per_video"], "bytes"),
             row("batch_throughput", f"cache bytes per video, batch of {n}", many["cache_bytes_per_video"], "bytes")]
    _log(f"batch throughput: {rows[3]['value']:.2f}x over batch 1, {rows[5]['value']:.2f}x over per-branch forwards")
    return rows


def probe_overhead_rows(plan: Plan) -> list[dict]:
    """Generation time of the built-in model (INT2 g=32 + taylor, 1 thread) with attention probes on every layer
    and every denoising step (dP_S per layer and step, as the paper reports its median), without and with the
    error-model diagnostics, over the same run without probes (whose cache keeps no full-precision copy)."""
    import dataclasses

    from jensenkv.bench.subjects import PROMPT, tiny_adapter
    from jensenkv.generate import generate_video

    cache = preset("rtn", 128, **INT2)
    plain, generation = tiny_adapter(cache, "taylor", quick=plan.quick)
    variants = {"none": plain}
    for name, diagnostics in (("probes", False), ("probes+diagnostics", True)):
        adapter, _ = tiny_adapter(dataclasses.replace(cache, keep_reference=True), "taylor", quick=plan.quick)
        adapter.configure(attention=dataclasses.replace(adapter.processors[0].attention, probes=True,
                                                         diagnostics=diagnostics,
                                                         probe_layers=None, probe_steps=None))
        variants[name] = adapter

    def run(adapter):
        def call() -> None:
            with torch.inference_mode():
                generate_video(adapter, PROMPT, 0, generation)
        return call

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        wall, cpu = time_interleaved({name: run(a) for name, a in variants.items()}, plan.e2e_repeats, 1)
    finally:
        torch.set_num_threads(threads)
    rows = []
    for name, what in (("probes", "probes on every layer and step"),
                       ("probes+diagnostics", "probes + error-model diagnostics on every layer and step")):
        for samples, unit in ((cpu, "ratio"), (wall, "ratio (wall)")):
            median, iqr = paired_ratio(samples[name], samples["none"])
            rows.append(row("probe_overhead", f"built-in model, {what} / no probes (1 thread)", median, unit, iqr,
                            plan.e2e_repeats))
    _log(f"probe overhead: {rows[0]['value']:.3f} (probes), {rows[2]['value']:.3f} (with diagnostics), CPU time")
    return rows


def worldplay_rows(plan: Plan) -> list[dict]:
    """HY-WorldPlay at 480p (jensenkv.bench.worldplay_memory): per preset and memory mode, the bytes one chunk
    adds and what the caches hold before the last chunk, measured on one block and scaled to the model's
    layers, against ``memory_bytes`` (from the settings alone)."""
    from jensenkv.bench.worldplay_memory import QUANTS, TOY, WORLDPLAY_480P

    geometry = TOY if "--toy" in plan.worldplay else WORLDPLAY_480P
    rows = []
    for quant, overrides in QUANTS:
        for memory in ("rebuild", "append"):
            r = measure("held", quant, memory, *plan.worldplay, module="jensenkv.bench.worldplay_memory",
                        in_process=not plan.fresh_processes)
            scale = geometry.layers / r["measured_layers"]
            size = "toy" if geometry is TOY else "480p"
            config = (f"HY-WorldPlay {size} {label(quant, **overrides)}, {memory} ({r['frames']} frames held), "
                      f"{r['measured_layers']} layer measured x {scale:g}")
            mib = {what: r[key] * scale / MIB for what, key in (
                ("chunk", "chunk_bytes_max"), ("stored", "stored"), ("rss", "rss_growth"), ("live", "live"),
                ("theory", "memory_bytes"), ("bf16", "bf16"))}
            rows += [row("worldplay_cache_memory", f"{config}: one chunk's K+V, both streams", mib["chunk"], "MiB"),
                     row("worldplay_cache_memory", f"{config}: held, stored (nbytes)", mib["stored"], "MiB"),
                     row("worldplay_cache_memory", f"{config}: held, RSS growth", mib["rss"], "MiB"),
                     row("worldplay_cache_memory", f"{config}: held, tensor storage (buffer capacity)", mib["live"],
                         "MiB"),
                     row("worldplay_cache_memory", f"{config}: memory_bytes (settings)", mib["theory"], "MiB"),
                     row("worldplay_cache_memory", f"{config}: RSS growth / memory_bytes",
                         r["rss_growth"] / r["memory_bytes"], "ratio"),
                     row("worldplay_cache_memory", f"{config}: stored / BF16", r["stored"] / r["bf16"], "ratio")]
            _log(f"worldplay {quant} {memory}: {r['frames']} frames, stored {mib['stored']:.0f} MiB, "
                 f"RSS {mib['rss']:.0f} MiB, memory_bytes {mib['theory']:.0f} MiB")
    plan.notes.append(
        f"worldplay_cache_memory: {geometry.describe()}; random K/V of the real size committed through "
        "WorldPlayCaches.store_group (both streams, K and V) for every memory write of one video (no transformer: "
        f"the 8B weights do not fit); measured on {r['measured_layers']} block in a fresh process per row and "
        f"scaled to {geometry.layers} layers (every block holds the same shapes; 54 BF16 blocks do not fit this "
        "machine). RSS growth: resident pages; tensor storage: the buffers' capacity, sized up front as "
        "generation sizes them (WorldPlayCaches.reserve_memory). Text K/V (full precision) not included.")
    return rows


RUNNERS = {"cache_bytes_ratio": cache_bytes_rows, "held_memory_ratio": held_memory_rows,
           "generation_peak_memory_saving": generation_rows, "correction_overhead_ratio": correction_overhead_rows,
           "correction_overhead_floor": correction_overhead_floor_rows, "e2e_time_ratio": e2e_rows,
           "batch_throughput": batch_throughput_rows, "probe_overhead": probe_overhead_rows,
           "worldplay_cache_memory": worldplay_rows}
# (benchmark, config prefix, comparison, bound or target row, description)
TARGETS = (
    ("held_memory_ratio", "RSS growth / stored", "<=", "target", "RSS growth of the cache / stored bytes"),
    ("held_memory_ratio", "live tensor bytes / stored", "<=", "target", "live tensor bytes / stored bytes"),
    ("generation_peak_memory_saving", "(peak BF16", ">=", 0.60, "INT2 peak below BF16 peak, share of BF16 cache"),
    ("correction_overhead_ratio", "taylor / none, median", "<=", 1.035, "Taylor overhead, median over shapes"),
    ("correction_overhead_ratio", "taylor / none, worst", "<=", 1.05, "Taylor overhead, worst shape"),
    ("correction_overhead_ratio", "exact / none, median", "<=", 1.10, "exact overhead, median over shapes"),
    ("e2e_time_ratio", "INT2 g=32 + taylor / BF16, built-in", "<=", 1.10, "end to end, built-in model"),
    ("e2e_time_ratio", "INT2 g=32 + taylor / BF16, long-context", "<=", 1.05, "end to end, long-context"),
    ("batch_throughput", "over batch 1", ">=", 3.0, "videos/s per core, a batch over batch 1"),
    ("batch_throughput", "over batch 1, a forward per branch", ">=", 3.0,
     "videos/s per core, a batch over the unbatched generator (a forward per CFG branch)"),
    ("probe_overhead", "built-in model, probes on every layer and step /", "<=", 1.5,
     "dP_S probes on every layer and step, built-in model"),
)


def target_lines(frame: pd.DataFrame) -> list[str]:
    """One line per target: the measured value, the bound and met / missed."""
    lines = []
    for benchmark, prefix, op, bound, text in TARGETS:
        rows = frame[(frame.benchmark == benchmark) & frame.config.str.contains(prefix, regex=False)
                     & (frame.unit != "ratio (wall)")]
        if rows.empty:
            lines.append(f"| {text} | not measured | {op} {bound} | |")
            continue
        value = rows.value.iloc[0]
        if bound == "target":
            bound = frame[(frame.benchmark == benchmark) & frame.config.str.endswith(": target")].value.iloc[0]
        met = value <= bound if op == "<=" else value >= bound
        lines.append(f"| {text} | {value:.3f} | {op} {bound:.3f} | {'met' if met else 'missed'} |")
    return lines


def code_commit() -> str:
    """The commit being measured: HEAD's short id, "+dirty" when tracked files outside results/ differ from it;
    "unknown" outside a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(top,exclude)results")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return head + ("+dirty" if dirty else "")


def merge_rows(frame: pd.DataFrame, path: Path, replaced: tuple[str, ...]) -> pd.DataFrame:
    """This run's rows and every row of the bench.csv at ``path`` whose benchmark is not in ``replaced`` (the ones
    just run), in BENCHMARKS order: a run of one benchmark must not drop the others' measurements."""
    if not path.is_file():
        return frame
    kept = pd.read_csv(path, dtype={"commit": str, "measured": str})
    kept = kept[~kept.benchmark.isin(replaced)].reindex(columns=list(COLUMNS))
    kept[["commit", "measured"]] = kept[["commit", "measured"]].fillna(UNKNOWN)
    merged = pd.concat([kept, frame], ignore_index=True) if not kept.empty else frame
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    return merged.sort_values("benchmark", key=lambda b: b.map(order).fillna(len(order)), kind="stable",
                              ignore_index=True)


def write_report(frame: pd.DataFrame, out_dir: Path, plan: Plan, seconds: float) -> None:
    """bench.csv (every row, full precision) and bench.md (targets, then one table per benchmark)."""
    atomic_write(out_dir / "bench.csv", lambda f: f.write(frame.to_csv(index=False)), mode="w")
    cpu = platform.processor() or platform.machine()
    lines = ["# jensenkv benchmarks", "",
             f"CPU {cpu}, {len(os.sched_getaffinity(0))} usable cores, torch {torch.__version__} with "
             f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}), GPU: "
             f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}; wall time of the last run {seconds:.0f} s (each row names the commit and the date it measured).",
             "Timing ratios: median of paired, interleaved repetitions, with their interquartile range (iqr); "
             "unit `ratio` is process CPU time (what the targets read), `ratio (wall)` wall clock.",
             "Memory: measured in fresh processes with MALLOC_MMAP_THRESHOLD_=131072 (RSS), and as live tensor "
             "bytes (cache tensors plus the shared attention workspace).", ""]
    if plan.quick:
        lines += ["Smoke run (`--quick`): tiny sizes, the numbers mean nothing"
                  + ("" if plan.fresh_processes else "; memory measured in this process, not fresh ones") + ".", ""]
    lines += ["## Targets", "", "| target | measured | bound | |", "|---|---|---|---|", *target_lines(frame)]
    for benchmark, group in frame.groupby("benchmark", sort=False):
        shown = group.drop(columns="benchmark").copy()
        lines += ["", f"## {benchmark}", "", shown.to_markdown(index=False, floatfmt=".4g")]
    if plan.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in plan.notes]]
    atomic_write(out_dir / "bench.md", lambda f: f.write("\n".join(lines) + "\n"), mode="w")


def gpu_kernel(plan: Plan, out_dir: Path) -> None:
    """The Triton-vs-SDPA comparison (``bench.gpu``) into bench_gpu.csv where CUDA is visible; else a note."""
    if not torch.cuda.is_available():
        plan.notes.append(f"{GPU_BENCHMARK}: no CUDA GPU visible, so results/bench_gpu.csv (Triton INT2 kernel against "
                          "SDPA flash on BF16 at the Wan-1.3B and MAGI-1-4.5B shapes) was not written")
        return
    from jensenkv.bench.gpu import gpu_rows, paper_shapes, toy_shapes, write_gpu_csv

    _log(GPU_BENCHMARK)
    shapes = toy_shapes() if plan.quick else paper_shapes()
    path = write_gpu_csv(gpu_rows(shapes, "cuda", repeats=2 if plan.quick else 10, log=_log), out_dir)
    plan.notes.append(f"{GPU_BENCHMARK}: {torch.cuda.get_device_name(0)}, rows in {path.name}")


def run_suite(plan: Plan, out_dir: Path, only: tuple[str, ...] = BENCHMARKS + (GPU_BENCHMARK,)) -> pd.DataFrame:
    """Run the selected benchmarks, write bench.csv and bench.md (and bench_gpu.csv on a GPU) into ``out_dir``,
    return the bench.csv rows."""
    for name in only:
        if name not in BENCHMARKS + (GPU_BENCHMARK,):
            raise ValueError(f"only contains {name!r}: allowed are {BENCHMARKS + (GPU_BENCHMARK,)}")
    started = time.perf_counter()
    rows: list[dict] = []
    for name in BENCHMARKS:
        if name in only:
            _log(name)
            rows += RUNNERS[name](plan)
    if GPU_BENCHMARK in only:
        gpu_kernel(plan, out_dir)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["commit"], frame["measured"] = code_commit(), time.strftime("%Y-%m-%d", time.gmtime())
    if not any(name in only for name in BENCHMARKS):  # the GPU comparison alone: leave bench.csv / bench.md as they are
        for note in plan.notes:
            _log(note)
        return frame
    seconds = time.perf_counter() - started
    frame = merge_rows(frame, out_dir / "bench.csv", tuple(name for name in BENCHMARKS if name in only))
    write_report(frame, out_dir, plan, seconds)
    _log(f"wrote {out_dir / 'bench.csv'} and {out_dir / 'bench.md'} ({len(rows)} rows, {seconds:.0f} s)")
    return frame


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"
