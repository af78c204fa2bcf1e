"""Quantizer objects (one per cache and per K or V) and `make_quantizer`, the factory.

A Quantizer turns a (B, H, S, D) chunk into a QuantizedTensor. It applies the configured Hadamard
rotation before quantizing, counts its calls (`num_calls`, so tests can check "quantize once"),
and, for QVG, keeps the previous chunk's centroids to warm-start the next chunk's k-means.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jensenkv.quant.config import QuantConfig
from jensenkv.quant.hadamard import RandomHadamard
from jensenkv.quant.qvg import QVGTensor, gather_centroids, lloyd_kmeans, nearest_centroid, random_token_init
from jensenkv.quant.rtn import RTNTensor, rtn_quantize
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor


class Quantizer:
    """Base: input checks, rotation, call counting. Subclasses implement `_quantize` on rotated input."""

    def __init__(self, cfg: QuantConfig, head_dim: int):
        self.cfg = cfg
        self.head_dim = head_dim
        self.num_calls = 0
        rotate = cfg.method != "none" and cfg.rotation == "hadamard"
        self.rotation = RandomHadamard(head_dim, cfg.rotation_seed) if rotate else None

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        """x: (B, H, S, D) floating point -> stored form of x."""
        if x.ndim != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x with shape {tuple(x.shape)} is not allowed: expected (B, H, S, D) with D=head_dim={self.head_dim}"
            )
        if not x.is_floating_point():
            raise ValueError(f"x with dtype {x.dtype} is not allowed: expected a floating point tensor")
        if x.shape[2] == 0:
            raise ValueError("x with S=0 tokens is not allowed: a chunk needs at least one token")
        self.num_calls += 1
        x = x.detach().float()
        if self.rotation is not None:
            x = self.rotation.apply(x)  # (B, H, S, D), rotated basis
        return self._quantize(x)

    def _quantize(self, x: torch.Tensor) -> QuantizedTensor:
        raise NotImplementedError


class FullPrecisionQuantizer(Quantizer):
    """Method "none": keep the tensor in cfg.store_dtype."""

    def _quantize(self, x: torch.Tensor) -> FullPrecisionTensor:
        return FullPrecisionTensor(x, self.cfg.torch_store_dtype)


class RTNQuantizer(Quantizer):
    """Method "rtn": integer round-to-nearest at the configured granularity."""

    def _quantize(self, x: torch.Tensor) -> RTNTensor:
        return _rtn(x, self.cfg, self.rotation)


class QVGQuantizer(Quantizer):
    """Method "qvg": residual k-means stages + RTN; k-means warm-starts from the previous chunk."""

    def __init__(self, cfg: QuantConfig, head_dim: int):
        super().__init__(cfg, head_dim)
        self.generator = torch.Generator().manual_seed(cfg.qvg_seed)
        self.warm_centroids: list[torch.Tensor] | None = None  # per stage (N, C, D) float32, last chunk's

    def _quantize(self, x: torch.Tensor) -> QVGTensor:
        b, h, s, d = x.shape
        c = self.cfg.qvg_centroids
        if c > s:
            raise ValueError(
                f"quant.qvg_centroids={c} is not allowed for a chunk of S={s} tokens: must be <= tokens per chunk"
            )
        index_dtype = torch.uint8 if c <= 256 else torch.int16
        residual = x.reshape(b * h, s, d)  # (N, S, D)
        warm = self.warm_centroids
        if warm is not None and (warm[0].shape != (b * h, c, d) or warm[0].device != x.device):
            warm = None  # a different batch/head layout: nothing to warm-start from
        centroids, assignments, new_warm = [], [], []
        for stage in range(self.cfg.qvg_stages):
            init = warm[stage] if warm is not None else random_token_init(residual, c, self.generator)
            fitted = lloyd_kmeans(residual, init, self.cfg.qvg_iters)  # (N, C, D)
            stored = fitted.to(self.cfg.torch_scale_dtype)  # what is kept, and what the residual uses
            stored_f = stored.float()
            assign = nearest_centroid(residual, stored_f)  # (N, S)
            residual = residual - gather_centroids(stored_f, assign)
            centroids.append(stored.reshape(b, h, c, d))
            assignments.append(assign.to(index_dtype).reshape(b, h, s))
            new_warm.append(stored_f)
        self.warm_centroids = new_warm
        return QVGTensor(centroids, assignments, _rtn(residual.reshape(b, h, s, d), self.cfg, None), self.rotation)

    def reset(self) -> None:
        """Forget the warm-start state (e.g. at the start of a new video)."""
        self.warm_centroids = None


def _rtn(x: torch.Tensor, cfg: QuantConfig, rotation: RandomHadamard | None) -> RTNTensor:
    return rtn_quantize(
        x,
        bits=cfg.bits,
        granularity=cfg.granularity,
        group_size=cfg.group_size,
        symmetric=cfg.symmetric,
        scale_dtype=cfg.torch_scale_dtype,
        zero_dtype=cfg.torch_zero_dtype,
        rotation=rotation,
    )


_QUANTIZERS: dict[str, type[Quantizer]] = {"none": FullPrecisionQuantizer, "rtn": RTNQuantizer, "qvg": QVGQuantizer}


def make_quantizer(cfg: QuantConfig | Mapping[str, Any], head_dim: int) -> Quantizer:
    """Validate cfg against head_dim, then build its quantizer. A mapping goes through QuantConfig.from_dict."""
    if not isinstance(cfg, QuantConfig):
        cfg = QuantConfig.from_dict(cfg)
    cfg.validate(head_dim)
    return _QUANTIZERS[cfg.method](cfg, head_dim)
