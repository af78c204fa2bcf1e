"""Model families: the built-in tiny model, SkyReels-V2 / Wan through diffusers, MAGI-1 (one package each).

``family(kind)`` (jensenkv.models.registry) answers what the suite asks of a model; ``build_adapter(model_cfg,
cache=None, attention=None)`` (jensenkv.models.adapters) builds one. Both are re-exported lazily, so importing
a family's light modules does not pull in the cache and attention stacks.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"build_adapter": "adapters", "full_precision_cache": "adapters", "family": "registry",
            "FAMILIES": "registry", "ModelConfig": "config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jensenkv.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jensenkv.models' has no attribute {name!r}")
