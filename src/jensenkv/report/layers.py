"""Attention probes per layer: the one implementation of "mean over a cell's denoising probes, layer by layer"
(``probe_layer_means``), used for Table 1's ``table1_layers.csv`` (``layer_means``: every cell, every probe key,
for notebooks and users) and for the claims' per-layer error-model readings (``report.diagnostics.per_layer``,
which adds intervals over videos). Pooled cells average over all their replicates' probes.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from jensenkv.eval.attention import SUMMARY_KEYS, denoising_rows
from jensenkv.report.rows import run_ids_of
from jensenkv.report.store_frame import load_attention

CELL_COLUMNS = ("model", "quantizer", "label", "bits", "group_size", "rotation_seeds", "treatment", "run_id")


def cell_probes(results_dir: str | Path, run_ids) -> pd.DataFrame:
    """The probe tables (``load_attention``) of a cell's runs, one after the other, each row with its run_id;
    FileNotFoundError when a run has none."""
    return pd.concat([load_attention(results_dir, r).assign(run_id=r) for r in run_ids], ignore_index=True)


def probe_layer_means(probes: pd.DataFrame, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Probes -> one row per layer (the index): ``num_probes`` (denoising probes) and the mean over them of every
    SUMMARY_KEYS (then ``extra``) column the probes have."""
    rows = denoising_rows(probes)
    keys = [k for k in (*SUMMARY_KEYS, *extra) if k in rows.columns]
    means = rows.groupby("layer")[keys].mean()
    means.insert(0, "num_probes", rows.groupby("layer").size())
    return means


def layer_means(table: pd.DataFrame, results_dir: str | Path) -> pd.DataFrame:
    """One row per (cell of ``table``, layer): CELL_COLUMNS, ``layer`` and ``probe_layer_means``. Cells without
    probes (BF16, runs without attention) are skipped."""
    rows = []
    for _, cell in table.iterrows():
        try:
            means = probe_layer_means(cell_probes(results_dir, run_ids_of(cell["run_id"])))
        except FileNotFoundError:
            continue
        for layer, values in means.iterrows():  # (num_probes, keys...) as floats: num_probes back to int
            rows.append({**{c: cell.get(c) for c in CELL_COLUMNS}, "layer": int(layer), **values.to_dict(),
                         "num_probes": int(values["num_probes"])})
    return pd.DataFrame(rows, columns=[*CELL_COLUMNS, "layer", "num_probes"]) if not rows else pd.DataFrame(rows)
