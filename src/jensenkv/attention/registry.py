"""The attention backends by name, each registered with its capabilities, and the one check every call passes.

A backend is a kernel registered above its definition with what it can do (as diffusers' attention dispatch
registers each kernel with its constraints)::

    @register_backend("mine", Capabilities(kv_heads=False, second_order=False, causal=False))
    def my_attention(q, k_cur, v_cur, segments, correction, scale, strength, second_order, causal):
        ...  # only the computation: the call was checked against the capabilities before it got here

The decorator returns the kernel's public entry point, with the contract of ``reference_attention``:
entry(q, k_cur, v_cur, segments, correction="none", scale=None, strength=1.0, second_order=False, causal=False,
**options) with q (B, Hq, Q, D), k_cur / v_cur (B, Hkv, R, D/Dv), segments ``jensenkv.cache.Segment``s
-> (B, Hq, Q, Dv). The entry validates the call once (``check_call``: shapes, correction, strength, second
order, causal mask, each refused with one line naming what allows it) and resolves the softmax scale; the
kernel gets a float ``scale`` and its own ``options`` (block sizes, operand dtypes, ...) untouched.

``ATTENTION_BACKENDS`` maps each name to its entry point. Setting a name to a plain function (a test's spy
standing in for a kernel) keeps that name's capabilities, or gives a new name ``Capabilities()``'s defaults:
every option is passed to it as the caller gave it, and it checks what it needs itself.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass

import torch

from jensenkv.attention._inputs import Strength, check_causal, check_strength, resolve_scale, validate_attention_inputs
from jensenkv.attention.second_order import check_second_order
from jensenkv.cache import Segment

AttentionFn = Callable[..., torch.Tensor]
StorageRefusal = Callable[..., "str | None"]  # (key QuantConfig, value QuantConfig) -> reason, or None
DeviceRefusal = Callable[[str], "str | None"]  # (model.device, resolved) -> reason, or None


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the defaults are what a plain function set into ``ATTENTION_BACKENDS`` under a
    new name gets (every option passed through; it decides itself).

    kv_heads: reads grouped-query K/V as stored, k_cur / v_cur and the segments with their KV heads
        (B, Hkv, ...) and query head h reading KV head h // (Hq / Hkv); the others are handed them expanded
        to the query heads (``Segment.expanded``).
    second_order: implements attention.second_order (the b (1 - pi) term); False refuses it.
    causal: takes causal=True (a causal LM's mask over the current chunk); False refuses it.
    storage_refusal: why it cannot read a cache quantized by (key, value) QuantConfigs, or None (None: it reads
        every stored form); checked by the config before any model loads.
    device_refusal: why it cannot run on a device on this machine, or None (None: any device).
    """

    kv_heads: bool = False
    second_order: bool = True
    causal: bool = True
    storage_refusal: StorageRefusal | None = None
    device_refusal: DeviceRefusal | None = None


@dataclass(frozen=True)
class Backend:
    """One registered backend: its name, kernel, capabilities and public entry point (the checked call of the
    kernel; for a plain function set as it is, the function itself)."""

    name: str
    kernel: AttentionFn
    capabilities: Capabilities
    entry: AttentionFn


