"""Build the chunk-wise adapter a model config describes, through its family (jensenkv.models.registry)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jensenkv.attention.config import AttentionConfig
from jensenkv.cache import CacheConfig, CacheSettings
from jensenkv.generation.config import GenerationConfig
from jensenkv.models.config import ModelConfig, RunGenerationConfig, as_model_config
from jensenkv.models.registry import family


def full_precision_cache(dtype: str = CacheSettings.full_precision_dtype) -> CacheConfig:
    """The BF16 reference cache: nothing quantized, stored in ``dtype`` (cache.full_precision_dtype)."""
    full = CacheSettings(full_precision_dtype=dtype).full_precision()
    return CacheConfig(key=full, value=full)


def build_adapter(model: ModelConfig | Mapping, cache: CacheConfig | None = None,
                  attention: AttentionConfig | None = None, generation: GenerationConfig | None = None) -> Any:
    """The adapter a model config (or a mapping of its fields) describes, with the given cache (default: the
    BF16 reference cache), attention settings and sampler (default: RunGenerationConfig's, the built-in model's)."""
    cfg = as_model_config(model)
    return family(cfg.kind).build_adapter(cfg, cache if cache is not None else full_precision_cache(),
                                          attention if attention is not None else AttentionConfig(),
                                          generation if generation is not None else RunGenerationConfig())
