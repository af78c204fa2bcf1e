"""HY-WorldPlay's model node (the ``model.*`` fields of ``kind: worldplay``), its presets and the pure helpers
the family and the adapter share (no model code imported here)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from jensenkv.checks import fail
from jensenkv.models.family import CheckpointNode
from jensenkv.models.worldplay.settings import WorldPlaySettings

# preset -> the checkpoint folder of tencent/HY-WorldPlay (the AR action models; the bidirectional one is not run)
PRESET_VARIANTS = {"8b_distilled": "ar_distilled_action_model", "8b": "ar_model", "8b_rl": "ar_rl_model"}
PRESETS = ("tiny", *PRESET_VARIANTS)
WORLDPLAY_REPO = "tencent/HY-WorldPlay"
# HunyuanVideo-1.5 480p I2V in diffusers' layout: the VAE, Qwen2.5-VL-7B text model, Glyph ByT5 and SigLIP of
# the official tencent/HunyuanVideo-1.5 (+ FLUX.1-Redux's SigLIP), converted by diffusers' script
HUNYUAN_REPO = "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v"
# subfolder -> the file in it the loader reads first (jensenkv.models.worldplay.text / vae)
HUNYUAN_PARTS = {"vae": "config.json", "text_encoder": "config.json", "tokenizer": "tokenizer_config.json",
                 "text_encoder_2": "config.json", "tokenizer_2": "tokenizer_config.json",
                 "image_encoder": "config.json", "feature_extractor": "preprocessor_config.json"}
SPATIAL_DOWNSAMPLE = 16   # HunyuanVideo-1.5 VAE: 16x spatial, 4x temporal
TEMPORAL_DOWNSAMPLE = 4
TINY_SPATIAL = 4          # the tiny stand-in VAE: 4x spatial, no temporal compression
LICENCE = ("Tencent HY-WorldPlay Community License: not licensed in the EU, the UK or South Korea; outputs may "
           "not be used to improve other AI models; more than 1 million monthly active users need a separate "
           "licence from Tencent")
PRECISION_KEYS = ("autocast", "fp32_timesteps", "inputs_dtype")  # WorldPlayPrecision fields besides dtype


@dataclass
class WorldPlayNode(CheckpointNode):
    """kind "worldplay": HY-WorldPlay (jensenkv.models.worldplay, docs/WORLDPLAY.md): ``preset`` tiny (seeded
    random, no weights) or 8b_distilled / 8b / 8b_rl, the official checkpoints of tencent/HY-WorldPlay at
    ``path`` on HunyuanVideo-1.5's VAE and encoders at ``hunyuan_path``."""

    preset: Optional[str] = None          # tiny | 8b_distilled | 8b | 8b_rl
    variant: Optional[str] = None         # checkpoint folder in tencent/HY-WorldPlay (null: the preset's)
    hunyuan_path: Optional[str] = None    # HunyuanVideo-1.5 480p I2V, diffusers layout (folder or Hub id)
    vae_path: Optional[str] = None        # null: <hunyuan_path>/vae
    model_overrides: Optional[dict[str, Any]] = None  # WorldPlayTransformerConfig fields replaced in the preset
    precision: Optional[dict[str, Any]] = None  # WorldPlayPrecision fields besides dtype (null: plain model.dtype)
    latent_height: Optional[int] = None   # tiny: latent frame size (real presets: height / 16)
    latent_width: Optional[int] = None
    seed: Optional[int] = None            # tiny: seed of the random initialisation


def worldplay_settings(generation: Any) -> WorldPlaySettings:
    """The run's ``generation.worldplay`` (the family requires it: ``check_generation``)."""
    return generation.worldplay if generation.worldplay is not None else WorldPlaySettings()


def video_frames(generation: Any) -> int:
    """Latent frames of the video: chunks x frames per chunk."""
    return generation.num_chunks * generation.frames_per_chunk


def pixel_size(model: Any) -> tuple[int, int]:
    """(height, width) in pixels of the first frame the model needs (the tiny stand-in VAE: 4x the latents)."""
    if model.preset == "tiny":
        return (int(model.latent_height or 8) * TINY_SPATIAL, int(model.latent_width or model.latent_height or 8)
                * TINY_SPATIAL)
    return int(model.height), int(model.width)


def architecture(model: Any) -> Any:
    """The transformer config of the preset with model.model_overrides applied (ValueError naming a field
    it does not have or a bad value)."""
    from jensenkv.models.worldplay.config import WorldPlayTransformerConfig

    overrides = dict(model.model_overrides or {})
    allowed = sorted(f.name for f in fields(WorldPlayTransformerConfig))
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        fail("model.model_overrides", overrides, f"{unknown} are not WorldPlay transformer fields; use {allowed}")
    for key in ("patch_size", "rope_dim_list"):
        if key in overrides:
            overrides[key] = tuple(int(x) for x in overrides[key])
    try:
        if model.preset == "tiny":
            return WorldPlayTransformerConfig.tiny(**overrides)
        cfg = WorldPlayTransformerConfig(**overrides)
        cfg.validate()
        return cfg
    except (TypeError, ValueError) as e:
        fail("model.model_overrides", overrides, str(e))


def precision(model: Any) -> Any:
    """WorldPlayPrecision of the model: model.dtype plus model.precision (autocast, fp32_timesteps,
    inputs_dtype)."""
    from jensenkv.models.worldplay.config import WorldPlayPrecision

    values = dict(model.precision or {})
    unknown = sorted(set(values) - set(PRECISION_KEYS))
    if unknown:
        fail("model.precision", values, f"{unknown} are not allowed; use {list(PRECISION_KEYS)}")
    try:
        return WorldPlayPrecision(dtype=model.dtype, **values)
    except (TypeError, ValueError) as e:
        fail("model.precision", values, str(e))
