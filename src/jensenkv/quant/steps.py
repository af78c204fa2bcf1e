"""GroupSteps: the per-group rounding steps of quantized keys, as the Jensen correction reads them.

It lives in ``quant`` (which produces it) so that ``quant`` never imports ``correction``;
``jensenkv.correction`` re-exports it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jensenkv.quant.hadamard import RandomHadamard


@dataclass
class GroupSteps:
    """Compact per-element quantization steps of cached keys.

    step: (B, H, K, G). Group j of token k covers the g = D // G contiguous channels
    [j*g, (j+1)*g) of the key, in the rotated basis when ``rotation`` is set.
    Per-tensor and per-token quantization have G = 1; token groups of g channels have G = D / g;
    per-channel (KIVI keys) has G = D.
    """

    step: torch.Tensor  # (B, H, K, G)
    rotation: RandomHadamard | None = None


def step_max(step: torch.Tensor) -> torch.Tensor:
    """() float32: the largest of stored steps (any stored dtype, positive by construction), read in place.

    float8 has no max kernel; positive floats are ordered like their bit patterns, so its max is taken on the
    uint8 view (no float copy of the steps).
    """
    if step.dtype.is_floating_point and step.element_size() == 1:
        return step.view(torch.uint8).amax().view(step.dtype).float()
    return step.amax().float()
