"""The built-in tiny model (configs/model/tiny.yaml) as the end-to-end benchmark's subject.

Variants: a BF16 cache ("bf16": keys and values stored in bfloat16, the reference row), INT2 RTN g=32
keys and values, and INT2 with the Taylor and the exact correction. One adapter (one model copy) per
variant. Without trained weights the loader's FileNotFoundError names the file and `make train-tiny`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path


from jensenkv.bench.quant_configs import key_value_configs
from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig
from jensenkv.models.registry import build_adapter
from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "a red circle moving right on a dark background"
BASELINE = "bf16"
VARIANTS = (("bf16", "none"), ("rtn-int2-g32", "none"), ("rtn-int2-g32", "taylor"), ("rtn-int2-g32", "exact"))


def variant_name(quant: str, correction: str) -> str:
    return quant if correction == "none" else f"{quant}+{correction}"


def _cache(quant: str) -> CacheConfig:
    key, value = key_value_configs(quant)
    return CacheConfig(key=key, value=value)


def tiny_adapters(quick: bool) -> tuple[dict[str, ChunkwiseAdapter], str, str, GenerationConfig, str]:
    """(adapters by variant name, baseline name, prompt, generation config, shape label) for the benchmark.

    quick: 2 chunks of 2 denoising steps instead of the model's defaults.
    """
    from jensenkv.run import preset

    spec = preset("model=tiny", "model.device=cpu")  # the same model and sampler as Table 1's runs
    adapters: dict[str, ChunkwiseAdapter] = {}
    for quant, correction in VARIANTS:
        attention = AttentionSettings(backend="cached", correction=correction)
        adapters[variant_name(quant, correction)] = build_adapter(spec.model, cache=_cache(quant), attention=attention,
                                                                  generation=spec.generation)
    generation = spec.generation
    if quick:
        generation = replace(generation, num_chunks=2, steps=2, kv_range=None)
    c, h, w = next(iter(adapters.values())).latent_frame_shape
    cfg = "CFG" if generation.use_cfg else "no CFG"
    chunks = f"{generation.num_chunks}x{generation.frames_per_chunk} frames"
    shape = f"tiny {chunks} {c}x{h}x{w} {generation.steps} steps {cfg}"
    return adapters, BASELINE, PROMPT, generation, shape
