"""Table 1's rows and treatments, read from each run's identity (no list of known quantizers or corrections).

A row is one quantizer of one model: the run's key and value quantizer settings with the rotation seed left
out, so runs over several rotation seeds fall in one row and are pooled. Its label spells out what the
settings are: method, zero point, dither, smoothing, rotation with the number of rotation seeds pooled, QVG's
centroids; bits and group go in their own column. A treatment is what the runs of a row are compared on: the
identity fields of ``jensenkv.tracking.COMPARED`` (correction, strength and any field added there), labelled
"none" for the uncorrected baseline. So a new quantizer option is a new row and a new correction or strength
a new "none -> X" line, with no change here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from jensenkv.quant.config import QuantConfig
from jensenkv.report.intervals import BASELINE
from jensenkv.tracking import COMPARED, ResultsStore, config_hash

DETAIL_COLUMNS = ("row_id", "rotation_seed", "treatment", "zero_point", "dither", "smoothing", "qvg_centroids",
                  "probe_steps")
ZERO_NAMES = {"integer": "integer zero", "min_aligned": "min-aligned zero", "fixed_point": "fixed-point zero"}
SMOOTHING_NAMES = {"channel_mean": "channel-mean smoothing"}


def _key(identity: Mapping[str, Any], name: str) -> QuantConfig | None:
    """The identity's key / value quantizer as a QuantConfig (None when absent or not readable)."""
    values = identity.get(name)
    if not isinstance(values, Mapping):
        return None
    try:
        return QuantConfig.from_dict(values)
    except (TypeError, ValueError):
        return None


def run_details(identity: Mapping[str, Any] | None) -> dict[str, Any]:
    """The DETAIL_COLUMNS of one run from its identity (row id, rotation seed, treatment, grid options)."""
    identity = identity or {}
    key = _key(identity, "key")
    sans_seed = {name: {k: v for k, v in (identity.get(name) or {}).items() if k != "rotation_seed"}
                 for name in ("key", "value")}
    rotated = key is not None and key.rotation != "none"
    quantized = key is not None and key.method != "none"
    return {
        "row_id": config_hash(sans_seed),
        "rotation_seed": int(key.rotation_seed) if rotated else None,
        "treatment": treatment_label({k: identity.get(k) for k in COMPARED}),
        "zero_point": (("symmetric" if key.symmetric else key.zero_convention) if quantized else None),
        "dither": key.dither if quantized else None,
        "smoothing": key.smoothing if quantized else None,
        "qvg_centroids": key.qvg_centroids if quantized and key.method == "qvg" else None,
        "probe_steps": str(identity["probe_steps"]) if identity.get("probe_steps") is not None else None,
    }


def attach_details(runs: pd.DataFrame, results_dir: str | Path | None = None) -> pd.DataFrame:
    """``runs`` (rows of load_results) plus DETAIL_COLUMNS, read from each record's identity when
    ``results_dir`` is given; otherwise (or for columns a caller already set) derived from the label columns."""
    runs = runs.copy()
    if results_dir is not None and not runs.empty:
        store = ResultsStore(results_dir)
        details = pd.DataFrame([run_details(store.read_record(r).get("identity")) for r in runs["run_id"]],
                               index=runs.index)
        for col in DETAIL_COLUMNS:
            runs[col] = details[col]
    for col in ("quantizer", "bits", "group_size", "rotation", "correction", "strength"):
        if col not in runs.columns:
            runs[col] = None
    if "row_id" not in runs.columns:  # label columns only: one row per (quantizer, bits, group, rotation)
        runs["row_id"] = [config_hash([str(r[c]) for c in ("quantizer", "bits", "group_size", "rotation")])
                          for _, r in runs.iterrows()]
    if "treatment" not in runs.columns:
        runs["treatment"] = [treatment_label({k: r.get(k) for k in COMPARED}) for _, r in runs.iterrows()]
    for col in DETAIL_COLUMNS:
        if col not in runs.columns:
            runs[col] = None
    return runs


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def treatment_label(fields: Mapping[str, Any]) -> str:
    """"none" for an uncorrected run; else the correction, then " x<strength>" when a numeric strength is not
    1, ", second order" when that switch is on, then ", <field> <value>" for every other set field (a strength label; a calibration file by its stem, or
    a calibration record by its name, path or digest)."""
    correction = fields.get("correction")
    if not _present(correction) or correction == BASELINE:
        return BASELINE
    label = str(correction)
    for name, value in fields.items():
        if name == "correction" or not _present(value):
            continue
        if isinstance(value, bool):  # a switch (second_order): named when on, absent when off
            label += f", {name.replace('_', ' ')}" if value else ""
            continue
        if name == "strength" and isinstance(value, (int, float)) and not isinstance(value, bool):
            label += "" if float(value) == 1.0 else f" x{float(value):g}"
            continue
        label += f", {name} {_short(value)}"
    return label


def _short(value: Any) -> str:
    """A treatment field in a few characters: a file by its stem, a mapping by its name / path or a digest."""
    if isinstance(value, Mapping):
        named = next((value[k] for k in ("name", "label", "path", "file") if _present(value.get(k))), None)
        return _short(named) if named is not None else config_hash(dict(value), 6)
    if isinstance(value, str) and ("/" in value or value.endswith((".json", ".pt", ".safetensors", ".yaml"))):
        return Path(value).stem
    return str(value)


def quantizer_label(row: Mapping[str, Any], rotation_seeds: int = 0) -> str:
    """The row's quantizer in words from its columns (quantizer label, zero point, dither, smoothing, QVG
    centroids, rotation), e.g. "QuaRot (3 rotation seeds) + RTN, integer zero" or "RTN, min-aligned zero,
    subtractive dither"."""
    quantizer = str(row.get("quantizer") or "")
    if quantizer == "bf16":
        return "BF16"
    base = quantizer.removeprefix("quarot+").split("+")[0]
    name = {"rtn": "RTN", "kivi": "KIVI", "qvg": "QVG", "qvg_pro": "QVG-Pro", "qvg_rtn": "QVG (RTN residual)"}
    parts = [name.get(base, base)]
    if _present(row.get("qvg_centroids")):
        parts.append(f"{int(row['qvg_centroids'])} centroids")
    zero = row.get("zero_point")
    if _present(zero):
        parts.append(ZERO_NAMES.get(zero, str(zero)) if zero != "symmetric" else "symmetric")
    if _present(row.get("dither")) and row["dither"] != "none":
        parts.append(f"{row['dither']} dither")
    if _present(row.get("smoothing")) and row["smoothing"] != "none":
        parts.append(SMOOTHING_NAMES.get(row["smoothing"], f"{row['smoothing']} smoothing"))
    if not _present(zero):  # label columns only: the quantizer label's tags
        parts += quantizer.removeprefix("quarot+").split("+")[1:]
    label = ", ".join(parts)
    if quantizer.startswith("quarot+") or row.get("rotation") == "hadamard":
        seeds = f" ({rotation_seeds} rotation seed{'s' if rotation_seeds != 1 else ''})" if rotation_seeds else ""
        label = f"QuaRot{seeds} + {label}"
    return label


def bits_label(row: Mapping[str, Any]) -> str:
    if row.get("quantizer") == "bf16":
        return "BF16"
    return f"INT{int(row['bits'])} g{int(row['group_size'])}"
