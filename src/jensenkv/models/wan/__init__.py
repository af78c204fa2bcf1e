"""Drive diffusers' Wan-family transformers (SkyReels-V2, Wan2.1 / Self-Forcing) chunk by chunk over a KV cache.

Nothing in diffusers is changed. Three pieces, one module each:

* ``processor.CachedSelfAttnProcessor``: the self-attention of one layer over its cache (quantize on commit,
  correction, probes), with kernels from ``jensenkv.attention.ATTENTION_BACKENDS``.
* ``rope.RopeFrameOffsetHook``: shifts the temporal RoPE positions by the chunk's first latent frame.
* ``adapter.ChunkwiseAdapter``: the model-facing API of the generator (``denoise``, ``commit``, ``decode``, ...).

``state`` holds what they share. The checkpoint loaders live in ``jensenkv.models.loaders`` and are
re-exported here so that older imports keep working.
"""
from __future__ import annotations

from jensenkv.models.loaders import (
    MissingWeightsError,
    T5PromptEncoder,
    WanVaeDecoder,
    cast_like_diffusers,
    load_original_wan_checkpoint,
    load_wan_transformer,
    require_subfolder,
    resolve_local_dir,
)
from jensenkv.models.wan.adapter import ChunkwiseAdapter, pixel_decode
from jensenkv.models.wan.processor import (
    CachedSelfAttnProcessor,
    apply_rotary,
    block_causal_mask,
    limit_kv_range,
    window_context,
)
from jensenkv.models.wan.rope import ROPE_HOOK_NAME, RopeFrameOffsetHook
from jensenkv.models.wan.state import AttentionSettings, ChunkState, InFlightChunk

__all__ = [
    "ROPE_HOOK_NAME",
    "AttentionSettings",
    "CachedSelfAttnProcessor",
    "ChunkState",
    "ChunkwiseAdapter",
    "InFlightChunk",
    "MissingWeightsError",
    "RopeFrameOffsetHook",
    "T5PromptEncoder",
    "WanVaeDecoder",
    "apply_rotary",
    "block_causal_mask",
    "cast_like_diffusers",
    "limit_kv_range",
    "load_original_wan_checkpoint",
    "load_wan_transformer",
    "pixel_decode",
    "require_subfolder",
    "resolve_local_dir",
    "window_context",
]
