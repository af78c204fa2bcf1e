"""Drive diffusers' Wan-family transformers (SkyReels-V2, Wan2.1 / Self-Forcing) chunk by chunk over a KV cache.

Nothing in diffusers is changed. Three pieces:

* ``CachedSelfAttnProcessor``: one per self-attention layer (``attn1``), installed with diffusers'
  ``set_attn_processor`` (dict form; cross-attention keeps the stock processor). It owns that layer's
  caches (one ``ChunkedKVCache`` per CFG branch) and computes attention with the suite's attention
  functions, so quantization (on commit), the Jensen-bias correction and the probes all happen here.
  It sees post-RoPE K/V, which is what is cached.
* ``RopeFrameOffsetHook``: a diffusers ``ModelHook`` on ``transformer.rope`` that shifts the temporal
  RoPE positions by the chunk's first latent frame (the stock RoPE always starts at frame 0).
* ``ChunkwiseAdapter``: the model-facing API of the generator (``denoise``, ``commit``, ``decode``, ...).

The loaders at the end (assembled into an adapter by ``jensenkv.models.registry``) never touch the network:
they resolve a local directory first and raise ``MissingWeightsError`` naming where they looked.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.models.transformers.transformer_wan import _get_qkv_projections

from jensenkv.cache import CacheConfig, CacheSegment, ChunkedKVCache
from jensenkv.generate import GenerationConfig, check_kv_range

PROCESSOR_MODES = ("cached", "commit", "full")
ATTENTION_BACKENDS = {"cached": "cached_attention", "reference": "reference_attention",
                      "flex": "flex_cached_attention", "triton": "triton_cached_attention"}
CORRECTIONS = ("none", "taylor", "exact")
BRANCHES = ("cond", "uncond")
ROPE_HOOK_NAME = "jensenkv_rope_frame_offset"
TRANSFORMER_CLASSES = {"SkyReelsV2Transformer3DModel": SkyReelsV2Transformer3DModel,
                       "WanTransformer3DModel": WanTransformer3DModel}


class MissingWeightsError(FileNotFoundError):
    """Model weights are not on this machine (the suite never downloads them at run time)."""


@dataclass(frozen=True)
class AttentionSettings:
    """How the cached self-attention is computed.

    backend: "cached" (fast CPU path), "reference" (the readable oracle), "flex" (GPU FlexAttention) or
        "triton" (fused kernel over the packed cache; TRITON_INTERPRET=1 runs it on a CPU).
    correction: Jensen-bias correction of the cached scores, "none" | "taylor" | "exact"; strength scales it.
    probes: record ``attention_probes`` per layer and denoising step (small dicts, no maps);
        probe_layers restricts them to some layer indices.
    """

    backend: str = "cached"
    correction: str = "none"
    strength: float = 1.0
    probes: bool = False
    probe_layers: tuple[int, ...] | None = None

    def validate(self) -> None:
        if self.backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend={self.backend!r} is not allowed: "
                             f"use one of {tuple(ATTENTION_BACKENDS)}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction={self.correction!r} is not allowed: use one of {CORRECTIONS}")
        if not self.strength >= 0:
            raise ValueError(f"strength={self.strength!r} is not allowed: it must be >= 0")


@dataclass(frozen=True)
class InFlightChunk:
    """One chunk of a "cached" / "commit" forward.

    index: the chunk's position in the video; step: its denoising step (None for a commit pass);
    kv_range: how many of the most recent preceding chunks it attends to, counting earlier in-flight
        chunks of the same forward first, then cached ones (MAGI-1's k_range; None: all).
    """

    index: int
    step: int | None = None
    kv_range: int | None = None


@dataclass
class ChunkState:
    """What the processors and the RoPE hook need to know about the forward being run (shared by all layers).

    mode: "cached" (denoise over the cache), "commit" (attend like "cached", then commit this forward's
        K/V to the branch's cache) or "full" (no cache: full-sequence block-causal attention, the reference).
    window: the consecutive chunks of a "cached" / "commit" forward, oldest first: one chunk, or the
        chunks in flight of a staircase tick (MAGI-1), each attending to the cache and block-causally to
        the window.
    start_frame: latent frame index of the first frame of the forward's input (shifts RoPE).
    """

    mode: str = "cached"
    branch: str = "cond"
    window: tuple[InFlightChunk, ...] = (InFlightChunk(0),)
    start_frame: int = 0
    frames_per_chunk: int = 1
    tokens_per_frame: int = 1
    probe_records: list[dict] = field(default_factory=list)
    quantize_seconds: float = 0.0


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved-pair RoPE. x (B, S, H, D); cos, sin (1, S, 1, D) with pairs repeated."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (B, S, H, D/2) each
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


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


def limit_kv_range(segments: list[CacheSegment], kv_range: int | None) -> list[CacheSegment]:
    """The most recent ``kv_range`` visible cached chunks (all when None)."""
    if kv_range is None:
        return segments
    return segments[len(segments) - kv_range:] if kv_range > 0 else []


class CachedSelfAttnProcessor:
    """Self-attention of one layer over [cached chunks, current chunk(s)] with quantize-on-commit.

    Keeps a ``ChunkedKVCache`` per CFG branch; the current chunks' K/V (in flight, not committed) stay full
    precision and are never corrected: they go to the attention functions as ``k_cur`` / ``v_cur``, and the
    bias applies to cached scores only.
    """

    _attention_backend = None  # read by diffusers' set_attention_backend; unused here
    _parallel_config = None

    def __init__(self, layer_index: int, state: ChunkState, cache_config: CacheConfig, head_dim: int,
                 attention: AttentionSettings):
        self.layer_index = layer_index
        self.state = state
        self.head_dim = head_dim
        self.configure(cache_config, attention)

    def configure(self, cache_config: CacheConfig, attention: AttentionSettings) -> None:
        """Swap the cache and attention settings; clears the caches."""
        attention.validate()
        cache_config.key.validate(self.head_dim)  # fail now, not at the first commit
        cache_config.value.validate(self.head_dim)
        if attention.probes and not cache_config.keep_reference:
            cache_config = replace(cache_config, keep_reference=True)  # probes compare with the BF16 cache
        self.cache_config = cache_config
        self.attention = attention
        self.caches: dict[str, ChunkedKVCache] = {}

    def cache(self, branch: str) -> ChunkedKVCache:
        if branch not in BRANCHES:
            raise ValueError(f"branch={branch!r} is not allowed: use one of {BRANCHES}")
        if branch not in self.caches:
            self.caches[branch] = ChunkedKVCache(self.cache_config, self.head_dim)
        return self.caches[branch]

    def reset(self) -> None:
        self.caches = {}

    def _attention_fn(self) -> Callable[..., torch.Tensor]:
        import jensenkv.attention as attention_lib  # looked up per call: config switches (and test spies) apply at once

        name = ATTENTION_BACKENDS[self.attention.backend]
        fn = getattr(attention_lib, name, None)
        if fn is None:
            raise ValueError(f"attention backend={self.attention.backend!r} needs jensenkv.attention.{name}, "
                             "which this installation does not provide")
        return fn

    def __call__(self, attn: torch.nn.Module, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("CachedSelfAttnProcessor got encoder_hidden_states: install it on attn1 only")
        state = self.state
        query, key, value = _get_qkv_projections(attn, hidden_states, None)  # (B, S, H*D) each
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
            cache = self.cache(state.branch)
            out = self._window_attention(q, k, v, cache.segments())  # (B, H, S, D)
            if state.mode == "commit":
                self._commit(cache, k, v)
        else:
            raise ValueError(f"processor mode={state.mode!r} is not allowed: use one of {PROCESSOR_MODES}")

        out = out.transpose(1, 2).flatten(2, 3).type_as(query)  # (B, S, H*D)
        return attn.to_out[1](attn.to_out[0](out))

    def _window_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cached: list[CacheSegment]) -> torch.Tensor:
        """Each in-flight chunk attends to its visible cached chunks and block-causally to the window.

        q, k, v: (B, H, S, D) over the window's chunks (equal lengths, oldest first) -> (B, H, S, D).
        One attention call per chunk, so the cached segments (quantized, corrected) and the in-flight
        tokens (``k_cur``: full precision, never corrected) keep their roles.
        """
        window = self.state.window
        tokens = q.shape[2] // len(window)  # tokens per chunk
        outs = []
        for position, chunk in enumerate(window):
            in_flight, cache_limit = window_context(position, chunk.kv_range)
            rows = slice(position * tokens, (position + 1) * tokens)
            keys = slice((position - in_flight) * tokens, (position + 1) * tokens)  # earlier in-flight + itself
            segments = limit_kv_range(cached, cache_limit)
            q_c, k_c, v_c = q[:, :, rows], k[:, :, keys], v[:, :, keys]  # (B, H, T, D), (B, H, (in_flight+1)*T, D)
            outs.append(self._attention_fn()(q_c, k_c, v_c, segments, correction=self.attention.correction,
                                             strength=self.attention.strength))  # (B, H, T, D)
            if self.state.mode == "cached" and segments and self._probing():
                self._record_probes(q_c, k_c, v_c, segments, chunk)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, S, D)

    def _probing(self) -> bool:
        layers = self.attention.probe_layers
        return self.attention.probes and (layers is None or self.layer_index in layers)

    def _record_probes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       segments: list[CacheSegment], chunk: InFlightChunk) -> None:
        from jensenkv.attention import attention_probes

        values = attention_probes(q, k, v, segments, self.attention.correction, strength=self.attention.strength)
        self.state.probe_records.append({"layer": self.layer_index, "step": chunk.step,
                                         "chunk": chunk.index, "branch": self.state.branch, **values})

    def _commit(self, cache: ChunkedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        start = time.perf_counter()
        cache.commit(k, v)  # (B, H, S, D) each; quantized once, here
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        self.state.quantize_seconds += time.perf_counter() - start


class RopeFrameOffsetHook(ModelHook):
    """Shift Wan/SkyReels RoPE by ``state.start_frame`` latent frames.

    The stock ``rope.forward`` reads only the input's shape and always starts at frame 0, so the hook hands
    it a shape-only (meta) tensor of ``start_frame + F`` frames and keeps the last F frames' frequencies.
    """

    def __init__(self, state: ChunkState):
        super().__init__()
        self.state = state
        self._skip_tokens = 0

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        hidden_states = args[0] if args else kwargs.pop("hidden_states")  # (B, C, F, H, W)
        offset = self.state.start_frame
        p_t, p_h, p_w = module.patch_size
        b, c, f, h, w = hidden_states.shape
        if offset % p_t:
            raise ValueError(f"start_frame={offset} is not allowed: it must be a multiple of the temporal patch {p_t}")
        total_frames = (offset + f) // p_t
        if total_frames > module.max_seq_len:
            raise ValueError(f"start_frame + frames = {offset + f} latent frames exceeds the model's "
                             f"rope_max_seq_len={module.max_seq_len}; generate fewer chunks")
        self._skip_tokens = (offset // p_t) * (h // p_h) * (w // p_w)
        if offset:
            hidden_states = torch.empty((b, c, offset + f, h, w), device="meta")
        return (hidden_states, *args[1:]), kwargs

    def post_forward(self, module: torch.nn.Module, output: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        cos, sin = output  # (1, S_total, 1, D) each
        return cos[:, self._skip_tokens:], sin[:, self._skip_tokens:]


def pixel_decode(latents: torch.Tensor) -> torch.Tensor:
    """Pixel-space models: (1, C, F, H, W) in [-1, 1] -> (F, C, H, W) in [0, 1]."""
    return ((latents[0].permute(1, 0, 2, 3).float() + 1) / 2).clamp(0, 1)


class ChunkwiseAdapter:
    """A Wan-family transformer driven chunk by chunk over per-layer quantized KV caches.

    Args:
        transformer: a ``SkyReelsV2Transformer3DModel`` or ``WanTransformer3DModel``.
        encode_prompt: list of prompts -> (B, L, text_dim) embeddings.
        latent_frame_shape: (C, H, W) of one latent frame.
        generation: the sampling defaults of this model (steps, shift, guidance, chunking, ...).
        cache: the KV-cache settings (quantizers, sink / window); attention: see ``AttentionSettings``.
        decode: (1, C, F, H, W) latents -> (F, 3, H', W') video in [0, 1] (default: pixel space).
        clean_range: committed chunks are clamped to this range (pixel-space models; None for latents).
        fps: SkyReels-V2 ``inject_sample_info`` models only (24 or 16).
    """

    def __init__(self, transformer: torch.nn.Module, encode_prompt: Callable[[list[str]], torch.Tensor],
                 latent_frame_shape: tuple[int, int, int], generation: GenerationConfig, cache: CacheConfig,
                 attention: AttentionSettings | None = None,
                 decode: Callable[[torch.Tensor], torch.Tensor] = pixel_decode,
                 clean_range: tuple[float, float] | None = None, fps: int = 24):
        if not isinstance(transformer, tuple(TRANSFORMER_CLASSES.values())):
            raise ValueError(f"transformer={type(transformer).__name__} is not allowed: use one of "
                             f"{tuple(TRANSFORMER_CLASSES)}")
        generation.validate()
        self.transformer = transformer.eval()
        self.is_skyreels = isinstance(transformer, SkyReelsV2Transformer3DModel)
        self._stock_frames_per_block = getattr(transformer.config, "num_frame_per_block", None)
        if self.is_skyreels and transformer.config.num_frame_per_block != 1:
            # The processors own causality; a model-built mask would only cost an (S, S) tensor per forward.
            transformer.register_to_config(num_frame_per_block=1)
        self.encode_prompt = encode_prompt
        self.latent_frame_shape = tuple(int(x) for x in latent_frame_shape)
        self.generation = generation
        self.decode_fn = decode
        self.clean_range = clean_range
        self.fps = fps
        cfg = transformer.config
        self.head_dim = int(cfg.attention_head_dim)
        _, p_h, p_w = cfg.patch_size
        _, h, w = self.latent_frame_shape
        if h % p_h or w % p_w:
            raise ValueError(f"latent frame size {h}x{w} is not allowed: it must be divisible by the patch {p_h}x{p_w}")
        self.state = ChunkState()
        attention = attention if attention is not None else AttentionSettings()
        self.processors: list[CachedSelfAttnProcessor] = []
        procs = {}
        for name, proc in transformer.attn_processors.items():
            if ".attn1." in name:
                layer = int(name.split(".")[1])  # "blocks.{i}.attn1.processor"
                procs[name] = CachedSelfAttnProcessor(layer, self.state, cache, self.head_dim, attention)
                self.processors.append(procs[name])
            else:
                procs[name] = proc
        transformer.set_attn_processor(procs)
        registry = HookRegistry.check_if_exists_or_initialize(transformer.rope)
        if registry.get_hook(ROPE_HOOK_NAME) is not None:  # an earlier adapter on this model: rebind to our state
            registry.remove_hook(ROPE_HOOK_NAME)
        registry.register_hook(RopeFrameOffsetHook(self.state), ROPE_HOOK_NAME)
        self._prompt_embeds: dict[str, torch.Tensor] = {}
        self._committed: dict[str, int] = {}  # branch -> chunks committed so far

    # --- configuration -------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype  # diffusers' view: the compute dtype, not a kept-fp32 module's

    @property
    def quantize_seconds(self) -> float:
        return self.state.quantize_seconds

    def configure(self, cache: CacheConfig | None = None, attention: AttentionSettings | None = None) -> None:
        """Change the cache and/or attention settings (clears the caches); the model stays loaded."""
        for proc in self.processors:
            proc.configure(cache if cache is not None else proc.cache_config,
                           attention if attention is not None else proc.attention)
        self.reset()

    def reset(self) -> None:
        """Start a new video: empty caches, no probes, zero timers."""
        for proc in self.processors:
            proc.reset()
        self.state.probe_records = []
        self.state.quantize_seconds = 0.0
        self._committed = {}

    def caches(self, branch: str = "cond") -> list[ChunkedKVCache]:
        """This branch's cache of every self-attention layer, in layer order."""
        return [proc.cache(branch) for proc in self.processors]

    def probes(self) -> list[dict] | None:
        return list(self.state.probe_records) if any(p.attention.probes for p in self.processors) else None

    def set_prompt(self, prompt: str, negative_prompt: str | None = None) -> None:
        """Encode the conditional prompt (and the negative one for CFG's "uncond" branch)."""
        prompts = [prompt] if negative_prompt is None else [prompt, negative_prompt]
        embeds = self.encode_prompt(prompts).to(self.device, self.dtype)  # (n, L, text_dim)
        self._prompt_embeds = {b: embeds[i:i + 1] for i, b in enumerate(BRANCHES[:len(prompts)])}

    # --- forwards --------------------------------------------------------------------------------------
    def _forward(self, latents: torch.Tensor, t_frames: torch.Tensor, branch: str) -> torch.Tensor:
        """latents (1, C, F, H, W); t_frames (1, F) flow times in [0, 1] -> velocity (1, C, F, H, W) float32."""
        if branch not in self._prompt_embeds:
            raise ValueError(f"branch={branch!r} has no prompt: call set_prompt first "
                             f"(with a negative prompt for 'uncond'); have {tuple(self._prompt_embeds)}")
        b, _, f, h, w = latents.shape
        _, p_h, p_w = self.transformer.config.patch_size
        self.state.tokens_per_frame = (h // p_h) * (w // p_w)
        timestep = (t_frames * 1000.0).to(self.device)  # (B, F) model timesteps
        kwargs: dict[str, Any] = {}
        if self.is_skyreels:
            kwargs["enable_diffusion_forcing"] = True  # per-frame timesteps (B, F)
            if self.transformer.config.inject_sample_info:
                kwargs["fps"] = [0 if self.fps == 16 else 1] * b
        elif bool((timestep == timestep[:, :1]).all()):
            timestep = timestep[:, 0]  # (B,): one timestep for the whole input
        else:
            timestep = timestep.repeat_interleave(self.state.tokens_per_frame, dim=1)  # (B, S) per token
        out = self.transformer(hidden_states=latents.to(self.device, self.dtype), timestep=timestep,
                               encoder_hidden_states=self._prompt_embeds[branch], return_dict=False, **kwargs)[0]
        return out.float()

    def _set_state(self, mode: str, branch: str, window: tuple[InFlightChunk, ...], start_frame: int) -> None:
        for chunk in window:
            check_kv_range(chunk.kv_range)
        s = self.state
        s.mode, s.branch, s.window, s.start_frame = mode, branch, window, start_frame

    @torch.no_grad()
    def denoise(self, chunk: torch.Tensor, t: float, chunk_index: int, branch: str = "cond", *,
                step: int | None = None, kv_range: int | None = None) -> torch.Tensor:
        """Velocity of one noisy chunk (1, C, F, H, W) at flow time t, attending to the branch's cache.

        Chunks are equally long, so the chunk starts at latent frame chunk_index * F (RoPE offset).
        """
        return self.denoise_window(chunk, [t], chunk_index, branch, steps=[step], kv_ranges=[kv_range])

    @torch.no_grad()
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int,
                       branch: str = "cond", *, steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor:
        """Velocity of ``len(t)`` consecutive noisy chunks in one forward (a MAGI-1 staircase tick).

        chunks: (1, C, n*F, H, W), oldest first, chunk j at flow time t[j] (denoising step steps[j]) and
        attending to at most kv_ranges[j] preceding chunks (earlier in-flight ones first, then cached;
        None: all). Returns (1, C, n*F, H, W) float32. With n = 1 this is ``denoise``.
        """
        n, frames = len(t), chunks.shape[2]
        steps = [None] * n if steps is None else list(steps)
        kv_ranges = [None] * n if kv_ranges is None else list(kv_ranges)
        if n < 1 or frames % n:
            raise ValueError(f"t with {n} entries is not allowed: it needs one flow time per chunk and the "
                             f"{frames} frames must split into equal chunks")
        for key, values in (("steps", steps), ("kv_ranges", kv_ranges)):
            if len(values) != n:
                raise ValueError(f"{key} with {len(values)} entries is not allowed: it needs one per chunk ({n})")
        window = tuple(InFlightChunk(first_chunk_index + j, steps[j], kv_ranges[j]) for j in range(n))
        frames_per_chunk = frames // n
        self._set_state("cached", branch, window, first_chunk_index * frames_per_chunk)
        t_frames = torch.tensor([float(x) for x in t]).repeat_interleave(frames_per_chunk)  # (n*F,)
        return self._forward(chunks, t_frames.expand(chunks.shape[0], -1), branch)  # t_frames: (B, n*F)

    @torch.no_grad()
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None:
        """Run the clean chunk (1, C, F, H, W) at t = 0 and append its K/V to every layer's cache."""
        expected = self._committed.get(branch, 0)
        if chunk_index != expected:
            raise ValueError(f"chunk_index={chunk_index} is not allowed: chunks are committed in order and the "
                             f"{branch!r} cache expects chunk {expected} next")
        self._set_state("commit", branch, (InFlightChunk(chunk_index, None, kv_range),),
                        chunk_index * clean_chunk.shape[2])
        t_frames = torch.zeros(clean_chunk.shape[0], clean_chunk.shape[2])  # (B, F)
        self._forward(clean_chunk, t_frames, branch)
        self._committed[branch] = expected + 1

    @torch.no_grad()
    def forward_full(self, latents: torch.Tensor, t_frames: torch.Tensor, branch: str = "cond",
                     frames_per_chunk: int | None = None) -> torch.Tensor:
        """Reference: one forward over the whole sequence (1, C, F, H, W) with the block-causal mask.

        t_frames: (1, F) flow time per frame; chunks of ``frames_per_chunk`` frames (default: the
        generation config's). No cache is read or written.
        """
        fpc = frames_per_chunk or self.generation.frames_per_chunk
        if latents.shape[2] % fpc:
            raise ValueError(f"frames={latents.shape[2]} is not allowed: "
                             f"it must be a multiple of frames_per_chunk={fpc}")
        self._set_state("full", branch, (InFlightChunk(0),), 0)
        self.state.frames_per_chunk = fpc
        return self._forward(latents, t_frames, branch)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, F, H, W) -> (F, 3, H', W') video in [0, 1]."""
        return self.decode_fn(latents)

    def remove(self) -> None:
        """Restore the stock self-attention processors and remove the RoPE hook."""
        procs = {f"{name}.processor": (type(m)._default_processor_cls() if name.endswith(".attn1") else m.processor)
                 for name, m in self.transformer.named_modules() if hasattr(m, "get_processor")}
        self.transformer.set_attn_processor(procs)
        HookRegistry.check_if_exists_or_initialize(self.transformer.rope).remove_hook(ROPE_HOOK_NAME)
        if self.is_skyreels:
            self.transformer.register_to_config(num_frame_per_block=self._stock_frames_per_block)
        self.processors = []


# --- loaders for real checkpoints (never download) ---------------------------------------------------------

FETCH_HINT = "run `make fetch-weights` on a machine with internet (or copy the files there), then retry"
CHECKPOINT_PREFIXES = ("model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def resolve_local_dir(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local model directory for ``path`` (a directory, or a Hub id looked up in the HF cache only).

    Raises MissingWeightsError naming what is missing and where it was looked for.
    """
    from huggingface_hub import constants, snapshot_download

    local = Path(path).expanduser()
    if local.is_dir():
        return local
    text = str(path)
    if local.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1:
        raise MissingWeightsError(f"model path={text!r}: no such local directory; {FETCH_HINT}")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id=text, cache_dir=str(cache), local_files_only=True))
    except Exception as err:  # LocalEntryNotFoundError and friends: nothing usable in the cache
        raise MissingWeightsError(
            f"model path={text!r} is neither a local directory nor in the Hugging Face cache "
            f"(looked in {cache}; set model.cache_dir or HF_HUB_CACHE to change it); {FETCH_HINT}") from err