class BackendRegistry(MutableMapping):
    """name -> entry point, in registration order; ``backend(name)`` / ``capabilities(name)`` for the rest."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._registered: dict[AttentionFn, Backend] = {}  # entry point -> its registration (to restore it)

    def register(self, backend: Backend) -> None:
        self._backends[backend.name] = backend
        self._registered[backend.entry] = backend

    def backend(self, name: str) -> Backend:
        """The registration of ``name``; ValueError naming the registered ones otherwise."""
        try:
            return self._backends[name]
        except (KeyError, TypeError):
            raise ValueError(f"attention backend={name!r} is not allowed: use one of {tuple(self)}") from None

    def capabilities(self, name: str) -> Capabilities:
        return self.backend(name).capabilities

    def names(self, predicate: Callable[[Capabilities], bool]) -> tuple[str, ...]:
        """The registered names whose capabilities satisfy ``predicate``, in registration order."""
        return tuple(name for name, b in self._backends.items() if predicate(b.capabilities))

    def __getitem__(self, name: str) -> AttentionFn:
        return self._backends[name].entry

    def __setitem__(self, name: str, fn: AttentionFn) -> None:
        known = self._registered.get(fn)
        if known is not None and known.name == name:  # an entry point put back (e.g. a test's undo)
            self._backends[name] = known
            return
        if known is not None:  # another name for a registered entry point: what it can do comes along
            self._backends[name] = Backend(name, known.kernel, known.capabilities, fn)
            return
        previous = self._backends.get(name)
        capabilities = previous.capabilities if previous is not None else Capabilities()
        self._backends[name] = Backend(name, fn, capabilities, fn)

    def __delitem__(self, name: str) -> None:
        del self._backends[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def __len__(self) -> int:
        return len(self._backends)


ATTENTION_BACKENDS = BackendRegistry()


def listed(names: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def refuse_second_order(second_order: object, backend: str) -> None:
    """ValueError for a backend that does not implement the second-order term."""
    if second_order is not False:
        supported = ATTENTION_BACKENDS.names(lambda c: c.second_order)
        raise ValueError(f"attention.second_order={second_order!r} is not allowed with backend={backend!r}: "
                         f"the second-order correction needs a backend in {supported}")


def refuse_causal(causal: object, backend: str) -> None:
    """ValueError for a backend that has no causal mask over the current chunk."""
    if causal is not False:
        raise ValueError(f"causal={causal!r} is not allowed with attention.backend={backend!r}: a causal LM's "
                         f"attention needs a backend in {ATTENTION_BACKENDS.names(lambda c: c.causal)}")


def _check_kv_heads(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor, segments: Sequence[Segment],
                    correction: str, strength: Strength) -> None:
    """The inputs of a backend reading KV heads as stored: Hq a multiple of Hkv, strength per query head."""
    if q.ndim != 4 or k_cur.ndim != 4:
        raise ValueError(f"q.shape={tuple(q.shape)}, k_cur.shape={tuple(k_cur.shape)}: both must be (B, H, S, D)")
    heads_q, heads_kv = q.shape[1], k_cur.shape[1]
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(
            f"k_cur.shape={tuple(k_cur.shape)} has {heads_kv} KV heads for q.shape={tuple(q.shape)}: "
            f"the {heads_q} query heads must be a multiple of the KV heads"
        )
    check_strength(strength, heads_q)  # per query head (the check below sees the KV heads' view of q)
    validate_attention_inputs(q[:, :heads_kv], k_cur, v_cur, segments, correction)


def check_call(capabilities: Capabilities, backend: str, q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
               segments: Sequence[Segment], correction: str, scale: float | None, strength: Strength,
               second_order: object, causal: object) -> float:
    """Every check of an attention call, against what ``backend`` can do; returns the softmax scale (1/sqrt(D)
    unless given). One-line ValueErrors naming the argument, its value and what is allowed."""
    if capabilities.kv_heads:
        _check_kv_heads(q, k_cur, v_cur, segments, correction, strength)
    else:
        validate_attention_inputs(q, k_cur, v_cur, segments, correction, strength)
    if capabilities.second_order:
        check_second_order(second_order, correction)
    else:
        refuse_second_order(second_order, backend)
    if capabilities.causal:
        check_causal(causal, q.shape[2], k_cur.shape[2])
    else:
        refuse_causal(causal, backend)
    return resolve_scale(scale, q.shape[-1])


def _entry_point(name: str, kernel: AttentionFn, capabilities: Capabilities) -> AttentionFn:
    def entry(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor, segments: Sequence[Segment],
              correction: str = "none", scale: float | None = None, strength: Strength = 1.0,
              second_order: bool = False, causal: bool = False, **options) -> torch.Tensor:
        scale = check_call(capabilities, name, q, k_cur, v_cur, segments, correction, scale, strength,
                           second_order, causal)
        return kernel(q, k_cur, v_cur, segments, correction, scale, strength, second_order, causal, **options)

    entry.__name__ = entry.__qualname__ = kernel.__name__
    entry.__doc__ = kernel.__doc__
    entry.__module__ = kernel.__module__
    return entry


def register_backend(name: str, capabilities: Capabilities) -> Callable[[AttentionFn], AttentionFn]:
    """Decorator: register the kernel below as backend ``name`` with its ``capabilities``; returns its checked
    public entry point (see the module docstring for both contracts)."""

    def decorate(kernel: AttentionFn) -> AttentionFn:
        entry = _entry_point(name, kernel, capabilities)
        ATTENTION_BACKENDS.register(Backend(name, kernel, capabilities, entry))
        return entry

    return decorate


def get_backend(name: str) -> AttentionFn:
    """The entry point registered as ``name``; ValueError naming the registered ones otherwise."""
    return ATTENTION_BACKENDS.backend(name).entry
