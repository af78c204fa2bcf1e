"""Evaluators: fidelity to the BF16 reference (PSNR, SSIM, LPIPS), VBench dimensions, attention metrics.

Names are re-exported lazily so that importing one evaluator (e.g. for config checks) stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "mass_by_layer_step": "attention", "probe_frame": "attention", "summarize_probes": "attention",
    "LpipsScorer": "fidelity", "lpips_availability": "fidelity", "video_psnr": "fidelity", "video_ssim": "fidelity",
    "VBenchResult": "vbench", "dimension_missing_reason": "vbench", "evaluate_vbench": "vbench",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jensenkv.eval.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jensenkv.eval' has no attribute {name!r}")
