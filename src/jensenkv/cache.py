"""Chunked KV cache for one attention layer: quantize-on-commit, sinks, sliding window, byte accounting.

Each committed chunk is quantized exactly once (keys and values by separate quantizers; values
may stay full precision with method "none") and never re-quantized. The first `sink_chunks`
chunks are kept in full precision (each config's `store_dtype`) and stay visible forever; of the
other chunks only the last `window_chunks` are kept, and a chunk that leaves the window is
dropped (its storage freed). `segments()` returns the visible chunks, oldest first, dequantized.

Memory accounting: `nbytes` counts exactly the stored form of the held chunks (packed codes,
steps, zeros, centroids, full-precision sinks). NOT counted: the full-precision reference copies
kept with `keep_reference` (a probe aid) and the per-chunk memo of dequantized tensors that
`segments()` keeps so that a chunk is dequantized once rather than on every attention call (a
compute cache, not storage). `bf16_nbytes` is what the same visible K and V would take in BF16.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig, QuantizedTensor, make_quantizer
from jensenkv.quant.tensors import FullPrecisionTensor

BF16_BYTES = 2


def _as_quant_config(value: QuantConfig | Mapping[str, Any], key: str) -> QuantConfig:
    if isinstance(value, QuantConfig):
        return value
    if isinstance(value, Mapping):
        return QuantConfig.from_dict(value)
    raise ValueError(f"cache.{key}={value!r} is not allowed: must be a QuantConfig or a mapping of its fields")


@dataclass(frozen=True)
class CacheConfig:
    """How one layer's cache stores chunks (see docs/ARCHITECTURE.md)."""

    key: QuantConfig
    value: QuantConfig  # may be QuantConfig(method="none"): values kept full precision
    sink_chunks: int = 0
    window_chunks: int | None = None
    keep_reference: bool = False

    def __post_init__(self) -> None:
        # Mappings (e.g. Hydra nodes) are accepted and converted in place of the frozen fields.
        object.__setattr__(self, "key", _as_quant_config(self.key, "key"))
        object.__setattr__(self, "value", _as_quant_config(self.value, "value"))
        if isinstance(self.sink_chunks, bool) or not isinstance(self.sink_chunks, int) or self.sink_chunks < 0:
            raise ValueError(f"cache.sink_chunks={self.sink_chunks!r} is not allowed: must be an integer >= 0")
        if self.window_chunks is not None and (
            isinstance(self.window_chunks, bool) or not isinstance(self.window_chunks, int) or self.window_chunks < 0
        ):
            raise ValueError(
                f"cache.window_chunks={self.window_chunks!r} is not allowed: must be null (unbounded) or an integer >= 0"
            )
        if not isinstance(self.keep_reference, bool):
            raise ValueError(f"cache.keep_reference={self.keep_reference!r} is not allowed: must be true or false")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> CacheConfig:
        """Build from a mapping (nested key/value mappings allowed); unknown keys are errors."""
        allowed = {"key", "value", "sink_chunks", "window_chunks", "keep_reference"}
        values = {k: v for k, v in dict(values).items() if k != "_target_"}
        for name in values:
            if name not in allowed:
                raise ValueError(f"cache.{name} is not an allowed key: allowed keys are {sorted(allowed)}")
        return cls(**values)


@dataclass
class CacheSegment:
    """One visible chunk as attention sees it. Tensors are shared with the cache's memo: do not modify."""

    k: torch.Tensor  # (B, H, K, D) float32, dequantized, original basis
    v: torch.Tensor  # (B, H, K, D) float32
    steps: GroupSteps | None  # None when the keys are full precision (sink chunk or key method "none")
    k_ref: torch.Tensor | None = None  # (B, H, K, D) full-precision keys when keep_reference
    v_ref: torch.Tensor | None = None  # (B, H, K, D)


@dataclass
class _StoredChunk:
    index: int  # commit order, 0-based
    is_sink: bool
    k: QuantizedTensor
    v: QuantizedTensor
    num_tokens: int
    k_ref: torch.Tensor | None = None
    v_ref: torch.Tensor | None = None
    segment: CacheSegment | None = None  # memo of the dequantized view (compute cache, not counted)


