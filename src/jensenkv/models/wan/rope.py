"""The RoPE frame offset: a diffusers ``ModelHook`` on ``transformer.rope`` (the stock RoPE starts at frame 0)."""
from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks import ModelHook

from jensenkv.models.wan.state import ChunkState

ROPE_HOOK_NAME = "jensenkv_rope_frame_offset"


class RopeFrameOffsetHook(ModelHook):
    """Shift Wan/SkyReels RoPE by ``state.start_frame`` latent frames.

    The stock ``rope.forward`` reads only the input's shape and always starts at frame 0, so the hook hands
    it a shape-only (meta) tensor of ``start_frame + F`` frames and keeps the last F frames' frequencies.
    """

    def __init__(self, state: ChunkState):
        super().__init__()
        self.state = state
        self._skip_tokens = 0

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        hidden_states = args[0] if args else kwargs.pop("hidden_states")  # (B, C, F, H, W)
        offset = self.state.start_frame
        p_t, p_h, p_w = module.patch_size
        b, c, f, h, w = hidden_states.shape
        if offset % p_t:
            raise ValueError(f"start_frame={offset} is not allowed: it must be a multiple of the temporal patch {p_t}")
        total_frames = (offset + f) // p_t
        if total_frames > module.max_seq_len:
            raise ValueError(f"start_frame + frames = {offset + f} latent frames exceeds the model's "
                             f"rope_max_seq_len={module.max_seq_len}; generate fewer chunks")
        self._skip_tokens = (offset // p_t) * (h // p_h) * (w // p_w)
        if offset:
            hidden_states = torch.empty((b, c, offset + f, h, w), device="meta")
        return (hidden_states, *args[1:]), kwargs

    def post_forward(self, module: torch.nn.Module, output: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        cos, sin = output  # (1, S_total, 1, D) each
        return cos[:, self._skip_tokens:], sin[:, self._skip_tokens:]

