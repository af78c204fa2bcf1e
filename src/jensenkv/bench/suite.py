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

import time
from pathlib import Path

import pandas as pd
import torch

from jensenkv.bench.import_rows import run_import_rows
from jensenkv.bench.plan import BENCHMARKS, GPU_BENCHMARK, Plan, log_progress
from jensenkv.bench.memory_rows import cache_bytes_rows, generation_rows, held_memory_rows, worldplay_rows
from jensenkv.bench.suite_report import COLUMNS, code_commit, kept_notes, merge_rows, write_report
from jensenkv.bench.timing_rows import (batch_throughput_rows, correction_overhead_floor_rows, correction_overhead_rows,
                                        e2e_rows, probe_overhead_rows)

RUNNERS = {"cache_bytes_ratio": cache_bytes_rows, "held_memory_ratio": held_memory_rows,
           "generation_peak_memory_saving": generation_rows, "correction_overhead_ratio": correction_overhead_rows,
           "correction_overhead_floor": correction_overhead_floor_rows, "e2e_time_ratio": e2e_rows,
           "batch_throughput": batch_throughput_rows, "probe_overhead": probe_overhead_rows,
           "worldplay_cache_memory": worldplay_rows, "run_imports": run_import_rows}


def gpu_kernel(plan: Plan, out_dir: Path) -> None:
    """The Triton-vs-SDPA comparison (``bench.gpu``) into bench_gpu.csv where CUDA is visible; else a note."""
    if not torch.cuda.is_available():
        plan.notes.append(f"{GPU_BENCHMARK}: no CUDA GPU visible, so results/bench_gpu.csv (Triton INT2 kernel against "
                          "SDPA flash on BF16 at the Wan-1.3B and MAGI-1-4.5B shapes) was not written")
        return
    from jensenkv.bench.gpu import gpu_rows, paper_shapes, toy_shapes, write_gpu_csv

    log_progress(GPU_BENCHMARK)
    shapes = toy_shapes() if plan.quick else paper_shapes()
    path = write_gpu_csv(gpu_rows(shapes, "cuda", repeats=2 if plan.quick else 10, log=log_progress), out_dir)
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
            log_progress(name)
            rows += RUNNERS[name](plan)
    if GPU_BENCHMARK in only:
        gpu_kernel(plan, out_dir)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["commit"], frame["measured"] = code_commit(), time.strftime("%Y-%m-%d", time.gmtime())
    if not any(name in only for name in BENCHMARKS):  # the GPU comparison alone: leave bench.csv / bench.md as they are
        for note in plan.notes:
            log_progress(note)
        return frame
    seconds = time.perf_counter() - started
    replaced = tuple(name for name in BENCHMARKS if name in only)
    frame = merge_rows(frame, out_dir / "bench.csv", replaced)
    write_report(frame, out_dir, plan, seconds, kept_notes(out_dir / "bench.md", replaced))
    log_progress(f"wrote {out_dir / 'bench.csv'} and {out_dir / 'bench.md'} ({len(rows)} rows, {seconds:.0f} s)")
    return frame
