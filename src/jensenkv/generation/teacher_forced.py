"""Teacher-forced fidelity: the quantized cache's direct effect on one chunk, without trajectory divergence.

End-to-end PSNR against the BF16 video mixes two things: what a quantized cache does to the chunk that reads it,
and how far the history has already drifted (equivalent rotation seeds alone move it by 2-8 dB). Here every
chunk reads the BF16 run's own history:

    for chunk i (the plain one-chunk loop, generation.window_size = 1):
        the BF16 history (chunks < i, as the BF16 run made them) is committed into both caches: the quantized
        adapter quantizes it on commit, the reference adapter keeps it in full precision;
        chunk i is denoised from the same noise once with each cache (its whole schedule);
        compared: the two clean chunks (decoded frames; the caller scores them, e.g. PSNR), the relative error
        of the denoiser output at the chunk's first step, where both calls see the identical input (pure
        cache effect), and the relative error of the clean latents;
        the reference's clean chunk i is then committed into both caches as history.

The noise is drawn exactly as ``generate_videos`` draws it for one video (one generator seeded with the seed:
the chunk's noise, then its re-noising draws), so the reference side reproduces the BF16 run bit for bit and the
quantized side sees the same draws. Chunk 0 reads no cache (nothing to compare) and is not reported. Works on
any ``ChunkwiseModel``: no model kind is asked.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import ChunkwiseModel, commit_all_branches, denoise_all_branches, sampler_step


@dataclass
class ChunkFidelity:
    """One chunk read with the BF16 history: the quantized cache against the full-precision one."""

    chunk: int
    rel_err: float          # ||v_q - v_ref|| / ||v_ref|| at the chunk's first step (identical inputs)
    latent_rel_err: float   # ||x_q - x_ref|| / ||x_ref|| of the clean chunk latents
    video: torch.Tensor     # (F, C, H, W) decoded clean chunk, quantized cache
    reference: torch.Tensor  # (F, C, H, W) decoded clean chunk, full-precision cache


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    norm = float(b.double().norm())
    return float((a.double() - b.double()).norm()) / norm if norm > 0 else float("nan")


def _velocity(adapter: ChunkwiseModel, x: torch.Tensor, t: float, chunk: int, step: int, branches: Sequence[str],
              cfg: GenerationConfig) -> torch.Tensor:
    """The guided velocity (B, C, F, H, W) of one chunk at one step (CFG combined as the generator does)."""
    v = denoise_all_branches(adapter, x, [t], chunk, tuple(branches), [step], [cfg.kv_range_at(step)])
    return v["cond"] if not cfg.use_cfg else v["uncond"] + cfg.guidance_scale * (v["cond"] - v["uncond"])


def check_teacher_forced(cfg: GenerationConfig) -> None:
    """ValueError naming the key when the schedule is not the plain one-chunk loop."""
    if cfg.window_size != 1:
        raise ValueError(f"generation.window_size={cfg.window_size} is not allowed for teacher-forced fidelity: "
                         "it replays the plain one-chunk loop (window_size=1), where a chunk reads only committed "
                         "history")


@torch.no_grad()
def teacher_forced_chunks(quantized: ChunkwiseModel, reference: ChunkwiseModel, prompt: str, seed: int,
                          config: GenerationConfig | None = None) -> list[ChunkFidelity]:
    """Per chunk >= 1, the quantized cache (``quantized``: an adapter configured with the run's cache) against
    the full-precision one (``reference``: the same model with the BF16 reference cache), both reading the BF16
    run's own history. Both adapters are reset first; their probes, if on, record these calls too."""
    cfg = config if config is not None else reference.generation
    cfg.validate()
    check_teacher_forced(cfg)
    branches = ("cond", "uncond") if cfg.use_cfg else ("cond",)
    negative = cfg.negative_prompt if cfg.use_cfg else None
    for adapter in (quantized, reference):
        adapter.reset()
        adapter.set_prompt(prompt, negative)
    sigmas = reference.noise_levels(cfg).tolist()
    c, h, w = reference.latent_frame_shape
    shape = (1, c, cfg.frames_per_chunk, h, w)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))  # the BF16 run's draws, in its order
    out = []
    for chunk in range(cfg.num_chunks):
        twin = torch.Generator(device="cpu")
        twin.set_state(gen.get_state())  # the quantized side's copy of the same draws
        x_ref = torch.randn(shape, generator=gen).to(reference.device)  # (1, C, F, H, W)
        x_q = torch.randn(shape, generator=twin).to(quantized.device)
        first_err = float("nan")
        for step in range(cfg.steps):
            t, t_next = sigmas[step], sigmas[step + 1]
            v_ref = _velocity(reference, x_ref, t, chunk, step, branches, cfg)
            v_q = _velocity(quantized, x_q, t, chunk, step, branches, cfg)
            if step == 0:  # identical inputs: the cache is the only difference
                first_err = _relative(v_q, v_ref)
            x_ref = sampler_step(x_ref, v_ref, t, t_next, cfg.sampler, gen)
            x_q = sampler_step(x_q, v_q, t, t_next, cfg.sampler, twin)
        if reference.clean_range is not None:
            x_ref, x_q = x_ref.clamp(*reference.clean_range), x_q.clamp(*reference.clean_range)
        if chunk > 0:
            out.append(ChunkFidelity(chunk, first_err, _relative(x_q, x_ref), quantized.decode(x_q).float().cpu(),
                                     reference.decode(x_ref).float().cpu()))
        for adapter in (quantized, reference):  # the BF16 history, for both caches
            commit_all_branches(adapter, x_ref.to(adapter.device), chunk, branches, cfg.commit_kv_range)
    return out
