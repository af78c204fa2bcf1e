"""The tiny Wan-family test models' sizes and stand-in text encoder, shared by conftest's fixtures and the kits.

A plain module (not conftest) so a kit can import it at any time: under pytest, the name ``conftest`` is
whichever conftest.py was imported last (tests/slurm has its own)."""
from __future__ import annotations

import zlib

import torch

WAN_TEST_CONFIG = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4,
                   "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2,
                   "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
WAN_FRAME = (4, 16, 16)  # (C, H, W) of one latent frame of the tiny Wan-family models


def encode_prompt(prompts: list[str]) -> torch.Tensor:
    """A deterministic stand-in text encoder: (B, 12, 16), seeded by the prompt text."""
    return torch.stack([torch.randn(12, 16, generator=torch.Generator().manual_seed(zlib.crc32(p.encode())))
                        for p in prompts])