class ChunkedKVCache:
    """KV cache of one attention layer, one chunk per `commit`."""

    def __init__(self, cfg: CacheConfig, head_dim: int):
        if not isinstance(cfg, CacheConfig):
            cfg = CacheConfig.from_dict(cfg)
        self.cfg = cfg
        self.head_dim = head_dim
        self.key_quantizer = make_quantizer(cfg.key, head_dim)  # validates cfg.key against head_dim
        self.value_quantizer = make_quantizer(cfg.value, head_dim)
        self._chunks: list[_StoredChunk] = []
        self.num_committed = 0
        self._batch_heads: tuple[int, int] | None = None

    def _check_chunk(self, k: torch.Tensor, v: torch.Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if t.ndim != 4:
                raise ValueError(f"{name} with shape {tuple(t.shape)} is not allowed: expected (B, H, S, D)")
            if t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} with head dim {t.shape[-1]} (shape {tuple(t.shape)}) is not allowed: "
                    f"the cache was built for head_dim={self.head_dim}"
                )
        if k.shape != v.shape:
            raise ValueError(f"k shape {tuple(k.shape)} and v shape {tuple(v.shape)} must match (B, H, S, D)")
        if self._batch_heads is not None and tuple(k.shape[:2]) != self._batch_heads:
            raise ValueError(
                f"k with (B, H)={tuple(k.shape[:2])} is not allowed: earlier chunks have (B, H)={self._batch_heads}"
            )

    def commit(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one clean chunk, k and v (B, H, S, D): quantized here, once, and never again."""
        self._check_chunk(k, v)
        index = self.num_committed
        self.num_committed += 1
        self._batch_heads = tuple(k.shape[:2])
        is_sink = index < self.cfg.sink_chunks
        if not is_sink and self.cfg.window_chunks == 0:
            return  # it would leave the window at once: nothing to store
        if is_sink:
            k_stored = FullPrecisionTensor(k, self.cfg.key.torch_store_dtype)
            v_stored = FullPrecisionTensor(v, self.cfg.value.torch_store_dtype)
        else:
            k_stored, v_stored = self.key_quantizer.quantize(k), self.value_quantizer.quantize(v)
        chunk = _StoredChunk(index, is_sink, k_stored, v_stored, num_tokens=k.shape[2])
        if self.cfg.keep_reference:
            chunk.k_ref, chunk.v_ref = k.detach().clone(), v.detach().clone()
        self._chunks.append(chunk)
        self._evict()

    def _evict(self) -> None:
        """Drop the non-sink chunks that left the window (frees their storage)."""
        if self.cfg.window_chunks is None:
            return
        sinks = [c for c in self._chunks if c.is_sink]
        recent = [c for c in self._chunks if not c.is_sink]
        self._chunks = sinks + recent[max(0, len(recent) - self.cfg.window_chunks) :]

    def segments(self) -> list[CacheSegment]:
        """Visible chunks, oldest first, each dequantized once and memoized."""
        for chunk in self._chunks:
            if chunk.segment is None:
                chunk.segment = CacheSegment(
                    k=chunk.k.dequantize(),
                    v=chunk.v.dequantize(),
                    steps=chunk.k.group_steps(),
                    k_ref=chunk.k_ref,
                    v_ref=chunk.v_ref,
                )
        return [chunk.segment for chunk in self._chunks]

    @property
    def chunk_indices(self) -> list[int]:
        """Commit indices of the visible chunks, oldest first."""
        return [c.index for c in self._chunks]

    @property
    def nbytes(self) -> int:
        """Exact bytes stored for the visible chunks (reference copies and the dequantized memo excluded)."""
        return sum(c.k.nbytes + c.v.nbytes for c in self._chunks)

    @property
    def bf16_nbytes(self) -> int:
        """Bytes the same visible K and V tokens would take in BF16."""
        b, h = self._batch_heads or (0, 0)
        return BF16_BYTES * 2 * b * h * self.num_tokens * self.head_dim

    @property
    def num_chunks(self) -> int:
        """Visible (= held) chunks."""
        return len(self._chunks)

    @property
    def num_tokens(self) -> int:
        """Tokens in the visible chunks."""
        return sum(c.num_tokens for c in self._chunks)

    def clear(self) -> None:
        """Forget every chunk and the quantizers' warm-start state (a new video starts)."""
        self._chunks = []
        self.num_committed = 0
        self._batch_heads = None
        for quantizer in (self.key_quantizer, self.value_quantizer):
            if hasattr(quantizer, "reset"):
                quantizer.reset()
