"""Per-video metrics of the cells of a table, their 95% intervals and the paired test of each treatment.

A cell is one table row (quantizer) under one treatment (correction, strength, ...), made of one run or of
several runs pooled over rotation seeds (``run_id`` holds them joined by ";"). Its metric is the mean over its
videos; a video is identified by (prompt, seed, rotation seed). ``add_intervals`` adds to a table of cells:
``num_videos``, ``<metric>_ci95_low`` / ``_high`` (bootstrap over videos, jensenkv.eval.stats), and on each
treated cell ``delta_<metric>`` (treated - baseline, paired video by video with the baseline cell of the same
row: same prompt, seed and rotation seed) with its interval ``delta_<metric>_ci95_low`` / ``_high`` and
``p_<metric>`` (two-sided paired sign-flip test). Pairs are only formed within one row, whose runs the
selection guarantees share prompts, seeds and every other setting.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import mean_interval, paired_difference
from jensenkv.tracking import ResultsStore

INTERVAL_METRICS = ("psnr", "ssim", "lpips", "vbench", "content", "delta_p_s")
PER_VIDEO_KEYS = {"delta_p_s": "delta_p_s_mean"}  # the per-video name of a run-level metric
VIDEO_KEYS = ("prompt", "seed", "rotation_seed")
RUN_SEPARATOR = ";"  # a pooled cell's run ids, joined
BASELINE = "none"


def run_ids_of(cell_run_id: str) -> list[str]:
    """The run ids of one cell (one, or several pooled ones joined by RUN_SEPARATOR)."""
    return [r for r in str(cell_run_id).split(RUN_SEPARATOR) if r]


def rotation_seed_of(identity: dict | None) -> int:
    """The rotation seed a run's keys were rotated with; -1 for unrotated runs (their seed is reset, unused)."""
    key = (identity or {}).get("key") or {}
    return int(key.get("rotation_seed") or 0) if key.get("rotation", "none") != "none" else -1


def video_metrics(results_dir: str | Path, run_ids) -> pd.DataFrame:
    """One row per (run, prompt, seed) with its rotation seed and the per-video value of every
    INTERVAL_METRICS metric present. ``run_ids`` may hold pooled cells' joined ids.

    VBench's per-video score is the mean x100 of the dimensions scored for that video, as the run-level one."""
    store = ResultsStore(results_dir)
    rows = []
    ids = [r for cell in run_ids for r in run_ids_of(cell)]
    for run_id in dict.fromkeys(ids):
        record = store.read_record(run_id)
        rotation_seed = rotation_seed_of(record.get("identity"))
        for video in record.get("per_prompt", []):
            metrics = video.get("metrics", {})
            row = {"run_id": run_id, "prompt": video["prompt"], "seed": int(video["seed"]),
                   "rotation_seed": rotation_seed}
            for metric in INTERVAL_METRICS:
                value = metrics.get(PER_VIDEO_KEYS.get(metric, metric))
                if value is not None:
                    row[metric] = float(value)
            dims = [v for k, v in metrics.items() if k.startswith("vbench_") and v is not None]
            if dims and "vbench" not in row:
                row["vbench"] = 100.0 * sum(dims) / len(dims)
            rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["run_id", *VIDEO_KEYS, *INTERVAL_METRICS])


def add_intervals(table: pd.DataFrame, videos: pd.DataFrame, cell: tuple[str, ...] = ("model", "row_id"),
                  baseline: str = BASELINE) -> pd.DataFrame:
    """``table`` (one row per cell, with run_id, treatment and the ``cell`` columns that name its row) plus
    the interval columns. The baseline cell of a row is the one whose treatment is ``baseline``."""
    out = table.copy()
    by_cell = [_cell_videos(videos, row["run_id"]) for _, row in out.iterrows()]
    out["num_videos"] = [len(v) for v in by_cell]
    twins = [_twin(out, row, cell, baseline) for _, row in out.iterrows()]
    for metric in INTERVAL_METRICS:
        lows, highs, deltas, ps, d_lows, d_highs = [], [], [], [], [], []
        for per_video, twin in zip(by_cell, twins):
            values = per_video[metric] if metric in per_video else pd.Series(dtype=float)
            ci = mean_interval(values.to_numpy())
            lows.append(ci.low)
            highs.append(ci.high)
            delta = p = d_low = d_high = math.nan
            base = by_cell[twin] if twin is not None else None
            if base is not None and metric in base and len(values):
                joined = pd.concat([values.rename("t"), base[metric].rename("b")], axis=1, join="inner")
                test = paired_difference(joined["t"].to_numpy(), joined["b"].to_numpy())
                delta, p, d_low, d_high = test.delta, test.p_value, test.low, test.high
            deltas.append(delta)
            ps.append(p)
            d_lows.append(d_low)
            d_highs.append(d_high)
        out[f"{metric}_ci95_low"], out[f"{metric}_ci95_high"] = lows, highs
        out[f"delta_{metric}"], out[f"p_{metric}"] = deltas, ps
        out[f"delta_{metric}_ci95_low"], out[f"delta_{metric}_ci95_high"] = d_lows, d_highs
    return out


def _cell_videos(videos: pd.DataFrame, cell_run_id: str) -> pd.DataFrame:
    """The videos of one cell indexed by VIDEO_KEYS; a key seen twice (two runs of one rotation seed) is an
    error, since pairing would then be ambiguous."""
    ids = run_ids_of(cell_run_id)
    part = videos[videos["run_id"].isin(ids)] if not videos.empty else videos
    indexed = part.set_index(list(VIDEO_KEYS))
    if indexed.index.has_duplicates:
        dup = indexed.index[indexed.index.duplicated()][0]
        raise ValueError(f"cell {cell_run_id!r} holds the video (prompt, seed, rotation seed)={dup!r} twice: "
                         "a pooled cell takes one run per rotation seed")
    return indexed


def _twin(table: pd.DataFrame, row: pd.Series, cell: tuple[str, ...], baseline: str) -> int | None:
    """The position in ``table`` of the baseline cell of ``row``'s table row (None for the baseline itself or
    when the table lacks it)."""
    if row["treatment"] == baseline:
        return None
    same = table["treatment"] == baseline
    for col in cell:
        same &= (table[col] == row[col]) | (table[col].isna() & pd.isna(row[col]))
    positions = [i for i, match in enumerate(same.tolist()) if match]
    return positions[0] if positions else None
