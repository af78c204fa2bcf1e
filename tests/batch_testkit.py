"""What the batched-generation tests share: generate a batch, regenerate each video alone, measure the gap.

Frames and latents: max |a - b| / max |b|. Probe values v: |b - a| / max(|v|, 1), since several probes are
differences of O(1) masses (delta_p_s = p_s - p_s_ref) that cannot keep a rounding error relative to
themselves.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from jensenkv.generate import GenerationConfig, generate_video, generate_videos

TOLERANCE = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def max_probe_error(batched: list[dict], alone: list[dict]) -> float:
    """Largest |b - a| / max(|a|, 1) over every numeric probe value (same records, same order)."""
    assert len(batched) == len(alone) and batched
    worst = 0.0
    for b, a in zip(batched, alone):
        assert b.keys() == a.keys() and all(b[k] == a[k] for k in ("layer", "step", "chunk", "branch"))
        for key, value in a.items():
            if isinstance(value, float) and math.isfinite(value):
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
        else:
            assert result.probes is None
        assert result.timings["batch_size"] == len(prompts) and alone.timings["batch_size"] == 1
    return errors
