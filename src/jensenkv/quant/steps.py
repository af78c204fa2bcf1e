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