def require_subfolder(directory: Path, subfolder: str, what: str) -> Path:
    sub = directory / subfolder
    if not sub.is_dir():
        raise MissingWeightsError(f"{what} not found: expected the folder {sub}; {FETCH_HINT}")
    return sub


def load_original_wan_checkpoint(file: str | os.PathLike, key: str | None = None) -> dict[str, torch.Tensor]:
    """State dict of an original-format Wan / Self-Forcing checkpoint (.pt or .safetensors) in diffusers names.

    key: the entry holding the weights in a .pt dict (Self-Forcing: "generator_ema" or "generator").
    Prefixes added by training wrappers ("model.", FSDP, torch.compile) are stripped.
    """
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    file = Path(file).expanduser()
    if not file.is_file():
        raise MissingWeightsError(f"transformer_checkpoint={str(file)!r} does not exist; {FETCH_HINT}")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    if key is not None:
        if key not in state:
            raise ValueError(f"checkpoint_key={key!r} is not in {file}: it has {sorted(state)[:10]}")
        state = state[key]
    cleaned = {}
    for name, tensor in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in CHECKPOINT_PREFIXES:
                if name.startswith(prefix):
                    name, changed = name[len(prefix):], True
        cleaned[name] = tensor
    return convert_wan_transformer_to_diffusers(cleaned)


