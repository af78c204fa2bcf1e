"""The RoPE frame offset: torch forward hooks on ``transformer.rope`` (the stock RoPE starts at frame 0).

Plain torch hooks, so one mechanism serves diffusers' Wan-family classes and ``dit.SkyReelsV2DiT`` alike.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from jensenkv.models.wan.state import ChunkState

# rope module -> the handles of its offset hooks: one offset per module (a later adapter replaces an earlier one's)
_INSTALLED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[RemovableHandle, ...]] = weakref.WeakKeyDictionary()


class RopeFrameOffsetHook:
    """Shift Wan/SkyReels RoPE by ``state.start_frame`` latent frames.

    The stock ``rope.forward`` reads only the input's shape and always starts at frame 0, so ``pre_forward``
    hands it a shape-only (meta) tensor of ``start_frame + F`` frames and ``post_forward`` keeps the last F
    frames' frequencies.
    """

    def __init__(self, state: ChunkState):
        self.state = state
        self._skip_tokens = 0

    def pre_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
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

    def post_forward(self, module: torch.nn.Module, args: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        cos, sin = output  # (1, S_total, 1, D) each
        return cos[:, self._skip_tokens:], sin[:, self._skip_tokens:]


def install_rope_offset(rope: torch.nn.Module, state: ChunkState) -> RopeFrameOffsetHook:
    """Offset ``rope`` by ``state.start_frame`` (replacing an offset installed earlier on it)."""
    remove_rope_offset(rope)
    hook = RopeFrameOffsetHook(state)
    _INSTALLED[rope] = (rope.register_forward_pre_hook(hook.pre_forward, with_kwargs=True),
                        rope.register_forward_hook(hook.post_forward))
    return hook


def installed_rope_offset(rope: torch.nn.Module) -> bool:
    return rope in _INSTALLED


def remove_rope_offset(rope: torch.nn.Module) -> None:
    for handle in _INSTALLED.pop(rope, ()):
        handle.remove()
