"""The built-in attention backends, registered in this order, and the questions asked of the registry.

Each kernel registers itself where it is defined (``registry.register_backend``, capabilities beside it);
importing this module registers all four: "cached" (fast CPU path: one SDPA call with the bias folded in),
"reference" (the readable float64 oracle), "flex" (FlexAttention, compiled on GPU), "triton" (fused kernel over
the packed cache; GPU, or the CPU under TRITON_INTERPRET=1). ``ATTENTION_BACKENDS`` maps every name to its
checked entry point; a new backend is one more ``register_backend`` (docs/ARCHITECTURE.md's checklist).
"""
from __future__ import annotations

from jensenkv.attention import cpu, reference, flex, triton_kernel  # noqa: F401 - registers, in this order
from jensenkv.attention.registry import ATTENTION_BACKENDS, AttentionFn, Capabilities, get_backend, listed  # noqa: F401
from jensenkv.checks import fail


def reads_kv_heads(name: str) -> bool:
    """Whether backend ``name`` reads grouped-query KV heads as stored (no expanded copy per call)."""
    return ATTENTION_BACKENDS.capabilities(name).kv_heads


def second_order_backends() -> tuple[str, ...]:
    """The backends that implement attention.second_order."""
    return ATTENTION_BACKENDS.names(lambda c: c.second_order)


def causal_backends() -> tuple[str, ...]:
    """The backends that take causal=True (a causal LM's calls)."""
    return ATTENTION_BACKENDS.names(lambda c: c.causal)


def _refusals(name: object) -> Capabilities:
    """The capabilities of ``name``, or the defaults (no refusal) for a name not registered: the config's
    choice check names that one."""
    if isinstance(name, str) and name in ATTENTION_BACKENDS:
        return ATTENTION_BACKENDS.capabilities(name)
    return Capabilities()


def check_backend_storage(name: str, key, value) -> None:
    """One-line ValueError when backend ``name`` cannot read a cache quantized by ``key`` / ``value`` (QuantConfigs)."""
    limit = _refusals(name).storage_refusal
    reason = limit(key, value) if limit is not None else None
    if reason is not None:
        readers = ATTENTION_BACKENDS.names(lambda c: c.storage_refusal is None)
        fail("attention.backend", name, f"{reason}; backends {listed(readers)} read every stored form")


def check_backend_device(name: str, device: str) -> None:
    """One-line ValueError when backend ``name`` cannot run on ``device`` on this machine (before any model loads)."""
    limit = _refusals(name).device_refusal
    reason = limit(device) if limit is not None else None
    if reason is not None:
        anywhere = ATTENTION_BACKENDS.names(lambda c: c.device_refusal is None)
        fail("attention.backend", name, f"{reason}; backends {listed(anywhere)} run on any device")
