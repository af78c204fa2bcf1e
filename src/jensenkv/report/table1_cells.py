"""Table 1's runs and cells: which runs of a store the table compares (one context per model, the latest per
row, replicate and treatment), and those runs pooled into one cell per (model, row, treatment) in the long CSV
form, in the table's row order.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from jensenkv.eval.attention import denoising_rows
from jensenkv.report.layers import cell_probes
from jensenkv.report.rows import (BASELINE, QUANTIZER_ORDER, REASON_SOURCE, RUN_SEPARATOR, VIDEO_METRICS,
                                  attach_details, by_replicate, full_cache, quantizer_label)
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.store.files import portable


CSV_COLUMNS = ("model", "quantizer", "label", "bits", "group_size", "rotation", "rotation_seeds", "zero_point",
               "dither", "smoothing", "qvg_centroids", "correction", "strength", "treatment", "effective_bits",
               "psnr", "ssim", "lpips", "vbench", "content", "delta_p_s", "delta_p_s_abs", "delta_p_s_median", "jsd",
               "num_prompts", "num_runs", "vbench_dimensions_used", "run_id")
# Run-level numbers a pooled cell averages over its runs (weighted by videos); renamed to their CSV names.
POOLED = {"effective_bits": "effective_bits", "psnr": "psnr", "ssim": "ssim", "lpips": "lpips", "vbench": "vbench",
          "content": "content", "delta_p_s_mean": "delta_p_s", "delta_p_s_abs_mean": "delta_p_s_abs",
          "delta_p_s_median": "delta_p_s_median",
          "jsd_mean": "jsd"}
GRID_TAG_ORDER = {"min_aligned": 1, "fixed_point": 2, "dither": 3, "channel_mean": 4}  # QuantConfig.label's tags


ROW = ("model", "row_id")  # one table row: a quantizer setting of one model (replicates pooled)
CELL = (*ROW, "treatment")
# The rows the committed Table 1 must have (experiment=table1), as (quantizer label, bits); each needs its
# "none" and --correction cells. Rows beyond these (other options, other corrections) are shown when run.
TABLE1_ROWS = (("bf16", 16), ("rtn", 2), ("rtn+min_aligned", 2), ("rtn+dither", 2), ("rtn+channel_mean", 2),
               ("rtn", 4), ("quarot+rtn", 2), ("qvg", 2))


def select_runs(runs: pd.DataFrame, group_size: int = 32, corrections: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The runs Table 1 shows: one per (model, row, replicate, treatment)."""
    return choose_runs(runs, group_size, corrections).runs


def choose_runs(runs: pd.DataFrame, group_size: int = 32, corrections: tuple[str, ...] | None = None,
                results_dir: str | Path | None = None) -> Selection:
    """Table 1's runs, all of one context per model, the latest per (row, replicate, treatment); and what was
    left out. ``corrections``: keep only these (None: every correction run)."""
    runs = attach_details(runs, results_dir)
    candidates = table1_candidates(runs, group_size, corrections)
    selection = comparable(candidates, results_dir=results_dir)
    if not selection.runs.empty:
        selection.runs = latest(selection.runs, ("model", "row_id", "replicate", "treatment"))
    return selection


def table1_candidates(runs: pd.DataFrame, group_size: int, corrections: tuple[str, ...] | None) -> pd.DataFrame:
    """BF16 runs and quantized runs of the table's kind (full cache, values like keys, RTN-family group size)."""
    if runs.empty:
        return runs
    runs = runs.copy()
    for col in ("sink_chunks", "window_chunks", "values", "granularity", "group_size", "method"):
        if col not in runs.columns:
            runs[col] = None
    bf16 = runs["quantizer"] == "bf16"
    own_block = runs["method"] == "qvg"  # QVG's residual block is its preset's (published: 64)
    quantized = (~bf16) & (runs["values"] == "same") & (own_block | (runs["group_size"] == group_size))
    if corrections is not None:
        quantized &= runs["correction"].isin(corrections)
    return runs[full_cache(runs) & (bf16 | quantized)]


