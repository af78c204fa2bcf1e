"""Per-video metrics of the runs in a table, their 95% intervals and the paired test of each correction.

A run's metric is the mean over its videos (prompt x seed). ``add_intervals`` adds to a Table 1 long table:
``num_videos``, ``<metric>_ci95_low`` / ``_high`` (bootstrap over videos, jensenkv.eval.stats), and on each
corrected row ``delta_<metric>`` (corrected - uncorrected, paired by prompt and seed with the "none" run of
the same cell) with its interval ``delta_<metric>_ci95_low`` / ``_high`` and ``p_<metric>`` (two-sided paired
sign-flip test). Pairs are only ever formed between the
two runs of one cell, which the selection guarantees share prompts, seeds and every other setting.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import mean_interval, paired_difference
from jensenkv.tracking import ResultsStore

INTERVAL_METRICS = ("psnr", "ssim", "lpips", "vbench", "content", "delta_p_s")
PER_VIDEO_KEYS = {"delta_p_s": "delta_p_s_mean"}  # the per-video name of a run-level metric
VIDEO_KEYS = ("prompt", "seed")


def video_metrics(results_dir: str | Path, run_ids) -> pd.DataFrame:
    """One row per (run, prompt, seed) with the per-video value of every INTERVAL_METRICS metric present.

    VBench's per-video score is the mean x100 of the dimensions scored for that video, as the run-level one."""
    store = ResultsStore(results_dir)
    rows = []
    for run_id in dict.fromkeys(run_ids):
        for video in store.read_record(run_id).get("per_prompt", []):
            metrics = video.get("metrics", {})
            row = {"run_id": run_id, "prompt": video["prompt"], "seed": int(video["seed"])}
            for metric in INTERVAL_METRICS:
                value = metrics.get(PER_VIDEO_KEYS.get(metric, metric))
                if value is not None:
                    row[metric] = float(value)
            dims = [v for k, v in metrics.items() if k.startswith("vbench_") and v is not None]
            if dims and "vbench" not in row:
                row["vbench"] = 100.0 * sum(dims) / len(dims)
            rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", *VIDEO_KEYS, *INTERVAL_METRICS]) if not rows else pd.DataFrame(rows)


def add_intervals(table: pd.DataFrame, videos: pd.DataFrame, correction: str,
                  cell: tuple[str, ...] = ("model", "quantizer", "bits", "group_size", "rotation")) -> pd.DataFrame:
    """``table`` (one row per run, with run_id, correction and the ``cell`` columns) plus the interval columns."""
    out = table.copy()
    by_run = {run_id: part.set_index(list(VIDEO_KEYS)) for run_id, part in videos.groupby("run_id")}
    out["num_videos"] = [len(by_run[r]) if r in by_run else 0 for r in out["run_id"]]
    for metric in INTERVAL_METRICS:
        lows, highs, deltas, ps, d_lows, d_highs = [], [], [], [], [], []
        for _, row in out.iterrows():
            per_video = by_run.get(row["run_id"])
            values = per_video[metric] if per_video is not None and metric in per_video else pd.Series(dtype=float)
            ci = mean_interval(values.to_numpy())
            lows.append(ci.low)
            highs.append(ci.high)
            delta = p = d_low = d_high = math.nan
            if row["correction"] == correction:
                twin = _twin(out, row, cell)
                base = by_run.get(twin) if twin is not None else None
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


def _twin(table: pd.DataFrame, row: pd.Series, cell: tuple[str, ...]) -> str | None:
    """The run id of the uncorrected run of ``row``'s cell, if the table has it."""
    same = table["correction"] == "none"
    for col in cell:
        same &= (table[col] == row[col]) | (table[col].isna() & pd.isna(row[col]))
    matches = table.loc[same, "run_id"]
    return matches.iloc[0] if len(matches) else None
