"""Model families: the built-in tiny model, SkyReels-V2 / Wan through diffusers, MAGI-1 (one package each).

``family(kind)`` (jensenkv.models.registry) answers what the suite asks of a model; ``build_adapter(model_cfg,
cache=None, attention=None)`` (jensenkv.models.adapters) builds one. Both are re-exported lazily, so importing
a family's light modules does not pull in the cache and attention stacks.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

# diffusers imports bitsandbytes whenever it is installed (pyiqa requires it; no model here is bnb-quantized), and
# bitsandbytes' CPU backend then asks the Hugging Face Hub for a kernel at import: a DNS lookup and a warning at
# every run. None in sys.modules makes the import machinery report it absent, so diffusers (which probes it once,
# at its own import) leaves it out. An already imported bitsandbytes is kept.
sys.modules.setdefault("bitsandbytes", None)

_EXPORTS = {"build_adapter": "adapters", "full_precision_cache": "adapters", "family": "registry",
            "FAMILIES": "registry", "ModelConfig": "config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jensenkv.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jensenkv.models' has no attribute {name!r}")
