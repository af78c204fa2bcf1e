"""What the batched-generation tests share: generate a batch, regenerate each video alone, measure the gap.

Frames and latents: max |a - b| / max |b|. Probe values v: |b - a| / max(|v|, 1), since several probes are
differences of O(1) masses (delta_p_s = p_s - p_s_ref) that cannot keep a rounding error relative to
themselves. The error-model diagnostics (``em_*``) count codes, not values: a last-bit difference between a
batched and a single GEMM (which CPU kernels may round differently) flips an INT2 code sitting on a rounding
boundary, and a flip moves a mean over the call's N elements by about 1/N (seen: 1.2e-5 on a 2-core x86 machine).
They are held to DIAGNOSTIC_TOLERANCE, a few flips; everything continuous to TOLERANCE, which leaves room for the
same flip's effect downstream (seen on 2026-12-07: frames 1.02e-5 apart, QuaRot INT2 with Taylor, SkyReels-V2).
``within_tolerance`` applies both.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import generate_video, generate_videos

TOLERANCE = 2e-5
DIAGNOSTIC_TOLERANCE = 1e-4  # em_* diagnostics: a few INT2 codes flipped by last-bit GEMM differences


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def max_probe_error(batched: list[dict], alone: list[dict], diagnostics: bool = False) -> float:
    """Largest |b - a| / max(|a|, 1) over every numeric probe value (same records, same order): the continuous
    ones, or with ``diagnostics`` the error-model diagnostics (``em_*``) only."""
    assert len(batched) == len(alone) and batched
    worst = 0.0
    for b, a in zip(batched, alone):
        assert b.keys() == a.keys() and all(b[k] == a[k] for k in ("layer", "step", "chunk", "branch"))
        for key, value in a.items():
            if key.startswith("em_") == diagnostics and isinstance(value, float) and math.isfinite(value):
                worst = max(worst, abs(b[key] - value) / max(abs(value), 1.0))
    return worst


def batch_errors(adapter, prompts: Sequence[str], seeds: Sequence[int],
                 cfg: GenerationConfig | None = None) -> dict[str, float]:
    """Worst gap, over the batch's videos, between each video batched and the same video alone."""
    batched = generate_videos(adapter, prompts, seeds, cfg)
    errors = {"frames": 0.0, "latents": 0.0, "probes": 0.0}
    for result, prompt, seed in zip(batched, prompts, seeds):
        alone = generate_video(adapter, prompt, seed, cfg)
        errors["frames"] = max(errors["frames"], rel(result.video, alone.video))
        errors["latents"] = max(errors["latents"], rel(result.latents, alone.latents))
        if alone.probes is not None:
            errors["probes"] = max(errors["probes"], max_probe_error(result.probes, alone.probes))
            errors["diagnostics"] = max(errors.get("diagnostics", 0.0),
                                        max_probe_error(result.probes, alone.probes, diagnostics=True))
        else:
            assert result.probes is None
        assert result.timings["batch_size"] == len(prompts) and alone.timings["batch_size"] == 1
    return errors


def within_tolerance(errors: dict[str, float]) -> bool:
    """Every continuous gap within TOLERANCE and the error-model diagnostics within DIAGNOSTIC_TOLERANCE."""
    return (max(v for k, v in errors.items() if k != "diagnostics") <= TOLERANCE
            and errors.get("diagnostics", 0.0) <= DIAGNOSTIC_TOLERANCE)
