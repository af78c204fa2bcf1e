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

The loop is model-agnostic: an adapter (see ``jensenkv.models.wan.ChunkwiseAdapter``) provides
``reset``, ``set_prompt``, ``denoise_window``, ``commit``, ``decode``, ``latent_frame_shape`` and
``clean_range``; the schedule is the adapter's ``generation`` config unless the caller passes another.
``generate_videos`` runs a batch of videos in lock step where the adapter has ``set_prompts`` (and, with
``batches_branches``, the CFG branches in the same forward), each video exactly what it is alone.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from jensenkv.generation import SAMPLERS, GenerationConfig, check_kv_range  # noqa: F401 - re-exported

def flow_sigmas(steps: int, shift: float) -> torch.Tensor:
    """(steps + 1,) noise levels from 1 to 0 on the shifted schedule shift*s / (1 + (shift-1)*s) (Wan/SD3)."""
    if steps < 1:
        raise ValueError(f"steps={steps} is not allowed: it must be >= 1")
    if not shift > 0:
        raise ValueError(f"shift={shift} is not allowed: it must be > 0")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * s / (1 + (shift - 1) * s)).float()


class ChunkwiseModel(Protocol):
    """What ``generate_video`` needs from a model adapter."""

    generation: GenerationConfig              # the model's sampling defaults
    latent_frame_shape: tuple[int, int, int]  # (C, H, W) of one latent frame
    clean_range: tuple[float, float] | None   # clamp committed chunks to this range (pixel-space models)
    device: torch.device
    quantize_seconds: float | None  # None unless the adapter times its commits (time_quantize)

    def reset(self) -> None: ...
    def set_prompt(self, prompt: str, negative_prompt: str | None) -> None: ...
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int, branch: str, *,
                       steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor: ...
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str, *,
               kv_range: int | None = None) -> None: ...
    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...
    def probes(self) -> list[dict] | None: ...
    # optional: ``reserve_caches(config, branches)``, called once the prompt is set, sizes every cache it will
    # fill for the video ``config`` generates (``ChunkedKVCache.reserve``)


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


def _denoise(adapter: Any, x: torch.Tensor, t: list[float], first: int, branches: tuple[str, ...],
             steps: list[int], kv_ranges: list[int | None]) -> dict[str, torch.Tensor]:
    """branch -> velocity (B, C, n*F, H, W): one forward for every branch where the adapter can, else one each."""
    if len(branches) > 1 and getattr(adapter, "batches_branches", False):
        return adapter.denoise_branches(x, t, first, branches, steps=steps, kv_ranges=kv_ranges)
    return {b: adapter.denoise_window(x, t, first, b, steps=steps, kv_ranges=kv_ranges) for b in branches}


def _commit(adapter: Any, clean: torch.Tensor, index: int, branches: tuple[str, ...], kv_range: int | None) -> None:
    if len(branches) > 1 and getattr(adapter, "batches_branches", False):
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
    probes are computed on it alone. The adapter runs a batch of B > 1 only if it has ``set_prompts``.
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
    elif hasattr(adapter, "set_prompts"):
        adapter.set_prompts(prompts, negative)
    else:
        raise ValueError(f"a batch of {batch} videos is not allowed for {type(adapter).__name__}: it generates "
                         "one video at a time (generation.batch_size=1)")
    # the adapter sizes each cache's buffers for what this video leaves in them (no doubling slack)
    reserve = getattr(adapter, "reserve_caches", None)
    if reserve is not None:
        reserve(cfg, branches)
    # an adapter with its own time schedule (MAGI-1: linspace^2 then shift) provides the noise levels
    noise_levels = getattr(adapter, "noise_levels", None)
    sigmas = (noise_levels(cfg) if noise_levels is not None else flow_sigmas(cfg.steps, cfg.shift)).tolist()
    gens = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
    # an adapter that stores latents in a lower precision between steps (HY-WorldPlay: BF16) names the dtype;
    # the steps themselves stay float32
    storage = getattr(adapter, "latent_dtype", None)

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
        v = _denoise(adapter, x, t, window[0], branches, steps, kv_ranges)
        vel = v["cond"] if not cfg.use_cfg else v["uncond"] + cfg.guidance_scale * (v["cond"] - v["uncond"])
        for j, i in enumerate(window):
            chunk_vel = vel[:, :, j * frames:(j + 1) * frames]  # (B, C, F, H, W)
            in_flight[i] = stored(sampler_step(in_flight[i], chunk_vel, t[j], sigmas[steps[j] + 1], cfg.sampler, gens))
        if steps[0] == cfg.steps - 1:  # the oldest chunk is clean: commit it, it leaves the window
            clean = in_flight.pop(window[0])
            if adapter.clean_range is not None:
                clean = clean.clamp(*adapter.clean_range)
            _commit(adapter, clean, window[0], branches, cfg.commit_kv_range)
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
