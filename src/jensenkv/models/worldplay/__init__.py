"""HY-WorldPlay (HunyuanVideo-1.5 480p I2V + action and ProPE camera branches) in pure torch.

Part A (the transformer and its caches): ``config`` (shape and precision), ``model``
(``WorldPlayTransformer``, official module names), ``cache`` (``WorldPlayCaches``: per block a RoPE cache
and a ProPE cache on the suite's ``ChunkedKVCache``, text K/V, the ``rebuild`` / ``append`` memory modes),
``checkpoint`` (strict loader of the official ``tencent/HY-WorldPlay`` files) and ``oracle`` (one masked
forward over [context; current], the tests' reference).

The model code is imported lazily, so reading presets (``jensenkv.models.worldplay.config``) stays light.
"""
from __future__ import annotations

from typing import Any

from jensenkv.models.worldplay.config import MEMORY_MODES, WorldPlayPrecision, WorldPlayTransformerConfig

__all__ = [
    "MEMORY_MODES",
    "CameraInputs",
    "TextInputs",
    "WorldPlayCaches",
    "WorldPlayPrecision",
    "WorldPlayTransformer",
    "WorldPlayTransformerConfig",
]

_LAZY = {"WorldPlayTransformer": "model", "TextInputs": "model", "CameraInputs": "model", "WorldPlayCaches": "cache"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"jensenkv.models.worldplay.{_LAZY[name]}"), name)
    raise AttributeError(name)
