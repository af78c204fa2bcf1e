"""The options in a results store as rows x variants, with per-video values: what the claims report compares.

Rows and variants come from the records' labels, so a new option shows up without code changes:

- a **row** is one quantizer option: the labels that describe the cache (quantizer label, bits, group size,
  values, sinks, window, ...: ``ROW_LABELS``), named like "quarot+rtn INT2 g32"; a label whose value differs
  from the store's usual one is appended as "key=value";
- a **variant** is what is done at attention time: every other label (correction, strength, and whatever an
  option adds, e.g. a calibration label), named by the correction plus "key=value" for each such label that
  differs from its usual value.

Runs come from one context per model (``jensenkv.report.selection.comparable``: same prompts, seeds, model
settings and weights); one run per (setting, variant), the latest. Runs of one row and variant whose identities
differ only in fields named *_seed (QuaRot rotation seeds, dither seeds) are pooled as its "members": each
(member, prompt, seed) is one video; runs differing in anything else get distinct row names. Paired
differences pair a corrected video with the uncorrected one of the same member, prompt and seed; a difference
between rows (INT2 vs INT4) first averages each row over its members per (prompt, seed).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from jensenkv.eval.stats import Interval, PairedDifference, mean_interval, paired_difference
from jensenkv.report.intervals import VIDEO_KEYS, video_metrics
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.report.table1 import QUANTIZER_ORDER
from jensenkv.tracking import COMPARED, ResultsStore, load_results

# Labels that say what is stored in the cache; every other label is a variant of attention-time handling.
ROW_LABELS = ("model", "quantizer", "method", "bits", "group_size", "granularity", "rotation", "values",
              "sink_chunks", "window_chunks")
NAMED_IN_ROW = ("model", "quantizer", "method", "bits", "group_size", "rotation")  # always part of the name
REASON_SOURCE = {"delta_p_s": "attention", "abs_delta_p_s": "attention"}  # the record's missing-reason key
UNIT = ("member", *VIDEO_KEYS)  # one pooled video: the run's seed fields, prompt and seed
IDENTITY_VARIANT = (*COMPARED, "metrics")  # identity fields of attention-time handling (tracking.COMPARED)


def flatten(obj, prefix: str = "") -> dict:
    """A nested identity as {"key.rotation_seed": 0, ...} (lists kept whole)."""
    if not isinstance(obj, dict):
        return {prefix: obj}
    out = {}
    for k, v in obj.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def pool_keys(identity: dict, variant_keys: list[str]) -> tuple[dict, dict]:
    """(what must be equal for settings to be pooled, the seed fields that may differ) of one run's identity:
    fields named *_seed are seeds; correction, strength and fields named like a variant label are not
    settings of the cache."""
    flat = flatten({k: v for k, v in identity.items() if k not in (*IDENTITY_VARIANT, *variant_keys)})
    seeds = {k: v for k, v in flat.items() if k.rsplit(".", 1)[-1].endswith("_seed")}
    return {k: v for k, v in flat.items() if k not in seeds}, seeds


def label_keys(results_dir: str | Path) -> list[str]:
    """Every label key the store's records carry, in first-seen order."""
    keys: dict[str, None] = {}
    for record in ResultsStore(results_dir).iter_records():
        keys.update(dict.fromkeys(record.get("labels", {})))
    return list(keys)


def _usual(runs: pd.DataFrame, col: str):
    """The most common value of a column, absent (None) counting as a value: a label only some records carry
    (a new option) then differs from the usual absence."""
    values = [None if _missing(v) else v for v in runs[col]]
    return Counter(values).most_common(1)[0][0] if values else None


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _same(a, b) -> bool:
    return (_missing(a) and _missing(b)) or (not _missing(a) and not _missing(b) and a == b)


def _fmt_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else str(value)
    return "null" if _missing(value) else str(value)


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
            name, tag = "bf16", {"bf16"}
        else:
            name = f"{r['quantizer']} INT{_fmt_value(r['bits'])} g{_fmt_value(r['group_size'])}"
            tag = {*str(r["quantizer"]).split("+"), f"INT{_fmt_value(r['bits'])}", f"g{_fmt_value(r['group_size'])}"}
            for col in extra_row:
                if not _same(r[col], usual[col]):
                    name += f" {col}={_fmt_value(r[col])}"
                    tag.add(f"{col}={_fmt_value(r[col])}")
        variant = str(r.get("correction") or "none")
        for col in variant_keys:
            if col != "correction" and not _same(r[col], usual[col]) and variant != "none":
                variant += f" {col}={_fmt_value(r[col])}"
        names.append(name)
        variants.append(variant)
        tags.append(frozenset(tag))
    runs["row"], runs["variant"], runs["tags"] = names, variants, tags
    return runs


