"""The report's rows, treatments and videos, read from each run's identity: the one place that says which runs
are pooled, how a video is named and in which order the tables list things (no list of known quantizers or
corrections).

A row is one quantizer of one model: the run's key and value quantizer settings (``store_frame.QUANTIZER``) with
every seed field (``*_seed``: rotation, dither, k-means seeds) left out. Runs of one row and treatment that
differ only in seeds are its replicates and are pooled: each (prompt, seed, replicate) is one video
(VIDEO_KEYS), a treated video pairs with the uncorrected video of the same key, and where two rows are compared
(the claims' INT2 vs INT4) each row's replicates are first averaged per (prompt, seed). A treatment is what the
runs of a row are compared on: the identity fields of ``jensenkv.report.store_frame.COMPARED`` (correction, strength and
any field added there), labelled "none" for the uncorrected baseline. The row's label spells out its settings:
method, zero point, dither, smoothing, rotation with the number of rotation seeds pooled, QVG's centroids; bits
and group go in their own column. So a new quantizer option is a new row and a new correction or strength a new
"none -> X" line, with no change here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from jensenkv.quant.config import QuantConfig
from jensenkv.hashing import config_hash
from jensenkv.report.store_frame import COMPARED, QUANTIZER
from jensenkv.store.results import ResultsStore

BASELINE = "none"  # the treatment every other one is paired against
DETAIL_COLUMNS = ("row_id", "replicate", "rotation_seed", "treatment", "zero_point", "dither", "smoothing",
                  "qvg_centroids", "probe_steps", "tags")
VIDEO_KEYS = ("prompt", "seed", "replicate")  # one video of a row (records' per-video rows)
PROBE_VIDEO_KEYS = ("run_id", "prompt_index", "seed")  # the same video in a probe table: one run per replicate
VIDEO_METRICS = ("psnr", "ssim", "lpips", "vbench", "content", "delta_p_s", "delta_p_s_abs")  # per-video values
# the per-video name of a metric in the records: dP_S is the mean over the video's probes (every layer, chunk,
# branch and probed step); delta_p_s_abs is the mean of |dP_S| over the same probes (opposite-sign layers do not
# cancel)
PER_VIDEO_KEYS = {"delta_p_s": "delta_p_s_mean", "delta_p_s_abs": "delta_p_s_abs_mean"}
REASON_SOURCE = {"delta_p_s": "attention", "delta_p_s_abs": "attention"}  # whose <key>_missing_reason says why
RUN_SEPARATOR = ";"  # a pooled cell's run ids, joined
QUANTIZER_ORDER = {"bf16": 0, "rtn": 1, "kivi": 2, "quarot+rtn": 3, "quarot+kivi": 4, "qvg": 5, "quarot+qvg": 6,
                   "qvg_pro": 7, "qvg_rtn": 8}  # the tables' order of quantizer families
ZERO_NAMES = {"integer": "integer zero", "min_aligned": "min-aligned zero", "fixed_point": "fixed-point zero"}
SMOOTHING_NAMES = {"channel_mean": "channel-mean smoothing"}


def present(value: Any) -> bool:
    """Whether a cell holds a value (not None, NaN or pd.NA)."""
    return not (value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)))


def quantizer_fields(identity: Mapping[str, Any]) -> tuple[dict, dict]:
    """(the key / value settings without their seed fields, as {"key.bits": 2, ...}; the seed fields): the
    first names the row, the second the replicate."""
    flat = {f"{name}.{k}": v for name in QUANTIZER for k, v in (identity.get(name) or {}).items()}
    seeds = {k: v for k, v in flat.items() if k.endswith("_seed")}
    return {k: v for k, v in flat.items() if k not in seeds}, seeds


def _key(identity: Mapping[str, Any], name: str) -> QuantConfig | None:
    """The identity's key / value quantizer as a QuantConfig (None when absent or not readable)."""
    values = identity.get(name)
    if not isinstance(values, Mapping):
        return None
    known = {f.name for f in fields(QuantConfig)}  # a record may carry more (e.g. an older schema's label)
    try:
        return QuantConfig.from_dict({k: v for k, v in values.items() if k in known})
    except (TypeError, ValueError):
        return None


