"""Reference chunk-wise sampler for the tiny model: no KV cache, the full block-causal forward every step.

Chunk k is denoised with chunks 0..k-1 in the same forward pass at timestep 0 (clean), exactly what a KV
cache filled by a clean t = 0 pass would hold, so this is the ground truth the cached generator
(`jensenkv.generation.loop`) must reproduce. Rectified flow (Wan convention): x_t = (1 - t) x0 + t eps, the model
predicts v = eps - x0 at timestep t * 1000, and an Euler step goes x <- x + (t_next - t) v.
"""
from __future__ import annotations

import torch
from torch import nn

from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import flow_sigmas
from jensenkv.models.tiny.text import WordTokenizer


def predict_velocity(transformer: nn.Module, x: torch.Tensor, t_frames: torch.Tensor,
                     text: torch.Tensor) -> torch.Tensor:
    """x (B, C, F, H, W) in [-1, 1] scale, t_frames (B, F) in [0, 1], text (B, L, text_dim) -> v (B, C, F, H, W)."""
    return transformer(hidden_states=x, timestep=t_frames * 1000.0, encoder_hidden_states=text,
                       enable_diffusion_forcing=True, return_dict=False)[0]


@torch.no_grad()
def sample_block_causal(transformer: nn.Module, text_encoder: nn.Module, tokenizer: WordTokenizer,
                        prompts: list[str], seed: int, sampler: GenerationConfig,
                        height: int = 16, width: int = 16) -> torch.Tensor:
    """Generate one video per prompt chunk by chunk; returns (B, F, C, H, W) float32 in [0, 1]."""
    b, fpc = len(prompts), sampler.frames_per_chunk
    channels = transformer.config.in_channels
    cond_ids = tokenizer(prompts)  # (B, L)
    ids = torch.cat([cond_ids, torch.full_like(cond_ids, tokenizer.pad_id)]) if sampler.use_cfg else cond_ids
    text = text_encoder(ids)  # (B or 2B, L, text_dim)
    n_branch = ids.shape[0] // b
    sigmas = flow_sigmas(sampler.steps, sampler.shift)  # the cached generator's schedule
    gen = torch.Generator().manual_seed(int(seed))
    done = torch.zeros(b, channels, 0, height, width)  # (B, C, F_done, H, W) clean frames in [-1, 1]
    for _ in range(sampler.num_chunks):
        x = torch.randn(b, channels, fpc, height, width, generator=gen)  # (B, C, fpc, H, W)
        for i in range(sampler.steps):
            t, t_next = float(sigmas[i]), float(sigmas[i + 1])
            full = torch.cat([done, x], dim=2).repeat(n_branch, 1, 1, 1, 1)  # (nB, C, F_done + fpc, H, W)
            t_frames = torch.zeros(full.shape[0], full.shape[2])
            t_frames[:, -fpc:] = t
            v = predict_velocity(transformer, full, t_frames, text)[:, :, -fpc:]  # (nB, C, fpc, H, W)
            if n_branch == 2:
                v_cond, v_uncond = v.chunk(2)
                v = v_uncond + sampler.guidance_scale * (v_cond - v_uncond)
            x = x + (t_next - t) * v
        done = torch.cat([done, x.clamp(-1, 1)], dim=2)
    return ((done.permute(0, 2, 1, 3, 4) + 1) / 2).clamp(0, 1)  # (B, F, C, H, W)
