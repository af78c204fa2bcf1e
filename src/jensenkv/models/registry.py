"""Build a chunk-wise model adapter from a model config (configs/model/*.yaml).

``kind: tiny`` loads the built-in model (``jensenkv.models.tiny.load_tiny``); ``kind: diffusers`` loads a
SkyReels-V2 / Wan checkpoint from a local folder or the Hugging Face cache (never the network). A config
with a Hydra ``_target_`` is instantiated instead, with ``cache`` and ``attention`` passed as keywords.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig
from jensenkv.models.wan import (
    AttentionSettings,
    ChunkwiseAdapter,
    cast_like_diffusers,
    T5PromptEncoder,
    WanVaeDecoder,
    load_wan_transformer,
    require_subfolder,
    resolve_local_dir,
)
from jensenkv.quant import QuantConfig

KINDS = ("tiny", "diffusers", "magi")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GENERATION_KEYS = ("num_chunks", "frames_per_chunk", "steps", "shift", "guidance_scale", "sampler", "kv_range",
                   "commit_kv_range", "negative_prompt", "window_size")
COMMON_KEYS = ("kind", "name", "device", "dtype", *GENERATION_KEYS)
DIFFUSERS_KEYS = ("class", "path", "cache_dir", "height", "width", "max_sequence_length", "transformer_subfolder",
                  "transformer_checkpoint", "checkpoint_key", "fps", "vae_dtype")
TINY_KEYS = ("weights_dir",)


def full_precision_cache() -> CacheConfig:
    """A cache that quantizes nothing and stores keys and values as computed (the model's dtype, float32 on
    CPU); runs pick their reference storage dtype themselves (RunSpec.reference_cache_config)."""
    return CacheConfig(key=QuantConfig(method="none"), value=QuantConfig(method="none"))


def _plain(cfg: Any) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # omegaconf ships with hydra; plain dicts work without it
        pass
    if not isinstance(cfg, Mapping):
        raise ValueError(f"model config={cfg!r} is not allowed: it must be a mapping")
    return dict(cfg)


def _check_keys(cfg: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(f"model config keys {unknown} are not allowed for kind={cfg.get('kind')!r}; "
                         f"allowed: {sorted(allowed)}")


def _device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _dtype(name: str | None, key: str = "dtype") -> torch.dtype:
    name = name or "float32"
    if name not in DTYPES:
        raise ValueError(f"model.{key}={name!r} is not allowed: use one of {tuple(DTYPES)}")
    return DTYPES[name]


def generation_config(cfg: Mapping, defaults: Mapping | None = None) -> GenerationConfig:
    """GenerationConfig from the config's sampler keys; a null (or absent) key takes ``defaults``' value."""
    values = dict(defaults or {})
    values.update({k: cfg[k] for k in GENERATION_KEYS if cfg.get(k) is not None})
    if values.get("kv_range") is not None:
        values["kv_range"] = tuple(values["kv_range"])
    generation = GenerationConfig(**values)
    generation.validate()
    return generation


def build_adapter(model_cfg: Mapping, cache: CacheConfig | None = None,
                  attention: AttentionSettings | None = None) -> ChunkwiseAdapter:
    """The adapter a model config describes, with the given cache (default: full precision) and attention."""
    cfg = _plain(model_cfg)
    cache = cache if cache is not None else full_precision_cache()
    attention = attention if attention is not None else AttentionSettings()
    if "_target_" in cfg:
        from hydra.utils import instantiate

        return instantiate(cfg, cache=cache, attention=attention, _convert_="all")
    kind = cfg.get("kind")
    if kind == "tiny":
        return load_tiny_adapter(cache=cache, attention=attention, **cfg)
    if kind == "diffusers":
        return load_diffusers_adapter(cache=cache, attention=attention, **cfg)
    if kind == "magi":
        from jensenkv.models.magi.build import load_magi_adapter

        return load_magi_adapter(cache=cache, attention=attention, **cfg)
    raise ValueError(f"model.kind={kind!r} is not allowed: use one of {KINDS} (or a Hydra _target_)")


def load_tiny_adapter(cache: CacheConfig, attention: AttentionSettings | None = None, **cfg: Any) -> ChunkwiseAdapter:
    """The built-in pixel-space model (``load_tiny``); null sampler keys take its config.json defaults."""
    from jensenkv.models.tiny import load_tiny

    _check_keys(cfg, COMMON_KEYS + TINY_KEYS)
    kwargs = {"weights_dir": cfg["weights_dir"]} if cfg.get("weights_dir") else {}
    transformer, text_encoder, tokenizer, tiny_config = load_tiny(**kwargs)
    device, dtype = _device(cfg.get("device")), _dtype(cfg.get("dtype"))
    sampler = tiny_config["sampler"]  # steps, shift, cfg_scale, frames_per_chunk, num_chunks
    defaults = {"steps": sampler["steps"], "shift": sampler["shift"], "guidance_scale": sampler["cfg_scale"],
                "frames_per_chunk": sampler["frames_per_chunk"], "num_chunks": sampler["num_chunks"]}
    text_encoder = text_encoder.to(device).eval()

    def encode(prompts: list[str]) -> torch.Tensor:
        return text_encoder(tokenizer(prompts).to(device))  # (B, L, text_dim)

    channels = transformer.config.in_channels
    return ChunkwiseAdapter(cast_like_diffusers(transformer, dtype).to(device), encode,
                            (channels, int(tiny_config["data"]["height"]), int(tiny_config["data"]["width"])),
                            generation_config(cfg, defaults), cache, attention, clean_range=(-1.0, 1.0))


def load_diffusers_adapter(cache: CacheConfig, attention: AttentionSettings | None = None,
                           **cfg: Any) -> ChunkwiseAdapter:
    """SkyReels-V2 / Wan from a diffusers folder (transformer, vae, text_encoder, tokenizer subfolders).

    ``transformer_checkpoint`` (optional) replaces the transformer weights by an original-format Wan
    checkpoint, e.g. Self-Forcing's self_forcing_dmd.pt (``checkpoint_key: generator_ema``).
    """
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    _check_keys(cfg, COMMON_KEYS + DIFFUSERS_KEYS)
    for key in ("class", "path", "height", "width"):
        if cfg.get(key) is None:
            raise ValueError(f"model.{key} is missing: kind=diffusers needs class, path, height and width")
    device, dtype = _device(cfg.get("device")), _dtype(cfg.get("dtype"))
    local = resolve_local_dir(cfg["path"], cfg.get("cache_dir"))
    transformer = load_wan_transformer(local, cfg["class"], dtype, cfg.get("transformer_subfolder") or "transformer",
                                       cfg.get("transformer_checkpoint"), cfg.get("checkpoint_key"))
    vae = AutoencoderKLWan.from_pretrained(str(require_subfolder(local, "vae", "Wan VAE")), local_files_only=True,
                                           torch_dtype=_dtype(cfg.get("vae_dtype"), "vae_dtype")).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(require_subfolder(local, "tokenizer", "T5 tokenizer")),
                                              local_files_only=True)
    text_encoder = UMT5EncoderModel.from_pretrained(str(require_subfolder(local, "text_encoder", "UMT5 text encoder")),
                                                    local_files_only=True, torch_dtype=dtype).to(device)
    scale = int(vae.config.scale_factor_spatial)
    height, width = int(cfg["height"]), int(cfg["width"])
    if height % scale or width % scale:
        raise ValueError(f"model.height/width={height}x{width} is not allowed: both must be multiples of {scale}")
    encode = T5PromptEncoder(tokenizer, text_encoder, int(cfg.get("max_sequence_length") or 512))
    shape = (int(transformer.config.in_channels), height // scale, width // scale)
    return ChunkwiseAdapter(transformer.to(device), encode, shape, generation_config(cfg), cache, attention,
                            decode=WanVaeDecoder(vae), fps=int(cfg.get("fps") or 24))