def setting_tags(identity: Mapping[str, Any] | None) -> frozenset[str]:
    """The key quantizer's settings as words (what a verdict may say rows share), read from the identity's
    settings, never from a label: method, width, group, zero point in effect (dither implies min-aligned),
    dither, smoothing, rotation, QVG centroids."""
    key = _key(identity or {}, "key")
    if key is None:
        return frozenset()
    if key.method == "none":
        return frozenset({"full precision"})
    tags = {key.method.upper(), f"INT{key.bits}", f"g{key.group_size}",
            "symmetric" if key.symmetric else ZERO_NAMES.get(key.zero_convention, f"{key.zero_convention} zero")}
    if key.dither != "none":
        tags.add(f"{key.dither} dither")
    if key.smoothing != "none":
        tags.add(SMOOTHING_NAMES.get(key.smoothing, f"{key.smoothing} smoothing"))
    tags.add(f"{key.rotation} rotation" if key.rotation != "none" else "no rotation")
    if key.method == "qvg":
        tags.add(f"{key.qvg_centroids} centroids")
    return frozenset(tags)


def run_details(identity: Mapping[str, Any] | None) -> dict[str, Any]:
    """The DETAIL_COLUMNS of one run from its identity (row id, replicate, rotation seed, treatment, grid options)."""
    identity = identity or {}
    key = _key(identity, "key")
    setting, seeds = quantizer_fields(identity)
    rotated = key is not None and key.rotation != "none"
    quantized = key is not None and key.method != "none"
    return {
        "row_id": config_hash(setting),
        "replicate": config_hash(seeds),
        "rotation_seed": int(key.rotation_seed) if rotated else None,
        "treatment": treatment_label({k: identity.get(k) for k in COMPARED}),
        "zero_point": (("symmetric" if key.symmetric else key.zero_convention) if quantized else None),
        "dither": key.dither if quantized else None,
        "smoothing": key.smoothing if quantized else None,
        "qvg_centroids": key.qvg_centroids if quantized and key.method == "qvg" else None,
        "probe_steps": _probe_steps(identity),
        "tags": setting_tags(identity),
    }


def _probe_steps(identity: dict) -> str | None:
    """The denoising steps a run probed: "[0, 9]", "all", or None (no probes); with the diagnostics' own steps."""
    if "attention" not in (identity.get("metrics") or ()):
        return None
    steps = identity.get("probe_steps")
    text = "all" if steps is None else str(steps)
    diagnosed = identity.get("diagnostic_steps")
    return text if diagnosed is None or not identity.get("diagnostics") else f"{text}; diagnostics {diagnosed}"


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


def treatment_label(fields: Mapping[str, Any]) -> str:
    """"none" for an uncorrected run; else the correction, then " x<strength>" when a numeric strength is not
    1, ", second order" when that switch is on, then ", <field> <value>" for every other set field (a strength
    label; a calibration file by its stem, or a calibration record by its name, path or digest)."""
    correction = fields.get("correction")
    if not present(correction) or correction == BASELINE:
        return BASELINE
    label = str(correction)
    for name, value in fields.items():
        if name == "correction" or not present(value):
            continue
        if isinstance(value, bool):  # a switch (second_order): named when on, absent when off
            label += f", {name.replace('_', ' ')}" if value else ""
            continue
        if name == "strength" and isinstance(value, (int, float)):  # (a bool is a switch, handled above)
            label += "" if float(value) == 1.0 else f" x{float(value):g}"
            continue
        label += f", {name} {_short(value)}"
    return label


