"""Load SkyReels-V2 / Wan from a diffusers folder into the chunk-wise adapter."""
from __future__ import annotations

from typing import Any

import torch

from jensenkv.models.loaders import (
    T5PromptEncoder,
    WanVaeDecoder,
    load_wan_transformer,
    require_subfolder,
    resolve_local_dir,
)
from jensenkv.models.wan.adapter import WanChunkwiseAdapter
from jensenkv.quant.config import FLOAT_DTYPES


def load_diffusers_adapter(cfg: Any, cache: Any, attention: Any, generation: Any) -> WanChunkwiseAdapter:
    """SkyReels-V2 / Wan from a diffusers folder (transformer, vae, text_encoder, tokenizer subfolders).

    ``transformer_checkpoint`` (optional) replaces the transformer weights by an original-format Wan
    checkpoint, e.g. Self-Forcing's self_forcing_dmd.pt (``checkpoint_key: generator_ema``).
    """
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    device, dtype = torch.device(cfg.device), FLOAT_DTYPES[cfg.dtype]
    local = resolve_local_dir(cfg.path, cfg.cache_dir)
    transformer = load_wan_transformer(local, cfg.transformer_class, dtype, cfg.transformer_subfolder or "transformer",
                                       cfg.transformer_checkpoint, cfg.checkpoint_key)
    vae = AutoencoderKLWan.from_pretrained(str(require_subfolder(local, "vae", "Wan VAE")), local_files_only=True,
                                           torch_dtype=FLOAT_DTYPES[cfg.vae_dtype or cfg.dtype]).to(device)
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
    return WanChunkwiseAdapter(transformer.to(device), encode, shape, generation, cache, attention,
                            decode=WanVaeDecoder(vae), fps=cfg.fps or 24)
