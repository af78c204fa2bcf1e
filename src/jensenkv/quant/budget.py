"""Bits per stored element of a QuantConfig, from its settings alone (what `QuantizedTensor.nbytes` counts).

Per (B, H) slice of a chunk of `tokens` tokens and head_dim D:
  codes                bits per element
  step (+ zero)        scale_dtype (+ zero storage: 8 bits integer / fixed-point, the float's bits min-aligned;
                       nothing when symmetric) per group
  channel-mean         D values in scale_dtype per chunk
  QVG, per stage       qvg_centroids * D centroids in the centroid dtype per span, one id per token (8 bits up
                       to 256 centroids, else 16)
Dither adds 16 bytes per tensor (its seed and counter), left out here (it does not scale with the tensor).
Channel groups (KIVI keys) use the nominal bits + meta / g; when tokens is not a multiple of g the short last
group costs a little more than this formula says.
"""
from __future__ import annotations

from jensenkv.quant.config import QuantConfig
from jensenkv.quant.qvg import span_bounds


def dtype_bits(dtype) -> int:
    return dtype.itemsize * 8


def bits_per_element(cfg: QuantConfig, head_dim: int, tokens: int) -> float:
    """Stored bits per element of one (B, H) slice of a `tokens` x `head_dim` chunk (see module docstring)."""
    if cfg.method == "none":
        return float(dtype_bits(cfg.torch_store_dtype))
    meta = dtype_bits(cfg.torch_scale_dtype) + (0 if cfg.symmetric else dtype_bits(cfg.torch_zero_dtype))
    elements_per_group = {"tensor": tokens * head_dim, "token": head_dim, "token_group": cfg.group_size,
                          "channel": cfg.group_size}[cfg.granularity]
    bits = cfg.bits + meta / elements_per_group
    if cfg.smoothing == "channel_mean":
        bits += dtype_bits(cfg.torch_scale_dtype) / tokens
    if cfg.method == "qvg":
        spans = len(span_bounds(tokens, cfg.qvg_span))
        id_bits = 8 if cfg.qvg_centroids <= 256 else 16
        per_stage = spans * cfg.qvg_centroids * head_dim * dtype_bits(cfg.torch_centroid_dtype) + tokens * id_bits
        bits += cfg.qvg_stages * per_stage / (tokens * head_dim)
    return bits


def qvg_paper_bits(block: int, stages: int, span: int, head_dim: int = 128, centroids: int = 256) -> float:
    """QVG's own accounting: 2 + 8/block + stages (8/d + C*16/S) bits per element (INT2 codes, fp8 scale per
    block, uint8 ids, bf16 centroids over a span of S tokens)."""
    return 2 + 8 / block + stages * (8 / head_dim + centroids * 16 / span)
