"""QuantizedTensor: what the cache stores for one chunk, plus the full-precision ("none") form.

A QuantizedTensor holds only real storage (packed codes, steps, zeros, centroids, ...) and counts
its bytes exactly in `nbytes`; `dequantize()` rebuilds a float32 (B, H, S, D) tensor in the
ORIGINAL basis (it undoes the Hadamard rotation when one was applied before quantizing).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from jensenkv.quant.hadamard import RandomHadamard
from jensenkv.quant.steps import GroupSteps


def tensor_nbytes(*tensors: torch.Tensor | None) -> int:
    """Exact bytes of the given tensors' elements (None counts 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class QuantizedTensor(ABC):
    """One stored (B, H, S, D) tensor. Subclasses implement the reconstruction in the rotated basis."""

    shape: tuple[int, int, int, int]
    rotation: RandomHadamard | None = None

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Exact bytes of everything stored."""

    @abstractmethod
    def _dequantize_rotated(self) -> torch.Tensor:
        """(B, H, S, D) float32 reconstruction in the basis the codes live in."""

    def dequantize(self) -> torch.Tensor:
        """(B, H, S, D) float32 reconstruction in the original (un-rotated) basis."""
        x = self._dequantize_rotated()  # (B, H, S, D)
        return self.rotation.inverse(x) if self.rotation is not None else x

    @abstractmethod
    def group_steps(self) -> GroupSteps | None:
        """The key-noise description the Jensen correction needs (None when nothing is quantized)."""


class FullPrecisionTensor(QuantizedTensor):
    """Method "none": the tensor kept as is, in a stated dtype (QuantConfig.store_dtype)."""

    def __init__(self, x: torch.Tensor, dtype: torch.dtype):
        self.data = x.detach().to(dtype).clone()  # (B, H, S, D); clone: never alias the caller's buffer
        self.shape = tuple(self.data.shape)
        self.rotation = None

    @classmethod
    def view_of(cls, data: torch.Tensor) -> FullPrecisionTensor:
        """A stored tensor over ``data`` (B, H, S, D) as it is: no copy (a store's buffer, one video's rows)."""
        stored = cls.__new__(cls)
        stored.data, stored.shape, stored.rotation = data, tuple(data.shape), None
        return stored

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.data)

    def _dequantize_rotated(self) -> torch.Tensor:
        return self.data.float()

    def group_steps(self) -> None:
        return None
