"""Which runs a table or figure may put side by side: the one place that chooses runs from the results store.

Every row of ``load_results`` carries ``context`` (model and sampler settings, weights digest, prompts,
seeds, cache layout, evaluators) and ``setting`` (the context plus the quantizer): see
``jensenkv.tracking.comparison_columns``. A table or figure is drawn from one context only, so its runs
differ in the quantizer and the correction and nothing else; the two runs of a "none -> correction" cell
share one setting. Runs of other contexts are left out and reported, never mixed in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

RUN_ORDER = ("num_prompts", "created_at", "run_id")  # latest(): most prompts, then newest, then a fixed order


@dataclass
class Selection:
    """The runs chosen from one context, and one line per run left out (with why)."""

    runs: pd.DataFrame
    context: str | None = None
    context_desc: str = ""
    left_out: list[str] = field(default_factory=list)


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


def comparable(runs: pd.DataFrame, per: tuple[str, ...] = ("model",)) -> Selection:
    """The runs of one context per ``per`` group (each model has its own prompts and settings; within a
    model, the context with the most distinct settings, then the most runs, prompts, the newest run);
    every other run is listed in ``left_out`` with its context."""
    if runs.empty:
        return Selection(runs)
    runs = _ensure(runs, ("context", "setting", "context_desc", "correction", *per, *RUN_ORDER))
    contexts = [_best_context(group) for _, group in runs.groupby(list(per), dropna=False, sort=True)]
    chosen = runs[runs["context"].isin(contexts)]
    descs = list(dict.fromkeys(str(d) for d in chosen["context_desc"]))
    left_out = [f"{describe_run(row)}: other prompts, seeds, model settings or weights ({row['context_desc']})"
                for _, row in runs[~runs["context"].isin(contexts)].sort_values("run_id").iterrows()]
    return Selection(chosen, contexts[0] if len(contexts) == 1 else None, "; ".join(descs), left_out)
