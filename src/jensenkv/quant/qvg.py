"""QuantVideoGen (QVG): k-means "semantic smoothing" along tokens, then RTN on the residual.

Per chunk and per (B, H) slice, the S token vectors (D-dim) are clustered into C centroids by a
batched Lloyd k-means; each token's centroid is subtracted, and this repeats on the residual for
`qvg_stages` stages (progressive residual quantization). The final residual is RTN-quantized with
the configured bits / granularity. Stored: centroids (B, H, C, D) in scale_dtype per stage,
assignments (B, H, S) (uint8 when C <= 256, else int16) per stage, and the residual's packed
codes, steps and zeros. The residual is taken against the STORED (rounded) centroids, so the only
reconstruction error is the residual's RTN error and group_steps() = the residual's steps.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from jensenkv.quant.rtn import RTNTensor
from jensenkv.quant.steps import GroupSteps
from jensenkv.quant.tensors import QuantizedTensor, tensor_nbytes

if TYPE_CHECKING:
    from jensenkv.quant.hadamard import RandomHadamard


def nearest_centroid(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """x (N, S, D), centroids (N, C, D) -> (N, S) int64 index of the nearest centroid (Euclidean)."""
    # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2; ||x||^2 is the same for every c, so it is dropped.
    dist = (centroids * centroids).sum(-1)[:, None, :] - 2 * x @ centroids.transpose(1, 2)  # (N, S, C)
    return dist.argmin(-1)


def gather_centroids(centroids: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
    """centroids (N, C, D), assign (N, S) -> (N, S, D): each token's centroid."""
    return centroids.gather(1, assign.long()[..., None].expand(-1, -1, centroids.shape[-1]))


def lloyd_kmeans(x: torch.Tensor, init: torch.Tensor, iters: int) -> torch.Tensor:
    """Batched Lloyd iterations. x (N, S, D), init (N, C, D) -> centroids (N, C, D).

    A centroid that loses all its tokens keeps its previous position (no re-seeding).
    """
    centroids = init.float()
    n, c, d = centroids.shape
    for _ in range(iters):
        assign = nearest_centroid(x, centroids)  # (N, S)
        sums = x.new_zeros(n, c, d).scatter_add_(1, assign[..., None].expand(-1, -1, d), x)  # (N, C, D)
        counts = x.new_zeros(n, c).scatter_add_(1, assign, x.new_ones(assign.shape))  # (N, C)
        centroids = torch.where(counts[..., None] > 0, sums / counts.clamp(min=1)[..., None], centroids)
    return centroids


def random_token_init(x: torch.Tensor, num_centroids: int, generator: torch.Generator) -> torch.Tensor:
    """Cold start: C distinct tokens per slice, chosen by a seeded permutation. x (N, S, D) -> (N, C, D)."""
    n, s, _ = x.shape
    perm = torch.rand(n, s, generator=generator).argsort(dim=-1)[:, :num_centroids].to(x.device)  # (N, C)
    return gather_centroids(x, perm)


class QVGTensor(QuantizedTensor):
    """Stages of (centroids, assignments) plus the RTN-quantized final residual."""

    def __init__(
        self,
        centroids: list[torch.Tensor],
        assignments: list[torch.Tensor],
        residual: RTNTensor,
        rotation: RandomHadamard | None = None,
    ):
        self.centroids = centroids  # per stage: (B, H, C, D) in scale_dtype
        self.assignments = assignments  # per stage: (B, H, S) uint8 or int16
        self.residual = residual  # (B, H, S, D), in the rotated basis; its own rotation is None
        self.shape = residual.shape
        self.rotation = rotation

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(*self.centroids, *self.assignments) + self.residual.nbytes

    def _dequantize_rotated(self) -> torch.Tensor:
        b, h, s, d = self.shape
        x = self.residual.dequantize().reshape(b * h, s, d)  # (N, S, D)
        for cents, assign in zip(self.centroids, self.assignments):
            x = x + gather_centroids(cents.float().reshape(b * h, -1, d), assign.reshape(b * h, s))
        return x.reshape(b, h, s, d)

    def group_steps(self) -> GroupSteps:
        return GroupSteps(step=self.residual.token_steps(), rotation=self.rotation)
