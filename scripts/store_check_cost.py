"""Cost of checking records and attention.csv when they are read: load_results over a store of Table-1-sized
runs (16 prompts x 3 seeds, 11,520 probe rows, about 5 MB of attention.csv each) and load_attention of one run.

    python scripts/store_check_cost.py                      # 30 runs in a temporary folder, 25 repeats
    python scripts/store_check_cost.py --runs 60 --keep /tmp/store60

The records are synthetic but sound (their ids hash their identities, every requested metric is there), shaped
like the runner's. Prints the minimum and median over repeats of this process's CPU time (run with
OMP_NUM_THREADS=1), which other processes on a shared machine barely move. To compare with the code before the
checks, run it from a checkout of that code with --keep, then time the kept store with --reuse.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

PROMPTS = [f"prompt {i}" for i in range(16)]
SEEDS = [0, 1, 2]
METRICS = ["attention", "content", "psnr"]


def build_store(root: Path, runs: int) -> None:
    """``runs`` sound runs with Table 1's videos and probe rows (4 layers, 10 steps, 3 chunks, 2 branches)."""
    from jensenkv.eval.attention import SUMMARY_KEYS
    from jensenkv.tracking import ATTENTION_FILE, ResultsStore, atomic_write, config_hash

    rng = np.random.default_rng(0)
    store = ResultsStore(root)
    pairs = [(p, s) for p in PROMPTS for s in SEEDS]
    probes = pd.DataFrame([(k, s, layer, step, chunk, branch) for k, (_, s) in enumerate(pairs) for layer in range(4)
                           for step in range(10) for chunk in (1, 2, 3) for branch in ("cond", "uncond")],
                          columns=["prompt_index", "seed", "layer", "step", "chunk", "branch"])
    for key in SUMMARY_KEYS:
        probes[key] = rng.random(len(probes))
    video_metrics = {f"{k}_mean": 0.1 for k in ("p_s", "p_r", "p_s_ref", "delta_p_s", "jsd", "out_mse")}
    video_metrics.update(psnr=30.0, content=1.0, content_colour=1.0, content_direction=1.0, delta_p_s_median=0.01)
    for i in range(runs):
        identity = {"model": {"name": "tiny"}, "key": {"method": "rtn", "bits": 2, "group_size": 32, "seed": i},
                    "correction": "none", "prompts": PROMPTS, "seeds": SEEDS, "metrics": METRICS}
        run_id = config_hash(identity)
        path = atomic_write(store.run_dir(run_id) / ATTENTION_FILE, lambda f: probes.to_csv(f, index=False), mode="w")
        store.write_record({
            "run_id": run_id, "identity": identity, "created_at": "2026-12-01T00:00:00+00:00",
            "labels": {"model": "tiny", "quantizer": "rtn", "method": "rtn", "bits": 2, "group_size": 32,
                       "correction": "none", "sink_chunks": 0, "window_chunks": None},
            "metrics": dict(video_metrics), "missing": {}, "vbench_dimensions_used": [],
            "per_prompt": [{"index": k, "prompt": p, "seed": s, "metrics": dict(video_metrics), "missing": {}}
                           for k, (p, s) in enumerate(pairs)],
            "files": {ATTENTION_FILE: {"rows": len(probes), "bytes": path.stat().st_size}}})


def cpu_times(call, repeats: int) -> tuple[float, float]:
    """(min, median) CPU seconds of ``call()`` over ``repeats``, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--keep", type=Path, default=None, help="build the store here and keep it")
    parser.add_argument("--reuse", type=Path, default=None, help="time a store built before (--keep)")
    args = parser.parse_args()
    from jensenkv.tracking import load_attention, load_results

    with tempfile.TemporaryDirectory() as tmp:
        root = args.reuse or args.keep or Path(tmp) / "results"
        if args.reuse is None:
            build_store(root, args.runs)
        runs = load_results(root)
        first = runs["run_id"].iloc[0]
        low, mid = cpu_times(lambda: load_results(root), args.repeats)
        print(f"load_results, {len(runs)} runs: {low * 1e3:.0f} ms min, {mid * 1e3:.0f} ms median (CPU)")
        low, mid = cpu_times(lambda: load_attention(root, first), args.repeats)
        print(f"load_attention, one run of {len(load_attention(root, first))} rows: {low * 1e3:.0f} ms min, "
              f"{mid * 1e3:.0f} ms median (CPU)")


if __name__ == "__main__":
    main()
