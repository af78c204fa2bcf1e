"""Subtractive dither offsets, regenerated from a (seed, counter) pair instead of being stored.

A quantizer with dither="subtractive" numbers its quantize calls; call n of a quantizer seeded s draws its
offsets from the generator seeded by SeedSequence([s, n]), so consecutive chunks get independent offsets,
a run is reproducible from its config, and dequantize regenerates exactly the offsets that were added.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DRAW_NBYTES = 16  # the stored seed and counter: two int64


@dataclass(frozen=True)
class DitherDraw:
    """One quantize call's dither: offsets u ~ U[-1/2, 1/2) in units of the step, one per element."""

    seed: int
    counter: int
    # videos stacked along the batch axis (``quant.samples``): each one's offsets are the draw it made alone
    samples: int = 1

    @property
    def nbytes(self) -> int:
        return DRAW_NBYTES * self.samples  # each video keeps its own (seed, counter)

    def offsets(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """(shape) float32 offsets in [-1/2, 1/2); drawn on the CPU, so identical on every device. With
        ``samples`` > 1, shape[0] splits into that many videos that each get the draw of shape[0] / samples."""
        state = np.random.SeedSequence([self.seed, self.counter]).generate_state(1, dtype=np.uint64)[0]
        gen = torch.Generator().manual_seed(int(state) >> 1)  # manual_seed takes a signed 64-bit value
        own = (shape[0] // self.samples, *shape[1:]) if self.samples > 1 else tuple(shape)
        draw = torch.rand(own, generator=gen) - 0.5
        if self.samples > 1:
            draw = draw.repeat(self.samples, *([1] * (len(shape) - 1)))
        return draw.to(device)
