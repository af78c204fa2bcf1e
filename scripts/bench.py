"""`make bench`: memory, correction overhead and end-to-end benchmarks -> results/bench.csv and bench.md; on a
machine with a CUDA GPU also the Triton kernel against SDPA flash -> results/bench_gpu.csv (jensenkv.bench.gpu).

    .venv/bin/python scripts/bench.py                            # everything
    .venv/bin/python scripts/bench.py --quick --out-dir /tmp/b   # smoke run with tiny sizes
    .venv/bin/python scripts/bench.py --only e2e_time_ratio      # a subset
    .venv/bin/python scripts/bench.py --only gpu_kernel          # the GPU comparison alone
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared CPU a thread descheduled by another tenant
# otherwise makes its partner spin at every barrier, and that spinning counts as this process's CPU time
# (the unit the targets read), more so for paths with more parallel ops. Set before torch starts OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from jensenkv.bench.plan import BENCHMARKS, GPU_BENCHMARK, Plan, quick_plan
from jensenkv.bench.suite import run_suite

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1-2 repetitions: a smoke run")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results", help="where bench.csv / bench.md go")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS + (GPU_BENCHMARK,),
                        default=list(BENCHMARKS + (GPU_BENCHMARK,)))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: $OMP_NUM_THREADS, else the usable CPU cores)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads={args.threads} is not allowed: it must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    run_suite(quick_plan() if args.quick else Plan(), args.out_dir, only=tuple(args.only))


if __name__ == "__main__":
    main()
