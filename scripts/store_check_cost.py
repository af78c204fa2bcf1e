"""Cost of checking records and their runs' files when they are read: load_results over a store of Table-1-sized
runs (16 prompts x 3 seeds, 11,520 probe rows, about 5 MB of attention.csv each, and per video its result, its
probe table and its two mp4s) and load_attention of one run.

    python scripts/store_check_cost.py                      # 30 runs in a temporary folder, 25 repeats
    python scripts/store_check_cost.py --runs 60 --keep /tmp/store60

The records are synthetic but sound (their ids hash their identities, every requested metric is there, every
file's digest is listed), shaped like the runner's. Prints the minimum and median over repeats of this process's
CPU time (run with OMP_NUM_THREADS=1), which other processes on a shared machine barely move: "cold" is a
process's first read, which hashes every file; "warm" a later read in the same process, which finds the files'
digests kept by their stat. To compare with the code before the checks, run it from a checkout of that code with
--keep, then time the kept store with --reuse.
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
VIDEO_BYTES = (5_000, 60_000)  # a built-in-model Table 1 video and its enlarged copy, about


def build_store(root: Path, runs: int) -> None:
    """``runs`` sound runs with Table 1's videos and probe rows (4 layers, 10 steps, 3 chunks, 2 branches)."""
    import dataclasses

    from jensenkv.eval.attention import SUMMARY_KEYS, summarize_probes
    from jensenkv.quant import QuantConfig
    from jensenkv.store.record_check import identity_labels
    from jensenkv.hashing import config_hash
    from jensenkv.store.files import atomic_write, atomic_write_json, file_sha256, sealed
    from jensenkv.store.record import ATTENTION_FILE
    from jensenkv.store.results import ResultsStore

    rng = np.random.default_rng(0)
    store = ResultsStore(root)
    pairs = [(p, s) for p in PROMPTS for s in SEEDS]
    probes = pd.DataFrame([(k, s, layer, step, chunk, branch) for k, (_, s) in enumerate(pairs) for layer in range(4)
                           for step in range(10) for chunk in (1, 2, 3) for branch in ("cond", "uncond")],
                          columns=["prompt_index", "seed", "layer", "step", "chunk", "branch"])
    for key in SUMMARY_KEYS:
        probes[key] = rng.random(len(probes))
    video_metrics = dict(psnr=30.0, content=1.0, content_colour=1.0, content_direction=1.0)
    for i in range(runs):
        key = dataclasses.asdict(QuantConfig(rotation_seed=i))
        identity = {"model": {"kind": "tiny", "name": "tiny"}, "generation": {"steps": 10}, "key": key, "value": key,
                    "correction": "none", "strength": 1.0, "second_order": False, "sink_chunks": 0,
                    "window_chunks": None, "prompts": PROMPTS, "seeds": SEEDS, "metrics": METRICS}
        run_id = config_hash(identity)
        run_dir = store.run_dir(run_id)
        atomic_write(run_dir / ATTENTION_FILE, lambda f: probes.to_csv(f, index=False), mode="w")
        videos = []
        for k, (p, s) in enumerate(pairs):
            rows = probes[probes["prompt_index"] == k]
            path = store.prompt_result_path(run_id, k)
            atomic_write_json(path.with_suffix(".attention.json"), rows.to_dict(orient="list"))
            files = [path.with_suffix(".attention.json")]
            for folder, size in zip(("videos", "videos_upscaled"), VIDEO_BYTES):
                files.append(atomic_write(run_dir / folder / f"{k:04d}_s{s}.mp4", lambda f: f.write(rng.bytes(size))))
            video = {"index": k, "prompt": p, "seed": s, "metrics": {**video_metrics, **summarize_probes(rows)},
                     "missing": {}, "video": f"{k:04d}_s{s}.mp4"}
            atomic_write_json(path, sealed({**video, "files": {f.relative_to(run_dir).as_posix(): file_sha256(f) for f in files}}))
            videos.append(video)
        store.write_record({
            "run_id": run_id, "identity": identity, "created_at": "2026-12-01T00:00:00+00:00",
            "labels": identity_labels(identity),
            "metrics": {**video_metrics, **summarize_probes(probes)}, "missing": {}, "vbench_dimensions_used": [],
            "per_prompt": videos, "files": {ATTENTION_FILE: {"rows": len(probes), "text_columns": ["branch"]}}})


def cpu_times(call, repeats: int) -> tuple[float, float]:
    """(min, median) CPU seconds of ``call()`` over ``repeats``, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times), statistics.median(times)


def cold(call):
    """``call()`` as a process's first read: no file digest kept yet."""
    from jensenkv.store import files as store_files

    store_files._FILE_DIGESTS.clear()
    return call()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--keep", type=Path, default=None, help="build the store here and keep it")
    parser.add_argument("--reuse", type=Path, default=None, help="time a store built before (--keep)")
    args = parser.parse_args()
    from jensenkv.report.store_frame import load_attention, load_results

    with tempfile.TemporaryDirectory() as tmp:
        root = args.reuse or args.keep or Path(tmp) / "results"
        if args.reuse is None:
            build_store(root, args.runs)
        runs = load_results(root)
        first = runs["run_id"].iloc[0]
        files = sum(1 for p in Path(root).rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file()) / 1e6
        low, mid = cpu_times(lambda: cold(lambda: load_results(root)), args.repeats)
        print(f"load_results, {len(runs)} runs ({files} files, {size:.0f} MB), cold: {low * 1e3:.0f} ms min, "
              f"{mid * 1e3:.0f} ms median (CPU)")
        low, mid = cpu_times(lambda: load_results(root), args.repeats)
        print(f"load_results, warm: {low * 1e3:.0f} ms min, {mid * 1e3:.0f} ms median (CPU)")
        low, mid = cpu_times(lambda: load_attention(root, first), args.repeats)
        print(f"load_attention, one run of {len(load_attention(root, first))} rows: {low * 1e3:.0f} ms min, "
              f"{mid * 1e3:.0f} ms median (CPU)")


if __name__ == "__main__":
    main()
