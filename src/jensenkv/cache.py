"""Chunked KV cache for one attention layer: quantize-on-commit, sinks, sliding window, byte accounting.

Each committed chunk is quantized exactly once (keys and values by separate quantizers; values
may stay full precision with method "none") and never re-quantized. A cache of a batch of videos
(B > 1) quantizes each video with its own pair of quantizers, so no statistic, dither draw or k-means
state mixes videos, and stacks the stored forms (``quant.samples``): each video is stored exactly as
it would be alone. The first `sink_chunks`
chunks are kept in full precision (each config's `store_dtype`) and stay visible forever; of the
other chunks only the last `window_chunks` are kept, and a chunk that leaves the window is
dropped (its storage freed). `segments()` returns the visible chunks, oldest first, as lazy views.

Memory: a chunk holds only its stored form (packed codes, steps, zeros, centroids, full-precision
sinks), exactly what `nbytes` counts. RTN and full-precision chunks live back to back in per-layer growing
buffers (``quant.store``: one for the keys, one for the values, two more for the sinks), so the visible
chunks, or any run of them, are one strided view that the Triton kernel reads in place; `held_nbytes` counts
what those buffers hold (the stored bytes plus the capacity slack; `reserve` sets the capacity up front).
Nothing dequantized is held between attention calls: the fast
attention paths dequantize the views' stored tensors into one workspace shared by all layers
(``jensenkv.attention.workspace``), and a view's own `k` / `v` / `steps` are built on first use and
live only as long as the caller keeps that view. The one documented extra is probe memory: the
full-precision reference copies kept with `keep_reference` (the probes compare against them), not
counted in `nbytes`. `bf16_nbytes` is what the same visible K and V would take in BF16.
"""
from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Optional

import torch

from jensenkv.checks import check_choice, check_int
from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig, QuantizedTensor, make_quantizer
from jensenkv.quant.config import FLOAT_DTYPES
from jensenkv.quant.samples import stack_samples, video_of
from jensenkv.quant.store import ChunkStore
from jensenkv.quant.tensors import FullPrecisionTensor, tensor_nbytes

BF16_BYTES = 2


def _as_quant_config(value: QuantConfig | Mapping[str, Any], key: str) -> QuantConfig:
    if isinstance(value, QuantConfig):
        return value
    if isinstance(value, Mapping):
        return QuantConfig.from_dict(value)
    raise ValueError(f"cache.{key}={value!r} is not allowed: must be a QuantConfig or a mapping of its fields")


VALUES_MODES = ("same", "none")


def check_cache_layout(sink_chunks: Any, window_chunks: Any) -> None:
    """Sinks: an integer >= 0. Window: null (every non-sink chunk visible) or an integer >= 0 (0: sinks only)."""
    check_int("cache.sink_chunks", sink_chunks, 0)
    check_int("cache.window_chunks", window_chunks, 0, optional=True)


@dataclass
class CacheSettings:
    """How a layer's cache stores the chunks (the quantizer itself is ``RunConfig.quant``).

    values: "same" quantizes values like keys (KIVI "channel" keys: values per token, in groups of
        group_size channels, as KIVI does); "none" keeps values full precision (isolates the key error).
    full_precision_dtype: what everything unquantized is stored in: the BF16 reference cache, sink chunks,
        values=none. "BF16" everywhere in the suite means this cache.
    """

    values: str = "same"
    sink_chunks: int = 0               # first n chunks stay full precision and always visible
    window_chunks: Optional[int] = None  # only the last n non-sink chunks are visible (null: all; 0: sinks only)
    full_precision_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        check_choice("cache.values", self.values, VALUES_MODES)
        check_cache_layout(self.sink_chunks, self.window_chunks)
        check_choice("cache.full_precision_dtype", self.full_precision_dtype, tuple(FLOAT_DTYPES))

    def full_precision(self) -> QuantConfig:
        """The quantizer of everything kept unquantized: the BF16 reference's keys and values."""
        return QuantConfig(method="none", store_dtype=self.full_precision_dtype)

    def key_value(self, quant: QuantConfig, head_dim: int | None = None) -> tuple[QuantConfig, QuantConfig]:
        """(key, value) QuantConfigs with the settings each method ignores reset (so equal runs hash equal)."""
        if quant.method == "none":
            full = self.full_precision()
            return full, full
        defaults = QuantConfig()
        reset = {"store_dtype": self.full_precision_dtype}
        if quant.method != "qvg":
            reset.update({f.name: getattr(defaults, f.name) for f in dataclasses.fields(quant)
                          if f.name.startswith("qvg_")})
        if quant.rotation == "none":
            reset["rotation_seed"] = defaults.rotation_seed
        if quant.dither == "none":
            reset["dither_seed"] = defaults.dither_seed
        key = dataclasses.replace(quant, **reset)
        key.validate(head_dim)
        if self.values == "none":
            return key, self.full_precision()
        if key.granularity != "channel":
            return key, key
        value = dataclasses.replace(key, granularity="token_group")  # KIVI: per-token values
        try:
            value.validate(head_dim)
        except ValueError as e:
            raise ValueError(f"{e} (granularity=channel keys: values are quantized per token in groups of "
                             "group_size channels, as KIVI does; or set cache.values=none)") from None
        return key, value


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
        check_cache_layout(self.sink_chunks, self.window_chunks)  # the config tree's rule, shared
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
class _StoredChunk:
    index: int  # commit order, 0-based
    is_sink: bool
    k: QuantizedTensor
    v: QuantizedTensor
    num_tokens: int
    k_ref: torch.Tensor | None = None  # (B, H, S, D) probe memory (keep_reference), not counted in nbytes
    v_ref: torch.Tensor | None = None
    store_keys: tuple = (None, None)  # the layer buffers holding k and v (None: the chunk's own tensors)


