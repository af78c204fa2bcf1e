"""The suite's timing benchmarks, one function per benchmark returning its rows: the correction's overhead in
cached attention and the SDPA floors of its bias forms, generation end to end with an INT2 cache against BF16,
batch throughput, and the attention probes' overhead; every variant timed interleaved with the ones it is
compared to (``jensenkv.bench.timing``).
"""
from __future__ import annotations

import statistics

import torch

from jensenkv.bench.memory import measure
from jensenkv.bench.presets import preset
from jensenkv.bench.timing import paired_ratio, time_interleaved
from jensenkv.bench.plan import INT2, MIB, Plan, log_progress, row

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
        log_progress(f"overhead {shape}: " + ", ".join(f"{c} {per_shape[c][-1]:.3f}" for c in corrections))
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
        log_progress(f"floor {shape}: " + ", ".join(f"{r['config'].split(' SDPA')[0]} {r['value']:.3f}"
                                                    for r in rows[-2 * (len(variants) - 1):] if r["unit"] == "ratio"))
    rows += _median_rows("correction_overhead_floor", per_shape)
    if all(per_shape.get(name) for name in ("columns", "split", "exact")):
        plan.notes.append(
            f"correction_overhead_floor: SDPA alone, median over shapes: bias columns at d+G "
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
    from jensenkv.generation.loop import generate_video

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
        log_progress(f"e2e {name}: {rows[-2]['value']:.3f} CPU, {rows[-1]['value']:.3f} wall "
                     f"(BF16 median {statistics.median(wall['bf16']):.2f} s wall)")
    return rows


def batch_throughput_rows(plan: Plan) -> list[dict]:
    """Videos per second per core on the built-in model (INT2 g=32 + taylor, 1 thread), interleaved: one batch
    of ``batch_videos`` against one video at a time, and against one at a time with a forward per CFG branch
    (the generator before batching); then the peak RSS growth during one batch against one video (fresh
    processes, 1 thread) and each video's cache bytes."""
    from jensenkv.bench.subjects import PROMPT, tiny_adapter
    from jensenkv.generation.loop import generate_videos

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
    log_progress(f"batch throughput: {rows[3]['value']:.2f}x over batch 1, "
                 f"{rows[5]['value']:.2f}x over per-branch forwards")
    return rows


def probe_overhead_rows(plan: Plan) -> list[dict]:
    """Generation time of the built-in model (INT2 g=32 + taylor, 1 thread) with attention probes on every layer
    and every denoising step (dP_S per layer and step, as the paper reports its median), without and with the
    error-model diagnostics, over the same run without probes (whose cache keeps no full-precision copy)."""
    import dataclasses

    from jensenkv.bench.subjects import PROMPT, tiny_adapter
    from jensenkv.generation.loop import generate_video

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
    log_progress(f"probe overhead: {rows[0]['value']:.3f} (probes), {rows[2]['value']:.3f} (with diagnostics), "
                 "CPU time")
    return rows
