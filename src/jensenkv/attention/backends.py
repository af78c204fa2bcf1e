"""The attention kernels the cached self-attention processor can use, chosen by name.

A plain dict, as diffusers' ``dispatch_attention_fn`` keeps its backends: a new kernel (or a test's spy)
is one more entry, e.g. ``ATTENTION_BACKENDS["mine"] = my_cached_attention``. Every entry has the
contract of ``reference_attention``: fn(q, k_cur, v_cur, segments, correction=..., strength=...) with
q (B, H, Q, D), k_cur / v_cur (B, H, R, D/Dv) -> (B, H, Q, Dv). ``second_order=True`` (attention.second_order)
is passed to every entry; those that cannot compute it raise ValueError (``second_order.SECOND_ORDER_BACKENDS``
lists the ones that do).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from jensenkv.attention.cpu import cached_attention
from jensenkv.attention.flex import flex_cached_attention
from jensenkv.attention.reference import reference_attention
from jensenkv.attention.triton_kernel import device_refusal, storage_refusal, triton_cached_attention
from jensenkv.checks import fail

AttentionFn = Callable[..., torch.Tensor]

ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "cached": cached_attention,  # fast CPU path: one SDPA call with the bias folded in
    "reference": reference_attention,  # the readable float64 oracle
    "flex": flex_cached_attention,  # FlexAttention (compiled on GPU)
    "triton": triton_cached_attention,  # fused kernel over the packed cache (GPU; CPU under TRITON_INTERPRET=1)
}


# Backends that take GQA inputs as stored: k_cur / v_cur and the cached segments with their KV heads
# (B, Hkv, ...), query head h reading KV head h // (Hq / Hkv). The others get them expanded to the query heads.
KV_HEAD_BACKENDS = frozenset({"triton"})


def reads_kv_heads(name: str) -> bool:
    """Whether backend ``name`` reads grouped-query KV heads as stored (no expanded copy per call)."""
    return name in KV_HEAD_BACKENDS


# What a backend cannot read, from the key / value quantizer settings: fn(key, value) -> reason or None
STORAGE_LIMITS: dict[str, Callable[..., str | None]] = {"triton": storage_refusal}


def check_backend_storage(name: str, key, value) -> None:
    """One-line ValueError when backend ``name`` cannot read a cache quantized by ``key`` / ``value`` (QuantConfigs)."""
    limit = STORAGE_LIMITS.get(name)
    reason = limit(key, value) if limit is not None else None
    if reason is not None:
        fail("attention.backend", name, f"{reason}; backends cached, reference and flex read every stored form")


# What a backend cannot run on, from the run's device (model.device, resolved): fn(device) -> reason or None
DEVICE_LIMITS: dict[str, Callable[[str], str | None]] = {"triton": device_refusal}


def check_backend_device(name: str, device: str) -> None:
    """One-line ValueError when backend ``name`` cannot run on ``device`` on this machine (before any model loads)."""
    limit = DEVICE_LIMITS.get(name)
    reason = limit(device) if limit is not None else None
    if reason is not None:
        fail("attention.backend", name, f"{reason}; backends cached and reference run on any device")


def get_backend(name: str) -> AttentionFn:
    """The kernel registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return ATTENTION_BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"attention backend={name!r} is not allowed: use one of {tuple(ATTENTION_BACKENDS)}") from None
