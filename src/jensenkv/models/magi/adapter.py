"""Drive MAGI-1 chunk by chunk over the suite's KV cache: the generator's ``ChunkwiseModel`` contract.

``jensenkv.generation.loop.generate_video`` runs the staircase (``window_size`` chunks in flight, per-stage
``kv_range``) and calls ``denoise_window`` once per tick with one branch; MAGI's own passes happen here:

* time: the generator's noise level s (1 = noise) is MAGI time t = 1 - s, and the velocity is negated
  (MAGI predicts the direction towards clean). ``noise_levels`` gives the generator MAGI's schedule.
* clean-chunk refresh: ``commit`` only remembers the finished chunk; the next tick's forward prepends it at
  ``clean_t`` with the null caption and ``commit_kv_range`` (0 = itself only), and the pass that writes the
  cache commits its K/V then (in that forward the in-flight chunks see it at full precision, as in the
  official pipeline, which writes the cache from the same forward).
* guidance, ``cfg_number`` = 3: cond (text + cache), prefix (null caption + cache; the only pass that
  writes the cache) and uncond (null caption, each chunk alone at frame 0, no cache), combined per chunk
  with the piecewise scales; ``cfg_number`` = 1 (distilled): one pass that writes the cache, plus the
  nearly-clean re-run of the oldest chunk alone.
* batch: ``set_prompts`` gives B videos, run in lock step (latents (B, C, n*F, H, W)): every pass is one
  forward for the whole batch, each video reading and writing its own cache rows (quantized per video) and
  cross-attending to its own caption's valid tokens; the null caption is shared. Inside the forward the
  patch embedding, the per-video captions' cross-attention and the exact correction's attention run video
  by video, so that each video is computed bit for bit as alone on CPU (see ``MagiDiT.forward``,
  ``WindowAttention._attend``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.config import GenerationConfig, check_kv_range
from jensenkv.generation.loop import ChunkwiseAdapterBase
from jensenkv.models.magi.attention import MagiLayerCaches, WindowAttention, WindowChunk
from jensenkv.models.magi.config import magi_noise_levels
from jensenkv.models.magi.model import Caption, MagiDiT, range_attention
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.attention.config import AttentionConfig

# encode_prompt(prompt, num_chunks) -> one (L_j, caption_channels) tensor of valid caption tokens per chunk
PromptEncoder = Callable[[str, int], list[torch.Tensor]]


@dataclass
class _Pending:
    latent: torch.Tensor  # (B, C, F, H, W) the finished chunk of every video
    index: int
    kv_range: int | None


class MagiChunkwiseAdapter(ChunkwiseAdapterBase):
    """MAGI-1 DiT + prompt encoder + decoder behind the generator's ``ChunkwiseModel`` contract."""

    batches_videos = True

    def __init__(self, model: MagiDiT, encode_prompt: PromptEncoder, latent_frame_shape: tuple[int, int, int],
                 generation: GenerationConfig, sampling: MagiScheduleConfig, cache: CacheConfig,
                 attention: AttentionConfig | None = None, decode: Callable[[torch.Tensor], torch.Tensor] | None = None):
        generation.validate()
        sampling.validate()
        if generation.guidance_scale != 1.0:
            raise ValueError(f"guidance_scale={generation.guidance_scale!r} is not allowed for MAGI-1: guidance is "
                             "magi.cfg_number with magi.prev_chunk_scales / text_scales; set guidance_scale to 1")
        if sampling.null_caption_tokens > model.config.caption_max_length:
            raise ValueError(f"magi.null_caption_tokens={sampling.null_caption_tokens} is not allowed: the null caption "
                             f"has caption_max_length={model.config.caption_max_length} rows")
        if model.config.distill and generation.steps == 12:
            raise ValueError("steps=12 is not allowed for a distilled MAGI-1 here: its shortcut schedule "
                             "(shortcut_mode) is not ported; use 8, 16, 32 or 64")
        self.model = model.eval()
        self.encode_prompt = encode_prompt
        self.latent_frame_shape = tuple(int(x) for x in latent_frame_shape)
        self.generation = generation
        self.sampling = sampling
        self.decode_fn = decode
        cfg = model.config
        self.layers = MagiLayerCaches(cfg.num_layers, cfg.head_dim, cfg.groups, cache,
                                      attention if attention is not None else AttentionConfig(),
                                      heads=cfg.num_heads, device=model.x_embedder.weight.device)
        self._captions: list[list[torch.Tensor]] | None = None  # per video, per chunk: (L_j, caption_channels)
        self._pending: _Pending | None = None
        self._next_commit = 0

    # --- protocol ---------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.x_embedder.weight.device

    @property
    def quantize_seconds(self) -> float:
        return self.layers.quantize_seconds

    def noise_levels(self, config: GenerationConfig) -> torch.Tensor:
        """(steps + 1,) generator noise levels 1 -> 0: 1 - MAGI's time schedule (linspace^2, SD3 shift)."""
        return magi_noise_levels(config.steps, config.shift, self.sampling.t_schedule)

    def configure(self, cache: CacheConfig | None = None, attention: AttentionConfig | None = None) -> None:
        """Swap the cache and/or attention settings; clears the caches (the model stays loaded)."""
        self.layers.configure(cache if cache is not None else self.layers.cache_config,
                              attention if attention is not None else self.layers.attention)
        self.reset()

    def reset(self) -> None:
        self.layers.reset()
        self._pending = None
        self._next_commit = 0

    def caches(self, branch: str = "cond") -> list[ChunkedKVCache]:
        """Every layer's cache; MAGI's cond and prefix passes share one cache, so ``branch`` is not used."""
        return list(self.layers.caches)

    def reserve_caches(self, config: GenerationConfig, branches: Sequence[str]) -> None:
        """Size every layer's cache for the video ``config`` generates (the generator's hook; the passes share
        one cache, so ``branches`` is not used). A chunk's K/V are cached by the tick after its commit, so the
        last chunk, committed after the last tick, never is."""
        tokens = math.prod(self.model.token_grid(config.frames_per_chunk, *self.latent_frame_shape[1:]))
        for cache in self.layers.caches:
            cache.reserve_chunks(config.num_chunks - 1, tokens)

    def probes(self) -> list[dict] | None:
        return list(self.layers.probe_records) if self.layers.attention.probes else None

    def set_prompts(self, prompts: Sequence[str], negative_prompt: str | None = None) -> None:
        """Encode one prompt per video of the batch, for every chunk (captions may differ per chunk, e.g.
        MAGI's duration tokens, and per prompt in length).

        Each prompt is encoded on its own, so a video's captions never depend on its batch. MAGI-1's
        unconditional passes use the learned null caption, so a negative prompt is not allowed.
        """
        self.check_prompts(prompts)
        if negative_prompt:
            raise ValueError(f"negative_prompt={negative_prompt!r} is not allowed for MAGI-1: its unconditional "
                             "passes use the learned null caption")
        chunks = self.generation.num_chunks
        self._captions = [[c.to(self.device) for c in self.encode_prompt(p, chunks)] for p in prompts]

    @property
    def batch_size(self) -> int:
        """Videos per forward (the prompts of the last ``set_prompts``)."""
        return len(self._captions) if self._captions is not None else 1

    def null_caption(self) -> torch.Tensor:
        """(null_caption_tokens, caption_channels): the valid part of the learned null caption."""
        return self.model.y_embedder.null_caption_embedding[: self.sampling.null_caption_tokens]

    def caption(self, chunk_index: int, sample: int = 0) -> torch.Tensor:
        """(L, caption_channels): video ``sample``'s valid caption tokens for that chunk."""
        if self._captions is None:
            raise ValueError("no prompt: call set_prompt first")
        captions = self._captions[sample]
        return captions[min(chunk_index, len(captions) - 1)]

    def captions(self, chunk_index: int) -> list[torch.Tensor]:
        """One caption per video of the batch for that chunk (their lengths may differ)."""
        return [self.caption(chunk_index, b) for b in range(self.batch_size)]

    def distill_dt(self) -> float | None:
        """Distilled models' shortcut embedding input: magi.distill_dt, or steps / 4 * 2 (the official
        non-12-step rule)."""
        if not self.model.config.distill:
            return None
        return self.sampling.distill_dt if self.sampling.distill_dt is not None else self.generation.steps / 4 * 2

    # --- forwards ----------------------------------------------------------------------------------------
    def _run(self, x: torch.Tensor, t: Sequence[float], captions: list[Caption], dropped: Sequence[bool],
             window: tuple[WindowChunk, ...], start_frame: int, pass_name: str, commit_position: int | None = None,
             use_cache: bool = True) -> torch.Tensor:
        """One model pass over consecutive chunks of every video (MAGI convention): x (B, C, n*F, H, W) ->
        (B, C, n*F, H, W) float32; captions[j]: chunk j's, shared (a tensor) or one per video (a list)."""
        attend = WindowAttention(self.layers, window, pass_name, commit_position, use_cache)
        return self.model(x.to(self.device), torch.tensor([float(v) for v in t], device=self.device), captions,
                          torch.tensor(list(dropped), dtype=torch.bool, device=self.device), start_frame, attend,
                          self.distill_dt()).float()

    @torch.no_grad()
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int, branch: str = "cond", *,
                       steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor:
        """Generator-convention velocity (B, C, n*F, H, W) of n in-flight chunks (B, C, n*F, H, W) of every
        video at noise levels ``t``."""
        if branch != "cond":
            raise ValueError(f"branch={branch!r} is not allowed for MAGI-1: its guidance passes run inside one "
                             "call (branch 'cond'); keep guidance_scale at 1")
        if chunks.shape[0] != self.batch_size:
            raise ValueError(f"chunks with batch {chunks.shape[0]} are not allowed: set_prompts gave "
                             f"{self.batch_size} prompts, one per video")
        fpc, steps, kv_ranges = self.window_args(chunks, t, steps, kv_ranges)
        n = len(t)
        times = [1.0 - float(s) for s in t]  # MAGI time: 0 = noise, 1 = clean
        window = [WindowChunk(first_chunk_index + j, steps[j], kv_ranges[j]) for j in range(n)]
        x, all_t, offset = chunks, list(times), 0
        pending = self._pending
        if pending is not None and pending.index == first_chunk_index - 1:
            x = torch.cat([pending.latent.to(chunks.device, chunks.dtype), chunks], dim=2)
            all_t = [self.sampling.clean_t, *times]
            window = [WindowChunk(pending.index, None, pending.kv_range), *window]
            offset = 1
            self._pending = None
        window = tuple(window)
        start = window[0].index * fpc
        commit = 0 if offset else None
        null = self.null_caption()  # shared by every video
        texts = [null] * offset + [self.captions(c.index) for c in window[offset:]]  # in flight: one per video
        nulls = [null] * len(window)
        s = self.sampling
        if s.cfg_number == 1:
            v = self._run(x, all_t, texts, [False] * len(window), window, start, "cond", commit)[:, :, offset * fpc:]
            v = self._nearly_clean(v, chunks, times, window[offset:], fpc, texts[offset:])
        else:
            v_cond = self._run(x, all_t, texts, [False] * len(window), window, start, "cond")[:, :, offset * fpc:]
            v_prefix = self._run(x, all_t, nulls, [True] * len(window), window, start, "prefix", commit)[:, :, offset * fpc:]
            parts = []
            for j, chunk in enumerate(window[offset:]):
                cols = slice(j * fpc, (j + 1) * fpc)
                alone = (WindowChunk(chunk.index, chunk.step, 0),)
                v_uncond = self._run(chunks[:, :, cols], [times[j]], [null], [True], alone, 0, "uncond", use_cache=False)
                p, txt = s.guidance_scales(times[j])
                parts.append((1 - p) * v_uncond + (p - txt) * v_prefix[:, :, cols] + txt * v_cond[:, :, cols])
            v = torch.cat(parts, dim=2)
        return -v  # generator convention: v = eps - x0

    def _nearly_clean(self, v: torch.Tensor, chunks: torch.Tensor, times: list[float], window: tuple[WindowChunk, ...],
                      fpc: int, texts: list[Caption]) -> torch.Tensor:
        """Distilled models: once the oldest in-flight chunk is past the threshold, mix its output with a pass
        over it alone (not cached): scale * v + (1 - scale) * v_alone."""
        s = self.sampling
        if not self.model.config.distill or s.distill_nearly_clean_chunk_threshold is None:
            return v
        if not times[0] > s.distill_nearly_clean_chunk_threshold:
            return v
        alone = (WindowChunk(window[0].index, window[0].step, 0),)
        start = (window[-1].index + 1) * fpc  # the official pass appends the copy after the window
        v_alone = self._run(chunks[:, :, :fpc], [times[0]], [texts[0]], [False], alone, start, "alone")
        v = v.clone()
        v[:, :, :fpc] = s.distill_prev_chunks_scale * v[:, :, :fpc] + (1 - s.distill_prev_chunks_scale) * v_alone
        return v

    @torch.no_grad()
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None:
        """Remember the finished chunk (B, C, F, H, W); the next tick's forward re-runs it at clean_t and caches
        its K/V (each video in its own cache rows)."""
        if chunk_index != self._next_commit:
            raise ValueError(f"chunk_index={chunk_index} is not allowed: chunks are committed in order and chunk "
                             f"{self._next_commit} is next")
        check_kv_range(kv_range, "commit_kv_range")
        self._pending = _Pending(clean_chunk.detach().clone(), chunk_index, kv_range)
        self._next_commit += 1

    @torch.no_grad()
    def forward_full(self, latents: torch.Tensor, chunk_t: Sequence[float], captions: list[torch.Tensor],
                     dropped: Sequence[bool], key_ranges: Sequence[tuple[int, int]], start_frame: int = 0) -> torch.Tensor:
        """Reference: one MAGI-convention forward over consecutive chunks with no cache.

        latents (B, C, n*F, H, W); chunk j has MAGI time chunk_t[j], caption captions[j] (shared, or one per
        video), adaLN row dropped[j] and attends to the chunks [key_ranges[j][0], key_ranges[j][1]) of this
        sequence (MAGI's k_range).
        """
        n = len(chunk_t)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            tokens = q.shape[2] // n  # q (B, H, S, D); k, v (B, H_kv, S, D)
            return range_attention(q, k, v, tokens, [(a * tokens, b * tokens) for a, b in key_ranges])

        return self.model(latents.to(self.device), torch.tensor([float(v) for v in chunk_t], device=self.device),
                          [c.to(self.device) if isinstance(c, torch.Tensor) else [x.to(self.device) for x in c]
                           for c in captions],
                          torch.tensor(list(dropped), dtype=torch.bool, device=self.device), start_frame, attend,
                          self.distill_dt()).float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, F, H, W) -> (F', 3, H', W') video in [0, 1] (one video: the generator decodes each alone)."""
        if self.decode_fn is None:
            raise ValueError("this MAGI-1 adapter has no decoder: pass decode= (the ViT VAE or a latent preview)")
        return self.decode_fn(latents)