def _order(row: pd.Series) -> tuple:
    """BF16, then per family (QUANTIZER_ORDER) by bits, the plain grid before its options (GRID_TAG_ORDER)."""
    quantizer = str(row["quantizer"])
    rotated = quantizer.startswith("quarot+")
    base, *tags = quantizer.removeprefix("quarot+").split("+")
    family = QUANTIZER_ORDER.get(("quarot+" if rotated else "") + base, 99)
    return (family, row["bits"] if pd.notna(row["bits"]) else 0, tuple(GRID_TAG_ORDER.get(t, 99) for t in tags),
            str(row["label"]))


def _pooled_median(results_dir: Path | None, run_ids: list[str]) -> float:
    """delta_p_s median over every denoising probe of the pooled runs (NaN when a run has no probes)."""
    if results_dir is None:
        return math.nan
    try:
        return float(denoising_rows(cell_probes(results_dir, run_ids))["delta_p_s"].median())
    except FileNotFoundError:
        return math.nan


def pool_cells(runs: pd.DataFrame, results_dir: Path | None = None) -> pd.DataFrame:
    """One row per cell (model, row, treatment): its runs (one per replicate, ``rows.by_replicate``) pooled.
    Numbers are the runs' values averaged with weights = videos per run (= the mean over all the cell's videos);
    a number missing from any run is missing for the cell, with that run's reason."""
    cells = []
    for _, group in runs.groupby(list(CELL), dropna=False, sort=False):
        group = by_replicate(group)
        first = group.iloc[0].to_dict()
        cell = {k: v for k, v in first.items() if not k.endswith("_missing_reason")}
        weights = group["num_prompts"].astype(float).fillna(1.0).to_numpy()
        for source, name in POOLED.items():
            values = group[source].astype(float) if source in group.columns else pd.Series([math.nan] * len(group))
            cell[name] = float((values.to_numpy() * weights).sum() / weights.sum()) if values.notna().all() \
                else math.nan
        if len(group) > 1 and pd.notna(cell["delta_p_s_median"]):
            cell["delta_p_s_median"] = _pooled_median(results_dir, list(group["run_id"]))
        for col in [c for c in group.columns if c.endswith("_missing_reason")]:
            reasons = group[col].dropna()
            cell[col] = reasons.iloc[0] if len(reasons) else None
        seeds = list(dict.fromkeys(int(s) for s in group["rotation_seed"].dropna()))  # distinct, in order
        cell["rotation_seeds"] = ",".join(str(s) for s in seeds) if seeds else None
        cell["num_runs"] = len(group)
        cell["num_prompts"] = int(group["num_prompts"].fillna(0).sum())
        cell["run_id"] = RUN_SEPARATOR.join(group["run_id"])
        cell["label"] = quantizer_label(cell, len(seeds))
        cells.append(cell)
    return pd.DataFrame(cells)


def long_table(runs: pd.DataFrame, results_dir: Path | None = None) -> pd.DataFrame:
    """The CSV form, one row per cell: required columns first, then each metric's missing reason (empty when
    present)."""
    runs = attach_details(runs)
    if "num_prompts" not in runs.columns:
        runs["num_prompts"] = None
    table = pool_cells(runs, results_dir) if not runs.empty else pd.DataFrame(columns=list(CSV_COLUMNS))
    for col in CSV_COLUMNS:
        if col not in table.columns:
            table[col] = None
    for metric in VIDEO_METRICS:
        reason_col = f"{metric}_missing_reason"
        given = f"{REASON_SOURCE.get(metric, metric)}_missing_reason"
        table[reason_col] = table[given] if given in table.columns else None
        no_value = table[metric].isna()
        table.loc[no_value & table[reason_col].isna(), reason_col] = f"{metric} was not computed for this run"
        table.loc[~no_value, reason_col] = None
        table[reason_col] = table[reason_col].map(lambda r: portable(r) if isinstance(r, str) else r)
    if not table.empty:
        keys = [(str(row["model"]), *_order(row), row["treatment"] != BASELINE, str(row["treatment"]))
                for _, row in table.iterrows()]
        table = table.iloc[sorted(range(len(table)), key=keys.__getitem__)]
    for col in ("bits", "group_size", "num_prompts", "num_runs", "qvg_centroids"):  # integers, empty where n/a
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("Int64")
    reasons = [f"{m}_missing_reason" for m in VIDEO_METRICS]
    extra = [c for c in ("row_id", "probe_steps") if c in table.columns]
    return table[list(CSV_COLUMNS) + reasons + extra].reset_index(drop=True)
