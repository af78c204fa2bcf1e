"""The experiment pipeline behind ``python -m jensenkv.run``: one run = one (model, quantizer, correction,
eval) point over a list of prompts.

    python -m jensenkv.run quant=rtn quant.bits=2 correction=taylor
    python -m jensenkv.run -m quant.bits=2,4 quant.group_size=32,64,128 quant.rotation=none,hadamard \
        correction=none,taylor,exact
    python -m jensenkv.run -m experiment=table1 [hydra/launcher=local_parallel | hydra/launcher=slurm]

A run is identified by a hash of its canonical resolved config (logger, launcher, paths and bookkeeping
excluded; settings a method ignores are normalised away, so e.g. every bf16 run is the same run). The
BF16 reference video of each (model, prompt, seed) is generated once, stored under ``results/refs/`` and
reused by every quantized run. A finished run (its record exists) is a no-op; an interrupted one resumes
at the first prompt without a saved result. Bad config values stop the run with one line naming the key,
the value and what is allowed, before any model is loaded.

Heavy libraries (torchmetrics, diffusers, the model code) are imported inside the functions that use
them, so that validation -- and its error for bad input -- takes seconds.

Modules (the run's specification, config -> RunSpec and its id, is ``jensenkv.config.resolve``): ``runner`` (references, generation, metrics,
record, W&B), ``cli`` (precheck of every swept value, the Hydra task, the compose-API entry).
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it; imported on first use, so ``python -m jensenkv.run`` reaches its
# Ctrl-C handler (``__main__``) before any heavy import
_EXPORTS = {
    **dict.fromkeys(("check_group_overrides", "compose_config", "group_options", "main", "precheck", "preset",
                     "run_overrides", "sweep_variants", "task"), "jensenkv.run.cli"),
    **dict.fromkeys(("Runner", "save_mp4"), "jensenkv.run.runner"),
    **dict.fromkeys(("CONFIG_DIR", "CONFIG_GROUPS", "RunSpec", "build_spec", "resolve"), "jensenkv.config.resolve"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jensenkv.run' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
