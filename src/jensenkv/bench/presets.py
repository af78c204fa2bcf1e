"""Cache settings for the benchmarks, composed from configs/ exactly as a run composes them.

``preset("rtn", **{"quant.bits": 2})`` composes configs/config.yaml with quant=rtn and the overrides,
then turns the quant node into (key, value) QuantConfigs with the run's own rule
(``jensenkv.cache.CacheSettings.key_value``), so a label such as "rtn" means one quantizer everywhere.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from jensenkv.cache import CacheConfig

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"


def preset(quant: str, head_dim: int, **overrides: Any) -> CacheConfig:
    """The cache of configs/quant/<quant>.yaml with ``quant.<field>=value`` overrides (keys without "quant.")."""
    from omegaconf import OmegaConf

    from jensenkv.run import compose_config

    if not (CONFIG_DIR / "quant" / f"{quant}.yaml").is_file():
        allowed = sorted(p.stem for p in (CONFIG_DIR / "quant").glob("*.yaml"))
        raise ValueError(f"quant={quant!r} is not allowed: use one of {allowed}")
    cfg = compose_config([f"quant={quant}"] + [f"quant.{k}={v}" for k, v in overrides.items()])
    key, value = OmegaConf.to_object(cfg.cache).key_value(OmegaConf.to_object(cfg.quant), head_dim)
    return CacheConfig(key=key, value=value)


def label(quant: str, **overrides: Any) -> str:
    """A config column entry, e.g. "rtn bits=2 group_size=32"."""
    return " ".join([quant] + [f"{k}={v}" for k, v in overrides.items()])
