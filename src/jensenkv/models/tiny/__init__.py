"""The built-in tiny video diffusion model (a pixel-space SkyReels-V2 transformer on procedural videos; plain torch,
``jensenkv.models.wan.dit``).

``load_tiny()`` (``weights``) returns the trained transformer, its text encoder and tokenizer, and the stored
config; ``make train-tiny`` (scripts/train_tiny.py) retrains them into ``weights/``. ``family.TinyFamily`` is
what the rest of the suite asks about the model. Names are re-exported lazily: reading the family imports no model
code, and nothing here imports diffusers.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"load_tiny": "weights", "save_tiny": "weights", "sampler_config": "weights", "split_state": "weights",
            "TextEncoder": "text", "WordTokenizer": "text", "WEIGHTS_DIR": "paths"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jensenkv.models.tiny.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jensenkv.models.tiny' has no attribute {name!r}")