class GivenTensor(QuantizedTensor):
    """A hand-built segment's keys or values, kept as given (tests, diagnostics, the LLM cache's head-expanded
    copies): already dequantized, in their own dtype, with the quantization steps they were given (None: full
    precision). ``dequantize`` returns the tensor itself, so a float64 segment stays float64 for the oracle."""

    def __init__(self, data: torch.Tensor, steps: GroupSteps | None = None):
        self.data = data  # (B, H, S, D) as given: never written
        self.steps = steps  # step (B, H, S, G) and rotation, or None
        self.shape = tuple(data.shape)
        self.rotation = None  # the data is in the original basis; a rotation lives in ``steps``

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.data)

    def _dequantize_rotated(self) -> torch.Tensor:
        return self.data

    def dequantize(self) -> torch.Tensor:
        return self.data  # (B, H, S, D) in the given dtype (not cast to float32)

    def group_steps(self) -> GroupSteps | None:
        return self.steps

    def video(self, b: int) -> GivenTensor:
        """Video b's rows (1, H, S, D), a view."""
        own = slice(b, b + 1)
        return GivenTensor(self.data[own], None if self.steps is None else GroupSteps(self.steps.step[own],
                                                                                      self.steps.rotation))


def carries_steps(stored: QuantizedTensor) -> bool:
    """Whether stored keys carry quantization steps (known from the form alone: nothing is built)."""
    if isinstance(stored, GivenTensor):
        return stored.steps is not None
    return not isinstance(stored, FullPrecisionTensor)


KV = Literal["k", "v"]


