"""`make bench`: performance benchmarks -> results/bench.csv and results/bench.md.

    .venv/bin/python scripts/bench.py                 # full suite (<= 15 min on 2 CPU cores, idle machine)
    .venv/bin/python scripts/bench.py --quick --out-dir /tmp/b   # smoke run in seconds
    .venv/bin/python scripts/bench.py --only attention e2e       # a subset
    .venv/bin/python scripts/bench.py --gpu           # also time the flex path on CUDA (skipped on CPU)
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from jensenkv.bench.suite import BENCHMARKS, full_plan, quick_plan, run_suite

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions: a smoke run")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results", help="where bench.csv / bench.md go")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS),
                        help="run only these benchmarks")
    parser.add_argument("--gpu", action="store_true", help="also time jensenkv.attention's flex path on CUDA")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: $OMP_NUM_THREADS, else the usable CPU cores)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads={args.threads} is not allowed: it must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    plan = quick_plan() if args.quick else full_plan()
    run_suite(plan, args.out_dir, only=tuple(args.only), gpu=args.gpu)


if __name__ == "__main__":
    main()
