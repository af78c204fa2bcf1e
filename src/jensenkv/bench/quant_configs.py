"""The quantizer configurations the benchmarks compare, by name, and their theoretical storage cost.

Names: ``bf16``; ``rtn-int{B}-g{g}`` (asymmetric RTN, token groups of g channels);
``kivi-int{B}-g{g}`` (keys per channel in groups of g tokens, values in token groups of g channels,
as KIVI does; float16 zero points as in configs/quant/kivi.yaml); ``qvg-int{B}[-g{g}]``
(QuantVideoGen: 256 k-means centroids per chunk, RTN residual in token groups of g channels).
"""
from __future__ import annotations

import re

import torch

from jensenkv.quant import QuantConfig

_NAME = re.compile(r"^(?P<method>rtn|kivi|qvg)-int(?P<bits>\d+)(?:-g(?P<group>\d+))?$")


def key_value_configs(name: str) -> tuple[QuantConfig, QuantConfig]:
    """(key config, value config) for a benchmark config name; ValueError names the bad name."""
    if name == "bf16":
        full = QuantConfig(method="none", store_dtype="bfloat16")
        return full, full
    match = _NAME.match(name)
    if match is None:
        raise ValueError(
            f"config={name!r} is not allowed: use 'bf16', 'rtn-int<B>-g<g>', 'kivi-int<B>-g<g>' or 'qvg-int<B>[-g<g>]'"
        )
    method, bits = match["method"], int(match["bits"])
    group = int(match["group"]) if match["group"] else QuantConfig().group_size
    if method in ("rtn", "kivi") and match["group"] is None:
        raise ValueError(
            f"config={name!r} is not allowed: {method} configs need a group size, e.g. '{method}-int2-g32'"
        )
    if method == "rtn":
        cfg = QuantConfig(method="rtn", bits=bits, granularity="token_group", group_size=group)
        return cfg, cfg
    if method == "kivi":
        # As configs/quant/kivi.yaml: real-valued float16 zero points (the group minimum), values per token.
        keys = QuantConfig(method="rtn", bits=bits, granularity="channel", group_size=group, zero_dtype="float16")
        values = QuantConfig(method="rtn", bits=bits, granularity="token_group", group_size=group, zero_dtype="float16")
        return keys, values
    cfg = QuantConfig(method="qvg", bits=bits, granularity="token_group", group_size=group, qvg_centroids=256)
    return cfg, cfg


def dtype_bits(name: str) -> int:
    """Storage bits of a torch dtype given by name, e.g. 'float16' -> 16, 'uint8' -> 8."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={name!r} is not a torch dtype name (e.g. 'float16', 'uint8')")
    return dtype.itemsize * 8


def theory_bits_per_element(cfg: QuantConfig, head_dim: int, tokens: int) -> float:
    """Bits per stored element: B codes + (step + zero bits) per group, plus QVG's centroids and cluster ids.

    Channel groups (KIVI keys) use the nominal B + meta/g; with ``tokens`` not a multiple of g the last,
    short group costs a little more, which the measured value shows and the 1% tolerance covers.
    QVG stores per stage and per (batch, head) ``qvg_centroids`` centroids of head_dim values in
    scale_dtype and one cluster id per token (uint8 up to 256 centroids, int16 above).
    """
    if cfg.method == "none":
        return float(dtype_bits(cfg.store_dtype))  # kept as is: 16 for the "bf16" reference row
    meta = dtype_bits(cfg.scale_dtype) + (0 if cfg.symmetric else dtype_bits(cfg.zero_dtype))
    elements_per_group = {
        "tensor": tokens * head_dim,
        "token": head_dim,
        "token_group": cfg.group_size,
        "channel": cfg.group_size,
    }[cfg.granularity]
    bits = cfg.bits + meta / elements_per_group
    if cfg.method == "qvg":
        id_bits = 8 if cfg.qvg_centroids <= 256 else 16
        per_stage = cfg.qvg_centroids * head_dim * dtype_bits(cfg.scale_dtype) + tokens * id_bits  # per (B, H)
        bits += cfg.qvg_stages * per_stage / (tokens * head_dim)
    return bits
