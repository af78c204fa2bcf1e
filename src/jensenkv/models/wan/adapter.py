"""The Wan-family chunk-wise adapter: the generator's ``ChunkwiseModel`` contract over a Wan-family transformer:
diffusers' SkyReels-V2 and Wan2.1 / Self-Forcing classes, or ``dit.SkyReelsV2DiT`` (the built-in model's, plain torch)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.attention.config import layer_strengths
from jensenkv.generation.config import GenerationConfig, check_kv_range
from jensenkv.generation.loop import ChunkwiseAdapterBase
from jensenkv.models.loaders import TRANSFORMER_CLASS_NAMES, transformer_classes
from jensenkv.models.wan.dit import SkyReelsV2DiT
from jensenkv.models.wan.fps import FPS_EMBEDDING_IDS
from jensenkv.models.wan.processor import CachedSelfAttnProcessor
from jensenkv.models.wan.rope import install_rope_offset, remove_rope_offset
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan.state import BRANCHES, ChunkState, InFlightChunk


def pixel_decode(latents: torch.Tensor) -> torch.Tensor:
    """Pixel-space models: (1, C, F, H, W) in [-1, 1] -> (F, C, H, W) in [0, 1]."""
    return ((latents[0].permute(1, 0, 2, 3).float() + 1) / 2).clamp(0, 1)


def run_per_video(module: torch.nn.Module) -> None:
    """Make ``module`` run its input (B, ...) one batch row (video) at a time, through an instance ``forward``
    (the weights and state dict are untouched; deleting the attribute restores the class's forward)."""
    stock = type(module).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([stock(module, x[b:b + 1]) for b in range(x.shape[0])])

    module.forward = forward


class WanChunkwiseAdapter(ChunkwiseAdapterBase):
    """A Wan-family transformer driven chunk by chunk over per-layer quantized KV caches.

    Args:
        transformer: a ``SkyReelsV2Transformer3DModel`` or ``WanTransformer3DModel`` (diffusers), or a
            ``SkyReelsV2DiT``.
        encode_prompt: list of prompts -> (B, L, text_dim) embeddings.
        latent_frame_shape: (C, H, W) of one latent frame.
        generation: the sampling defaults of this model (steps, shift, guidance, chunking, ...).
        cache: the KV-cache settings (quantizers, sink / window); attention: see ``AttentionConfig``.
        decode: (1, C, F, H, W) latents -> (F, 3, H', W') video in [0, 1] (default: pixel space).
        clean_range: committed chunks are clamped to this range (pixel-space models; None for latents).
        fps: the frame rate a SkyReels-V2 ``inject_sample_info`` model is conditioned on (24 or 16; other
            models ignore it).
    """

    def __init__(self, transformer: torch.nn.Module, encode_prompt: Callable[[list[str]], torch.Tensor],
                 latent_frame_shape: tuple[int, int, int], generation: GenerationConfig, cache: CacheConfig,
                 attention: AttentionConfig | None = None,
                 decode: Callable[[torch.Tensor], torch.Tensor] = pixel_decode,
                 clean_range: tuple[float, float] | None = None, fps: int = 24):
        if isinstance(transformer, SkyReelsV2DiT):
            self.is_skyreels = True
        else:  # a diffusers model: diffusers is loaded already
            classes = transformer_classes()
            if not isinstance(transformer, tuple(classes.values())):
                raise ValueError(f"transformer={type(transformer).__name__} is not allowed: use one of "
                                 f"{(*TRANSFORMER_CLASS_NAMES, SkyReelsV2DiT.__name__)}")
            self.is_skyreels = isinstance(transformer, classes["SkyReelsV2Transformer3DModel"])
        patch = tuple(transformer.config.patch_size)
        if patch[0] != 1:
            # Chunks, per-frame timesteps, the block-causal mask and the RoPE offset all count latent frames
            # as token frames; a temporal patch would merge frames across those boundaries.
            raise ValueError(f"patch_size={patch} is not allowed: the temporal patch size must be 1 "
                             f"(got {patch[0]}); use patch_size (1, p_h, p_w)")
        generation.validate()
        self.transformer = transformer.eval()
        if not self.is_skyreels:  # its batched Conv3d patch embedding rounds a video unlike the video alone
            run_per_video(transformer.patch_embedding)
        self._stock_frames_per_block = getattr(transformer.config, "num_frame_per_block", None)
        if self.is_skyreels and transformer.config.num_frame_per_block != 1:
            # The processors own causality; a model-built mask would only cost an (S, S) tensor per forward.
            transformer.register_to_config(num_frame_per_block=1)
        self.encode_prompt = encode_prompt
        self.latent_frame_shape = tuple(int(x) for x in latent_frame_shape)
        self.generation = generation
        self.decode_fn = decode
        self.clean_range = clean_range
        if getattr(transformer.config, "inject_sample_info", False) and fps not in FPS_EMBEDDING_IDS:
            raise ValueError(f"fps={fps!r} is not allowed: this SkyReels-V2 model embeds only "
                             f"{' or '.join(map(str, FPS_EMBEDDING_IDS))} fps")
        self.fps = fps
        cfg = transformer.config
        self.head_dim = int(cfg.attention_head_dim)
        _, p_h, p_w = cfg.patch_size
        _, h, w = self.latent_frame_shape
        if h % p_h or w % p_w:
            raise ValueError(f"latent frame size {h}x{w} is not allowed: it must be divisible by the patch {p_h}x{p_w}")
        self.state = ChunkState()
        attention = attention if attention is not None else AttentionConfig()
        self.processors: list[CachedSelfAttnProcessor] = []
        procs = {}
        strengths = self._strengths(attention)
        for name, proc in transformer.attn_processors.items():
            if ".attn1." in name:
                layer = int(name.split(".")[1])  # "blocks.{i}.attn1.processor"
                procs[name] = CachedSelfAttnProcessor(layer, self.state, cache, self.head_dim, attention,
                                                      strengths[layer])
                self.processors.append(procs[name])
            else:
                procs[name] = proc
        transformer.set_attn_processor(procs)
        install_rope_offset(transformer.rope, self.state)  # replaces an earlier adapter's on this model
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
    def time_quantize(self) -> bool:
        """Whether commits time their quantization (``quantize_seconds``); off by default."""
        return self.state.time_quantize

    @time_quantize.setter
    def time_quantize(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"time_quantize={value!r} is not allowed: it must be true or false")
        self.state.time_quantize = value

    @property
    def quantize_seconds(self) -> float | None:
        """Seconds spent quantizing on commit since ``reset``; None unless ``time_quantize`` is on."""
        return self.state.quantize_seconds if self.state.time_quantize else None

    def configure(self, cache: CacheConfig | None = None, attention: AttentionConfig | None = None) -> None:
        """Change the cache and/or attention settings (clears the caches); the model stays loaded."""
        if self.processors:
            attention = attention if attention is not None else self.processors[0].attention
            strengths = self._strengths(attention)
        for proc in self.processors:
            proc.configure(cache if cache is not None else proc.cache_config, attention, strengths[proc.layer_index])
        self.reset()

    def _strengths(self, attention: AttentionConfig) -> list[float | torch.Tensor]:
        """Each layer's strength (layer_strengths): the global float, or its (H,) calibrated strengths."""
        cfg = self.transformer.config
        return layer_strengths(attention, int(cfg.num_layers), int(cfg.num_attention_heads), self.device)

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

    def reserve_caches(self, config: GenerationConfig, branches: Sequence[str]) -> None:
        """Size every layer's cache of ``branches`` for the video ``config`` generates (the generator's hook)."""
        _, p_h, p_w = self.transformer.config.patch_size
        _, h, w = self.latent_frame_shape
        tokens = config.frames_per_chunk * (h // p_h) * (w // p_w)  # a chunk's tokens: temporal patch 1
        for branch in branches:
            for cache in self.caches(branch):
                cache.reserve_chunks(config.num_chunks, tokens)

    def probes(self) -> list[dict] | None:
        return list(self.state.probe_records) if any(p.attention.probes for p in self.processors) else None

    batches_branches = True  # denoise_branches / commit_branches: the CFG branches in one forward
    batches_videos = True

    def set_prompts(self, prompts: Sequence[str], negative_prompt: str | None = None) -> None:
        """Encode one prompt per video of the batch (and the negative one, shared, for "uncond").

        Each prompt is encoded on its own, so a video's embedding never depends on its batch."""
        self.check_prompts(prompts)
        cond = torch.cat([self.encode_prompt([p]) for p in prompts]).to(self.device, self.dtype)  # (B, L, text_dim)
        self._prompt_embeds = {"cond": cond}
        if negative_prompt is not None:
            negative = self.encode_prompt([negative_prompt]).to(self.device, self.dtype)  # (1, L, text_dim)
            self._prompt_embeds["uncond"] = negative.expand(len(prompts), *negative.shape[1:])

    @property
    def batch_size(self) -> int:
        """Videos per forward and branch (the prompts of the last ``set_prompts``)."""
        return next(iter(self._prompt_embeds.values())).shape[0] if self._prompt_embeds else 1

    # --- forwards --------------------------------------------------------------------------------------
    def _forward(self, latents: torch.Tensor, t_frames: torch.Tensor, branches: Sequence[str]) -> torch.Tensor:
        """latents (B, C, F, H, W), the same for every branch; t_frames (B, F) flow times in [0, 1] ->
        velocity (len(branches) * B, C, F, H, W) float32, branch-major (one forward for every branch)."""
        for branch in branches:
            if branch not in self._prompt_embeds:
                raise ValueError(f"branch={branch!r} has no prompt: call set_prompt first "
                                 f"(with a negative prompt for 'uncond'); have {tuple(self._prompt_embeds)}")
        if self.batch_size not in (1, latents.shape[0]):
            raise ValueError(f"latents with batch {latents.shape[0]} are not allowed: set_prompts gave "
                             f"{self.batch_size} prompts, one per video")
        n = len(branches)
        if n > 1:
            latents, t_frames = latents.repeat(n, 1, 1, 1, 1), t_frames.repeat(n, 1)
        b, _, f, h, w = latents.shape
        _, p_h, p_w = self.transformer.config.patch_size
        self.state.tokens_per_frame = (h // p_h) * (w // p_w)
        timestep = (t_frames * 1000.0).to(self.device)  # (B, F) model timesteps
        kwargs: dict[str, Any] = {}
        if self.is_skyreels:
            kwargs["enable_diffusion_forcing"] = True  # per-frame timesteps (B, F)
            if self.transformer.config.inject_sample_info:
                # ONE id for the whole forward: diffusers adds fps_projection(fps_embedding(fps)) repeated per frame,
                # (len(fps) * F, 6, D), to the per-frame time projection (B, F, 6, D), which broadcasts only for
                # len(fps) == 1 (its pipeline's one video). Every row shares the adapter's fps, and a 1-row
                # projection rounds the same whatever the batch, so a video batched stays the video alone.
                kwargs["fps"] = [FPS_EMBEDDING_IDS[self.fps]]
        else:
            # per token, even when every token shares one t: a (B,) timestep makes the time embedding a B-row
            # matmul, which BLAS computes for B = 1 with another kernel than for a batch's rows, so a video alone
            # would round differently from the same video in a batch
            timestep = timestep.repeat_interleave(self.state.tokens_per_frame, dim=1)  # (B, S)
        text = torch.cat([self._prompt_embeds[branch].expand(latents.shape[0] // n, -1, -1)
                          for branch in branches])  # (n * B, L, text_dim); one prompt serves a whole batch
        out = self.transformer(hidden_states=latents.to(self.device, self.dtype), timestep=timestep,
                               encoder_hidden_states=text, return_dict=False, **kwargs)[0]
        return out.float()

    def _set_state(self, mode: str, branches: Sequence[str], window: tuple[InFlightChunk, ...],
                   start_frame: int) -> None:
        for chunk in window:
            check_kv_range(chunk.kv_range)
        for branch in branches:
            if branch not in BRANCHES:
                raise ValueError(f"branch={branch!r} is not allowed: use one of {BRANCHES}")
        s = self.state
        s.mode, s.branches, s.window, s.start_frame = mode, tuple(branches), window, start_frame

    @torch.no_grad()
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int,
                       branch: str = "cond", *, steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor:
        """Velocity of ``len(t)`` consecutive noisy chunks in one forward (a MAGI-1 staircase tick).

        chunks: (B, C, n*F, H, W), oldest first, chunk j at flow time t[j] (denoising step steps[j]) and
        attending to at most kv_ranges[j] preceding chunks (earlier in-flight ones first, then cached;
        None: all). Chunks are equally long, so chunk j starts at latent frame (first_chunk_index + j) * F
        (RoPE offset). Returns (B, C, n*F, H, W) float32. With n = 1 this is ``denoise``.
        """
        return self.denoise_branches(chunks, t, first_chunk_index, (branch,), steps=steps,
                                     kv_ranges=kv_ranges)[branch]

    @torch.no_grad()
    def denoise_branches(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int,
                         branches: Sequence[str], *, steps: Sequence[int | None] | None = None,
                         kv_ranges: Sequence[int | None] | None = None) -> dict[str, torch.Tensor]:
        """``denoise_window`` for every branch in one forward: branch -> velocity (B, C, n*F, H, W)."""
        frames_per_chunk, steps, kv_ranges = self.window_args(chunks, t, steps, kv_ranges)
        window = tuple(InFlightChunk(first_chunk_index + j, steps[j], kv_ranges[j]) for j in range(len(t)))
        self._set_state("cached", branches, window, first_chunk_index * frames_per_chunk)
        t_frames = torch.tensor([float(x) for x in t]).repeat_interleave(frames_per_chunk)  # (n*F,)
        out = self._forward(chunks, t_frames.expand(chunks.shape[0], -1), branches)  # t_frames: (B, n*F)
        return dict(zip(branches, out.chunk(len(branches))))

    @torch.no_grad()
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None:
        """Run the clean chunk (B, C, F, H, W) at t = 0 and append its K/V to every layer's cache."""
        self.commit_branches(clean_chunk, chunk_index, (branch,), kv_range=kv_range)

    @torch.no_grad()
    def commit_branches(self, clean_chunk: torch.Tensor, chunk_index: int, branches: Sequence[str], *,
                        kv_range: int | None = None) -> None:
        """``commit`` for every branch in one forward, each into its own caches."""
        for branch in branches:
            expected = self._committed.get(branch, 0)
            if chunk_index != expected:
                raise ValueError(f"chunk_index={chunk_index} is not allowed: chunks are committed in order and "
                                 f"the {branch!r} cache expects chunk {expected} next")
        self._set_state("commit", branches, (InFlightChunk(chunk_index, None, kv_range),),
                        chunk_index * clean_chunk.shape[2])
        t_frames = torch.zeros(clean_chunk.shape[0], clean_chunk.shape[2])  # (B, F)
        self._forward(clean_chunk, t_frames, branches)
        for branch in branches:
            self._committed[branch] = chunk_index + 1

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
        self._set_state("full", (branch,), (InFlightChunk(0),), 0)
        self.state.frames_per_chunk = fpc
        return self._forward(latents, t_frames, (branch,))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, F, H, W) -> (F, 3, H', W') video in [0, 1] (one video: the generator decodes each alone)."""
        return self.decode_fn(latents)

    def remove(self) -> None:
        """Restore the stock self-attention processors and patch embedding, and remove the RoPE hook."""
        self.transformer.patch_embedding.__dict__.pop("forward", None)  # its class's forward again
        procs = {f"{name}.processor": (type(m)._default_processor_cls() if name.endswith(".attn1") else m.processor)
                 for name, m in self.transformer.named_modules() if hasattr(m, "get_processor")}
        self.transformer.set_attn_processor(procs)
        remove_rope_offset(self.transformer.rope)
        if self.is_skyreels:
            self.transformer.register_to_config(num_frame_per_block=self._stock_frames_per_block)
        self.processors = []

