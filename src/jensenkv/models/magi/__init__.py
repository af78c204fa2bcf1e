"""MAGI-1 (SandAI) in pure torch: the DiT with per-layer cached GQA self-attention, its sampling schedule
(staircase, kv ranges, clean-chunk refresh, three-way CFG, distilled single pass), official checkpoint
loading, T5 prompts and the ViT VAE decoder. ``build.load_magi_adapter`` builds it from a model config.

The model code is imported lazily, so reading presets (``jensenkv.models.magi.config``) stays light.
"""
from __future__ import annotations

from typing import Any

from jensenkv.models.magi.config import PRESETS, MagiModelConfig, magi_noise_levels, magi_times, model_preset
from jensenkv.models.magi.schedule import MagiGenerationNode, MagiScheduleConfig

__all__ = ["PRESETS", "MagiChunkwiseAdapter", "MagiDiT", "MagiGenerationNode", "MagiModelConfig", "MagiScheduleConfig",
           "magi_noise_levels", "magi_times", "model_preset"]


def __getattr__(name: str) -> Any:
    if name == "MagiChunkwiseAdapter":
        from jensenkv.models.magi.adapter import MagiChunkwiseAdapter

        return MagiChunkwiseAdapter
    if name == "MagiDiT":
        from jensenkv.models.magi.model import MagiDiT

        return MagiDiT
    raise AttributeError(name)
