"""The options in a results store as rows x variants, with per-video values: what the claims report compares.

Runs come from one context per model (``jensenkv.report.selection.comparable``: same prompts, seeds, model
settings and weights) and carry the rows of ``jensenkv.report.rows``, Table 1's: a row is one quantizer setting
(``row_id``), and its runs that differ only in seed fields are replicates, pooled (each (prompt, seed,
replicate) is one video). Rows and variants are named from the records' labels, so a new option shows up
without code changes:

- a **row** is named like "quarot+rtn INT2 g32" from the labels that describe the cache (``ROW_LABELS``); a label
  whose value differs from the store's usual one is appended as "key=value", and rows that the labels do not
  tell apart get the differing quantizer fields ("qvg INT2 g32 key.qvg_centroids=16");
- a **variant** is what is done at attention time: every other label (correction, strength, and whatever an
  option adds, e.g. a calibration label), named by the correction plus "key=value" for each such label that
  differs from its usual value.

One run per (row, replicate, variant), the latest; a cell lists its replicates in Table 1's order
(``rows.by_replicate``), so both pool the same videos in the same order. Paired differences pair a
corrected video with the uncorrected one of the same replicate, prompt and seed; a difference between rows
(INT2 vs INT4) first averages each row's replicates per (prompt, seed) (``rows.per_prompt_seed``). Intervals and
tests then run over prompts (``rows.cluster_means``, ``report.intervals``), as Table 1's do.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import Interval, PairedDifference
from jensenkv.report.intervals import cell_interval, cluster_differences, paired, shift
from jensenkv.report.rows import (QUANTIZER_ORDER, REASON_SOURCE, VIDEO_KEYS, attach_details, by_replicate,
                                  cluster_means, per_prompt_seed, present, quantizer_fields, video_metrics)
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.report.store_frame import load_results
from jensenkv.store.results import ResultsStore

# Labels that say what is stored in the cache; every other label is a variant of attention-time handling.
ROW_LABELS = ("model", "quantizer", "method", "bits", "group_size", "granularity", "rotation", "values",
              "sink_chunks", "window_chunks")
NAMED_IN_ROW = ("model", "quantizer", "method", "bits", "group_size", "rotation")  # always part of the name


def label_keys(results_dir: str | Path) -> list[str]:
    """Every label key the store's records carry, in first-seen order."""
    keys: dict[str, None] = {}
    for record in ResultsStore(results_dir).iter_records():
        keys.update(dict.fromkeys(record.get("labels", {})))
    return list(keys)


def _usual(runs: pd.DataFrame, col: str):
    """The most common value of a column, absent (None) counting as a value: a label only some records carry
    (a new option) then differs from the usual absence."""
    values = [v if present(v) else None for v in runs[col]]
    return Counter(values).most_common(1)[0][0] if values else None


def _same(a, b) -> bool:
    return (not present(a) and not present(b)) or (present(a) and present(b) and a == b)


def _fmt_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else str(value)
    return str(value) if present(value) else "null"


def name_rows(runs: pd.DataFrame, variant_keys: list[str]) -> pd.DataFrame:
    """``runs`` plus the columns row, variant and tags (the row's, a frozenset for ``verdicts.summarize``)."""
    runs = runs.copy()
    for col in (*ROW_LABELS, *variant_keys):
        if col not in runs.columns:
            runs[col] = None
    extra_row = [c for c in ROW_LABELS if c not in NAMED_IN_ROW]
    usual = {c: _usual(runs, c) for c in (*extra_row, *variant_keys)}
    names, variants, tags = [], [], []
    for _, r in runs.iterrows():
        if r["quantizer"] == "bf16":
            name = "bf16"
        else:
            name = f"{r['quantizer']} INT{_fmt_value(r['bits'])} g{_fmt_value(r['group_size'])}"
            for col in extra_row:
                if not _same(r[col], usual[col]):
                    name += f" {col}={_fmt_value(r[col])}"
        variant = str(r.get("correction") or "none")
        for col in variant_keys:
            if col != "correction" and not _same(r[col], usual[col]) and variant != "none":
                variant += f" {col}={_fmt_value(r[col])}"
        names.append(name)
        variants.append(variant)
        settings = r.get("tags")  # rows.setting_tags: from the identity's settings (never from the labels)
        tags.append(settings if isinstance(settings, frozenset) else frozenset())
    runs["row"], runs["variant"], runs["tags"] = names, variants, tags
    return runs


