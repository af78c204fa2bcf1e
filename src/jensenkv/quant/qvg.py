"""QuantVideoGen (QVG): k-means "semantic smoothing" along tokens, then RTN on the residual.

Per chunk, per (B, H) slice and per span of tokens (qvg_span; default the whole chunk), the token vectors
(D-dim) are clustered into C centroids by a batched k-means; each token's centroid is subtracted, and this
repeats on the residual for `qvg_stages` stages (progressive residual quantization). The final residual is
RTN-quantized with the configured bits / granularity / symmetry / scale dtype. Stored: per stage the
centroids (B, H, spans * C, D) in qvg_centroid_dtype and the in-span assignments (B, H, S) (uint8 when
C <= 256, else int16), plus the residual's packed codes, steps (and zeros when asymmetric). The residual is
taken against the STORED (rounded) centroids, so the only reconstruction error is the residual's RTN error
and group_steps() = the residual's steps.

Two k-means (qvg_kmeans):
- published (svg-project/Quant-VideoGen @0601468, kmeans/kmeans_euclid.py): C tokens drawn with
  replacement (torch.randint) as the start, fresh on every call; at most qvg_iters rounds of (assign,
  update); stop when fewer than qvg_tol of the labels changed since the last round (then the centroids are
  those the labels were assigned to); an empty cluster keeps its centroid; at the iteration limit the
  labels returned are from before the last centroid update. With symmetric absmax INT2 residuals
  (codes {-1, 0, 1}), an fp8 e4m3 scale per block of 64 (QVG) or 16 (QVG-Pro, 4 stages), bf16 centroids
  and 256 centroids over a 49,920-token span, bytes are 16 / (2 + 8/block + stages (8/128 + 256*16/S))
  = 7.05x (QVG) and 5.20x (QVG-Pro) below BF16 at d = 128.
- warm_start (the suite's first QVG, kept so its results reproduce): C distinct tokens by a seeded
  permutation for the first chunk, the previous chunk's centroids afterwards, exactly qvg_iters Lloyd
  rounds, labels re-assigned to the stored centroids.
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
    for _ in range(iters):
        centroids = update_centroids(x, nearest_centroid(x, centroids), centroids)
    return centroids


def update_centroids(x: torch.Tensor, assign: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Mean of each cluster's tokens; an empty cluster keeps its centroid. x (N, S, D), assign (N, S) -> (N, C, D)."""
    n, c, d = centroids.shape
    sums = x.new_zeros(n, c, d).scatter_add_(1, assign[..., None].expand(-1, -1, d), x)  # (N, C, D)
    counts = x.new_zeros(n, c).scatter_add_(1, assign, x.new_ones(assign.shape))  # (N, C)
    return torch.where(counts[..., None] > 0, sums / counts.clamp(min=1)[..., None], centroids)


def published_kmeans(
    x: torch.Tensor, num_centroids: int, max_iters: int, tol: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """QVG's batch_kmeans_Euclid. x (N, S, D) -> (labels (N, S), centroids (N, C, D), rounds run).

    Start: C tokens per slice drawn with replacement from `generator`. Each round assigns every token to its
    nearest centroid, then computes the new centroids; if fewer than `tol` of all labels changed since the
    previous round it stops before adopting them. At the limit the labels are from before the last update.
    """
    if max_iters < 1:
        raise ValueError(f"quant.qvg_iters={max_iters} is not allowed with qvg_kmeans=published: must be >= 1")
    n, s, _ = x.shape
    index = torch.randint(0, s, (n, num_centroids), generator=generator).to(x.device)  # (N, C), with replacement
    centroids = gather_centroids(x, index)  # (N, C, D)
    previous = None
    for rounds in range(1, max_iters + 1):
        labels = nearest_centroid(x, centroids)  # (N, S)
        updated = update_centroids(x, labels, centroids)
        if previous is not None and (labels != previous).sum().item() / labels.numel() < tol:
            break
        previous, centroids = labels, updated
    return labels, centroids, rounds


def span_bounds(tokens: int, span: int | None) -> list[tuple[int, int]]:
    """[start, end) of each k-means span: spans of `span` tokens, the remainder joining the last one."""
    if span is None or span >= tokens:
        return [(0, tokens)]
    count = tokens // span
    return [(i * span, (i + 1) * span if i < count - 1 else tokens) for i in range(count)]


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
        spans: list[tuple[int, int]] | None = None,
    ):
        self.centroids = centroids  # per stage: (B, H, spans * C, D) in the centroid dtype, span-major
        self.assignments = assignments  # per stage: (B, H, S) uint8 or int16, index within the token's span
        self.residual = residual  # (B, H, S, D), in the rotated basis; its own rotation is None
        self.shape = residual.shape
        self.rotation = rotation
        # token bounds of the k-means spans: fixed by (S, qvg_span), so not stored bytes
        self.spans = spans if spans is not None else [(0, self.shape[2])]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(*self.centroids, *self.assignments) + self.residual.nbytes

    def _dequantize_rotated(self) -> torch.Tensor:
        b, h, s, d = self.shape
        x = self.residual.dequantize().reshape(b * h, s, d)  # (N, S, D)
        for cents, assign in zip(self.centroids, self.assignments):
            cents = cents.float().reshape(b * h, len(self.spans), -1, d)  # (N, spans, C, D)
            assign = assign.reshape(b * h, s)
            x = x + torch.cat([gather_centroids(cents[:, i], assign[:, start:end])
                               for i, (start, end) in enumerate(self.spans)], dim=1)
        return x.reshape(b, h, s, d)

    def group_steps(self) -> GroupSteps:
        return GroupSteps(step=self.residual.token_steps(), rotation=self.rotation)
