"""The suite's memory benchmarks, one function per benchmark returning its rows: the stored bytes of a chunk per
preset (and QVG over its paper's span), the memory a held cache takes, the peak memory of a generation with an
INT2 cache against BF16, and HY-WorldPlay's caches at 480p (``jensenkv.bench.memory`` measures in fresh
processes).
"""
from __future__ import annotations


import torch

from jensenkv.bench.memory import measure
from jensenkv.bench.presets import label, preset
from jensenkv.bench.plan import INT2, MIB, Plan, log_progress, row, shape_text

BYTES_PRESETS = (("bf16", {}), ("rtn", INT2), ("rtn", {"bits": 4, "group_size": 32}), ("kivi", INT2),
                 ("quarot", INT2), ("qvg", INT2))


QVG_PAPER_SPAN = 49_920  # tokens QVG clusters together in its paper's setting (d = 128): 7.05x / 5.20x


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
        rows.append(row("cache_bytes_ratio", f"{label(quant, **overrides)} {shape_text(plan.bytes_shape)}",
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
    plan.notes.append(f"held_memory_ratio: stored {stored / MIB:.1f} MiB, one layer's workspace "
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
            log_progress(f"worldplay {quant} {memory}: {r['frames']} frames, stored {mib['stored']:.0f} MiB, "
                         f"RSS {mib['rss']:.0f} MiB, memory_bytes {mib['theory']:.0f} MiB")
    plan.notes.append(
        f"worldplay_cache_memory: {geometry.describe()}; random K/V of the real size committed through "
        "WorldPlayCaches.store_group (both streams, K and V) for every memory write of one video (no transformer: "
        f"the 8B weights do not fit); measured on {r['measured_layers']} block in a fresh process per row and "
        f"scaled to {geometry.layers} layers (every block holds the same shapes; 54 BF16 blocks do not fit this "
        "machine). RSS growth: resident pages; tensor storage: the buffers' capacity, sized up front as "
        "generation sizes them (WorldPlayCaches.reserve_memory). Text K/V (full precision) not included.")
    return rows
