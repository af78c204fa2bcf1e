"""Which runs a table or figure may put side by side: the one place that chooses runs from the results store.

Every row of ``load_results`` carries ``context`` (model and sampler settings, weights digest, prompts,
seeds, cache layout, evaluators) and ``setting`` (the context plus the quantizer): see
``jensenkv.report.store_frame.comparison_columns``. A table or figure is drawn from one context only, so its runs
differ in the quantizer and the correction and nothing else; the two runs of a "none -> correction" cell
share one setting. Runs of other contexts are left out and reported, never mixed in.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from jensenkv.hashing import config_hash
from jensenkv.report.store_frame import COMPARED, QUANTIZER
from jensenkv.store.results import ResultsStore

RUN_ORDER = ("num_prompts", "created_at", "run_id")  # latest(): most prompts, then newest, then a fixed order


@dataclass
class Selection:
    """The runs chosen from one context, and one line per run left out (with why)."""

    runs: pd.DataFrame
    context: str | None = None
    context_desc: str = ""
    left_out: list[str] = field(default_factory=list)  # one line per group of runs that differ alike
    num_left_out: int = 0


def _ensure(runs: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    runs = runs.copy()
    for col in columns:
        if col not in runs.columns:
            runs[col] = None
    for col in ("context", "setting"):  # records without an identity form one group of their own
        if col in runs.columns:
            runs[col] = runs[col].fillna("unknown")
    return runs


def describe_run(row: pd.Series) -> str:
    """A run as a reader knows it, e.g. "rtn INT2 g32 taylor (run 82c60c82168ecb2d)"."""
    if row.get("quantizer") == "bf16":
        return f"bf16 (run {row['run_id']})"
    return (f"{row.get('quantizer')} INT{row.get('bits')} g{row.get('group_size')} {row.get('correction')} "
            f"(run {row['run_id']})")


def latest(runs: pd.DataFrame, keys: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """One run per ``keys`` group: the one with the most prompts, then the newest (run id breaks ties)."""
    if runs.empty:
        return runs
    runs = _ensure(runs, (*RUN_ORDER, *keys))
    ordered = runs.sort_values(list(RUN_ORDER), na_position="first", kind="stable")
    return ordered.groupby(list(keys), dropna=False, sort=False).tail(1)


def _best_context(runs: pd.DataFrame) -> str:
    """The context with the most distinct settings, then the most runs, the most prompts, the newest run."""
    stats = runs.groupby("context", dropna=False).agg(settings=("setting", "nunique"), runs=("run_id", "size"),
                                                     prompts=("num_prompts", "max"), newest=("created_at", "max"))
    return stats.sort_values(["settings", "runs", "prompts", "newest"], kind="stable").index[-1]


def comparable(runs: pd.DataFrame, per: tuple[str, ...] = ("model",),
               results_dir: str | Path | None = None) -> Selection:
    """The runs of one context per ``per`` group (each model has its own prompts and settings; within a
    model, the context with the most distinct settings, then the most runs, prompts, the newest run);
    every other run is left out, grouped by the fields its context differs in from the chosen one (read from
    the records' identities under ``results_dir``; without it, by context)."""
    if runs.empty:
        return Selection(runs)
    runs = _ensure(runs, ("context", "setting", "context_desc", "correction", *per, *RUN_ORDER))
    contexts = [_best_context(group) for _, group in runs.groupby(list(per), dropna=False, sort=True)]
    chosen = runs[runs["context"].isin(contexts)]
    descs = list(dict.fromkeys(str(d) for d in chosen["context_desc"]))
    others = runs[~runs["context"].isin(contexts)].sort_values("run_id")
    left_out = left_out_lines(others, chosen, per, results_dir)
    return Selection(chosen, contexts[0] if len(contexts) == 1 else None, "; ".join(descs), left_out, len(others))


def flat_fields(identity: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """An identity as {dotted field: value} (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in (identity or {}).items():
        if isinstance(value, Mapping):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _shown(value: Any) -> str:
    """A field's value, short: a list of texts (prompts) or a long list as its length and digest."""
    if isinstance(value, (list, tuple)) and (len(value) > 8 or any(isinstance(v, str) for v in value)):
        return f"{len(value)} items {config_hash(list(value), 6)}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def context_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """"prompts: 2 items b5f894 (chosen: 16 items ba7fc5); seeds: [0] (chosen: [0, 1, 2])": the context fields
    (not the quantizer or the correction) in which one run differs from the chosen runs."""
    ignored = (*COMPARED, *QUANTIZER, "metrics")  # the context is the rest (store_frame.comparison_columns) ...
    in_context = {k for k in set(theirs) | set(ours) if k.split(".")[0] not in ignored} | {"key.store_dtype"}
    keys = sorted(k for k in in_context if theirs.get(k) != ours.get(k))  # ... plus the cache's storage dtype
    return "; ".join(f"{k}: {_shown(theirs.get(k))} (chosen: {_shown(ours.get(k))})" for k in keys)


def left_out_lines(others: pd.DataFrame, chosen: pd.DataFrame, per: tuple[str, ...],
                   results_dir: str | Path | None) -> list[str]:
    """One line per group of left-out runs that differ from the chosen runs of their ``per`` group in the same
    fields and values: the count, what differs, and which runs."""
    if others.empty:
        return []
    groups: dict[str, list[str]] = {}
    store = ResultsStore(results_dir) if results_dir is not None else None
    reference: dict[tuple, dict] = {}
    for _, row in others.iterrows():
        key = tuple(row[c] for c in per)
        if store is None:
            what = f"other prompts, seeds, model settings or weights ({row['context_desc']})"
        else:
            if key not in reference:
                mates = chosen[(chosen[list(per)] == pd.Series(key, index=list(per))).all(axis=1)]
                reference[key] = flat_fields(store.read_record(mates["run_id"].iloc[0]).get("identity")) \
                    if not mates.empty else {}
            what = context_difference(flat_fields(store.read_record(row["run_id"]).get("identity")),
                                      reference[key]) or "an identity the chosen runs' context does not match"
        groups.setdefault(what, []).append(describe_run(row))
    lines = []
    for what, names in groups.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        lines.append(f"{len(names)} run{'s' * (len(names) != 1)} differing in {what}: {shown}")
    return lines
