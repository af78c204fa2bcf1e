"""Model adapters: the built-in tiny model and diffusers' Wan family (SkyReels-V2, Wan2.1 / Self-Forcing).

``build_adapter(model_cfg, cache=None, attention=None)`` (in ``jensenkv.models.registry``) is re-exported
lazily, so importing ``jensenkv.models.tiny`` does not pull in the cache and attention stacks.
"""
from __future__ import annotations

from typing import Any

__all__ = ["build_adapter"]


def __getattr__(name: str) -> Any:
    if name == "build_adapter":
        from jensenkv.models.registry import build_adapter

        return build_adapter
    raise AttributeError(f"module 'jensenkv.models' has no attribute {name!r}")
