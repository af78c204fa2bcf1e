"""Attention over [quantized cache, current chunk] with the Jensen-bias correction.

reference_attention is the oracle; cached_attention the fast CPU path (one SDPA call);
flex_cached_attention the FlexAttention path (compiled on GPU); triton_cached_attention the fused
kernel over the packed cache (GQA too); attention_probes the diagnostics. Each is registered with its
capabilities (``attention.registry``); ATTENTION_BACKENDS / get_backend choose among them by name.
"""
from __future__ import annotations

from jensenkv.attention.backends import ATTENTION_BACKENDS, get_backend  # first: registers the kernels in order
from jensenkv.attention._inputs import CORRECTIONS
from jensenkv.attention.cpu import cached_attention
from jensenkv.attention.flex import flex_cached_attention
from jensenkv.attention.probes import PROBE_KEYS, attention_probes, jensen_shannon
from jensenkv.attention.reference import reference_attention
from jensenkv.attention.registry import Capabilities, register_backend
from jensenkv.attention.triton_kernel import triton_cached_attention
from jensenkv.cache import Segment

__all__ = [
    "ATTENTION_BACKENDS",
    "CORRECTIONS",
    "Capabilities",
    "PROBE_KEYS",
    "Segment",
    "Segment",
    "attention_probes",
    "cached_attention",
    "flex_cached_attention",
    "get_backend",
    "jensen_shannon",
    "reference_attention",
    "register_backend",
    "triton_cached_attention",
]
