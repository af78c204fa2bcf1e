"""The chunk-wise autoregressive generation loop over a model adapter with a (quantized) KV cache.

Per chunk: draw noise, denoise it over ``steps`` Euler (or x0-renoise) steps on a shifted flow schedule
while it attends to the cache of earlier chunks, then commit its clean keys and values (one extra forward
at t = 0 per CFG branch, quantized once on commit). Flow matching, Wan convention:
x_t = (1 - t) x0 + t eps, the model predicts v = eps - x0.

Schedule: ``window_size`` chunks are in flight at once, MAGI-1's pipelined staircase. Each model call
(a "tick") advances every in-flight chunk by one step; a chunk enters ``steps // window_size`` ticks after
the one before it, so chunk i is that many steps ahead of chunk i + 1. In the tick's single forward the
in-flight chunks attend to the committed (quantized) cache and block-causally to the earlier in-flight
chunks (full precision, never corrected). The oldest chunk leaves the window after its last step and is
committed then, before the next tick. window_size = 1 is the plain one-chunk-at-a-time loop.

The loop is model-agnostic: it drives any adapter with the ``ChunkwiseModel`` contract (every adapter
subclasses ``ChunkwiseAdapterBase``, which gives the optional parts their defaults); the schedule is the
adapter's ``generation`` config unless the caller passes another. ``generate_videos`` runs a batch of videos in
lock step where the adapter ``batches_videos`` (and, with ``batches_branches``, the CFG branches in the same
forward), each video exactly what it is alone.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.config import GenerationConfig, check_kv_range


def flow_sigmas(steps: int, shift: float) -> torch.Tensor:
    """(steps + 1,) noise levels from 1 to 0 on the shifted schedule shift*s / (1 + (shift-1)*s) (Wan/SD3)."""
    if steps < 1:
        raise ValueError(f"steps={steps} is not allowed: it must be >= 1")
    if not shift > 0:
        raise ValueError(f"shift={shift} is not allowed: it must be > 0")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * s / (1 + (shift - 1) * s)).float()


class ChunkwiseModel(Protocol):
    """Everything the loop (``generate_videos``), teacher-forced fidelity and the runner call on a model adapter.

    ``ChunkwiseAdapterBase`` gives the defaults of the optional parts; every adapter subclasses it.
    Tensors: latents (B, C, n*F, H, W) of n consecutive chunks of F latent frames each; velocities the same
    shape, float32, in the flow convention v = eps - x0.
    """

    generation: GenerationConfig              # the model's sampling defaults
    latent_frame_shape: tuple[int, int, int]  # (C, H, W) of one latent frame
    clean_range: tuple[float, float] | None   # clamp committed chunks to this range (pixel-space models)
    batches_branches: bool  # denoise_branches / commit_branches run every CFG branch in one forward
    batches_videos: bool    # set_prompts takes several prompts: B > 1 videos in lock step
    latent_dtype: torch.dtype | None  # latents stored between steps in this dtype (None: float32 throughout)

    @property
    def device(self) -> torch.device: ...
    @property
    def quantize_seconds(self) -> float | None: ...  # since reset; None unless the adapter times its commits

    def configure(self, cache: CacheConfig | None = None, attention: Any = None) -> None: ...
    def reset(self) -> None: ...
    def caches(self, branch: str = "cond") -> list[ChunkedKVCache]: ...
    def reserve_caches(self, config: GenerationConfig, branches: Sequence[str]) -> None: ...
    def probes(self) -> list[dict] | None: ...
    def set_prompt(self, prompt: str, negative_prompt: str | None = None) -> None: ...
    def set_prompts(self, prompts: Sequence[str], negative_prompt: str | None = None) -> None: ...
    def noise_levels(self, config: GenerationConfig) -> torch.Tensor: ...
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int, branch: str = "cond",
                       *, steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor: ...
    def denoise_branches(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int,
                         branches: Sequence[str], *, steps: Sequence[int | None] | None = None,
                         kv_ranges: Sequence[int | None] | None = None) -> dict[str, torch.Tensor]: ...
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None: ...
    def commit_branches(self, clean_chunk: torch.Tensor, chunk_index: int, branches: Sequence[str], *,
                        kv_range: int | None = None) -> None: ...
    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...


class ChunkwiseAdapterBase:
    """The defaults of the ``ChunkwiseModel`` contract, and the argument checks every adapter shares.

    A subclass sets ``generation``, ``latent_frame_shape`` and ``device`` and defines ``configure``, ``reset``,
    ``caches``, ``denoise_window``, ``commit``, ``decode`` and ``set_prompts`` (a batch of videos) or
    ``set_prompt`` (one video at a time). The rest has a default here: plain flow sigmas, float32 latents, one
    forward per CFG branch, no batch of videos, no cache sizing ahead, no probes, untimed commits.
    """

    clean_range: tuple[float, float] | None = None
    batches_branches: bool = False
    batches_videos: bool = False
    latent_dtype: torch.dtype | None = None

    @property
    def quantize_seconds(self) -> float | None:
        return None

    def configure(self, cache: CacheConfig | None = None, attention: Any = None) -> None:
        """Swap the cache and/or attention settings (None: keep them); clears the caches, the model stays."""
        raise NotImplementedError(f"{type(self).__name__} does not define configure")

    def reset(self) -> None:
        """Start a new video: empty caches, no probes, zero timers."""
        raise NotImplementedError(f"{type(self).__name__} does not define reset")

    def caches(self, branch: str = "cond") -> list[ChunkedKVCache]:
        """The branch's cache of every self-attention layer, in layer order."""
        raise NotImplementedError(f"{type(self).__name__} does not define caches")

    def reserve_caches(self, config: GenerationConfig, branches: Sequence[str]) -> None:
        """Size every cache the video ``config`` generates will fill (``ChunkedKVCache.reserve_chunks``), once
        the prompt is set; the default leaves them to grow."""

    def probes(self) -> list[dict] | None:
        """One dict per (layer, step, chunk, branch[, sample]) since ``reset`` when probes are on; None: off."""
        return None

    def set_prompt(self, prompt: str, negative_prompt: str | None = None) -> None:
        """One video: ``set_prompts([prompt])``."""
        self.set_prompts([prompt], negative_prompt)

    def set_prompts(self, prompts: Sequence[str], negative_prompt: str | None = None) -> None:
        """One prompt per video of the batch (and the negative one, shared, for CFG's "uncond" branch)."""
        raise NotImplementedError(f"{type(self).__name__} defines neither set_prompt nor set_prompts")

    @staticmethod
    def check_prompts(prompts: Sequence[str]) -> None:
        if isinstance(prompts, str) or not prompts:
            raise ValueError(f"prompts={prompts!r} is not allowed: give a non-empty list, one prompt per video")

    def noise_levels(self, config: GenerationConfig) -> torch.Tensor:
        """(steps + 1,) noise levels from 1 to 0: the shifted flow schedule (``flow_sigmas``)."""
        return flow_sigmas(config.steps, config.shift)

    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int, branch: str = "cond",
                       *, steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor:
        """Velocity (B, C, n*F, H, W) of n = len(t) consecutive noisy chunks in one forward, chunk j at noise level
        t[j] (denoising step steps[j], seeing at most kv_ranges[j] preceding chunks), over the branch's cache."""
        raise NotImplementedError(f"{type(self).__name__} does not define denoise_window")

    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None:
        """The clean chunk (B, C, F, H, W) becomes history: its K/V enter the branch's caches (quantized once)."""
        raise NotImplementedError(f"{type(self).__name__} does not define commit")

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, F, H, W) latents of one video -> (F', 3, H', W') video in [0, 1]."""
        raise NotImplementedError(f"{type(self).__name__} does not define decode")

    def denoise(self, chunk: torch.Tensor, t: float, chunk_index: int, branch: str = "cond", *,
                step: int | None = None, kv_range: int | None = None) -> torch.Tensor:
        """Velocity of one noisy chunk (B, C, F, H, W) at flow time t: ``denoise_window`` of one chunk."""
        return self.denoise_window(chunk, [t], chunk_index, branch, steps=[step], kv_ranges=[kv_range])

    def denoise_branches(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int,
                         branches: Sequence[str], *, steps: Sequence[int | None] | None = None,
                         kv_ranges: Sequence[int | None] | None = None) -> dict[str, torch.Tensor]:
        """branch -> ``denoise_window`` of that branch (one forward each, unless ``batches_branches``)."""
        return {b: self.denoise_window(chunks, t, first_chunk_index, b, steps=steps, kv_ranges=kv_ranges)
                for b in branches}

    def commit_branches(self, clean_chunk: torch.Tensor, chunk_index: int, branches: Sequence[str], *,
                        kv_range: int | None = None) -> None:
        """``commit`` into every branch's caches (one forward each, unless ``batches_branches``)."""
        for b in branches:
            self.commit(clean_chunk, chunk_index, b, kv_range=kv_range)

    @staticmethod
    def window_args(chunks: torch.Tensor, t: Sequence[float], steps: Sequence[int | None] | None,
                    kv_ranges: Sequence[int | None] | None) -> tuple[int, list[int | None], list[int | None]]:
        """(frames per chunk, steps, kv_ranges) of ``denoise_window``'s n = len(t) chunks (B, C, n*F, H, W),
        the optional lists filled with None; ValueError naming the argument that does not fit."""
        n, frames = len(t), chunks.shape[2]
        if n < 1 or frames % n:
            raise ValueError(f"t with {n} entries is not allowed: it needs one flow time per chunk and the "
                             f"{frames} frames must split into equal chunks")
        steps = [None] * n if steps is None else list(steps)
        kv_ranges = [None] * n if kv_ranges is None else list(kv_ranges)
        for key, values in (("steps", steps), ("kv_ranges", kv_ranges)):
            if len(values) != n:
                raise ValueError(f"{key} with {len(values)} entries is not allowed: it needs one per chunk ({n})")
        for r in kv_ranges:
            check_kv_range(r)
        return frames // n, steps, kv_ranges


@dataclass
class GenerationResult:
    video: torch.Tensor                 # (F, C, H, W) float32 in [0, 1], decoded
    latents: torch.Tensor               # (1, C, F_latent, H_latent, W_latent) float32, the clean chunks
    probes: list[dict] | None           # one dict per (layer, step, chunk, branch) when probes are on
    # total_s, quantize_s (None: untimed), decode_s, per_chunk_s, batch_size: seconds per video, the batch's
    # time shared equally; per_chunk_s: from the previous commit (or the start) to each chunk's commit
    timings: dict[str, Any] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sampler_step(x: torch.Tensor, velocity: torch.Tensor, t: float, t_next: float, sampler: str,
                 generators: torch.Generator | Sequence[torch.Generator]) -> torch.Tensor:
    """One step from flow time t to t_next; x, velocity (B, C, F, H, W).

    "euler": x + (t_next - t) v. "x0_renoise": predict x0 = x - t v, re-noise it to t_next with fresh noise,
    video b's drawn from its own CPU generator ``generators[b]`` (one generator: B = 1), unless t_next = 0.
    """
    if sampler == "euler":
        return x + (t_next - t) * velocity
    x0 = x - t * velocity
    if t_next == 0:
        return x0
    gens = [generators] if isinstance(generators, torch.Generator) else list(generators)
    noise = torch.cat([torch.randn((1, *x.shape[1:]), generator=g) for g in gens]).to(x.device)  # (B, C, F, H, W)
    return (1 - t_next) * x0 + t_next * noise


@torch.no_grad()
def generate_video(adapter: ChunkwiseModel, prompt: str, seed: int,
                   config: GenerationConfig | None = None) -> GenerationResult:
    """Generate one video chunk by chunk; the same seed and config give the same video bit for bit on CPU."""
    return generate_videos(adapter, [prompt], [seed], config)[0]


def denoise_all_branches(adapter: ChunkwiseModel, x: torch.Tensor, t: list[float], first: int,
                         branches: tuple[str, ...], steps: list[int],
                         kv_ranges: list[int | None]) -> dict[str, torch.Tensor]:
    """branch -> velocity (B, C, n*F, H, W): one forward for every branch where the adapter can, else one each."""
    if len(branches) > 1 and adapter.batches_branches:
        return adapter.denoise_branches(x, t, first, branches, steps=steps, kv_ranges=kv_ranges)
    return {b: adapter.denoise_window(x, t, first, b, steps=steps, kv_ranges=kv_ranges) for b in branches}


def commit_all_branches(adapter: ChunkwiseModel, clean: torch.Tensor, index: int, branches: tuple[str, ...],
                        kv_range: int | None) -> None:
    """Commit the clean chunk (B, C, F, H, W) into every branch's caches (one forward where the adapter can)."""
    if len(branches) > 1 and adapter.batches_branches:
        adapter.commit_branches(clean, index, branches, kv_range=kv_range)
        return
    for b in branches:
        adapter.commit(clean, index, b, kv_range=kv_range)


def _per_video_probes(records: list[dict] | None, batch: int) -> list[list[dict] | None]:
    """The adapter's probe records split by video (their ``sample`` key, dropped); None: probes off."""
    if records is None:
        return [None] * batch
    out: list[list[dict]] = [[] for _ in range(batch)]
    for record in records:
        record = dict(record)
        out[record.pop("sample", 0)].append(record)
    return out


@torch.no_grad()
def generate_videos(adapter: ChunkwiseModel, prompts: Sequence[str], seeds: Sequence[int],
                    config: GenerationConfig | None = None) -> list[GenerationResult]:
    """Generate a batch of videos, one per (prompt, seed), in lock step: one forward per tick for all of them.

    Each video is what ``generate_video`` makes of it alone: its noise comes from a CPU generator seeded
    with its own seed, one (1, C, F, H, W) draw per chunk as it enters the window, plus, for "x0_renoise",
    one per re-noising step of each in-flight chunk (oldest first), so results depend neither on the
    device's RNG nor on the batch; its cache is its own (quantized per video, ``jensenkv.cache``); its
    probes are computed on it alone. The adapter runs a batch of B > 1 only if it ``batches_videos``.
    """
    cfg = config if config is not None else adapter.generation
    cfg.validate()
    prompts, seeds = list(prompts), [int(s) for s in seeds]
    if not prompts or len(prompts) != len(seeds):
        raise ValueError(f"prompts ({len(prompts)}) and seeds ({len(seeds)}) must be equally many and at least one")
    batch = len(prompts)
    branches = ("cond", "uncond") if cfg.use_cfg else ("cond",)
    negative = cfg.negative_prompt if cfg.use_cfg else None
    adapter.reset()
    if batch == 1:
        adapter.set_prompt(prompts[0], negative)
    elif adapter.batches_videos:
        adapter.set_prompts(prompts, negative)
    else:
        raise ValueError(f"a batch of {batch} videos is not allowed for {type(adapter).__name__}: it generates "
                         "one video at a time (generation.batch_size=1)")
    # the adapter sizes each cache's buffers for what this video leaves in them (no doubling slack)
    adapter.reserve_caches(cfg, branches)
    # the adapter's time schedule (MAGI-1: linspace^2 then shift; default: flow_sigmas)
    sigmas = adapter.noise_levels(cfg).tolist()
    gens = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
    # an adapter that stores latents in a lower precision between steps (HY-WorldPlay: BF16) names the dtype;
    # the steps themselves stay float32
    storage = adapter.latent_dtype

    def stored(x: torch.Tensor) -> torch.Tensor:
        return x if storage is None else x.to(storage).float()

    c, h, w = adapter.latent_frame_shape
    frames = cfg.frames_per_chunk
    shape = (1, c, frames, h, w)
    device = adapter.device
    lag = cfg.steps // cfg.window_size  # ticks between two chunks entering the window
    num_ticks = (cfg.num_chunks - 1) * lag + cfg.steps

    _sync(device)
    start = time.perf_counter()
    last_commit = start
    in_flight: dict[int, torch.Tensor] = {}  # chunk index -> its latents (B, C, F, H, W), oldest first
    chunks, per_chunk = [], []
    for tick in range(num_ticks):
        if tick % lag == 0 and tick // lag < cfg.num_chunks:  # pure noise at t = 1, each video from its own seed
            in_flight[tick // lag] = stored(torch.cat([torch.randn(shape, generator=g) for g in gens]).to(device))
        window = list(in_flight)  # consecutive chunk indices, oldest first
        steps = [tick - i * lag for i in window]  # the oldest is the furthest along
        t = [sigmas[s] for s in steps]
        x = torch.cat([in_flight[i] for i in window], dim=2)  # (B, C, n*F, H, W)
        kv_ranges = [cfg.kv_range_at(s) for s in steps]
        v = denoise_all_branches(adapter, x, t, window[0], branches, steps, kv_ranges)
        vel = v["cond"] if not cfg.use_cfg else v["uncond"] + cfg.guidance_scale * (v["cond"] - v["uncond"])
        for j, i in enumerate(window):
            chunk_vel = vel[:, :, j * frames:(j + 1) * frames]  # (B, C, F, H, W)
            in_flight[i] = stored(sampler_step(in_flight[i], chunk_vel, t[j], sigmas[steps[j] + 1], cfg.sampler, gens))
        if steps[0] == cfg.steps - 1:  # the oldest chunk is clean: commit it, it leaves the window
            clean = in_flight.pop(window[0])
            if adapter.clean_range is not None:
                clean = clean.clamp(*adapter.clean_range)
            commit_all_branches(adapter, clean, window[0], branches, cfg.commit_kv_range)
            chunks.append(clean.float())
            _sync(device)
            now = time.perf_counter()
            per_chunk.append((now - last_commit) / batch)
            last_commit = now

    latents = torch.cat(chunks, dim=2)  # (B, C, F_total, H, W)
    decode_start = time.perf_counter()
    videos = [adapter.decode(latents[b:b + 1]) for b in range(batch)]  # (F, C, H, W) in [0, 1] each
    _sync(device)
    end = time.perf_counter()
    # seconds per video: the batch's time shared out equally (the videos ran in lock step)
    timings = {
        "total_s": (end - start) / batch,
        "quantize_s": None if adapter.quantize_seconds is None else adapter.quantize_seconds / batch,
        "decode_s": (end - decode_start) / batch,
        "per_chunk_s": per_chunk,
        "batch_size": batch,
    }
    probes = _per_video_probes(adapter.probes(), batch)
    return [GenerationResult(video=videos[b].float().cpu(), latents=latents[b:b + 1].cpu(), probes=probes[b],
                             timings=dict(timings)) for b in range(batch)]
