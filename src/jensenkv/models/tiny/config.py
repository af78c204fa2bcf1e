"""Configuration of the built-in tiny model: transformer, sampler and training defaults, and the weights' location.

The transformer is SkyReels-V2's (``jensenkv.models.wan.dit.SkyReelsV2DiT``: diffusers'
``SkyReelsV2Transformer3DModel`` in plain torch, the same weights and outputs) in pixel space (3 channels, values in
[-1, 1]) with one attention head of dimension 128, so the paper's head dim d = 128 and group sizes
g = 32 / 64 / 128 all apply. ``num_frame_per_block = 2`` makes the stock model build the block-causal
(chunk-causal) mask itself: one chunk = 2 frames = 128 tokens at 16 x 16 with patch (1, 2, 2).
"""
from __future__ import annotations

from jensenkv.models.wan.dit import SkyReelsV2DiT
from jensenkv.models.tiny.paths import CONFIG_FILE, WEIGHTS_DIR, WEIGHTS_FILE  # noqa: F401 - re-exported
TEXT_PREFIX = "text_encoder."         # key prefix of the text encoder inside model.safetensors
TRANSFORMER_PREFIX = "transformer."


def default_transformer_config(text_dim: int = 64) -> dict:
    """kwargs of ``SkyReelsV2DiT`` (and of diffusers' ``SkyReelsV2Transformer3DModel``) for the tiny model."""
    return {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 1,
        "attention_head_dim": 128,
        "in_channels": 3,
        "out_channels": 3,
        "text_dim": text_dim,
        "freq_dim": 256,
        "ffn_dim": 256,
        "num_layers": 4,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "rope_max_seq_len": 64,
        "num_frame_per_block": 2,
    }


def build_transformer(config: dict) -> SkyReelsV2DiT:
    """A randomly initialised transformer from a config dict (as stored in config.json)."""
    kwargs = dict(config)
    kwargs["patch_size"] = tuple(kwargs["patch_size"])
    return SkyReelsV2DiT(**kwargs)
