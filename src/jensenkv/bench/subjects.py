"""The models the end-to-end and generation benchmarks run: the built-in one and a long-context random one.

The long-context configuration is a random-weight SkyReels-V2 transformer whose chunks hold 4096 tokens
(4 latent frames of 32 x 32 patches) over 8 chunks, so the cache, not the weights, dominates memory.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig
from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter

PROMPT = "a red circle moving right on a dark background"
# 4 layers of 2 heads x 64; a chunk is 4 latent frames of 64 x 64 with 2 x 2 patches: 4096 tokens.
LONG_CONTEXT = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 64, "in_channels": 4,
                "out_channels": 4, "text_dim": 32, "freq_dim": 256, "ffn_dim": 128, "num_layers": 4,
                "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 64}
LONG_FRAME = (4, 64, 64)  # (C, H, W) of one latent frame
LONG_GENERATION = GenerationConfig(num_chunks=8, frames_per_chunk=4, steps=1, guidance_scale=1.0)


def tiny_adapter(cache: CacheConfig, correction: str, quick: bool = False) -> tuple[ChunkwiseAdapter, GenerationConfig]:
    """The built-in model (the model=tiny preset) on the CPU; quick: 2 chunks of 2 steps."""
    from jensenkv.models.adapters import build_adapter
    from jensenkv.run import preset

    spec = preset("model=tiny", "model.device=cpu")  # the model and sampler of Table 1's runs
    adapter = build_adapter(spec.model, cache=cache, attention=AttentionSettings(correction=correction),
                            generation=spec.generation)
    generation = spec.generation
    if quick:
        generation = replace(generation, num_chunks=2, steps=2, kv_range=None)
    return adapter, generation


def long_context_adapter(cache: CacheConfig, correction: str, quick: bool = False,
                         seed: int = 0) -> tuple[ChunkwiseAdapter, GenerationConfig]:
    """Random-weight SkyReels-V2 at 4096 tokens per chunk, 8 chunks (quick: 16 x 16 frames, 3 chunks)."""
    from diffusers import SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    model = SkyReelsV2Transformer3DModel(**LONG_CONTEXT).eval()
    frame = (4, 16, 16) if quick else LONG_FRAME
    generation = replace(LONG_GENERATION, num_chunks=3) if quick else LONG_GENERATION
    text_dim = LONG_CONTEXT["text_dim"]

    def encode(prompts: list[str]) -> torch.Tensor:  # (B, 8, text_dim): fixed pseudo-embeddings
        gen = torch.Generator().manual_seed(len(prompts[0]))
        return torch.randn(len(prompts), 8, text_dim, generator=gen)

    adapter = ChunkwiseAdapter(model, encode, frame, generation, cache, AttentionSettings(correction=correction))
    return adapter, generation


def describe(generation: GenerationConfig, frame: tuple[int, int, int], patch: tuple[int, int, int]) -> str:
    tokens = generation.frames_per_chunk * (frame[1] // patch[1]) * (frame[2] // patch[2])
    return f"{generation.num_chunks} chunks x {tokens} tokens, {generation.steps} steps"
