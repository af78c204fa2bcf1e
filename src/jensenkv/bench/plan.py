"""What one run of the benchmark suite measures and at what size: the benchmarks' names (``BENCHMARKS``, in
report order), the ``Plan`` (sizes and repetitions; ``quick_plan``: a smoke run), the row every benchmark
returns (``row``) and the progress line it logs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


from jensenkv.bench.memory import LAYER_SHAPE

BENCHMARKS = ("cache_bytes_ratio", "held_memory_ratio", "generation_peak_memory_saving",
              "correction_overhead_ratio", "correction_overhead_floor", "e2e_time_ratio", "batch_throughput",
              "probe_overhead", "worldplay_cache_memory", "run_imports")


GPU_BENCHMARK = "gpu_kernel"  # its own file, results/bench_gpu.csv, only where CUDA is visible (bench.gpu)
INT2 = {"bits": 2, "group_size": 32}


MIB = float(1 << 20)


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


def log_progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"
