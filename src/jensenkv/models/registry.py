"""The model families, by ``model.kind``: adding a family is one package under ``models/`` and one line here.

``family(kind)`` is how the rest of the suite learns anything about a model (jensenkv.models.family).
"""
from __future__ import annotations

from jensenkv.models.family import ModelFamily
from jensenkv.models.magi.family import MagiFamily
from jensenkv.models.tiny.family import TinyFamily
from jensenkv.models.wan.family import WanFamily
from jensenkv.models.worldplay.family import WorldPlayFamily

FAMILIES: dict[str, ModelFamily] = {
    "tiny": TinyFamily(),      # the built-in model (jensenkv.models.tiny)
    "diffusers": WanFamily(),  # SkyReels-V2 / Wan2.1 / Self-Forcing through diffusers (jensenkv.models.wan)
    "magi": MagiFamily(),      # MAGI-1 in pure torch (jensenkv.models.magi)
    "worldplay": WorldPlayFamily(),  # HY-WorldPlay (HunyuanVideo-1.5 + action / camera) in pure torch
}


def family(kind: str) -> ModelFamily:
    """The family of ``model.kind``; ValueError naming the registered kinds otherwise."""
    try:
        return FAMILIES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"model.kind={kind!r} is not allowed: use one of {tuple(FAMILIES)}") from None
