"""WorldPlay's sampling schedule: ``FlowMatchDiscreteScheduler(shift, reverse=True, solver="euler")``
(hyvideo/schedulers/scheduling_flow_match_discrete.py, set_timesteps and step).

Noise levels: linspace(1, 0, steps + 1) in float32, then the SD3 shift s' = shift s / (1 + (shift - 1) s),
in float32; the model gets sigma x 1000 in float32 (never cast to BF16). Each step is
x + v (sigma_next - sigma) in float32 (the suite's generator does that step: ``jensenkv.generation.loop``), and
the result is stored in BF16 between steps (``generation.worldplay.latent_dtype``). Distilled: 4 steps,
no CFG, timesteps [1000, 937.5, 833.33, 625]; base: 50 steps, CFG 6.0; both shift 5.

``jensenkv.generation.loop.flow_sigmas`` is the same formula evaluated in float64 and rounded once: equal at 4 and
8 steps, but 1 float32 ulp apart at 50 steps, so WorldPlay's float32 evaluation lives here.
"""
from __future__ import annotations

import torch

NUM_TRAIN_TIMESTEPS = 1000


def worldplay_sigmas(steps: int, shift: float) -> torch.Tensor:
    """(steps + 1,) float32 noise levels from 1 to 0, computed as WorldPlay's scheduler does (float32)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"generation.steps={steps!r} is not allowed: must be an integer >= 1")
    if not shift > 0:
        raise ValueError(f"generation.shift={shift!r} is not allowed: must be > 0")
    s = torch.linspace(1, 0, steps + 1, dtype=torch.float32)
    if shift != 1.0:
        s = (shift * s) / (1 + (shift - 1) * s)
    return s


def worldplay_timesteps(steps: int, shift: float) -> torch.Tensor:
    """(steps,) float32 model timesteps: sigma x 1000 of every step but the last level."""
    return (worldplay_sigmas(steps, shift)[:-1] * NUM_TRAIN_TIMESTEPS).to(torch.float32)


def model_timestep(sigma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """() float32 timestep the transformer gets for a generator noise level (as WorldPlay's timesteps)."""
    return torch.tensor(sigma, dtype=torch.float32, device=device) * NUM_TRAIN_TIMESTEPS
