"""Build a MAGI-1 adapter from a model config (``configs/model/magi1_*.yaml``, ``kind: magi``).

``preset: tiny`` is a seeded random-initialised MAGI-1 (no weights, CPU in seconds) with a seeded word-table
text encoder and a tiny random ViT decoder. Real presets load the official files (see
``jensenkv.models.magi.checkpoint``) from ``path`` (a local copy of sand-ai/MAGI-1 or the Hub id, looked up
in the Hugging Face cache only).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from jensenkv.cache import CacheConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.models.magi.adapter import MagiChunkwiseAdapter
from jensenkv.models.magi.config import PRESET_VARIANTS, SPATIAL_DOWNSAMPLE, MagiModelConfig, model_preset
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.models.magi.model import MagiDiT
from jensenkv.models.magi.text import TinyPromptEncoder
from jensenkv.models.magi.vae import MagiVaeDecoder, Tiling, ViTDecoder, ViTDecoderConfig
from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant.config import FLOAT_DTYPES

TINY_DECODER = ViTDecoderConfig(video_size=16, video_length=2, patch_size=2, patch_length=1, z_chans=4, embed_dim=32,
                                depth=1, num_heads=2, mlp_ratio=2.0)


def build_tiny(seed: int = 0, **overrides: Any) -> MagiDiT:
    """The seeded random MAGI-1 of ``preset: tiny`` (norm gains around w + 1 = 1, like a trained model)."""
    cfg = model_preset("tiny", **overrides)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = MagiDiT(cfg)
        for name, param in model.named_parameters():
            if name.endswith("null_caption_embedding"):
                param.data.normal_(0, 1.0)
            elif name.endswith("rope.bands"):
                continue  # the official init 1 / 10000^(i/n)
            elif param.ndim == 1:  # norm gains stored as w - 1 and biases: small around 0
                param.data.normal_(0, 0.1)
            else:
                param.data.normal_(0, 1.0 / param.shape[-1] ** 0.5 if param.ndim == 2 else 0.2)
    finally:
        torch.random.set_rng_state(gen_state)
    return model


def build_tiny_decoder(channels: int, seed: int = 0) -> MagiVaeDecoder:
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed + 1)
    try:
        decoder = ViTDecoder(ViTDecoderConfig(**{**TINY_DECODER.to_dict(), "z_chans": channels}))
        for param in decoder.parameters():
            param.data.normal_(0, 0.2)
    finally:
        torch.random.set_rng_state(gen_state)
    return MagiVaeDecoder(decoder, latent_scale=1.0, tiling=None)


def load_vae_decoder(folder: Path, dtype: torch.dtype, device: torch.device, latent_scale: float = 0.18215,
                     tiling: Tiling | None = Tiling(), chunk_frames: int | None = None) -> MagiVaeDecoder:
    """The official ViT VAE folder (config.json with ddconfig + safetensors weights) -> decoder only."""
    import json

    from safetensors.torch import load_file

    config_file = folder / "config.json"
    files = sorted(folder.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise MissingWeightsError(f"MAGI-1 VAE not found: expected {config_file} and *.safetensors in {folder}; "
                                  f"{FETCH_HINT}")
    ddconfig = json.loads(config_file.read_text())["ddconfig"]
    decoder = ViTDecoder(ViTDecoderConfig.from_ddconfig(ddconfig))
    state = {}
    for file in files:
        state.update(load_file(str(file)))
    state = {k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")}
    decoder.load_state_dict(state, strict=True)
    return MagiVaeDecoder(decoder.to(device, dtype), latent_scale, tiling, chunk_frames)


def load_magi_adapter(cfg: Any, cache: CacheConfig, attention: AttentionConfig,
                      generation: GenerationConfig) -> MagiChunkwiseAdapter:
    """The MAGI-1 adapter of a ``kind: magi`` model node; the schedule is ``generation`` (its ``magi`` node:
    refresh pass, guidance, time schedule). See configs/model/magi1_*.yaml."""
    preset = cfg.preset or "tiny"
    device, dtype = torch.device(cfg.device), FLOAT_DTYPES[cfg.dtype]
    sampling = generation.magi if generation.magi is not None else MagiScheduleConfig()
    overrides = dict(cfg.model_overrides or {})
    seed = int(cfg.seed or 0)
    if preset == "tiny":
        model = build_tiny(seed, **overrides).to(device).to_dtype(dtype)
        mcfg = model.config
        text = TinyPromptEncoder(mcfg.caption_channels, mcfg.caption_max_length, seed=seed).to(device)
        shape = (mcfg.latent_channels, int(cfg.latent_height or 8), int(cfg.latent_width or 8))
        decode = build_tiny_decoder(mcfg.latent_channels, seed)
        return MagiChunkwiseAdapter(model, text, shape, generation, sampling, cache, attention, decode=decode)
    return _load_real(preset, cfg, overrides, device, dtype, generation, sampling, cache, attention)


def _load_real(preset: str, cfg: Any, overrides: dict, device: torch.device, dtype: torch.dtype,
               generation: GenerationConfig, sampling: MagiScheduleConfig, cache: CacheConfig,
               attention: AttentionConfig) -> MagiChunkwiseAdapter:
    from transformers import AutoTokenizer, T5EncoderModel

    from jensenkv.models.magi.checkpoint import load_dit, resolve_root, weights_dir
    from jensenkv.models.magi.text import MagiT5PromptEncoder, load_special_tokens

    if preset not in PRESET_VARIANTS:
        raise ValueError(f"model.preset={preset!r} is not allowed: use tiny or one of {tuple(PRESET_VARIANTS)}")
    for key in ("path", "height", "width"):
        if getattr(cfg, key) is None:
            raise ValueError(f"model.{key}=None is not allowed: a real MAGI-1 preset needs path, height and width")
    mcfg: MagiModelConfig = model_preset(preset, **overrides)
    variant = cfg.variant or PRESET_VARIANTS[preset]
    root = resolve_root(cfg.path, cfg.cache_dir,
                        [f"ckpt/magi/{variant}/*/*", "ckpt/t5/*", "ckpt/t5/*/*", "ckpt/vae/*"])
    model = load_dit(mcfg, weights_dir(root, variant), dtype, device)
    t5_dir = Path(cfg.t5_path or root / "ckpt" / "t5" / "t5-v1_1-xxl").expanduser()
    if not (t5_dir / "config.json").is_file():
        raise MissingWeightsError(f"MAGI-1 T5 encoder not found: expected {t5_dir / 'config.json'} (t5-v1_1-xxl in "
                                  f"transformers format; set model.t5_path); {FETCH_HINT}")
    tokenizer = AutoTokenizer.from_pretrained(str(t5_dir), local_files_only=True)
    encoder = T5EncoderModel.from_pretrained(str(t5_dir), local_files_only=True, torch_dtype=torch.float32).to(device)
    keys = tuple(cfg.special_tokens or ())
    tokens = load_special_tokens(cfg.special_tokens_file) if keys else None
    text = MagiT5PromptEncoder(tokenizer, encoder, mcfg.caption_max_length, tokens, keys)
    fps = int(cfg.fps or 24)
    decode = load_vae_decoder(Path(cfg.vae_path or root / "ckpt" / "vae").expanduser(),
                              FLOAT_DTYPES[cfg.vae_dtype or cfg.dtype], device, float(cfg.vae_latent_scale or 0.18215),
                              Tiling(sample_length=fps // 2), generation.frames_per_chunk)
    height, width = cfg.height, cfg.width
    if height % (SPATIAL_DOWNSAMPLE * mcfg.patch_size) or width % (SPATIAL_DOWNSAMPLE * mcfg.patch_size):
        raise ValueError(f"model.height/width={height}x{width} is not allowed: both must be multiples of "
                         f"{SPATIAL_DOWNSAMPLE * mcfg.patch_size}")
    shape = (mcfg.latent_channels, height // SPATIAL_DOWNSAMPLE, width // SPATIAL_DOWNSAMPLE)
    return MagiChunkwiseAdapter(model, text, shape, generation, sampling, cache, attention, decode=decode)
