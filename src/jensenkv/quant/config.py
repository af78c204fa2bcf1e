"""QuantConfig: what one quantizer does (method, bits, grouping, rotation, storage dtypes).

A node of the typed config tree (jensenkv.config.RunConfig.quant): Hydra composes it from its defaults plus a
preset (configs/quant/*.yaml) and builds it; `QuantConfig.from_dict(cfg)` also works. Treat it as a value:
derive variants with dataclasses.replace.
Every field is checked by `validate`, which raises ValueError naming the key, the value and what
is allowed; construction already runs the head-dim-free checks, `validate(head_dim)` adds the ones
that need the head dim (group divisibility, power-of-two Hadamard).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

METHODS = ("none", "rtn", "qvg")
BITS = (2, 3, 4, 8)
GRANULARITIES = ("tensor", "token", "token_group", "channel")
ROTATIONS = ("none", "hadamard")
FLOAT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# int8 / uint8: integer zero point round(-min/step) (int8 stored centred; a range is widened to include 0 only when z
# does not fit the dtype);
# a float dtype: the group minimum itself, rounded down into that dtype (KIVI / HF quanto; the bound holds at any offset).
ZERO_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, **FLOAT_DTYPES}
MAX_CENTROIDS = 32767  # assignments are stored as int16 above 256 centroids


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"quant.{key}={value!r} is not allowed: {allowed}")


@dataclass
class QuantConfig:
    """One quantizer's settings (see docs/ARCHITECTURE.md).

    group_size: channels per group for granularity "token_group" (must divide the head dim);
    tokens per group for "channel" (KIVI keys; the last group of a chunk may be shorter).
    store_dtype: dtype method "none" keeps the tensor in (also used for the cache's sink chunks).
    qvg_seed: seed of QVG's k-means initialisation (the cold start; later chunks warm-start).
    """

    method: str = "rtn"
    bits: int = 2
    granularity: str = "token_group"
    group_size: int = 32
    symmetric: bool = False
    rotation: str = "none"
    rotation_seed: int = 0
    scale_dtype: str = "float16"
    zero_dtype: str = "uint8"
    qvg_centroids: int = 256
    qvg_stages: int = 1
    qvg_iters: int = 10
    qvg_seed: int = 0
    store_dtype: str = "float32"

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None, **overrides: Any) -> QuantConfig:
        """Build from a mapping (e.g. a Hydra DictConfig node) plus keyword overrides; unknown keys are errors."""
        merged = {**dict(values or {}), **overrides}
        merged.pop("_target_", None)
        known = {f.name for f in fields(cls)}
        for key in merged:
            if key not in known:
                _fail(key, merged[key], f"unknown key; allowed keys: {sorted(known)}")
        return cls(**merged)

    def validate(self, head_dim: int | None = None) -> None:
        """Raise ValueError naming the first bad key, its value and what is allowed."""
        if self.method not in METHODS:
            _fail("method", self.method, f"must be one of {METHODS}")
        if type(self.bits) is not int or self.bits not in BITS:  # 2.0 == 2, but is not an integer width
            _fail("bits", self.bits, f"must be one of {BITS}")
        if self.granularity not in GRANULARITIES:
            _fail("granularity", self.granularity, f"must be one of {GRANULARITIES}")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 1:
            _fail("group_size", self.group_size, "must be a positive integer")
        if not isinstance(self.symmetric, bool):
            _fail("symmetric", self.symmetric, "must be true or false")
        if self.rotation not in ROTATIONS:
            _fail("rotation", self.rotation, f"must be one of {ROTATIONS}")
        if not isinstance(self.rotation_seed, int):
            _fail("rotation_seed", self.rotation_seed, "must be an integer")
        if self.scale_dtype not in FLOAT_DTYPES:
            _fail("scale_dtype", self.scale_dtype, f"must be one of {tuple(FLOAT_DTYPES)}")
        if self.zero_dtype not in ZERO_DTYPES:
            _fail("zero_dtype", self.zero_dtype, f"must be one of {tuple(ZERO_DTYPES)}")
        if self.store_dtype not in FLOAT_DTYPES:
            _fail("store_dtype", self.store_dtype, f"must be one of {tuple(FLOAT_DTYPES)}")
        if not isinstance(self.qvg_centroids, int) or not 1 <= self.qvg_centroids <= MAX_CENTROIDS:
            _fail("qvg_centroids", self.qvg_centroids, f"must be an integer in [1, {MAX_CENTROIDS}]")
        if not isinstance(self.qvg_stages, int) or self.qvg_stages < 1:
            _fail("qvg_stages", self.qvg_stages, "must be an integer >= 1")
        if not isinstance(self.qvg_iters, int) or self.qvg_iters < 0:
            _fail("qvg_iters", self.qvg_iters, "must be an integer >= 0")
        if not isinstance(self.qvg_seed, int):
            _fail("qvg_seed", self.qvg_seed, "must be an integer")
        if head_dim is None:
            return
        if not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim={head_dim!r} is not allowed: must be a positive integer")
        if self.method == "none":
            return  # nothing is quantized or rotated: grouping and rotation do not apply
        if self.granularity == "token_group" and head_dim % self.group_size:
            _fail(
                "group_size",
                self.group_size,
                f"with granularity=token_group it must divide head_dim={head_dim}",
            )
        if self.rotation == "hadamard" and head_dim & (head_dim - 1):
            _fail("rotation", self.rotation, f"hadamard needs a power-of-two head_dim, got head_dim={head_dim}")

    @property
    def label(self) -> str:
        """Row name in the paper's tables: bf16 | rtn | quarot+rtn | kivi | qvg (quarot+ prefix when rotated)."""
        if self.method == "none":
            return "bf16"
        base = "qvg" if self.method == "qvg" else ("kivi" if self.granularity == "channel" else "rtn")
        return f"quarot+{base}" if self.rotation == "hadamard" else base

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return FLOAT_DTYPES[self.scale_dtype]

    @property
    def torch_zero_dtype(self) -> torch.dtype:
        return ZERO_DTYPES[self.zero_dtype]

    @property
    def torch_store_dtype(self) -> torch.dtype:
        return FLOAT_DTYPES[self.store_dtype]