def row_order(runs: pd.DataFrame) -> list[str]:
    """Row names in the tables' order: BF16, RTN, KIVI, QuaRot, QVG (then others), by bits and group size."""
    def key(r):
        base = str(r["quantizer"]).split("+dither")[0]
        order = QUANTIZER_ORDER.get(base, QUANTIZER_ORDER.get(str(r["quantizer"]).split("+")[0], 99))
        bits = int(r["bits"]) if present(r["bits"]) else -1
        group = int(r["group_size"]) if present(r["group_size"]) else -1
        return (order, str(r["quantizer"]), bits, group, r["row"])

    first = runs.drop_duplicates("row")
    return [r["row"] for _, r in sorted(first.iterrows(), key=lambda item: key(item[1]))]


def variant_order(variants) -> list[str]:
    """"none" first, then the paper's corrections, then the rest alphabetically."""
    rank = {"none": 0, "taylor": 1, "exact": 2}
    return sorted(dict.fromkeys(variants), key=lambda v: (rank.get(v.split(" ")[0], 3), v))


@dataclass
class Options:
    """One model's runs of one context as rows x variants, with every video's metrics."""

    results_dir: Path
    model: str
    runs: pd.DataFrame  # one run per (row, replicate, variant): load_results + rows.DETAIL_COLUMNS + row, variant, tags
    videos: pd.DataFrame  # one row per (run, prompt, seed): rows.VIDEO_KEYS, metrics, row, variant
    selection: Selection
    variant_keys: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[str]:
        return row_order(self.runs)

    def variants(self, row: str) -> list[str]:
        return variant_order(self.runs.loc[self.runs["row"] == row, "variant"])

    def members(self, row: str, variant: str) -> pd.DataFrame:
        """The runs of one cell (several when replicates, runs differing only in seed fields, are pooled)."""
        return self.runs[(self.runs["row"] == row) & (self.runs["variant"] == variant)]

    def first(self, row: str, column: str):
        """A row's run-level value of ``column`` (equal across its runs, e.g. bits, effective_bits)."""
        values = [v for v in self.runs.loc[self.runs["row"] == row, column] if present(v)] \
            if column in self.runs.columns else []
        return values[0] if values else None

    def values(self, row: str, variant: str, metric: str) -> pd.Series:
        """Per-video values of one cell, indexed by VIDEO_KEYS (prompt, seed, replicate); NaN-free."""
        part = self.videos[(self.videos["row"] == row) & (self.videos["variant"] == variant)]
        if metric not in part.columns:
            return pd.Series(dtype=float)
        return part.set_index(list(VIDEO_KEYS))[metric].dropna().astype(float)

    def interval(self, row: str, variant: str, metric: str) -> Interval:
        """The cell's mean with its interval over prompts (replicates and seeds averaged within a prompt)."""
        return cell_interval(self.values(row, variant, metric))

    def shift(self, row: str, variant: str, metric: str) -> PairedDifference:
        """The cell's mean against 0, tested over prompts (sign flip) with its power."""
        return shift(self.values(row, variant, metric))

    def paired(self, row: str, variant: str, metric: str, base: str = "none") -> PairedDifference:
        """variant - base within one row, paired by prompt, seed and replicate."""
        return paired(self.values(row, variant, metric), self.values(row, base, metric))

    def across(self, row: str, variant: str, ref_row: str, ref_variant: str, metric: str) -> PairedDifference:
        """(row, variant) - (ref_row, ref_variant), each with its replicates averaged per (prompt, seed)
        (``rows.per_prompt_seed``), paired by prompt and seed (one context: both rows share them)."""
        return paired(per_prompt_seed(self.values(row, variant, metric)),
                      per_prompt_seed(self.values(ref_row, ref_variant, metric)))

    def clusters(self, row: str, variant: str, metric: str) -> pd.Series:
        """The cell's per-prompt means (``rows.cluster_means``): what its interval and tests run over."""
        return cluster_means(self.values(row, variant, metric))

    def paired_clusters(self, row: str, variant: str, metric: str, base: str = "none") -> pd.Series:
        """Per-prompt means of variant - base (paired per video first), as ``paired`` tests them."""
        return cluster_differences(self.values(row, variant, metric), self.values(row, base, metric))

    def across_clusters(self, row: str, variant: str, ref_row: str, ref_variant: str, metric: str) -> pd.Series:
        """Per-prompt means of (row, variant) - (ref_row, ref_variant), as ``across`` tests them."""
        return cluster_differences(per_prompt_seed(self.values(row, variant, metric)),
                                   per_prompt_seed(self.values(ref_row, ref_variant, metric)))

    def missing_reason(self, row: str, variant: str, metric: str) -> str:
        """Why a cell has no values of ``metric``: the run's recorded reason, or what is absent."""
        runs = self.members(row, variant)
        if runs.empty:
            return f"no {variant} run of {row}"
        col = f"{REASON_SOURCE.get(metric, metric)}_missing_reason"
        if col in runs.columns:
            reasons = [str(r) for r in runs[col] if present(r)]
            if reasons:
                return reasons[0]
        n = len(self.values(row, variant, metric))
        ids = ", ".join(runs["run_id"])
        if n == 1:
            return f"only 1 video with {metric} in run {ids}: no interval"
        return f"no per-video {metric} in run {ids}"

    def pooled_note(self, row: str, variant: str) -> str:
        """"" or e.g. "2 seeds pooled" when several replicates form one cell."""
        n = self.members(row, variant)["replicate"].nunique()
        return f"{n} seeds pooled" if n > 1 else ""


