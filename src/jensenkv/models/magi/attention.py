"""MAGI-1's self-attention over the suite's KV cache, with grouped-query heads.

One ``ChunkedKVCache`` per layer holds keys after the k-LayerNorm and RoPE and values, with the KV heads
NOT expanded (so ``nbytes`` counts KV heads). A backend that reads KV heads as stored
(``attention.backends.reads_kv_heads``: the Triton kernel) gets the cache's views and the in-flight K/V as
they are; for the others, and for the probes, the visible cached chunks and the in-flight chunks are
expanded to the query heads (query head h reads KV head h // (H / H_kv)) for the call. Quantization (on
commit), the Jensen-bias correction and the probes are the same as for every other model.

A batch of B videos runs in one forward: each cache holds B rows, one per video, each quantized as if alone
(``ChunkedKVCache``), and the probes are computed video by video.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache, Segment
from jensenkv.attention.config import layer_strengths
from jensenkv.attention.videos import attend_videos, probe_videos
from jensenkv.attention.backends import get_backend, reads_kv_heads
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan import limit_kv_range, window_context


@dataclass(frozen=True)
class WindowChunk:
    """One chunk of a forward: its video index, denoising step (None: clean refresh) and kv range
    (preceding chunks visible, earlier in-flight ones first, then cached; None: all)."""

    index: int
    step: int | None = None
    kv_range: int | None = None


class MagiLayerCaches:
    """The per-layer caches of a batch of videos (one row each) and the settings that read them (MAGI's
    passes share one cache)."""

    def __init__(self, num_layers: int, head_dim: int, groups: int, cache_config: CacheConfig,
                 attention: AttentionConfig, heads: int | None = None, device: torch.device | str = "cpu"):
        self.num_layers = num_layers
        self.head_dim = head_dim
        self.groups = groups
        self.heads = heads
        self.device = device  # where the per-head strengths live: the model's
        self.configure(cache_config, attention)

    def configure(self, cache_config: CacheConfig, attention: AttentionConfig) -> None:
        attention.validate()
        cache_config.key.validate(self.head_dim)
        cache_config.value.validate(self.head_dim)
        if attention.probes and not cache_config.keep_reference:
            cache_config = replace(cache_config, keep_reference=True)  # probes compare with the full-precision cache
        self.cache_config = cache_config
        self.attention = attention
        # per layer: the global float, or its (H,) calibrated strengths on the model's device
        self.strengths = layer_strengths(attention, self.num_layers, self.heads, self.device)
        self.reset()

    def reset(self) -> None:
        self.caches = [ChunkedKVCache(self.cache_config, self.head_dim) for _ in range(self.num_layers)]
        self.probe_records: list[dict] = []
        self.quantize_seconds = 0.0

    def segments(self, layer: int) -> list[Segment]:
        """Layer's visible cached chunks, GQA-expanded to the query heads for this call only: the cache keeps
        the KV heads' stored form, the expanded copies live as long as the attention call that reads them."""
        return [seg.expanded(self.groups) for seg in self.caches[layer].segments()]

    def stored_segments(self, layer: int) -> list[Segment]:
        """Layer's visible cached chunks as the cache's views, KV heads as stored (nothing expanded or copied)."""
        return self.caches[layer].segments()

    def attention_fn(self) -> Callable[..., torch.Tensor]:
        return get_backend(self.attention.backend)  # looked up per call: registered kernels (and test spies) apply

    def reads_kv_heads(self) -> bool:
        """Whether the backend takes the KV heads as stored (else every call expands them to the query heads)."""
        return reads_kv_heads(self.attention.backend)

    def probing(self, layer: int, step: int | None) -> bool:
        return self.attention.probes_at(layer, step)


class WindowAttention:
    """``attend`` for one forward: each chunk of ``window`` attends to its visible cached chunks and
    block-causally to the earlier chunks of the forward (full precision, never corrected); optionally the
    chunk at ``commit_position`` is committed to every layer's cache after that layer's attention."""

    def __init__(self, caches: MagiLayerCaches, window: tuple[WindowChunk, ...], pass_name: str,
                 commit_position: int | None = None, use_cache: bool = True):
        self.caches = caches
        self.window = window
        self.pass_name = pass_name
        self.commit_position = commit_position
        self.use_cache = use_cache

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, H, S, D); k, v (B, H_kv, S, D) over the window's chunks (equal lengths) -> (B, H, S, D)."""
        caches, groups = self.caches, self.caches.groups
        tokens = q.shape[2] // len(self.window)
        native = caches.reads_kv_heads()
        stored = caches.stored_segments(layer) if self.use_cache else []
        cached = stored if native else [seg.expanded(groups) for seg in stored]
        fn = caches.attention_fn()
        outs = []
        for position, chunk in enumerate(self.window):
            in_flight, cache_limit = window_context(position, chunk.kv_range)
            rows = slice(position * tokens, (position + 1) * tokens)
            keys = slice((position - in_flight) * tokens, (position + 1) * tokens)
            segments = limit_kv_range(cached, cache_limit)
            q_c = q[:, :, rows]  # (B, H, T, D)
            k_c, v_c = k[:, :, keys], v[:, :, keys]  # (B, H_kv, (in_flight+1)*T, D): views, as computed
            if not native:
                k_c, v_c = k_c.repeat_interleave(groups, dim=1), v_c.repeat_interleave(groups, dim=1)  # (B, H, ., D)
            outs.append(attend_videos(fn, q_c, k_c, v_c, segments, caches.attention, caches.strengths[layer]))
            if segments and chunk.step is not None and caches.probing(layer, chunk.step):
                if native:  # the probes read query heads
                    k_c, v_c = k_c.repeat_interleave(groups, dim=1), v_c.repeat_interleave(groups, dim=1)
                    segments = [seg.expanded(groups) for seg in segments]
                self._record_probes(layer, chunk, q_c, k_c, v_c, segments, outs[-1])
        if self.commit_position is not None:
            rows = slice(self.commit_position * tokens, (self.commit_position + 1) * tokens)
            self._commit(caches.caches[layer], k[:, :, rows], v[:, :, rows])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, S, D)

    def _record_probes(self, layer: int, chunk: WindowChunk, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       segments: list[Segment], attended: torch.Tensor) -> None:
        """One record per video of the batch, each computed on that video alone (``probe_videos``), reusing the
        attention output ``attended`` (B, H, T, Dv) of these inputs."""
        for values in probe_videos(q, k, v, segments, self.caches.attention, self.caches.strengths[layer],
                                   attended, step=chunk.step):
            self.caches.probe_records.append({"layer": layer, "step": chunk.step, "chunk": chunk.index,
                                              "branch": self.pass_name, **values})

    def _commit(self, cache: ChunkedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        start = time.perf_counter()
        cache.commit(k, v)  # (B, H_kv, T, D) each: KV heads only, quantized once (per video), here
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        self.caches.quantize_seconds += time.perf_counter() - start
