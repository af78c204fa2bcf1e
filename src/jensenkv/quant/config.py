"""QuantConfig: what one quantizer does (method, bits, grouping, rotation, zero point, dither, smoothing, dtypes).

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
from typing import Any, Optional

import torch

METHODS = ("none", "rtn", "qvg")
BITS = (2, 3, 4, 8)
GRANULARITIES = ("tensor", "token", "token_group", "channel")
ROTATIONS = ("none", "hadamard")
FLOAT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Steps may also be stored in fp8 e4m3 (QVG's residual scales); rounded up, so the bound holds.
SCALE_DTYPES = {**FLOAT_DTYPES, "float8_e4m3fn": torch.float8_e4m3fn}
# Zero-point conventions of an asymmetric grid (jensenkv.quant.rtn documents each):
#   integer      a grid level at exactly 0: z = round(-min/step) in int8 / uint8 (zero_dtype)
#   min_aligned  the grid starts at the group minimum, stored (rounded down) in a float dtype
#   fixed_point  z = round(-min/step * 2^F) / 2^F in int8 with F = 7 - bits fractional bits
ZERO_POINTS = ("integer", "min_aligned", "fixed_point")
ZERO_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, **FLOAT_DTYPES}
DITHERS = ("none", "subtractive")
SMOOTHINGS = ("none", "channel_mean")
QVG_KMEANS = ("warm_start", "published")
MAX_CENTROIDS = 32767  # assignments are stored as int16 above 256 centroids
FIXED_POINT_MAX_BITS = 4  # F = 7 - bits >= 3 fractional bits; INT8 codes would leave none


def fixed_point_frac_bits(bits: int) -> int:
    """Fractional bits of the fixed-point zero: int8 / 2^F spans [-2^(7-F), 2^(7-F)) which covers [0, 2^B - 1]."""
    return 7 - bits


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"quant.{key}={value!r} is not allowed: {allowed}")


@dataclass
class QuantConfig:
    """One quantizer's settings (see docs/ARCHITECTURE.md).

    group_size: channels per group for granularity "token_group" (must divide the head dim);
    tokens per group for "channel" (KIVI keys; the last group of a chunk may be shorter).
    store_dtype: dtype method "none" keeps the tensor in (also used for the cache's sink chunks).
    zero_point: the asymmetric grid's zero convention (ZERO_POINTS); null derives it: min_aligned when dither is
        on or zero_dtype is a float dtype, else integer (today's default: uint8, a grid level at 0).
    zero_dtype: storage of the zero: int8 / uint8 for integer (fixed_point always uses int8); a float dtype stores
        the group minimum (min_aligned; with an integer zero_dtype, min_aligned stores it in scale_dtype).
    dither: "subtractive" adds a seeded U(-step/2, step/2) offset before rounding and subtracts it on dequantize
        (min-aligned grid: the error is then exactly uniform and independent of x). Each quantize call draws a
        fresh offset from (dither_seed, call counter); the tensor stores only that pair.
    smoothing: "channel_mean" subtracts the chunk's per-channel mean (stored in scale_dtype) before quantizing and
        adds it back on dequantize (SageAttention); the steps, and so the correction, are unchanged by it.
    qvg_seed: seed of QVG's k-means initialisation.
    qvg_kmeans: "warm_start" (the suite's first QVG: seeded distinct-token start, later chunks warm-start from the
        previous chunk's centroids, qvg_iters Lloyd steps) or "published" (svg-project/Quant-VideoGen: random
        tokens drawn with replacement, fresh every call, at most qvg_iters steps, stop when < qvg_tol of the
        labels change; the labels returned are those from before the last centroid update).
    qvg_span: tokens clustered together (a chunk is cut into spans of qvg_span tokens, the remainder joining the
        last span); null: the whole chunk.
    qvg_centroid_dtype: storage of the centroids; null: scale_dtype (the first QVG). Published QVG: bfloat16.
    """

    method: str = "rtn"                # none (full precision) | rtn (round to nearest) | qvg (QuantVideoGen)
    bits: int = 2                      # integer width of the codes: 2, 3, 4 or 8
    granularity: str = "token_group"   # what shares a step and zero: tensor | token | token_group | channel
    group_size: int = 32
    symmetric: bool = False            # a grid centred on 0 (no zero point) instead of min..max
    rotation: str = "none"             # none | hadamard: a seeded random Hadamard rotation of the head dim first
    rotation_seed: int = 0             # seed of the rotation's random signs
    scale_dtype: str = "float16"       # storage of each group's step
    zero_dtype: str = "uint8"
    zero_point: Optional[str] = None
    dither: str = "none"
    dither_seed: int = 0               # seed of the dither offsets
    smoothing: str = "none"
    qvg_centroids: int = 256           # QVG: k-means centroids per chunk
    qvg_stages: int = 1                # QVG: residual quantization stages
    qvg_iters: int = 10                # QVG: Lloyd iterations (published: at most)
    qvg_seed: int = 0
    qvg_kmeans: str = "warm_start"
    qvg_tol: float = 1e-4              # QVG published: stop when fewer labels than this fraction change
    qvg_span: Optional[int] = None
    qvg_centroid_dtype: Optional[str] = None
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
        if self.scale_dtype not in SCALE_DTYPES:
            _fail("scale_dtype", self.scale_dtype, f"must be one of {tuple(SCALE_DTYPES)}")
        if self.zero_dtype not in ZERO_DTYPES:
            _fail("zero_dtype", self.zero_dtype, f"must be one of {tuple(ZERO_DTYPES)}")
        self._validate_grid()
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
        self._validate_qvg()
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

    def _validate_grid(self) -> None:
        """Zero point, dither and smoothing: each value allowed, and the combinations that define one grid."""
        if self.zero_point is not None and self.zero_point not in ZERO_POINTS:
            _fail("zero_point", self.zero_point, f"must be null or one of {ZERO_POINTS}")
        if self.dither not in DITHERS:
            _fail("dither", self.dither, f"must be one of {DITHERS}")
        if not isinstance(self.dither_seed, int) or isinstance(self.dither_seed, bool) or self.dither_seed < 0:
            _fail("dither_seed", self.dither_seed, "must be an integer >= 0")
        if self.smoothing not in SMOOTHINGS:
            _fail("smoothing", self.smoothing, f"must be one of {SMOOTHINGS}")
        zero_is_float = ZERO_DTYPES[self.zero_dtype].is_floating_point
        if self.zero_point == "integer" and zero_is_float:
            _fail("zero_point", self.zero_point,
                  f"an integer zero needs zero_dtype int8 or uint8, not {self.zero_dtype!r} "
                  "(a float zero_dtype stores the group minimum: zero_point=min_aligned)")
        if self.zero_point == "fixed_point":
            if zero_is_float:
                _fail("zero_point", self.zero_point,
                      f"a fixed-point zero is stored in int8, not zero_dtype={self.zero_dtype!r}")
            if self.bits > FIXED_POINT_MAX_BITS:
                _fail("zero_point", self.zero_point,
                      f"a fixed-point zero needs bits <= {FIXED_POINT_MAX_BITS} (F = 7 - bits fractional bits), "
                      f"got bits={self.bits}")
        if self.dither != "none":
            if self.symmetric:
                _fail("dither", self.dither, "needs the asymmetric min-aligned grid (symmetric=false): "
                      "a symmetric grid clamps dithered values at its ends")
            if self.zero_convention != "min_aligned":
                _fail("dither", self.dither, f"needs zero_point=min_aligned (or null), not {self.zero_point!r}: "
                      "on an integer or fixed-point grid the range's ends clamp dithered values")

    def _validate_qvg(self) -> None:
        if self.qvg_kmeans not in QVG_KMEANS:
            _fail("qvg_kmeans", self.qvg_kmeans, f"must be one of {QVG_KMEANS}")
        if self.qvg_kmeans == "published" and self.qvg_iters < 1:
            _fail("qvg_iters", self.qvg_iters,
                  "must be >= 1 with qvg_kmeans=published (its loop assigns before it stops)")
        if isinstance(self.qvg_tol, bool) or not isinstance(self.qvg_tol, (int, float)) or not 0 <= self.qvg_tol < 1:
            _fail("qvg_tol", self.qvg_tol, "must be a number in [0, 1) (fraction of labels changed)")
        if self.qvg_span is not None and (not isinstance(self.qvg_span, int) or isinstance(self.qvg_span, bool)
                                          or self.qvg_span < self.qvg_centroids):
            _fail("qvg_span", self.qvg_span, f"must be null or an integer >= qvg_centroids={self.qvg_centroids}")
        if self.qvg_centroid_dtype is not None and self.qvg_centroid_dtype not in FLOAT_DTYPES:
            _fail("qvg_centroid_dtype", self.qvg_centroid_dtype, f"must be null or one of {tuple(FLOAT_DTYPES)}")

    @property
    def zero_convention(self) -> str:
        """The zero point in effect: zero_point, or (null) min_aligned with dither or a float zero_dtype, else
        integer."""
        if self.zero_point is not None:
            return self.zero_point
        if self.dither != "none" or ZERO_DTYPES[self.zero_dtype].is_floating_point:
            return "min_aligned"
        return "integer"

    @property
    def label(self) -> str:
        """Row name in the paper's tables: a base name, then "+tag" for each convention that is not the base's own,
        with a "quarot+" prefix when rotated.

        Bases: bf16 | rtn | kivi (granularity=channel) | qvg, qvg_pro (qvg_stages > 1): QVG as published
        (qvg_kmeans=published) | qvg_rtn: the suite's first QVG (qvg_kmeans=warm_start).
        Tags: sym / asym (residual symmetry unlike the base's: qvg's is symmetric, the others' asymmetric);
        the zero convention when it differs from the base's (kivi and an asymmetric published qvg: min_aligned;
        others: integer; implied by dither, so not repeated); dither; channel_mean.
        E.g. "rtn", "rtn+min_aligned", "rtn+dither", "quarot+rtn+channel_mean", "qvg_pro", "qvg_rtn".
        """
        if self.method == "none":
            return "bf16"
        if self.method == "qvg":
            published = self.qvg_kmeans == "published"
            base = ("qvg_pro" if self.qvg_stages > 1 else "qvg") if published else "qvg_rtn"
            own_symmetric, own_zero = published, ("min_aligned" if published else "integer")
        else:
            base = "kivi" if self.granularity == "channel" else "rtn"
            own_symmetric, own_zero = False, ("min_aligned" if base == "kivi" else "integer")
        tags = []
        if self.symmetric != own_symmetric:
            tags.append("sym" if self.symmetric else "asym")
        if not self.symmetric and self.dither == "none" and self.zero_convention != own_zero:
            tags.append(self.zero_convention)
        if self.dither != "none":
            tags.append("dither")
        if self.smoothing != "none":
            tags.append(self.smoothing)
        name = "+".join([base, *tags])
        return f"quarot+{name}" if self.rotation == "hadamard" else name

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return SCALE_DTYPES[self.scale_dtype]

    @property
    def torch_zero_dtype(self) -> torch.dtype:
        """Where the zero is stored: zero_dtype; fixed_point: int8; min_aligned with an integer zero_dtype:
        scale_dtype."""
        convention = self.zero_convention
        if convention == "fixed_point":
            return torch.int8
        if convention == "min_aligned" and not ZERO_DTYPES[self.zero_dtype].is_floating_point:
            return self.torch_scale_dtype
        return ZERO_DTYPES[self.zero_dtype]

    @property
    def torch_centroid_dtype(self) -> torch.dtype:
        return FLOAT_DTYPES[self.qvg_centroid_dtype] if self.qvg_centroid_dtype else self.torch_scale_dtype

    @property
    def torch_store_dtype(self) -> torch.dtype:
        return FLOAT_DTYPES[self.store_dtype]