def cast_like_diffusers(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast parameters to ``dtype`` except the model's ``_keep_in_fp32_modules`` (as diffusers' loader does).

    Non-persistent buffers (RoPE tables) keep their dtype.
    """
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, param in model.named_parameters():
        target = torch.float32 if keep & set(name.split(".")) else dtype
        if param.is_floating_point():
            param.data = param.data.to(target)
    return model


def _folder_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingWeightsError(f"no *.safetensors weights in {folder}; {FETCH_HINT}")
    state: dict[str, torch.Tensor] = {}
    for file in files:  # one file or the shards of a sharded checkpoint
        state.update(load_file(str(file)))
    return state


def load_wan_transformer(local_dir: Path, class_name: str, dtype: torch.dtype, subfolder: str = "transformer",
                         checkpoint: str | None = None, checkpoint_key: str | None = None) -> torch.nn.Module:
    """The transformer from a diffusers folder; with ``checkpoint``, config from there and weights from the file.

    Built from its config and loaded with a strict state dict rather than ``from_pretrained``, which in
    diffusers 0.42 needs ``accelerate`` for these models (their fp32-kept modules force low-memory loading).
    """
    if class_name not in TRANSFORMER_CLASSES:
        raise ValueError(f"class={class_name!r} is not allowed: use one of {tuple(TRANSFORMER_CLASSES)}")
    cls = TRANSFORMER_CLASSES[class_name]
    folder = require_subfolder(local_dir, subfolder, f"{class_name} config/weights")
    if not (folder / "config.json").is_file():
        raise MissingWeightsError(f"{class_name} config not found: expected {folder / 'config.json'}; {FETCH_HINT}")
    model = cls.from_config(cls.load_config(str(folder)))
    state = (_folder_state_dict(folder) if checkpoint is None
             else load_original_wan_checkpoint(checkpoint, checkpoint_key))
    model.load_state_dict(state, strict=True)
    return cast_like_diffusers(model, dtype)


class T5PromptEncoder:
    """Wan's text conditioning: UMT5 states, zeroed past the prompt, padded to ``max_sequence_length``."""

    def __init__(self, tokenizer: Any, text_encoder: torch.nn.Module, max_sequence_length: int = 512):
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval()
        self.max_sequence_length = max_sequence_length

    @torch.no_grad()
    def __call__(self, prompts: list[str]) -> torch.Tensor:
        tok = self.tokenizer(prompts, padding="max_length", max_length=self.max_sequence_length, truncation=True,
                             add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        device = next(self.text_encoder.parameters()).device
        mask = tok.attention_mask.to(device)  # (B, L)
        states = self.text_encoder(tok.input_ids.to(device), mask).last_hidden_state  # (B, L, text_dim)
        return states * mask[..., None].to(states.dtype)


class WanVaeDecoder:
    """(1, C, F, H, W) normalized Wan latents -> (F', 3, H', W') video in [0, 1] through AutoencoderKLWan."""

    def __init__(self, vae: torch.nn.Module):
        self.vae = vae.eval()

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        param = next(self.vae.parameters())
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
        z = (latents.float().cpu() * std + mean).to(param.device, param.dtype)  # (1, C, F, H, W)
        video = self.vae.decode(z, return_dict=False)[0]  # (1, 3, F', H', W') in [-1, 1]
        return ((video[0].float().permute(1, 0, 2, 3) + 1) / 2).clamp(0, 1)