def _short(value: Any) -> str:
    """A treatment field in a few characters: a file by its stem, a mapping by its name / path or a digest."""
    if isinstance(value, Mapping):
        named = next((value[k] for k in ("name", "label", "path", "file") if present(value.get(k))), None)
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
    if present(row.get("qvg_centroids")):
        parts.append(f"{int(row['qvg_centroids'])} centroids")
    zero = row.get("zero_point")
    if present(zero):
        parts.append(ZERO_NAMES.get(zero, str(zero)) if zero != "symmetric" else "symmetric")
    if present(row.get("dither")) and row["dither"] != "none":
        parts.append(f"{row['dither']} dither")
    if present(row.get("smoothing")) and row["smoothing"] != "none":
        parts.append(SMOOTHING_NAMES.get(row["smoothing"], f"{row['smoothing']} smoothing"))
    if not present(zero):  # label columns only: the quantizer label's tags
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


def run_ids_of(cell_run_id: str) -> list[str]:
    """The run ids of one cell (one, or several pooled ones joined by RUN_SEPARATOR)."""
    return [r for r in str(cell_run_id).split(RUN_SEPARATOR) if r]


def by_replicate(runs: pd.DataFrame) -> pd.DataFrame:
    """The replicates of a cell in the one order every table lists, pools and bootstraps them in: by rotation
    seed (unrotated first), then by ``replicate`` (a digest of the seed fields: fixed, if arbitrary)."""
    return runs.sort_values(["rotation_seed", "replicate"], na_position="first", kind="stable")


def per_prompt_seed(values: pd.Series) -> pd.Series:
    """Per-video values (indexed by VIDEO_KEYS) with a row's replicates averaged: one value per (prompt, seed),
    what a comparison between two rows pairs (their replicates need not match)."""
    return values.groupby(level=["prompt", "seed"]).mean() if len(values) else values


CLUSTER = "prompt"  # the independent unit of every interval and test: videos of one prompt share its content


def cluster_means(values: pd.Series, prompt: str = CLUSTER, seed: str = "seed") -> pd.Series:
    """The one clustering rule of every table, claim, diagnostic and figure: per-video values (indexed by
    VIDEO_KEYS, or by (prompt, seed)) averaged over replicates within each (prompt, seed), then over seeds
    within each prompt: one value per prompt (the cluster), the unit every interval and sign flip runs over
    (jensenkv.eval.stats). Seeds and replicates are nested in their prompt, never counted as independent.
    ``prompt`` / ``seed``: the index levels that name them (a probe table: "prompt_index"; its replicate level
    is the run id)."""
    if not len(values):
        return values
    per_seed = values.groupby(level=[prompt, seed], sort=True).mean()
    return per_seed.groupby(level=prompt, sort=True).mean()


def full_cache(runs: pd.DataFrame) -> pd.Series:
    """Runs that keep every chunk (no attention sinks, no window): the only kind Table 1 and the figures show."""
    return (runs["sink_chunks"].fillna(0) == 0) & runs["window_chunks"].isna()


def video_metrics(results_dir: str | Path, run_ids) -> pd.DataFrame:
    """One row per (run, prompt, seed): run_id, VIDEO_KEYS and the per-video value of every VIDEO_METRICS metric
    present. ``run_ids`` may hold pooled cells' joined ids.

    VBench's per-video score is the mean x100 of the dimensions scored for that video, as the run-level one."""
    store = ResultsStore(results_dir)
    rows = []
    for run_id in dict.fromkeys(r for cell in run_ids for r in run_ids_of(cell)):
        record = store.read_record(run_id)
        replicate = config_hash(quantizer_fields(record.get("identity") or {})[1])
        for video in record.get("per_prompt", []):
            metrics = video.get("metrics", {})
            row = {"run_id": run_id, "prompt": video["prompt"], "seed": int(video["seed"]), "replicate": replicate}
            for metric in VIDEO_METRICS:
                value = metrics.get(PER_VIDEO_KEYS.get(metric, metric))
                if value is not None:
                    row[metric] = float(value)
            dims = [v for k, v in metrics.items() if k.startswith("vbench_") and v is not None]
            if dims and "vbench" not in row:
                row["vbench"] = 100.0 * sum(dims) / len(dims)
            rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["run_id", *VIDEO_KEYS, *VIDEO_METRICS])
