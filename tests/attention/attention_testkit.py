"""Random inputs for the attention tests: queries, a current chunk, and cached segments.

Segments are ``jensenkv.cache.Segment.from_tensors`` (the attention paths read only k, v, steps, k_ref, v_ref).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pytest
import torch

from jensenkv.cache import Segment
from jensenkv.correction import GroupSteps
from jensenkv.quant.hadamard import RandomHadamard


@dataclass
class AttentionCase:
    q: torch.Tensor  # (B, H, Q, D)
    k_cur: torch.Tensor  # (B, H, R, D)
    v_cur: torch.Tensor  # (B, H, R, Dv)
    segments: list[Segment]


def make_case(
    groups: int,
    rotated: bool,
    seed: int = 0,
    batch: int = 2,
    heads: int = 2,
    n_q: int = 6,
    head_dim: int = 128,
    value_dim: int = 64,
    step_range: tuple[float, float] = (2.0, 6.0),
    dtype: torch.dtype = torch.float32,
) -> AttentionCase:
    """Two quantized segments (12 and 5 keys, with steps) around a full-precision one (7 keys, no steps).

    Steps in ``step_range`` make the mean Taylor bias O(1) at scale 1/sqrt(D), so a wrong bias shows.
    """
    gen = torch.Generator().manual_seed(seed)
    rotation = RandomHadamard(head_dim, seed=seed + 1) if rotated else None

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    def segment(n_keys: int, with_steps: bool) -> Segment:
        lo, hi = step_range
        step = lo + (hi - lo) * torch.rand(batch, heads, n_keys, groups, generator=gen)  # (B, H, K, G)
        steps = GroupSteps(step.to(dtype), rotation) if with_steps else None
        k, v = rand(batch, heads, n_keys, head_dim), rand(batch, heads, n_keys, value_dim)
        return Segment.from_tensors(k=k, v=v, steps=steps, k_ref=k + 0.1 * rand(*k.shape), v_ref=v + 0.1 * rand(*v.shape))

    segments = [segment(12, True), segment(7, False), segment(5, True)]
    return AttentionCase(
        q=rand(batch, heads, n_q, head_dim),
        k_cur=rand(batch, heads, 4, head_dim),
        v_cur=rand(batch, heads, 4, value_dim),
        segments=segments,
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm()).item()


class AllocationCounter:
    """Bytes of every tensor storage created while it is active (``with AllocationCounter() as c: ...``),
    seen at the ATen dispatcher: each op's outputs whose storage is not one of its inputs' (views and in-place
    results are not allocations). Allocations outside ATen (the Triton interpreter's numpy tiles) are not
    counted: it measures what the suite's code creates per call."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.bytes = 0
        self.ops: list[tuple[str, int]] = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                from torch.utils import _pytree as pytree

                out = func(*args, **(kwargs or {}))
                inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor)}
                made = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in pytree.tree_leaves(out)
                        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs}
                for size in made.values():
                    if size:
                        counter.bytes += size
                        counter.ops.append((str(func), size))
                return out

        self._mode = Mode()

    def __enter__(self) -> AllocationCounter:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


# Interpreted Triton costs seconds per case on a CPU. The fast suite keeps a cover (every value of either axis in
# at least one case); the rest of a grid is `slow` (make test-full) and `gpu` (make gpu-check, where it is cheap).
GRID_REST = (pytest.mark.slow, pytest.mark.gpu)


def pairwise_cover(first: Sequence, second: Sequence) -> list:
    """pytest params for first x second: pair i = (first[i], second[i % len(second)]) (and the other way round
    when ``second`` is longer) runs in the fast suite; every other pair is marked ``GRID_REST``."""
    n = max(len(first), len(second))
    cover = {(first[i % len(first)], second[i % len(second)]) for i in range(n)}
    return [pytest.param(a, b, marks=() if (a, b) in cover else GRID_REST) for a in first for b in second]


def one_fast(values: Sequence, fast) -> list:
    """pytest params for ``values``: ``fast`` runs in the fast suite, the others are marked ``GRID_REST``."""
    if fast not in values:
        raise ValueError(f"{fast!r} is not one of {list(values)}")
    return [pytest.param(v, marks=() if v == fast else GRID_REST) for v in values]
