"""Helpers for the MAGI-1 tests: a tiny adapter and a recorder of the generator's calls."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from jensenkv.cache import CacheConfig
from jensenkv.models.config import RunGenerationConfig
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.models.adapters import build_adapter
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant import QuantConfig

MODEL = dict(kind="magi", name="magi1_tiny", preset="tiny", device="cpu", latent_height=4, latent_width=4)
GENERATION = dict(num_chunks=4, frames_per_chunk=2, steps=4, shift=3.0, window_size=2, kv_range=[2, 1],
                  commit_kv_range=0)
MAGI = {"null_caption_tokens": 8}
PROMPT = "a red ball rolls to the left"


def full_precision() -> CacheConfig:
    return CacheConfig(key=QuantConfig(method="none"), value=QuantConfig(method="none"))


def int2(group_size: int = 32) -> CacheConfig:
    return CacheConfig(key=QuantConfig(method="rtn", bits=2, group_size=group_size), value=QuantConfig(method="none"))


def tiny_adapter(cache: CacheConfig | None = None, attention: AttentionConfig | None = None, **overrides):
    """The tiny MAGI-1 through the registry; ``overrides`` are ModelConfig or RunGenerationConfig fields, and
    ``magi`` updates the schedule node (generation.magi)."""
    magi = MagiScheduleConfig(**{**MAGI, **overrides.pop("magi", {})})
    names = {f.name for f in fields(RunGenerationConfig)}
    generation = RunGenerationConfig(**{**GENERATION, **{k: v for k, v in overrides.items() if k in names}}, magi=magi)
    model = {**MODEL, **{k: v for k, v in overrides.items() if k not in names}}
    return build_adapter(model, cache=cache or full_precision(), attention=attention, generation=generation)


@dataclass
class Tick:
    chunks: torch.Tensor          # (1, C, n*F, H, W) generator input
    sigmas: list[float]
    first: int
    kv_ranges: list[int | None]
    refreshed: int | None         # index of the clean chunk re-run in this tick's forward
    velocity: torch.Tensor        # generator-convention output


@dataclass
class Recorder:
    ticks: list[Tick] = field(default_factory=list)
    clean: dict[int, torch.Tensor] = field(default_factory=dict)  # committed latents by chunk index

    def attach(self, adapter) -> None:
        denoise, commit = adapter.denoise_window, adapter.commit

        def denoise_window(chunks, t, first, branch="cond", *, steps=None, kv_ranges=None):
            pending = adapter._pending
            refreshed = pending.index if pending is not None and pending.index == first - 1 else None
            v = denoise(chunks, t, first, branch, steps=steps, kv_ranges=kv_ranges)
            self.ticks.append(Tick(chunks.clone(), [float(s) for s in t], first, list(kv_ranges), refreshed, v.clone()))
            return v

        def commit_chunk(clean, index, branch="cond", *, kv_range=None):
            self.clean[index] = clean.clone()
            return commit(clean, index, branch, kv_range=kv_range)

        adapter.denoise_window = denoise_window
        adapter.commit = commit_chunk


def full_sequence_velocity(adapter, recorder: Recorder, tick: Tick) -> torch.Tensor:
    """The tick's generator velocity recomputed from cache-free full-sequence forwards (MAGI's k_range form).

    Sequence = [clean chunks 0..first-1 at clean_t with the null caption, in-flight chunks]; each clean chunk
    attends to itself and its commit_kv_range predecessors, each in-flight chunk to its kv range. The cond
    pass reads clean chunks as the prefix pass cached them (adaLN row "dropped"), except the one re-run in
    this very forward, which the cond pass computes itself.
    """
    s, g = adapter.sampling, adapter.generation
    fpc = g.frames_per_chunk
    first, n = tick.first, len(tick.sigmas)
    times = [1.0 - x for x in tick.sigmas]
    clean = [recorder.clean[i] for i in range(first)]  # all committed before this tick
    latents = torch.cat([*clean, tick.chunks], dim=2)
    commit = g.commit_kv_range or 0
    ranges = [(max(0, c - commit), c + 1) for c in range(first)]
    ranges += [(max(0, first + j - (r if r is not None else first + j)), first + j + 1)
               for j, r in enumerate(tick.kv_ranges)]
    t_all = [s.clean_t] * first + times
    null = adapter.null_caption()
    texts = [null] * first + [adapter.caption(first + j) for j in range(n)]
    cols = slice(first * fpc, None)
    if s.cfg_number == 1:
        v = adapter.forward_full(latents, t_all, texts, [False] * (first + n), ranges)[:, :, cols]
        if adapter.model.config.distill and s.distill_nearly_clean_chunk_threshold is not None \
                and times[0] > s.distill_nearly_clean_chunk_threshold:
            alone = adapter.forward_full(tick.chunks[:, :, :fpc], [times[0]], [texts[first]], [False], [(0, 1)],
                                         start_frame=(first + n) * fpc)
            v = v.clone()
            v[:, :, :fpc] = s.distill_prev_chunks_scale * v[:, :, :fpc] + (1 - s.distill_prev_chunks_scale) * alone
        return -v
    cond_dropped = [c != tick.refreshed for c in range(first)] + [False] * n
    v_cond = adapter.forward_full(latents, t_all, texts, cond_dropped, ranges)[:, :, cols]
    v_prefix = adapter.forward_full(latents, t_all, [null] * (first + n), [True] * (first + n), ranges)[:, :, cols]
    parts = []
    for j in range(n):
        c = slice(j * fpc, (j + 1) * fpc)
        v_uncond = adapter.forward_full(tick.chunks[:, :, c], [times[j]], [null], [True], [(0, 1)])
        p, txt = s.guidance_scales(times[j])
        parts.append((1 - p) * v_uncond + (p - txt) * v_prefix[:, :, c] + txt * v_cond[:, :, c])
    return -torch.cat(parts, dim=2)

