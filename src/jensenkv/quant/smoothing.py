"""Channel-mean smoothing (SageAttention): quantize x minus its per-chunk channel mean, add the mean back.

Keys of a chunk share a large per-channel offset; removing it shrinks each group's range (and so its step)
before quantizing. The mean is stored in scale_dtype, and the SAME stored value is subtracted and added back,
so x_hat - x is exactly the inner quantizer's error: the steps, and the correction built on them
(GroupSteps), are those of the inner tensor, unchanged by the shift.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from jensenkv.quant.tensors import QuantizedTensor, tensor_nbytes

if TYPE_CHECKING:
    from jensenkv.quant.steps import GroupSteps


def channel_mean(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (B, H, S, D) -> its mean over the chunk's tokens, (B, H, 1, D), as stored in `dtype`."""
    return x.float().mean(dim=2, keepdim=True).to(dtype)


class ChannelMeanTensor(QuantizedTensor):
    """A quantized (x - mean) plus the stored mean (B, H, 1, D)."""

    def __init__(self, inner: QuantizedTensor, mean: torch.Tensor):
        if inner.rotation is not None:
            raise ValueError("the inner tensor of ChannelMeanTensor must not carry a rotation: the outer one does")
        self.inner = inner  # (B, H, S, D) quantized x - mean, rotated basis
        self.mean = mean  # (B, H, 1, D) in scale_dtype, rotated basis
        self.shape = inner.shape
        self.rotation = None  # set by the quantizer when the chunk was rotated

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes + tensor_nbytes(self.mean)

    def _dequantize_rotated(self) -> torch.Tensor:
        return self.inner._dequantize_rotated() + self.mean.float()  # (B, H, S, D)

    def group_steps(self) -> GroupSteps:
        from jensenkv.quant.steps import GroupSteps

        return GroupSteps(step=self.inner.group_steps().step, rotation=self.rotation)