def row_order(runs: pd.DataFrame) -> list[str]:
    """Row names in the tables' order: BF16, RTN, KIVI, QuaRot, QVG (then others), by bits and group size."""
    def key(r):
        base = str(r["quantizer"]).split("+dither")[0]
        order = QUANTIZER_ORDER.get(base, QUANTIZER_ORDER.get(str(r["quantizer"]).split("+")[0], 99))
        bits = -1 if _missing(r["bits"]) else int(r["bits"])
        group = -1 if _missing(r["group_size"]) else int(r["group_size"])
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
    runs: pd.DataFrame  # one run per (setting, variant): load_results columns + row, variant, tags
    videos: pd.DataFrame  # one row per (run, prompt, seed): metrics + member, row, variant
    selection: Selection
    variant_keys: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[str]:
        return row_order(self.runs)

    def variants(self, row: str) -> list[str]:
        return variant_order(self.runs.loc[self.runs["row"] == row, "variant"])

    def members(self, row: str, variant: str) -> pd.DataFrame:
        """The runs of one cell (several when settings differing only in a seed are pooled)."""
        return self.runs[(self.runs["row"] == row) & (self.runs["variant"] == variant)]

    def first(self, row: str, column: str):
        """A row's run-level value of ``column`` (equal across its runs, e.g. bits, effective_bits)."""
        values = [v for v in self.runs.loc[self.runs["row"] == row, column] if not _missing(v)] \
            if column in self.runs.columns else []
        return values[0] if values else None

    def values(self, row: str, variant: str, metric: str) -> pd.Series:
        """Per-video values of one cell, indexed by (member, prompt, seed); NaN-free."""
        part = self.videos[(self.videos["row"] == row) & (self.videos["variant"] == variant)]
        if metric not in part.columns:
            return pd.Series(dtype=float)
        return part.set_index(list(UNIT))[metric].dropna().astype(float)

    def interval(self, row: str, variant: str, metric: str) -> Interval:
        return mean_interval(self.values(row, variant, metric).to_numpy())

    def paired(self, row: str, variant: str, metric: str, base: str = "none") -> PairedDifference:
        """variant - base within one row, paired by pooled member (seed fields), prompt and seed."""
        t, b = self.values(row, variant, metric), self.values(row, base, metric)
        joined = pd.concat([t.rename("t"), b.rename("b")], axis=1, join="inner")
        return paired_difference(joined["t"].to_numpy(), joined["b"].to_numpy())

    def across(self, row: str, variant: str, ref_row: str, ref_variant: str, metric: str) -> PairedDifference:
        """(row, variant) - (ref_row, ref_variant), each averaged over its members, paired by prompt and
        seed (one context: the two rows share prompts and seeds)."""
        def by_video(r, v):  # one value per (prompt, seed): the mean over members and rotation seeds
            s = self.values(r, v, metric)
            return s.groupby(level=["prompt", "seed"]).mean() if len(s) else s

        joined = pd.concat([by_video(row, variant).rename("t"), by_video(ref_row, ref_variant).rename("b")],
                           axis=1, join="inner")
        return paired_difference(joined["t"].to_numpy(), joined["b"].to_numpy())

    def missing_reason(self, row: str, variant: str, metric: str) -> str:
        """Why a cell has no values of ``metric``: the run's recorded reason, or what is absent."""
        runs = self.members(row, variant)
        if runs.empty:
            return f"no {variant} run of {row}"
        col = f"{REASON_SOURCE.get(metric, metric)}_missing_reason"
        if col in runs.columns:
            reasons = [str(r) for r in runs[col] if not _missing(r)]
            if reasons:
                return reasons[0]
        n = len(self.values(row, variant, metric))
        ids = ", ".join(runs["run_id"])
        if n == 1:
            return f"only 1 video with {metric} in run {ids}: no interval"
        return f"no per-video {metric} in run {ids}"

    def pooled_note(self, row: str, variant: str) -> str:
        """"" or e.g. "2 seeds pooled" when runs of several seed fields form one cell."""
        n = self.members(row, variant)["member"].nunique()
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
        out[str(name)] = build_options(results_dir, str(name), comparable(part))
    return out


def build_options(results_dir: str | Path, model: str, selection: Selection) -> Options:
    """Options of the runs a selection chose (one context of one model)."""
    results_dir = Path(results_dir)
    variant_keys = [k for k in label_keys(results_dir) if k not in ROW_LABELS]
    if "correction" not in variant_keys:
        variant_keys.insert(0, "correction")
    chosen = name_rows(selection.runs, variant_keys)
    chosen = latest(chosen, ("setting", "variant"))
    chosen = _split_pools(chosen, results_dir, variant_keys)
    videos = video_metrics(results_dir, chosen["run_id"])
    if not videos.empty:
        if "delta_p_s" in videos.columns:
            videos["abs_delta_p_s"] = np.abs(videos["delta_p_s"])
        videos = videos.merge(chosen[["run_id", "member", "row", "variant"]], on="run_id", how="left")
    return Options(results_dir, model, chosen.reset_index(drop=True), videos, selection, variant_keys)

def _split_pools(runs: pd.DataFrame, results_dir: Path, variant_keys: list[str]) -> pd.DataFrame:
    """Add ``member`` (a hash of the run's seed fields) and give rows whose runs differ in more than seeds
    distinct names ("qvg INT2 g32 key.qvg_centroids=16"), so only seeds are ever pooled."""
    from jensenkv.tracking import config_hash

    store = ResultsStore(results_dir)
    runs = runs.copy()
    pools, members, settings = [], [], {}
    for run_id in runs["run_id"]:
        fixed, seeds = pool_keys(store.read_record(run_id).get("identity") or {}, variant_keys)
        pools.append(config_hash(fixed))
        members.append(config_hash(seeds))
        settings[pools[-1]] = fixed
    runs["pool"], runs["member"] = pools, members
    names = list(runs["row"])
    for row, part in runs.groupby("row", sort=False):
        distinct = list(dict.fromkeys(part["pool"]))
        if len(distinct) < 2:
            continue
        fields = sorted({k for p in distinct for k in settings[p]
                         if any(not _same(settings[p].get(k), settings[o].get(k)) for o in distinct)})
        for i, (_, r) in enumerate(runs.iterrows()):
            if r["row"] == row:
                names[i] = row + " " + " ".join(f"{k}={_fmt_value(settings[r['pool']].get(k))}" for k in fields)
    runs["row"] = names
    return runs