class Segment:
    """One cached chunk as every attention path reads it: its stored keys and values (what the fast paths read
    and dequantize into the shared workspace), their shapes, whether the keys carry steps, and the optional
    full-precision references of the probes.

    A cache's segments (``ChunkedKVCache.segments()``) are views of the chunks' stored forms; a hand-built one
    (``Segment.from_tensors``) wraps its tensors as ``GivenTensor``s. ``k``, ``v`` and ``steps`` are built from
    the stored form on first access and kept by this segment only: dropping it frees them.
    """

    def __init__(self, k: QuantizedTensor | torch.Tensor, v: QuantizedTensor | torch.Tensor,
                 steps: GroupSteps | None = None, k_ref: torch.Tensor | None = None, v_ref: torch.Tensor | None = None):
        """k, v: the stored forms, or tensors (B, H, K, D) / (B, H, K, Dv) of a hand-built segment, kept as
        ``GivenTensor``s with the keys' ``steps`` (None: full precision; stored keys carry their own)."""
        if isinstance(k, torch.Tensor):
            k = GivenTensor(k, steps)
        elif steps is not None:
            raise ValueError("steps is not allowed with stored keys: a stored form carries its own steps")
        self.stored_k: QuantizedTensor = k
        self.stored_v: QuantizedTensor = GivenTensor(v) if isinstance(v, torch.Tensor) else v
        self.k_ref = k_ref  # (B, H, K, D) full-precision keys (keep_reference, probes only) or None
        self.v_ref = v_ref  # (B, H, K, Dv)
        self.k_shape: tuple[int, ...] = tuple(self.stored_k.shape)  # (B, H, K, D)
        self.v_shape: tuple[int, ...] = tuple(self.stored_v.shape)  # (B, H, K, Dv)
        self.has_steps = carries_steps(self.stored_k)  # False: full-precision keys, never corrected

    @classmethod
    def from_tensors(cls, k: torch.Tensor, v: torch.Tensor, steps: GroupSteps | None = None,
                     k_ref: torch.Tensor | None = None, v_ref: torch.Tensor | None = None) -> Segment:
        """A hand-built segment: k (B, H, K, D) dequantized keys with their ``steps`` (None: full precision),
        v (B, H, K, Dv), and the optional full-precision references."""
        return cls(GivenTensor(k, steps), GivenTensor(v), k_ref=k_ref, v_ref=v_ref)

    def replace(self, **fields: Any) -> Segment:
        """A hand-built copy with some of k, v, steps, k_ref, v_ref replaced (the others as this one's)."""
        allowed = ("k", "v", "steps", "k_ref", "v_ref")
        for name in fields:
            if name not in allowed:
                raise ValueError(f"Segment.replace({name}=...) is not allowed: the fields are {allowed}")
        current = {name: getattr(self, name) for name in allowed}
        return Segment.from_tensors(**{**current, **fields})

    @cached_property
    def k(self) -> torch.Tensor:
        return self.stored_k.dequantize()  # (B, H, K, D) original basis (float32 from a cache)

    @cached_property
    def v(self) -> torch.Tensor:
        return self.stored_v.dequantize()  # (B, H, K, Dv)

    @cached_property
    def steps(self) -> GroupSteps | None:
        return self.stored_k.group_steps() if self.has_steps else None

    @property
    def num_tokens(self) -> int:
        return self.k_shape[2]

    def stored(self, name: KV) -> QuantizedTensor:
        """The stored keys ("k") or values ("v")."""
        return self.stored_k if name == "k" else self.stored_v

    def shape(self, name: KV) -> tuple[int, ...]:
        """(B, H, K, D) of the keys or (B, H, K, Dv) of the values, without dequantizing."""
        return self.k_shape if name == "k" else self.v_shape

    def dequantized(self, name: KV) -> torch.Tensor:
        """``k`` or ``v``."""
        return self.k if name == "k" else self.v

    def reference(self, name: KV) -> torch.Tensor:
        """The full-precision keys or values if kept, else the (possibly quantized) own."""
        ref = self.k_ref if name == "k" else self.v_ref
        return self.dequantized(name) if ref is None else ref

    def video(self, b: int) -> Segment:
        """Video b's rows ((1, H, K, D)): a cache's view as the stored form that video had alone (so the fast
        paths read it as they would alone), a hand-built segment by slicing its tensors."""
        own = slice(b, b + 1)
        return Segment(_video_of(self.stored_k, b), _video_of(self.stored_v, b),
                       k_ref=None if self.k_ref is None else self.k_ref[own],
                       v_ref=None if self.v_ref is None else self.v_ref[own])

    def expanded(self, groups: int) -> Segment:
        """Its KV heads repeated for the query heads of each group, as a hand-built segment (nothing is
        re-quantized; the keys are dequantized); itself when ``groups`` is 1."""
        if groups == 1:
            return self

        def rep(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.repeat_interleave(groups, dim=1)  # (B, H_kv, K, D) -> (B, H, K, D)

        steps = None if self.steps is None else GroupSteps(rep(self.steps.step), self.steps.rotation)
        return Segment.from_tensors(rep(self.k), rep(self.v), steps, rep(self.k_ref), rep(self.v_ref))


def _video_of(stored: QuantizedTensor, b: int) -> QuantizedTensor:
    return stored.video(b) if isinstance(stored, GivenTensor) else video_of(stored, b)


class ChunkedKVCache:
    """KV cache of one attention layer, one chunk per `commit`."""

    def __init__(self, cfg: CacheConfig, head_dim: int):
        if not isinstance(cfg, CacheConfig):
            cfg = CacheConfig.from_dict(cfg)
        self.cfg = cfg
        self.head_dim = head_dim
        self.key_quantizer = make_quantizer(cfg.key, head_dim)  # validates cfg.key against head_dim
        self.value_quantizer = make_quantizer(cfg.value, head_dim)
        self._per_video: list[tuple[Any, Any]] = []  # batch > 1: each video's own (key, value) quantizers
        self._chunks: list[_StoredChunk] = []
        self._stores: dict[tuple, ChunkStore] = {}  # (sink?, "k" | "v", store signature) -> the buffer
        self._reserved_tokens = (0, 0)  # (non-sink, sink) tokens the buffers hold from their first commit
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
            k_stored, v_stored = self._quantize(k, v)
        chunk = _StoredChunk(index, is_sink, k_stored, v_stored, num_tokens=k.shape[2],
                             store_keys=(self._place(k_stored, is_sink, "k"), self._place(v_stored, is_sink, "v")))
        if self.cfg.keep_reference:
            chunk.k_ref, chunk.v_ref = k.detach().clone(), v.detach().clone()
        self._chunks.append(chunk)
        self._evict()

    def _place(self, stored: QuantizedTensor, is_sink: bool, name: str) -> tuple | None:
        """Move a chunk's stored form into its layer buffer (``quant.store``) if its form lives in one; the
        buffer's key, or None (QVG, smoothed, tensor-granularity, INT3, dithered chunks keep their tensors)."""
        signature = ChunkStore.accepts(stored)
        if signature is None:
            return None
        key = (is_sink, name, signature)
        if key not in self._stores:
            self._stores[key] = ChunkStore(signature)
            self._stores[key].reserve(self._reserved_tokens[is_sink])
        self._stores[key].append(stored)
        return key

    def _release(self, chunk: _StoredChunk) -> None:
        for key, stored in zip(chunk.store_keys, (chunk.k, chunk.v)):
            if key is not None:
                self._stores[key].release(stored)

    def reserve(self, tokens: int, sink_tokens: int = 0) -> None:
        """Let the buffers hold ``tokens`` non-sink and ``sink_tokens`` sink tokens from their first commit on
        (no doubling slack when the final size is known; more still grows them). Replaces an earlier
        reservation for buffers not made yet (``clear`` keeps it)."""
        check_int("tokens", tokens, 0)
        check_int("sink_tokens", sink_tokens, 0)
        self._reserved_tokens = (tokens, sink_tokens)
        for (is_sink, _, _), store in self._stores.items():
            store.reserve(sink_tokens if is_sink else tokens)

    def reserve_chunks(self, num_chunks: int, tokens_per_chunk: int) -> None:
        """Reserve what a video of ``num_chunks`` commits of ``tokens_per_chunk`` tokens each leaves in the
        buffers: its non-sink chunks, at most the window plus the one a commit appends before the oldest leaves."""
        check_int("num_chunks", num_chunks, 0)
        check_int("tokens_per_chunk", tokens_per_chunk, 0)
        sinks = min(num_chunks, self.cfg.sink_chunks)
        held = num_chunks - sinks
        if self.cfg.window_chunks is not None:
            held = min(held, self.cfg.window_chunks + 1 if self.cfg.window_chunks else 0)
        self.reserve(held * tokens_per_chunk, sinks * tokens_per_chunk)

    def _quantize(self, k: torch.Tensor, v: torch.Tensor) -> tuple[QuantizedTensor, QuantizedTensor]:
        """(B, H, S, D) each -> stored forms; a batch is quantized video by video, then stacked."""
        if k.shape[0] == 1:
            return self.key_quantizer.quantize(k), self.value_quantizer.quantize(v)
        while len(self._per_video) < k.shape[0]:
            self._per_video.append((make_quantizer(self.cfg.key, self.head_dim),
                                    make_quantizer(self.cfg.value, self.head_dim)))
        keys, values = zip(*((kq.quantize(k[i:i + 1]), vq.quantize(v[i:i + 1]))
                             for i, (kq, vq) in enumerate(self._per_video[:k.shape[0]])))
        return stack_samples(list(keys)), stack_samples(list(values))

    def _evict(self) -> None:
        """Drop the non-sink chunks that left the window (frees their storage)."""
        if self.cfg.window_chunks is None:
            return
        sinks = [c for c in self._chunks if c.is_sink]
        recent = [c for c in self._chunks if not c.is_sink]
        keep = max(0, len(recent) - self.cfg.window_chunks)
        for chunk in recent[:keep]:  # oldest first, as the buffers release them
            self._release(chunk)
        self._chunks = sinks + recent[keep:]

    def segments(self) -> list[Segment]:
        """Visible chunks, oldest first, as lazy views of their stored form (nothing is dequantized here)."""
        return [Segment(chunk.k, chunk.v, k_ref=chunk.k_ref, v_ref=chunk.v_ref) for chunk in self._chunks]

    @property
    def chunk_indices(self) -> list[int]:
        """Commit indices of the visible chunks, oldest first."""
        return [c.index for c in self._chunks]

    @property
    def nbytes(self) -> int:
        """Exact bytes stored for the visible chunks (the probes' reference copies excluded)."""
        return sum(c.k.nbytes + c.v.nbytes for c in self._chunks)

    @property
    def held_nbytes(self) -> int:
        """Bytes held for the visible chunks: the layer buffers' capacity (stored bytes + slack, and the
        per-channel layouts' token-row tables) plus the chunks kept outside them."""
        loose = sum(t.nbytes for c in self._chunks for key, t in zip(c.store_keys, (c.k, c.v)) if key is None)
        return loose + sum(store.held_nbytes for store in self._stores.values())

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
        self._stores = {}
        self.num_committed = 0
        self._batch_heads = None
        self._per_video = []  # fresh quantizers for the next batch's videos
        for quantizer in (self.key_quantizer, self.value_quantizer):
            if hasattr(quantizer, "reset"):
                quantizer.reset()
