"""The built-in tiny model (configs/model/tiny.yaml) as the end-to-end benchmark's subject.

Variants: the full-precision cache ("bf16", the suite's BF16 reference row), INT2 RTN g=32 keys and
values, and INT2 with the Taylor and the exact correction. One adapter (one model copy) per variant.

Without trained weights (before `make train-tiny`) a randomly initialised model of the same
architecture is timed instead and the shape label says so: the attention, quantization and
matmul work do not depend on the weights, but the exact bias's form (series or elementwise)
depends on the magnitudes of q and the steps, so exact timings may differ from the trained model's.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import yaml

from jensenkv.bench.quant_configs import key_value_configs
from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig
from jensenkv.models.registry import build_adapter, full_precision_cache
from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter

ROOT = Path(__file__).resolve().parents[3]
TINY_CONFIG = ROOT / "configs" / "model" / "tiny.yaml"
PROMPT = "a red circle moving right on a dark background"
BASELINE = "bf16"
VARIANTS = (("bf16", "none"), ("rtn-int2-g32", "none"), ("rtn-int2-g32", "taylor"), ("rtn-int2-g32", "exact"))


def variant_name(quant: str, correction: str) -> str:
    return quant if correction == "none" else f"{quant}+{correction}"


def _cache(quant: str) -> CacheConfig:
    if quant == BASELINE:
        return full_precision_cache()
    key, value = key_value_configs(quant)
    return CacheConfig(key=key, value=value)


def random_init_tiny_adapter(cache: CacheConfig, attention: AttentionSettings, seed: int = 0) -> ChunkwiseAdapter:
    """The tiny architecture with seeded random weights and the tiny model's default sampler and frame size."""
    from jensenkv.models.registry import generation_config
    from jensenkv.models.tiny.config import SamplerConfig, build_transformer, default_transformer_config
    from jensenkv.models.tiny.data import DataConfig
    from jensenkv.models.tiny.text import TextConfig, build_text

    torch.manual_seed(seed)  # every variant gets the same random weights
    text_cfg = TextConfig()
    transformer = build_transformer(default_transformer_config(text_cfg.text_dim))
    tokenizer, text_encoder = build_text(text_cfg)
    text_encoder.eval()
    sampler, data = SamplerConfig(), DataConfig()
    generation = generation_config({}, {"steps": sampler.steps, "shift": sampler.shift,
                                        "guidance_scale": sampler.cfg_scale,
                                        "frames_per_chunk": sampler.frames_per_chunk, "num_chunks": sampler.num_chunks})

    def encode(prompts: list[str]) -> torch.Tensor:
        return text_encoder(tokenizer(prompts))  # (B, L, text_dim)

    return ChunkwiseAdapter(transformer.eval(), encode, (transformer.config.in_channels, data.height, data.width),
                            generation, cache, attention, clean_range=(-1.0, 1.0))


def tiny_adapters(quick: bool) -> tuple[dict[str, ChunkwiseAdapter], str, str, GenerationConfig, str]:
    """(adapters by variant name, baseline name, prompt, generation config, shape label) for the benchmark.

    quick: 2 chunks of 2 denoising steps instead of the model's defaults.
    """
    model_cfg = yaml.safe_load(TINY_CONFIG.read_text())
    model_cfg["device"] = "cpu"
    adapters: dict[str, ChunkwiseAdapter] = {}
    label = "tiny"  # the trained built-in model
    for quant, correction in VARIANTS:
        attention = AttentionSettings(backend="cached", correction=correction)
        try:
            adapter = build_adapter(model_cfg, cache=_cache(quant), attention=attention)
        except FileNotFoundError:  # no trained weights yet: time the same architecture, say so in the label
            adapter = random_init_tiny_adapter(_cache(quant), attention)
            label = "tiny-random-init"
        adapters[variant_name(quant, correction)] = adapter
    generation = next(iter(adapters.values())).generation
    if quick:
        generation = replace(generation, num_chunks=2, steps=2, kv_range=None)
    c, h, w = next(iter(adapters.values())).latent_frame_shape
    cfg = "CFG" if generation.use_cfg else "no CFG"
    chunks = f"{generation.num_chunks}x{generation.frames_per_chunk} frames"
    shape = f"{label} {chunks} {c}x{h}x{w} {generation.steps} steps {cfg}"
    return adapters, BASELINE, PROMPT, generation, shape
