"""Which one model a plot shows: a figure, a notebook or a video strip never mixes models.

Asked for a model, the store must hold runs of it; otherwise the built-in model when the store has runs of
it, else the first model in sorted order (so adding a second model's runs never changes what an unchanged
command shows).
"""
from __future__ import annotations

import pandas as pd

from jensenkv.checks import fail
from jensenkv.models.config import ModelBase

BUILT_IN_MODEL = ModelBase.name  # the default model's name (configs/config.yaml: model: tiny)


def store_models(runs: pd.DataFrame) -> list[str]:
    """The models with finished runs (rows of ``load_results``), sorted."""
    return sorted({str(m) for m in runs["model"].dropna()}) if "model" in runs.columns else []


def choose_model(runs: pd.DataFrame, model: str | None = None, key: str = "model") -> str | None:
    """``model`` if the store has runs of it (else one line naming ``key``, the value and the models there
    are), or the built-in model, or the first one; None for a store without runs."""
    models = store_models(runs)
    if model is not None:
        if model not in models:
            fail(key, model, f"use one of the models with runs in the store: {models}")
        return model
    if BUILT_IN_MODEL in models:
        return BUILT_IN_MODEL
    return models[0] if models else None
