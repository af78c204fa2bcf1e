"""A transformers ``Cache`` backed by the suite's quantized caches: [quantized prefix | full-precision recent].

Each attention layer keeps one ``ChunkedKVCache`` (keys after RoPE, KV heads as stored, so ``nbytes`` counts
KV heads) and a full-precision tail of recent tokens. Tokens move from the tail into the quantized cache at
the start of the next ``update``, so the call that produced them still attends to them in full precision (a
prefill attends to itself unquantized, as transformers' ``QuantizedCache`` does); once quantized, a token is
never quantized again (unlike ``QuantizedCache``, which re-quantizes the whole cache when its residual fills).

What moves: everything beyond the last ``residual_tokens`` tokens, in commits of ``commit_tokens`` tokens (None:
all at once, one chunk); the first ``sink_tokens`` tokens (attention sinks) are committed as their own chunk and
kept in full precision (the cache's sink chunk). Every quantizer of the suite applies (``QuantConfig``).

The attention function (``jensenkv.llm.attention``) finds the layer that returned the key tensor it is given
(``owner_of``) and reads that layer's stored segments: the bias goes on the quantized prefix only.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from jensenkv.attention.config import AttentionConfig, layer_strengths
from jensenkv.cache import CacheConfig, CacheSettings, ChunkedKVCache, Segment
from jensenkv.checks import check_int
from jensenkv.quant import QuantConfig

# id(key tensor returned by a layer's update) -> that layer; the attention call checks identity (``owner_of``)
_OWNERS: "weakref.WeakValueDictionary[int, QuantizedPrefixLayer]" = weakref.WeakValueDictionary()


@dataclass
class PrefixPolicy:
    """Which tokens a layer quantizes, and when (see the module docstring)."""

    residual_tokens: int = 0  # the most recent tokens kept in full precision (0: all before the current call)
    commit_tokens: int | None = None  # tokens per quantized chunk (None: all that are ready, as one chunk)
    sink_tokens: int = 0  # the first tokens kept in full precision forever (attention sinks)

    def __post_init__(self) -> None:
        check_int("cache.residual_tokens", self.residual_tokens, 0)
        check_int("cache.commit_tokens", self.commit_tokens, 1, optional=True)
        check_int("cache.sink_tokens", self.sink_tokens, 0)


class QuantizedPrefixLayer(CacheLayerMixin):
    """One attention layer's cache: a ``ChunkedKVCache`` of committed tokens and a full-precision tail."""

    is_compileable = False
    is_sliding = False

    def __init__(self, config: CacheConfig, head_dim: int, policy: PrefixPolicy, layer_idx: int,
                 owner: "JensenKVCache"):
        super().__init__()
        self.store = ChunkedKVCache(config, head_dim)
        self.policy = policy
        self.layer_idx = layer_idx
        self._owner = weakref.ref(owner)
        self.committed = 0  # tokens moved into ``store``

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = key_states[:, :, :0]  # (B, H_kv, 0, D): the full-precision tail
        self.values = value_states[:, :, :0]
        self.is_initialized = True

    @property
    def cache(self) -> "JensenKVCache":
        return self._owner()

    def _commit_ready(self) -> None:
        """Move the tail's tokens beyond ``residual_tokens`` into the quantized store, oldest first."""
        policy = self.policy
        while True:
            ready = self.keys.shape[2] - policy.residual_tokens
            if self.committed < policy.sink_tokens:  # the sink chunk first, alone
                take = policy.sink_tokens - self.committed
                if ready < take:
                    return
            else:
                take = ready if policy.commit_tokens is None else policy.commit_tokens
                if ready <= 0 or ready < take:
                    return
            self.store.commit(self.keys[:, :, :take].contiguous(), self.values[:, :, :take].contiguous())
            self.keys, self.values = self.keys[:, :, take:], self.values[:, :, take:]
            self.committed += take

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append this call's K/V (B, H_kv, S, D) to the tail after committing what is ready; returns the tail
        (B, H_kv, R, D) in full precision, the keys the current call sees besides the stored segments."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._commit_ready()
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        _OWNERS[id(self.keys)] = self
        return self.keys, self.values

    def prefill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store a prefix's K/V (B, H_kv, P, D) computed elsewhere (a full-precision forward), committed by the
        same policy as ``update`` would at the next call: the experiments share one prefill across quantizers."""
        if self.is_initialized:
            raise ValueError(f"layer {self.layer_idx} already holds tokens: prefill an empty cache")
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        sinks = min(self.policy.sink_tokens, keys.shape[2])
        self.store.reserve(max(0, keys.shape[2] - self.policy.residual_tokens - sinks), sinks)  # no growth slack
        self._commit_ready()

    def segments(self) -> list[Segment]:
        """The committed chunks, oldest first, as the cache's lazy views (KV heads as stored)."""
        return self.store.segments()

    def get_seq_length(self) -> int:
        return self.committed + (self.keys.shape[2] if self.is_initialized else 0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.store.clear()
        self.committed = 0
        self.keys = self.values = None
        self.is_initialized = False


def owner_of(key: torch.Tensor) -> QuantizedPrefixLayer | None:
    """The layer whose ``update`` returned ``key`` in this call (None: the key came from elsewhere)."""
    layer = _OWNERS.get(id(key))
    return layer if layer is not None and layer.keys is key else None


@dataclass
class CacheStats:
    """What a cache holds, summed over layers (bytes)."""

    stored: int = 0  # exact stored bytes of the committed tokens (codes, steps, zeros, sinks)
    held: int = 0  # bytes the layer buffers hold for them (capacity included): what the process keeps
    bf16: int = 0  # the same committed K and V tokens in BF16
    tail: int = 0  # the full-precision tail's bytes
    per_layer: list = field(default_factory=list)


class JensenKVCache(Cache):
    """``past_key_values`` for a transformers causal LM whose attention is ``attn_implementation="jensenkv"``.

    ``quant``: the key quantizer (values follow ``values``: "same" | "none", as ``cache.values``);
    ``attention``: backend, correction, strength, second order and probes (``AttentionConfig``); probes record
    one dict per layer call in ``probe_records``. ``policy``: which tokens are quantized and when.
    """

    def __init__(self, model_config, quant: QuantConfig, attention: AttentionConfig | None = None,
                 policy: PrefixPolicy | None = None, values: str = "same",
                 full_precision_dtype: str = "float32"):
        config = model_config.get_text_config(decoder=True)
        self.num_layers = config.num_hidden_layers
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.attention = attention or AttentionConfig()
        self.attention.validate()
        self.policy = policy or PrefixPolicy()
        settings = CacheSettings(values=values, sink_chunks=1 if self.policy.sink_tokens else 0,
                                 full_precision_dtype=full_precision_dtype)
        key, value = settings.key_value(quant, self.head_dim)
        self.cache_config = CacheConfig(key, value, sink_chunks=settings.sink_chunks,
                                        keep_reference=self.attention.probes)
        self.strengths = layer_strengths(self.attention, self.num_layers, self.heads, "cpu")
        self.probe_records: list[dict] = []
        super().__init__(layers=[QuantizedPrefixLayer(self.cache_config, self.head_dim, self.policy, i, self)
                                 for i in range(self.num_layers)])

    def prefill(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store every layer's prefix K/V ((B, H_kv, P, D) each, post-RoPE), e.g. a ``DynamicCache``'s."""
        if len(keys_values) != self.num_layers:
            raise ValueError(f"prefill got {len(keys_values)} layers' K/V: the model has {self.num_layers}")
        for layer, (k, v) in zip(self.layers, keys_values):
            layer.prefill(k, v)

    def configure(self, attention: AttentionConfig) -> None:
        """Attend with other settings over the same stored prefix (the experiment quantizes once per window and
        runs every correction over it)."""
        attention.validate()
        if attention.probes and not self.cache_config.keep_reference:
            raise ValueError("attention.probes=true needs a cache built with probes on: it keeps the full-precision "
                             "keys the probes compare with")
        self.attention = attention
        self.strengths = layer_strengths(attention, self.num_layers, self.heads, "cpu")

    def drop_tail(self) -> None:
        """Forget every layer's uncommitted full-precision tail and the probe records: back to the stored prefix."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[:, :, :0], layer.values[:, :, :0]
        self.probe_records = []

    def stats(self) -> CacheStats:
        stats = CacheStats()
        for layer in self.layers:
            store = layer.store
            stats.stored += store.nbytes
            stats.held += store.held_nbytes
            stats.bf16 += store.bf16_nbytes
            if layer.is_initialized:
                stats.tail += layer.keys.nbytes + layer.values.nbytes
            stats.per_layer.append(store.held_nbytes)
        return stats
