"""Drive Wan-family transformers (SkyReels-V2, Wan2.1 / Self-Forcing) chunk by chunk over a KV cache.

Real checkpoints run diffusers' classes, unchanged; the built-in model runs ``dit.SkyReelsV2DiT``, SkyReels-V2's
transformer in plain torch (diffusers' weights, config and processor API, bit-equal outputs), so a built-in run
never imports diffusers. Three pieces, one module each:

* ``processor.CachedSelfAttnProcessor``: the self-attention of one layer over its cache (quantize on commit,
  correction, probes), with kernels from ``jensenkv.attention.ATTENTION_BACKENDS``.
* ``rope.install_rope_offset``: torch hooks shifting the temporal RoPE positions by the chunk's first latent frame.
* ``adapter.WanChunkwiseAdapter``: the model-facing API of the generator (``denoise``, ``commit``, ``decode``, ...).

``state`` holds what they share, ``family.WanFamily`` what the rest of the suite asks about these models,
``fps`` the frame rates SkyReels-V2's fps embedding knows and ``build`` loads them. The checkpoint loaders live in ``jensenkv.models.loaders``. Names are re-exported lazily,
so reading the family does not import diffusers.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    **dict.fromkeys(("MissingWeightsError", "T5PromptEncoder", "WanVaeDecoder", "cast_like_diffusers",
                     "load_original_wan_checkpoint", "load_wan_transformer", "require_subfolder", "resolve_local_dir"),
                    "jensenkv.models.loaders"),
    **dict.fromkeys(("WanChunkwiseAdapter", "pixel_decode"), "jensenkv.models.wan.adapter"),
    **dict.fromkeys(("CachedSelfAttnProcessor", "block_causal_mask", "limit_kv_range", "window_context"),
                    "jensenkv.models.wan.processor"),
    **dict.fromkeys(("DiTConfig", "SkyReelsV2DiT", "apply_rotary", "qkv_projections"), "jensenkv.models.wan.dit"),
    **dict.fromkeys(("RopeFrameOffsetHook", "install_rope_offset", "installed_rope_offset", "remove_rope_offset"),
                    "jensenkv.models.wan.rope"),
    **dict.fromkeys(("ChunkState", "InFlightChunk"), "jensenkv.models.wan.state"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jensenkv.models.wan' has no attribute {name!r}")
