"""Build a chunk-wise model adapter from a model config (configs/model/*.yaml).

``kind: tiny`` loads the built-in model (``jensenkv.models.tiny.load_tiny``); ``kind: diffusers`` loads a
SkyReels-V2 / Wan checkpoint from a local folder or the Hugging Face cache (never the network); ``kind: magi``
builds MAGI-1 (``jensenkv.models.magi.build``). The model
and sampler settings are nodes of the config tree (jensenkv.config.ModelConfig, GenerationConfig).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from jensenkv.cache import CacheConfig
from jensenkv.config import CacheSettings, GenerationConfig, ModelConfig
from jensenkv.models.loaders import (
    T5PromptEncoder,
    WanVaeDecoder,
    cast_like_diffusers,
    load_wan_transformer,
    require_subfolder,
    resolve_local_dir,
)
from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter
from jensenkv.quant.config import FLOAT_DTYPES


def as_model_config(model: ModelConfig | Mapping) -> ModelConfig:
    """A ModelConfig from itself or a mapping of its fields (a Hydra node, a dict); unknown keys are errors."""
    if isinstance(model, ModelConfig):
        return model
    if not isinstance(model, Mapping):
        raise ValueError(f"model config={model!r} is not allowed: a ModelConfig or a mapping of its fields")
    values = {k: v for k, v in dict(model).items() if k != "_target_"}
    allowed = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"model config keys {unknown} are not allowed; allowed: {sorted(allowed)}")
    return ModelConfig(**values)


def full_precision_cache(dtype: str = CacheSettings.full_precision_dtype) -> CacheConfig:
    """The BF16 reference cache: nothing quantized, stored in ``dtype`` (cache.full_precision_dtype)."""
    full = CacheSettings(full_precision_dtype=dtype).full_precision()
    return CacheConfig(key=full, value=full)


def build_adapter(model: ModelConfig | Mapping, cache: CacheConfig | None = None,
                  attention: AttentionSettings | None = None,
                  generation: GenerationConfig | None = None) -> ChunkwiseAdapter:
    """The adapter a model config describes, with the given cache (default: the BF16 reference cache),
    attention settings and sampler (default: GenerationConfig's defaults, the built-in model's sampler)."""
    cfg = as_model_config(model)
    cache = cache if cache is not None else full_precision_cache()
    attention = attention if attention is not None else AttentionSettings()
    generation = generation if generation is not None else GenerationConfig()
    if cfg.kind == "tiny":
        return load_tiny_adapter(cfg, cache, attention, generation)
    if cfg.kind == "magi":
        from jensenkv.models.magi.build import load_magi_adapter

        return load_magi_adapter(cfg, cache, attention, generation)
    return load_diffusers_adapter(cfg, cache, attention, generation)


def _dtype(name: str) -> torch.dtype:
    return FLOAT_DTYPES[name]


def load_tiny_adapter(cfg: ModelConfig, cache: CacheConfig, attention: AttentionSettings,
                      generation: GenerationConfig) -> ChunkwiseAdapter:
    """The built-in pixel-space model (``load_tiny``)."""
    from jensenkv.models.tiny import load_tiny

    kwargs = {"weights_dir": cfg.weights_dir} if cfg.weights_dir else {}
    transformer, text_encoder, tokenizer, tiny_config = load_tiny(**kwargs)
    device, dtype = torch.device(cfg.device), _dtype(cfg.dtype)
    text_encoder = text_encoder.to(device).eval()

    def encode(prompts: list[str]) -> torch.Tensor:
        return text_encoder(tokenizer(prompts).to(device))  # (B, L, text_dim)

    channels = transformer.config.in_channels
    return ChunkwiseAdapter(cast_like_diffusers(transformer, dtype).to(device), encode,
                            (channels, int(tiny_config["data"]["height"]), int(tiny_config["data"]["width"])),
                            generation, cache, attention, clean_range=(-1.0, 1.0))


def load_diffusers_adapter(cfg: ModelConfig, cache: CacheConfig, attention: AttentionSettings,
                           generation: GenerationConfig) -> ChunkwiseAdapter:
    """SkyReels-V2 / Wan from a diffusers folder (transformer, vae, text_encoder, tokenizer subfolders).

    ``transformer_checkpoint`` (optional) replaces the transformer weights by an original-format Wan
    checkpoint, e.g. Self-Forcing's self_forcing_dmd.pt (``checkpoint_key: generator_ema``).
    """
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    device, dtype = torch.device(cfg.device), _dtype(cfg.dtype)
    local = resolve_local_dir(cfg.path, cfg.cache_dir)
    transformer = load_wan_transformer(local, cfg.transformer_class, dtype, cfg.transformer_subfolder or "transformer",
                                       cfg.transformer_checkpoint, cfg.checkpoint_key)
    vae = AutoencoderKLWan.from_pretrained(str(require_subfolder(local, "vae", "Wan VAE")), local_files_only=True,
                                           torch_dtype=_dtype(cfg.vae_dtype or cfg.dtype)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(require_subfolder(local, "tokenizer", "T5 tokenizer")),
                                              local_files_only=True)
    text_encoder = UMT5EncoderModel.from_pretrained(str(require_subfolder(local, "text_encoder", "UMT5 text encoder")),
                                                    local_files_only=True, torch_dtype=dtype).to(device)
    scale = int(vae.config.scale_factor_spatial)
    height, width = cfg.height, cfg.width
    if height % scale or width % scale:
        raise ValueError(f"model.height/width={height}x{width} is not allowed: both must be multiples of {scale}")
    encode = T5PromptEncoder(tokenizer, text_encoder, cfg.max_sequence_length or 512)
    shape = (int(transformer.config.in_channels), height // scale, width // scale)
    return ChunkwiseAdapter(transformer.to(device), encode, shape, generation, cache, attention,
                            decode=WanVaeDecoder(vae), fps=cfg.fps or 24)
