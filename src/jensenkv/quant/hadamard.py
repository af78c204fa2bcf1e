"""Randomized Hadamard rotation (QuaRot-style): x -> H diag(s) x with H the normalized Walsh-Hadamard matrix.

Applied to queries and keys alike, it leaves q.k unchanged (H diag(s) is orthogonal) while spreading
channel outliers across all channels, which shrinks per-group ranges before quantization.
Cost: O(d log d) per vector through the fast Walsh-Hadamard transform (no d x d matrix).
"""
from __future__ import annotations

import torch


def walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalized fast Walsh-Hadamard transform along the last dim (a power of two). Self-inverse."""
    d = x.shape[-1]
    if d <= 0 or d & (d - 1):
        raise ValueError(f"head_dim={d} is not allowed for the Hadamard rotation: it must be a power of two")
    lead = x.shape[:-1]
    src = x.reshape(-1, d)  # (N, d); read, never written
    buffers = (src.new_empty(src.shape), src.new_empty(src.shape))  # contiguous; a stage writes the one it does not read
    h, stage = 1, 0
    while h < d:  # butterflies pair element i with i + h: no stacked tensor per stage, no copy of x
        blocks = d // (2 * h)
        pairs, into = src.view(-1, blocks, 2, h), buffers[stage % 2].view(-1, blocks, 2, h)  # (N, blocks, 2, h)
        torch.add(pairs[:, :, 0], pairs[:, :, 1], out=into[:, :, 0])
        torch.sub(pairs[:, :, 0], pairs[:, :, 1], out=into[:, :, 1])
        src, h, stage = buffers[stage % 2], h * 2, stage + 1
    return (src.reshape(*lead, d) / d**0.5).to(x.dtype)


class RandomHadamard:
    """The orthogonal map R = H diag(s), s a seeded vector of random signs.

    ``apply`` computes R x (rotate), ``inverse`` computes R^T x (un-rotate); both along the last dim.
    """

    def __init__(self, dim: int, seed: int = 0):
        if dim <= 0 or dim & (dim - 1):
            raise ValueError(
                f"head_dim={dim} is not allowed with quant.rotation=hadamard: it must be a power of two"
            )
        self.dim = dim
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (dim,), generator=gen).float() * 2 - 1  # (d,) in {-1, +1}, on the CPU
        # copies of the signs per (device, dtype): a host-to-device copy once, not on every call
        self._signs_on: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def signs_on(self, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
        """The signs (d,) on ``device`` in ``dtype``, copied there once and reused."""
        key = (torch.device(device), dtype)
        signs = self._signs_on.get(key)
        if signs is None:
            signs = self._signs_on[key] = self.signs.to(*key)
        return signs

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return walsh_hadamard(x * self.signs_on(x.device, x.dtype))

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        return walsh_hadamard(x) * self.signs_on(x.device, x.dtype)
