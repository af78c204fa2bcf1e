"""Table 1's attention probes per layer: for each cell (row x treatment), the mean over its denoising probes of
P_S, its shift and the error-model diagnostics (em_*), layer by layer, from the runs' attention.csv.

Written next to Table 1 as ``table1_layers.csv`` (one row per cell and layer), for notebooks and users; the
claims report computes its per-layer readings, with intervals over videos, itself (``report.diagnostics``).
Pooled cells average over all their runs' probes.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from jensenkv.eval.attention import SUMMARY_KEYS, denoising_rows
from jensenkv.report.intervals import run_ids_of
from jensenkv.tracking import load_attention

CELL_COLUMNS = ("model", "quantizer", "label", "bits", "group_size", "rotation_seeds", "treatment", "run_id")


def layer_means(table: pd.DataFrame, results_dir: str | Path) -> pd.DataFrame:
    """One row per (cell of ``table``, layer): CELL_COLUMNS, ``layer``, ``num_probes`` and the mean of every
    SUMMARY_KEYS column the probes have. Cells without probes (BF16, runs without attention) are skipped."""
    rows = []
    for _, cell in table.iterrows():
        try:
            probes = pd.concat([denoising_rows(load_attention(results_dir, r)) for r in run_ids_of(cell["run_id"])])
        except FileNotFoundError:
            continue
        keys = [k for k in SUMMARY_KEYS if k in probes.columns]
        means = probes.groupby("layer")[keys].mean()
        counts = probes.groupby("layer").size()
        for layer, values in means.iterrows():
            rows.append({**{c: cell.get(c) for c in CELL_COLUMNS}, "layer": int(layer),
                         "num_probes": int(counts[layer]), **values.to_dict()})
    return pd.DataFrame(rows, columns=[*CELL_COLUMNS, "layer", "num_probes"]) if not rows else pd.DataFrame(rows)
