"""Table 1 built from a results store: the ``Table1`` (long table, paper layout, notes, selection), what keeps
it from being complete (``table1_gaps``, ``missing_rows``) and the per-video table every cell is computed from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jensenkv.report.intervals import add_intervals
from jensenkv.report.rows import BASELINE, VIDEO_METRICS, bits_label, run_ids_of, video_metrics
from jensenkv.report.selection import Selection
from jensenkv.report.store_frame import load_results
from jensenkv.report.table1_cells import ROW, TABLE1_ROWS, choose_runs, long_table
from jensenkv.report.table1_format import measurement_notes, missing_notes, paper_table


@dataclass
class Table1:
    """Table 1 built from a results store: the long table, the paper layout, notes and provenance."""

    table: pd.DataFrame
    paper: pd.DataFrame
    notes: list[str]
    selection: Selection
    correction: str
    missing_rows: list[str] = field(default_factory=list)
    videos: pd.DataFrame = field(default_factory=pd.DataFrame)  # per_video_table: what every cell is computed from

    @property
    def complete(self) -> bool:
        return not self.missing_rows

    def describe(self) -> str:
        """What each row compares and from which runs; what was left out; what is missing."""
        lines = [f"Table 1 compares runs over {self.selection.context_desc}:"]
        for _, rows in (self.table.groupby(list(ROW), dropna=False, sort=False) if len(self.table) else ()):
            first = rows.iloc[0]
            name = f"{first['model']} {first['label']}"
            by_treatment = dict(zip(rows["treatment"], rows["run_id"]))
            if first["quantizer"] == "bf16":
                lines.append(f"  {name}: run {by_treatment.get(BASELINE)}")
                continue
            base = f"none (run {by_treatment.get(BASELINE, 'missing')})"
            treated = [f"{t} (run {r})" for t, r in by_treatment.items() if t != BASELINE] or ["nothing"]
            lines.append(f"  {name} {bits_label(first)}: {base} -> " + "; ".join(treated))
        if self.selection.left_out:
            lines.append(f"left out ({self.selection.num_left_out} runs of another context, never mixed in; what "
                         "differs from the runs above):")
            lines += [f"  {line}" for line in self.selection.left_out]
        if self.missing_rows:
            lines.append("incomplete, missing: " + "; ".join(self.missing_rows))
        return "\n".join(lines)


def table1_gaps(table: pd.DataFrame, correction: str, runs: pd.DataFrame | None = None) -> list[str]:
    """What keeps the table from being complete: TABLE1_ROWS rows (per model) without a run or without their
    "none" / ``correction`` cell; treated runs (per replicate) without their uncorrected twin in ``runs``."""
    if table.empty:
        return ["every row (no runs)"]
    gaps = []
    for model in sorted(table["model"].dropna().unique()):
        part = table[table["model"] == model]
        for quantizer, bits in TABLE1_ROWS:
            rows = part[(part["quantizer"] == quantizer) & (part["bits"] == bits)]
            label = f"{model} {quantizer}" + ("" if quantizer == "bf16" else f" INT{bits}")
            wanted = (BASELINE,) if quantizer == "bf16" else (BASELINE, correction)
            lacking = [c for c in wanted if c not in set(rows["treatment"])]
            if len(lacking) == len(wanted):
                gaps.append(f"{label} (no run)")
            elif lacking:
                gaps.append(f"{label} ({', '.join(lacking)} run)")
    if runs is not None and not runs.empty:
        twin = ["model", "row_id", "replicate"]
        baselines = set(map(tuple, runs.loc[runs["treatment"] == BASELINE, twin].itertuples(index=False)))
        for _, run in runs[(runs["treatment"] != BASELINE) & (runs["quantizer"] != "bf16")].iterrows():
            if tuple(run[twin]) not in baselines:
                seed = f" rotation seed {int(run['rotation_seed'])}" if pd.notna(run["rotation_seed"]) else ""
                gaps.append(f"{run['model']} {run['quantizer']} INT{run['bits']}{seed}: no uncorrected twin of "
                            f"{run['treatment']} run {run['run_id']}")
    return gaps


def missing_rows(results_dir: str | Path, group_size: int = 32, correction: str = "taylor",
                 model: str | None = None) -> list[str]:
    """What keeps the store's Table 1 (of ``model``; None: every model) from being complete (``table1_gaps``),
    without building the table."""
    runs = load_results(results_dir)
    if model is not None and not runs.empty:
        runs = runs[runs["model"] == model]
    if runs.empty:
        return ["every row (no runs)"]
    selection = choose_runs(runs, group_size, None, results_dir)
    return table1_gaps(long_table(selection.runs, Path(results_dir)), correction, selection.runs)


def build_table1(results_dir: str | Path = "results", group_size: int = 32, correction: str = "taylor") -> Table1:
    results_dir = Path(results_dir)
    runs = load_results(results_dir)
    if runs.empty:
        raise FileNotFoundError(f"no finished runs under {results_dir / 'runs'}: run "
                                "`python -m jensenkv.run -m experiment=table1` first")
    selection = choose_runs(runs, group_size, None, results_dir)
    table = long_table(selection.runs, results_dir)
    videos = video_metrics(results_dir, table["run_id"])
    table = add_intervals(table, videos, ROW, BASELINE)
    notes = measurement_notes(table) + missing_notes(table)
    return Table1(table, paper_table(table), notes, selection, correction,
                  table1_gaps(table, correction, selection.runs), per_video_table(table, videos, selection.runs))


VIDEO_COLUMNS = ("model", "label", "bits", "treatment", "run_id", "prompt", "seed", "replicate", "rotation_seed",
                 *VIDEO_METRICS)


def per_video_table(table: pd.DataFrame, videos: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """table1_videos.csv: one row per (run, prompt, seed, replicate) of every cell of ``table`` with every
    per-video metric, in the table's order: anyone can recompute a cell (its mean, its prompt means, its
    paired difference) from it. ``replicate`` is the digest of the run's seed fields (rotation, dither, ...)."""
    per_run = pd.DataFrame([{"run_id": run_id, "cell": cell, "model": row["model"], "label": row["label"],
                             "bits": bits_label(row), "treatment": row["treatment"]}
                            for cell, (_, row) in enumerate(table.iterrows()) for run_id in run_ids_of(row["run_id"])])
    if videos.empty or per_run.empty:
        return pd.DataFrame(columns=list(VIDEO_COLUMNS))
    seeds = runs.drop_duplicates("run_id").set_index("run_id")["rotation_seed"] if "rotation_seed" in runs else {}
    out = videos.merge(per_run, on="run_id", how="inner")
    out["rotation_seed"] = pd.to_numeric(out["run_id"].map(seeds), errors="coerce").astype("Int64")
    for col in VIDEO_COLUMNS:
        if col not in out.columns:
            out[col] = math.nan
    out = out.sort_values(["cell", "prompt", "seed", "rotation_seed", "replicate"], kind="stable")
    return out[list(VIDEO_COLUMNS)].reset_index(drop=True)
