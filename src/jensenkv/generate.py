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


@dataclass
class GenerationResult:
    video: torch.Tensor                 # (F, C, H, W) float32 in [0, 1], decoded
    latents: torch.Tensor               # (1, C, F_latent, H_latent, W_latent) float32, the clean chunks
    probes: list[dict] | None           # one dict per (layer, step, chunk, branch) when probes are on
    timings: dict[str, Any] = field(default_factory=dict)  # total_s, quantize_s (None: untimed), decode_s, per_chunk_s
    # per_chunk_s: seconds from the previous commit (or the start) to each chunk's commit


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sampler_step(x: torch.Tensor, velocity: torch.Tensor, t: float, t_next: float, sampler: str,
                 generator: torch.Generator) -> torch.Tensor:
    """One step from flow time t to t_next; x, velocity (1, C, F, H, W).

    "euler": x + (t_next - t) v. "x0_renoise": predict x0 = x - t v, re-noise it to t_next with fresh noise
    drawn from ``generator`` (CPU) unless t_next = 0.
    """
    if sampler == "euler":
        return x + (t_next - t) * velocity
    x0 = x - t * velocity
    if t_next == 0:
        return x0
    return (1 - t_next) * x0 + t_next * torch.randn(x.shape, generator=generator).to(x.device)


@torch.no_grad()
def generate_video(adapter: ChunkwiseModel, prompt: str, seed: int,
                   config: GenerationConfig | None = None) -> GenerationResult:
    """Generate one video chunk by chunk; the same seed and config give the same video bit for bit on CPU.

    Noise comes from a CPU generator seeded with ``seed``: one (1, C, F, H, W) draw per chunk as it enters
    the window, plus, for "x0_renoise", one per re-noising step of each in-flight chunk (oldest first), so
    results do not depend on the device's RNG.
    """
    cfg = config if config is not None else adapter.generation
    cfg.validate()
    branches = ("cond", "uncond") if cfg.use_cfg else ("cond",)
    adapter.reset()
    adapter.set_prompt(prompt, cfg.negative_prompt if cfg.use_cfg else None)
    # an adapter with its own time schedule (MAGI-1: linspace^2 then shift) provides the noise levels
    noise_levels = getattr(adapter, "noise_levels", None)
    sigmas = (noise_levels(cfg) if noise_levels is not None else flow_sigmas(cfg.steps, cfg.shift)).tolist()
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    c, h, w = adapter.latent_frame_shape
    frames = cfg.frames_per_chunk
    shape = (1, c, frames, h, w)
    device = adapter.device
    lag = cfg.steps // cfg.window_size  # ticks between two chunks entering the window
    num_ticks = (cfg.num_chunks - 1) * lag + cfg.steps

    _sync(device)
    start = time.perf_counter()
    last_commit = start
    in_flight: dict[int, torch.Tensor] = {}  # chunk index -> its latent (1, C, F, H, W), oldest first
    chunks, per_chunk = [], []
    for tick in range(num_ticks):
        if tick % lag == 0 and tick // lag < cfg.num_chunks:
            in_flight[tick // lag] = torch.randn(shape, generator=gen).to(device)  # pure noise at t = 1
        window = list(in_flight)  # consecutive chunk indices, oldest first
        steps = [tick - i * lag for i in window]  # the oldest is the furthest along
        t = [sigmas[s] for s in steps]
        x = torch.cat([in_flight[i] for i in window], dim=2)  # (1, C, n*F, H, W)
        kv_ranges = [cfg.kv_range_at(s) for s in steps]
        v = {b: adapter.denoise_window(x, t, window[0], b, steps=steps, kv_ranges=kv_ranges) for b in branches}
        vel = v["cond"] if not cfg.use_cfg else v["uncond"] + cfg.guidance_scale * (v["cond"] - v["uncond"])
        for j, i in enumerate(window):
            chunk_vel = vel[:, :, j * frames:(j + 1) * frames]  # (1, C, F, H, W)
            in_flight[i] = sampler_step(in_flight[i], chunk_vel, t[j], sigmas[steps[j] + 1], cfg.sampler, gen)
        if steps[0] == cfg.steps - 1:  # the oldest chunk is clean: commit it, it leaves the window
            clean = in_flight.pop(window[0])
            if adapter.clean_range is not None:
                clean = clean.clamp(*adapter.clean_range)
            for b in branches:
                adapter.commit(clean, window[0], b, kv_range=cfg.commit_kv_range)
            chunks.append(clean.float())
            _sync(device)
            now = time.perf_counter()
            per_chunk.append(now - last_commit)
            last_commit = now

    latents = torch.cat(chunks, dim=2)  # (1, C, F_total, H, W)
    decode_start = time.perf_counter()
    video = adapter.decode(latents)  # (F, C, H, W) in [0, 1]
    _sync(device)
    end = time.perf_counter()
    timings = {
        "total_s": end - start,
        "quantize_s": adapter.quantize_seconds,
        "decode_s": end - decode_start,
        "per_chunk_s": per_chunk,
    }
    return GenerationResult(video=video.float().cpu(), latents=latents.cpu(), probes=adapter.probes(),
                            timings=timings)