def load_options(results_dir: str | Path = "results", model: str | None = None) -> dict[str, Options]:
    """{model: Options} for every model in the store (or only ``model``, matched against its label)."""
    results_dir = Path(results_dir)
    runs = load_results(results_dir)
    if runs.empty:
        return {}
    if model is not None:
        if "model" not in runs.columns or model not in set(runs["model"]):
            known = sorted(set(runs["model"].dropna())) if "model" in runs.columns else []
            raise ValueError(f"--model={model!r} is not allowed: the store has runs of {known}")
        runs = runs[runs["model"] == model]
    out = {}
    for name, part in runs.groupby("model", sort=True):
        out[str(name)] = build_options(results_dir, str(name), comparable(part, results_dir=results_dir))
    return out


def build_options(results_dir: str | Path, model: str, selection: Selection) -> Options:
    """Options of the runs a selection chose (one context of one model), on the rows of ``report.rows``."""
    results_dir = Path(results_dir)
    variant_keys = [k for k in label_keys(results_dir) if k not in ROW_LABELS]
    if "correction" not in variant_keys:
        variant_keys.insert(0, "correction")
    chosen = name_rows(attach_details(selection.runs, results_dir), variant_keys)
    chosen = _name_settings(by_replicate(latest(chosen, ("row_id", "replicate", "variant"))), results_dir)
    videos = video_metrics(results_dir, chosen["run_id"])
    if not videos.empty:
        videos = videos.merge(chosen[["run_id", "row", "variant"]], on="run_id", how="left")
    return Options(results_dir, model, chosen.reset_index(drop=True), videos, selection, variant_keys)


def _name_settings(runs: pd.DataFrame, results_dir: Path) -> pd.DataFrame:
    """Give a row name that covers several rows (``row_id``: quantizer settings the labels do not tell apart)
    one name per row, by the quantizer fields that differ ("qvg INT2 g32 key.qvg_centroids=16")."""
    store = ResultsStore(results_dir)
    names = runs["row"].copy()
    for row, part in runs.groupby("row", sort=False):
        if part["row_id"].nunique() < 2:
            continue
        settings = {i: quantizer_fields(store.read_record(r).get("identity") or {})[0]
                    for i, r in zip(part.index, part["run_id"])}
        fields = sorted({k for a in settings.values() for k in a
                         if any(not _same(a.get(k), b.get(k)) for b in settings.values())})
        for i, setting in settings.items():
            names[i] = row + " " + " ".join(f"{k}={_fmt_value(setting.get(k))}" for k in fields)
    return runs.assign(row=names)
