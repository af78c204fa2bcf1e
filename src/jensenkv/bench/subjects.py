"""The models the end-to-end and generation benchmarks run: the built-in one, a long-context random one and a
random-weight SkyReels-V2-DF-1.3B at its real size.

The long-context configuration is a random-weight SkyReels-V2 transformer whose chunks hold 4096 tokens
(4 latent frames of 32 x 32 patches) over 8 chunks, so the cache, not the weights, dominates memory.
SKYREELS_V2_1_3B is the transformer config of Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers (as diffusers'
scripts/convert_skyreelsv2_to_diffusers.py writes it): built with random weights, it has the real model's
shapes and cost without its download (`make gpu-check`, the memory headline).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from jensenkv.cache import CacheConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan import WanChunkwiseAdapter

PROMPT = "a red circle moving right on a dark background"
# 4 layers of 2 heads x 64; a chunk is 4 latent frames of 64 x 64 with 2 x 2 patches: 4096 tokens.
LONG_CONTEXT = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 64, "in_channels": 4,
                "out_channels": 4, "text_dim": 32, "freq_dim": 256, "ffn_dim": 128, "num_layers": 4,
                "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 64}
LONG_FRAME = (4, 64, 64)  # (C, H, W) of one latent frame
LONG_GENERATION = GenerationConfig(num_chunks=8, frames_per_chunk=4, steps=1, guidance_scale=1.0)
# SkyReels-V2-DF-1.3B-540P: 30 layers of 12 heads x 128; 544x960 video -> (16, 68, 120) latent frames (VAE
# stride 8) -> 34 x 60 = 2,040 tokens per latent frame with 2x2 patches.
SKYREELS_V2_1_3B = {"patch_size": (1, 2, 2), "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16,
                    "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30,
                    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
                    "inject_sample_info": True}
SKYREELS_V2_FRAME = (16, 68, 120)  # (C, H, W) of one latent frame at 544x960
SKYREELS_V2_TEXT_TOKENS = 512  # max_sequence_length of configs/model/skyreels_v2_df_1_3b.yaml
# Its interpreter-sized stand-in (the dry run of `make gpu-check`): 2 heads x 64, 1 layer, 16 tokens per frame.
TOY_SKYREELS = {**SKYREELS_V2_1_3B, "num_attention_heads": 2, "attention_head_dim": 64, "text_dim": 32,
                "ffn_dim": 64, "num_layers": 1}
TOY_SKYREELS_FRAME = (16, 8, 8)


def frame_tokens(config: dict, frame: tuple[int, int, int]) -> int:
    """Tokens of one latent frame: (H / p_h) x (W / p_w)."""
    patch = config["patch_size"]
    return (frame[1] // patch[1]) * (frame[2] // patch[2])


def tiny_adapter(cache: CacheConfig, correction: str,
                 quick: bool = False) -> tuple[WanChunkwiseAdapter, GenerationConfig]:
    """The built-in model (the model=tiny preset) on the CPU; quick: 2 chunks of 2 steps."""
    from jensenkv.models.adapters import build_adapter
    from jensenkv.run import preset

    spec = preset("model=tiny", "model.device=cpu")  # the model and sampler of Table 1's runs
    adapter = build_adapter(spec.model, cache=cache, attention=AttentionConfig(correction=correction),
                            generation=spec.generation)
    generation = spec.generation
    if quick:
        generation = replace(generation, num_chunks=2, steps=2, kv_range=None)
    return adapter, generation


def long_context_adapter(cache: CacheConfig, correction: str, quick: bool = False,
                         seed: int = 0) -> tuple[WanChunkwiseAdapter, GenerationConfig]:
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

    adapter = WanChunkwiseAdapter(model, encode, frame, generation, cache, AttentionConfig(correction=correction))
    return adapter, generation


def describe(generation: GenerationConfig, frame: tuple[int, int, int], patch: tuple[int, int, int]) -> str:
    tokens = generation.frames_per_chunk * (frame[1] // patch[1]) * (frame[2] // patch[2])
    return f"{generation.num_chunks} chunks x {tokens} tokens, {generation.steps} steps"


def random_skyreels_adapter(config: dict, frame: tuple[int, int, int], generation: GenerationConfig,
                            cache: CacheConfig, attention: AttentionConfig, device: str = "cpu",
                            dtype: torch.dtype = torch.float32, seed: int = 0) -> WanChunkwiseAdapter:
    """A SkyReels-V2 transformer of ``config`` with random weights (made on ``device``: a real-size one is
    initialised on the GPU in seconds), its prompt embeddings fixed random (1, 512, text_dim) tensors."""
    from diffusers import SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = SkyReelsV2Transformer3DModel(**config)
    model = model.to(dtype).eval()
    text = (SKYREELS_V2_TEXT_TOKENS, config["text_dim"])

    def encode(prompts: list[str]) -> torch.Tensor:  # (B, 512, text_dim)
        gen = torch.Generator().manual_seed(len(prompts[0]))
        return torch.randn(len(prompts), *text, generator=gen).to(device=device, dtype=dtype)

    return WanChunkwiseAdapter(model, encode, frame, generation, cache, attention)
