"""Weights with NaN or inf are refused where they are loaded, naming the file and the tensor: found later,
they cost a whole reference video and surface as a broken video that names neither."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch


class NonFiniteWeightsError(ValueError):
    """A weights file holds NaN or inf: restore or re-download it."""


def first_non_finite(tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, int, int] | None:
    """(tensor name, non-finite values, values) of the first floating tensor with NaN or inf; None if none.
    ``tensors``: (name, tensor) pairs, e.g. a state dict's items, or a file's tensors read one at a time."""
    for name, tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name, int((~torch.isfinite(tensor)).sum()), tensor.numel()
    return None


def check_finite_weights(state: Mapping[str, torch.Tensor], file: str | os.PathLike, restore: str) -> None:
    """NonFiniteWeightsError naming ``file`` and the tensor when ``state`` (read from it) holds NaN or inf;
    ``restore`` says how to get a sound copy."""
    bad = first_non_finite(state.items())
    if bad is not None:
        name, count, total = bad
        raise NonFiniteWeightsError(f"weights file {file}: tensor {name!r} holds {count} non-finite values (NaN/inf) "
                                    f"of {total}; the file is broken: {restore}")
