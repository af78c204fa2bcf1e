"""The cached self-attention processor: one per ``attn1`` layer, installed with the model's ``set_attn_processor``.

It owns that layer's caches (one ``ChunkedKVCache`` per CFG branch) and computes attention with a kernel
from ``jensenkv.attention.ATTENTION_BACKENDS``, so quantization (on commit), the Jensen-bias correction
and the probes all happen here. It sees post-RoPE K/V, which is what is cached.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from jensenkv.attention import get_backend
from jensenkv.attention.videos import attend_videos, probe_videos
from jensenkv.cache import CacheConfig, ChunkedKVCache, Segment
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan.dit import apply_rotary, qkv_projections
from jensenkv.models.wan.state import BRANCHES, PROCESSOR_MODES, ChunkState, InFlightChunk

__all__ = ["CachedSelfAttnProcessor", "apply_rotary", "block_causal_mask", "limit_kv_range", "window_context"]


def block_causal_mask(num_tokens: int, frames_per_chunk: int, tokens_per_frame: int,
                      device: torch.device) -> torch.Tensor:
    """(S, S) bool, True where query token i may attend key token j: chunk(j) <= chunk(i)."""
    chunk = torch.arange(num_tokens, device=device) // (tokens_per_frame * frames_per_chunk)  # (S,)
    return chunk[:, None] >= chunk[None, :]


def window_context(position: int, kv_range: int | None) -> tuple[int, int | None]:
    """What the in-flight chunk at ``position`` (0 = oldest) of a forward sees besides itself.

    ``kv_range`` counts the most recent preceding chunks, in flight or cached (MAGI-1's k_range), so the
    earlier in-flight chunks (the most recent ones) come first. Returns (earlier in-flight chunks visible,
    cached-chunk limit for ``limit_kv_range``, None meaning all).
    """
    if kv_range is None:
        return position, None
    in_flight = min(position, kv_range)
    return in_flight, kv_range - in_flight


def limit_kv_range(segments: list[Segment], kv_range: int | None) -> list[Segment]:
    """The most recent ``kv_range`` visible cached chunks (all when None, or when fewer are visible)."""
    if kv_range is None:
        return segments
    return segments[max(len(segments) - kv_range, 0):]  # clamp: a limit above the count shows every chunk


class CachedSelfAttnProcessor:
    """Self-attention of one layer over [cached chunks, current chunk(s)] with quantize-on-commit.

    Keeps a ``ChunkedKVCache`` per CFG branch; the current chunks' K/V (in flight, not committed) stay full
    precision and are never corrected: they go to the attention functions as ``k_cur`` / ``v_cur``, and the
    bias applies to cached scores only.
    """

    _attention_backend = None  # read by diffusers' set_attention_backend; unused here
    _parallel_config = None

    def __init__(self, layer_index: int, state: ChunkState, cache_config: CacheConfig, head_dim: int,
                 attention: AttentionConfig, strength: float | torch.Tensor | None = None):
        self.layer_index = layer_index
        self.state = state
        self.head_dim = head_dim
        self.configure(cache_config, attention, strength)

    def configure(self, cache_config: CacheConfig, attention: AttentionConfig,
                  strength: float | torch.Tensor | None = None) -> None:
        """Swap the cache and attention settings; clears the caches. ``strength``: this layer's, from
        ``layer_strengths`` (a float, or (H,) per-head strengths on the model's device); None: the global one."""
        attention.validate()
        cache_config.key.validate(self.head_dim)  # fail now, not at the first commit
        cache_config.value.validate(self.head_dim)
        if attention.probes and not cache_config.keep_reference:
            cache_config = replace(cache_config, keep_reference=True)  # probes compare with the BF16 cache
        self.cache_config = cache_config
        self.attention = attention
        self.strength = attention.strength if strength is None else strength
        self.caches: dict[str, ChunkedKVCache] = {}

    def cache(self, branch: str) -> ChunkedKVCache:
        if branch not in BRANCHES:
            raise ValueError(f"branch={branch!r} is not allowed: use one of {BRANCHES}")
        if branch not in self.caches:
            self.caches[branch] = ChunkedKVCache(self.cache_config, self.head_dim)
        return self.caches[branch]

    def reset(self) -> None:
        self.caches = {}

    def __call__(self, attn: torch.nn.Module, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("CachedSelfAttnProcessor got encoder_hidden_states: install it on attn1 only")
        state = self.state
        query, key, value = qkv_projections(attn, hidden_states)  # (B, S, H*D) each
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))  # (B, S, H, D)
        if rotary_emb is not None:
            query, key = apply_rotary(query, *rotary_emb), apply_rotary(key, *rotary_emb)
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, S, D)

        if state.mode == "full":
            # The model's own mask (if any) is ignored: causality is the processor's job in every mode.
            mask = block_causal_mask(q.shape[2], state.frames_per_chunk, state.tokens_per_frame, q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, S, D)
        elif state.mode in ("cached", "commit"):
            # the batch is len(branches) equal parts, branch-major (CFG in one forward): each its own cache
            outs, n = [], q.shape[0] // len(state.branches)
            for i, branch in enumerate(state.branches):
                part = slice(i * n, (i + 1) * n)
                cache = self.cache(branch)
                outs.append(self._window_attention(q[part], k[part], v[part], cache.segments(), branch))
                if state.mode == "commit":
                    self._commit(cache, k[part], v[part])
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)  # (B, H, S, D)
        else:
            raise ValueError(f"processor mode={state.mode!r} is not allowed: use one of {PROCESSOR_MODES}")

        out = out.transpose(1, 2).flatten(2, 3).type_as(query)  # (B, S, H*D)
        return attn.to_out[1](attn.to_out[0](out))

    def _window_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cached: list[Segment], branch: str) -> torch.Tensor:
        """Each in-flight chunk attends to its visible cached chunks and block-causally to the window.

        q, k, v: (B, H, S, D) over the window's chunks (equal lengths, oldest first) -> (B, H, S, D).
        One attention call per chunk, so the cached segments (quantized, corrected) and the in-flight
        tokens (``k_cur``: full precision, never corrected) keep their roles.
        """
        window = self.state.window
        tokens = q.shape[2] // len(window)  # tokens per chunk
        attend = get_backend(self.attention.backend)  # looked up per forward: new registrations apply at once
        outs = []
        for position, chunk in enumerate(window):
            in_flight, cache_limit = window_context(position, chunk.kv_range)
            rows = slice(position * tokens, (position + 1) * tokens)
            keys = slice((position - in_flight) * tokens, (position + 1) * tokens)  # earlier in-flight + itself
            segments = limit_kv_range(cached, cache_limit)
            q_c, k_c, v_c = q[:, :, rows], k[:, :, keys], v[:, :, keys]  # (B, H, T, D), (B, H, (in_flight+1)*T, D)
            outs.append(attend_videos(attend, q_c, k_c, v_c, segments, self.attention, self.strength))  # (B, H, T, D)
            if self.state.mode == "cached" and segments and self.attention.probes_at(self.layer_index, chunk.step):
                self._record_probes(q_c, k_c, v_c, segments, chunk, branch, outs[-1])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, S, D)

    def _record_probes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       segments: list[Segment], chunk: InFlightChunk, branch: str, attended: torch.Tensor) -> None:
        """One record per video of the batch, each computed on that video alone (``probe_videos``), reusing the
        attention output ``attended`` (B, H, T, Dv) of these inputs."""
        for values in probe_videos(q, k, v, segments, self.attention, self.strength, attended,
                                   step=chunk.step):
            self.state.probe_records.append({"layer": self.layer_index, "step": chunk.step, "chunk": chunk.index,
                                             "branch": branch, **values})

    def _commit(self, cache: ChunkedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
        if not self.state.time_quantize:
            cache.commit(k, v)  # (B, H, S, D) each; quantized once, here
            return
        # Opt-in timing: the device syncs it needs would stall the pipeline on every commit of every layer.
        _sync(k.device)
        start = time.perf_counter()
        cache.commit(k, v)
        _sync(k.device)
        self.state.quantize_seconds += time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

