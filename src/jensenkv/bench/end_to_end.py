"""End-to-end generation time of a chunk-wise model per cache configuration, against the BF16 cache.

One adapter per configuration is built up front; every repetition then generates the same video
(prompt, seed) once with each adapter, in a rotating order, so all configurations share the machine's
load. The quantize-on-commit share comes from generate_video's own timings (quantize_s over the sum
of the per-chunk times).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

import numpy as np

from jensenkv.bench.rows import BenchRow, time_ratio_row, time_row
from jensenkv.bench.timing import time_interleaved
from jensenkv.generate import ChunkwiseModel, GenerationConfig, generate_video


def end_to_end_rows(
    adapters: Mapping[str, ChunkwiseModel],
    baseline: str,
    repeats: int,
    prompt: str,
    seed: int = 0,
    generation: GenerationConfig | None = None,
    warmup: int = 1,
    shape: str = "",
) -> list[BenchRow]:
    """Per variant: seconds per video, the ratio against ``baseline`` and the quantize share of chunk time."""
    if baseline not in adapters:
        raise ValueError(f"baseline={baseline!r} is not allowed: choose one of {sorted(adapters)}")
    shares: dict[str, list[tuple[float, float]]] = {name: [] for name in adapters}
    for adapter in adapters.values():
        adapter.time_quantize = True  # commit timing is opt-in (it synchronizes the device)

    def run(name: str) -> Callable[[], None]:
        def call() -> None:
            result = generate_video(adapters[name], prompt, seed, generation)
            chunk_s = float(sum(result.timings["per_chunk_s"]))
            shares[name].append((float(result.timings["quantize_s"]), chunk_s))

        return call

    timings = time_interleaved({name: run(name) for name in adapters}, repeats=repeats, warmup=warmup)
    rows: list[BenchRow] = []
    for name, t in timings.items():
        rows.append(time_row("e2e_time", name, shape, t, note="generate_video wall time per video"))
    for name, t in timings.items():
        if name != baseline:
            rows.append(
                time_ratio_row("e2e_time_ratio", name, shape, t, timings[baseline],
                               note=f"generate_video {name} / {baseline}")
            )
    for name in adapters:
        measured = shares[name][warmup:]  # drop the warm-up calls, like the timings do
        quant_s = statistics.median(q for q, _ in measured)
        chunk_s = statistics.median(c for _, c in measured)
        per_rep = [q / c for q, c in measured]
        q75, q25 = np.percentile(per_rep, [75, 25])
        rows.append(
            BenchRow(
                benchmark="commit_quantize_share",
                config=name,
                shape=shape,
                value=quant_s / chunk_s,
                unit="ratio",
                median=statistics.median(per_rep),
                iqr=float(q75 - q25),
                repeats=len(measured),
                numerator=quant_s,
                denominator=chunk_s,
                note="seconds quantizing on commit / seconds generating the chunks (generate_video timings)",
            )
        )
    return rows
