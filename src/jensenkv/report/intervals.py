"""95% intervals of the cells of a table and the paired test of each treatment, from their per-video values.

A cell is one table row (quantizer) under one treatment (correction, strength, ...), made of one run or of
its replicates pooled (``run_id`` holds them joined by ";"; ``jensenkv.report.rows``). Its metric is the mean
over its videos; a video is identified by rows.VIDEO_KEYS (prompt, seed, replicate). The independent unit is
the prompt (``rows.cluster_means``: replicates averaged within (prompt, seed), seeds within the prompt), so
every interval and test here runs over prompt means (jensenkv.eval.stats). ``add_intervals`` adds to a table of
cells: ``num_videos``, ``num_clusters`` (prompts), ``<metric>_ci95_low`` / ``_high`` (Student-t over
prompts), and on each treated cell ``delta_<metric>`` (treated - baseline, paired video by video with the
baseline cell of the same row: same prompt, seed and replicate, then averaged per prompt) with its interval
``delta_<metric>_ci95_low`` / ``_high``, ``p_<metric>`` (two-sided exact sign-flip test over prompts) and
``delta_<metric>_mde`` (the smallest effect detected at 80% power). Pairs are only formed within one row, whose
runs the selection guarantees share prompts, seeds and every other setting.
"""
from __future__ import annotations

import math

import pandas as pd

from jensenkv.eval.stats import Interval, PairedDifference, mean_interval, shift_test
from jensenkv.report.rows import BASELINE, VIDEO_KEYS, VIDEO_METRICS, cluster_means, run_ids_of


def add_intervals(table: pd.DataFrame, videos: pd.DataFrame, cell: tuple[str, ...] = ("model", "row_id"),
                  baseline: str = BASELINE) -> pd.DataFrame:
    """``table`` (one row per cell, with run_id, treatment and the ``cell`` columns that name its row) plus
    the interval columns. The baseline cell of a row is the one whose treatment is ``baseline``."""
    out = table.copy()
    by_cell = [_cell_videos(videos, row["run_id"]) for _, row in out.iterrows()]
    out["num_videos"] = [len(v) for v in by_cell]
    out["num_clusters"] = [v.index.get_level_values("prompt").nunique() if len(v) else 0 for v in by_cell]
    twins = [_twin(out, row, cell, baseline) for _, row in out.iterrows()]
    for metric in VIDEO_METRICS:
        lows, highs, deltas, ps, d_lows, d_highs, mdes = [], [], [], [], [], [], []
        for per_video, twin in zip(by_cell, twins):
            values = per_video[metric] if metric in per_video else pd.Series(dtype=float)
            ci = cell_interval(values)
            lows.append(ci.low)
            highs.append(ci.high)
            delta = p = d_low = d_high = mde = math.nan
            base = by_cell[twin] if twin is not None else None
            if base is not None and metric in base and len(values):
                test = paired(values, base[metric])
                delta, p, d_low, d_high, mde = test.delta, test.p_value, test.low, test.high, test.mde
            deltas.append(delta)
            ps.append(p)
            d_lows.append(d_low)
            d_highs.append(d_high)
            mdes.append(mde)
        out[f"{metric}_ci95_low"], out[f"{metric}_ci95_high"] = lows, highs
        out[f"delta_{metric}"], out[f"p_{metric}"] = deltas, ps
        out[f"delta_{metric}_ci95_low"], out[f"delta_{metric}_ci95_high"] = d_lows, d_highs
        out[f"delta_{metric}_mde"] = mdes
    return out


def cell_interval(values: pd.Series, prompt: str = "prompt", seed: str = "seed") -> Interval:
    """The mean of a cell's per-video values (indexed by VIDEO_KEYS, or any index with ``prompt`` and ``seed``
    levels) with its interval over prompts (``rows.cluster_means``); n = prompts, videos = the videos behind."""
    values = values.dropna()
    return mean_interval(cluster_means(values, prompt, seed).to_numpy(), videos=len(values))


def paired(treated: pd.Series, base: pd.Series) -> PairedDifference:
    """treated - base, video by video (values of equal index: VIDEO_KEYS, or (prompt, seed) between rows), then
    averaged per prompt (``rows.cluster_means``): interval, sign-flip p and power over prompts."""
    diff = _differences(treated, base)
    return shift_test(cluster_means(diff).to_numpy(), videos=len(diff))


def _differences(treated: pd.Series, base: pd.Series) -> pd.Series:
    joined = pd.concat([treated.rename("t"), base.rename("b")], axis=1, join="inner").dropna()
    return joined["t"] - joined["b"]


def cluster_differences(treated: pd.Series, base: pd.Series) -> pd.Series:
    """treated - base paired per video, then one mean per prompt: the values ``paired`` tests."""
    return cluster_means(_differences(treated, base))


def shift(values: pd.Series) -> PairedDifference:
    """A per-video quantity against 0 (e.g. the uncorrected dP_S), over prompts as ``paired``."""
    values = values.dropna()
    return shift_test(cluster_means(values).to_numpy(), videos=len(values))


def _cell_videos(videos: pd.DataFrame, cell_run_id: str) -> pd.DataFrame:
    """The videos of one cell indexed by VIDEO_KEYS; a key seen twice (two runs of one replicate) is an error,
    since pairing would then be ambiguous."""
    ids = run_ids_of(cell_run_id)
    part = videos[videos["run_id"].isin(ids)] if not videos.empty else videos
    indexed = part.set_index(list(VIDEO_KEYS))
    if indexed.index.has_duplicates:
        dup = indexed.index[indexed.index.duplicated()][0]
        raise ValueError(f"cell {cell_run_id!r} holds the video (prompt, seed, replicate)={dup!r} twice: "
                         "a pooled cell takes one run per replicate (seed fields)")
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
