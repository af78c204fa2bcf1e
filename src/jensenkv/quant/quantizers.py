"""Quantizer objects (one per cache and per K or V) and `make_quantizer`, the factory.

A Quantizer turns a (B, H, S, D) chunk into a QuantizedTensor. It applies the configured Hadamard
rotation and channel-mean smoothing before quantizing, counts its calls (`num_calls`, so tests can check
"quantize once"; with dither the count is also the draw's counter, so call n's offsets are fixed by
(dither_seed, n)), and, for QVG's warm start, keeps the previous chunk's centroids.
`reset()` starts a new video: the warm start and the dither counter start over, so each video is
reproducible on its own.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jensenkv.quant.config import QuantConfig
from jensenkv.quant.dither import DitherDraw
from jensenkv.quant.hadamard import RandomHadamard
from jensenkv.quant.qvg import (
    QVGTensor,
    gather_centroids,
    lloyd_kmeans,
    nearest_centroid,
    published_kmeans,
    random_token_init,
    span_bounds,
)
from jensenkv.quant.rtn import RTNTensor, rtn_quantize
from jensenkv.quant.smoothing import ChannelMeanTensor, channel_mean
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor


class Quantizer:
    """Base: input checks, rotation, call counting. Subclasses implement `_quantize` on rotated input."""

    def __init__(self, cfg: QuantConfig, head_dim: int):
        self.cfg = cfg
        self.head_dim = head_dim
        self.num_calls = 0
        self.dither_counter = 0  # calls since the last reset: numbers the dither draws
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
        if self.cfg.method == "none" or self.cfg.smoothing == "none":
            stored = self._quantize(x)
        else:
            mean = channel_mean(x, self.cfg.torch_scale_dtype)  # (B, H, 1, D)
            stored = ChannelMeanTensor(self._quantize(x - mean.float()), mean)
        stored.rotation = self.rotation  # the outermost tensor undoes the rotation; inner ones hold None
        return stored

    def _quantize(self, x: torch.Tensor) -> QuantizedTensor:
        """Quantize the rotated (B, H, S, D) x into a tensor with rotation None."""
        raise NotImplementedError

    def next_dither(self) -> DitherDraw | None:
        """This call's dither draw (None without dither); advances the counter."""
        if self.cfg.dither == "none":
            return None
        self.dither_counter += 1
        return DitherDraw(self.cfg.dither_seed, self.dither_counter - 1)

    def reset(self) -> None:
        """Start a new video: the dither counter starts over."""
        self.dither_counter = 0


class FullPrecisionQuantizer(Quantizer):
    """Method "none": keep the tensor in cfg.store_dtype."""

    def _quantize(self, x: torch.Tensor) -> FullPrecisionTensor:
        return FullPrecisionTensor(x, self.cfg.torch_store_dtype)


class RTNQuantizer(Quantizer):
    """Method "rtn": integer round-to-nearest at the configured granularity."""

    def _quantize(self, x: torch.Tensor) -> RTNTensor:
        return _rtn(x, self.cfg, self.next_dither())


class QVGQuantizer(Quantizer):
    """Method "qvg": residual k-means stages + RTN (qvg_kmeans: published or warm_start, see jensenkv.quant.qvg)."""

    def __init__(self, cfg: QuantConfig, head_dim: int):
        super().__init__(cfg, head_dim)
        self.generator = torch.Generator().manual_seed(cfg.qvg_seed)
        self.warm_centroids: list[torch.Tensor] | None = None  # per stage (N, spans * C, D) float32, last chunk's

    def _quantize(self, x: torch.Tensor) -> QVGTensor:
        b, h, s, d = x.shape
        c = self.cfg.qvg_centroids
        spans = span_bounds(s, self.cfg.qvg_span)
        if c > spans[0][1] - spans[0][0]:
            raise ValueError(
                f"quant.qvg_centroids={c} is not allowed for a chunk of S={s} tokens: must be <= tokens per chunk"
            )
        index_dtype = torch.uint8 if c <= 256 else torch.int16
        residual = x.reshape(b * h, s, d)  # (N, S, D)
        warm = self.warm_centroids if self.cfg.qvg_kmeans == "warm_start" else None
        if warm is not None and (warm[0].shape != (b * h, c * len(spans), d) or warm[0].device != x.device):
            warm = None  # a different batch/head/span layout: nothing to warm-start from
        centroids, assignments, new_warm = [], [], []
        for stage in range(self.cfg.qvg_stages):
            stored_spans, assign_spans = [], []
            for i, (start, end) in enumerate(spans):
                part = residual[:, start:end]  # (N, span, D)
                stored, assign = self._cluster(part, None if warm is None else warm[stage][:, i * c:(i + 1) * c])
                stored_spans.append(stored)
                assign_spans.append(assign)
            stored = torch.cat(stored_spans, dim=1)  # (N, spans * C, D) in the centroid dtype
            assign = torch.cat(assign_spans, dim=1)  # (N, S), index within the span
            offsets = torch.cat([torch.full((end - start,), i * c, device=x.device) for i, (start, end)
                                 in enumerate(spans)])  # (S,) first centroid of each token's span
            residual = residual - gather_centroids(stored.float(), assign + offsets)
            centroids.append(stored.reshape(b, h, -1, d))
            assignments.append(assign.to(index_dtype).reshape(b, h, s))
            new_warm.append(stored.float())
        self.warm_centroids = new_warm
        res = _rtn(residual.reshape(b, h, s, d), self.cfg, self.next_dither())
        return QVGTensor(centroids, assignments, res, None, spans)

    def _cluster(self, x: torch.Tensor, warm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One span's k-means: x (N, S, D) -> (stored centroids (N, C, D), labels (N, S) int64)."""
        cfg = self.cfg
        if cfg.qvg_kmeans == "published":
            labels, fitted, _ = published_kmeans(x, cfg.qvg_centroids, cfg.qvg_iters, cfg.qvg_tol, self.generator)
            return fitted.to(cfg.torch_centroid_dtype), labels  # QVG keeps its labels, not re-assigned
        init = warm if warm is not None else random_token_init(x, cfg.qvg_centroids, self.generator)
        stored = lloyd_kmeans(x, init, cfg.qvg_iters).to(cfg.torch_centroid_dtype)  # what is kept
        return stored, nearest_centroid(x, stored.float())

    def reset(self) -> None:
        """Forget the warm-start state and restart the dither counter (e.g. at the start of a new video)."""
        super().reset()
        self.warm_centroids = None


def _rtn(x: torch.Tensor, cfg: QuantConfig, dither: DitherDraw | None) -> RTNTensor:
    return rtn_quantize(
        x,
        bits=cfg.bits,
        granularity=cfg.granularity,
        group_size=cfg.group_size,
        symmetric=cfg.symmetric,
        scale_dtype=cfg.torch_scale_dtype,
        zero_dtype=cfg.torch_zero_dtype,
        zero_point=None if cfg.symmetric else cfg.zero_convention,
        dither=dither,
    )


_QUANTIZERS: dict[str, type[Quantizer]] = {"none": FullPrecisionQuantizer, "rtn": RTNQuantizer, "qvg": QVGQuantizer}


def make_quantizer(cfg: QuantConfig | Mapping[str, Any], head_dim: int) -> Quantizer:
    """Validate cfg against head_dim, then build its quantizer. A mapping goes through QuantConfig.from_dict."""
    if not isinstance(cfg, QuantConfig):
        cfg = QuantConfig.from_dict(cfg)
    cfg.validate(head_dim)
    return _QUANTIZERS[cfg.method](cfg, head_dim)
