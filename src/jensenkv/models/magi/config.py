"""MAGI-1 architecture presets and sampling settings, as dataclasses.

``MagiModelConfig`` mirrors the ``model_config`` block of the official ``example/*/*_config.json``;
``magi_times`` / ``magi_noise_levels`` are its time schedules; the ``runtime_config`` / ``engine_config`` values
that steer sampling (guidance, clean-chunk refresh, distillation) are
``schedule.MagiScheduleConfig``. Nothing here is read by the DiT's forward as a hidden constant: the adapter
passes every schedule value in explicitly.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from jensenkv.models.magi.schedule import T_SCHEDULES

FFN_KINDS = ("gelu", "swiglu")


@dataclass(frozen=True)
class MagiModelConfig:
    """The DiT's shape (official key names in the comments)."""

    num_layers: int = 34
    hidden_size: int = 3072
    ffn_hidden_size: int = 12288
    num_heads: int = 24                 # num_attention_heads
    num_kv_heads: int = 8               # num_query_groups (GQA)
    head_dim: int = 128                 # kv_channels
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    t_patch_size: int = 1
    caption_channels: int = 4096
    caption_max_length: int = 800
    cond_hidden_ratio: float = 0.25
    xattn_cond_hidden_ratio: float = 1.0
    cond_gating_ratio: float = 1.0
    gated_linear_unit: bool = False     # True: SwiGLU (24B); False: exact-erf GELU (4.5B)
    layernorm_epsilon: float = 1e-6
    x_rescale_factor: float = 1.0
    half_channel_vae: bool = False      # 24B: 16 VAE channels duplicated to 32 model channels
    distill: bool = False               # shortcut (step-size) timestep embedding of the distilled models
    proj_interleave_blocks: int = 8     # linear_proj input interleaved [s0, c0, ..., s7, c7] (TP8 layout)
    frequency_embedding_size: int = 256
    rope_temperature: float = 10000.0

    def validate(self, prefix: str = "magi.") -> None:
        """ValueError naming ``prefix + field`` (the config key the value came from), the value and why."""
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{prefix}{key}={getattr(self, key)!r} is not allowed: {why}")

        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "head_dim",
                    "in_channels", "out_channels", "patch_size", "t_patch_size", "caption_channels",
                    "caption_max_length", "proj_interleave_blocks", "frequency_embedding_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "it must be an integer >= 1")
        if self.num_heads % self.num_kv_heads:
            raise bad("num_kv_heads", f"it must divide num_heads={self.num_heads} (GQA groups)")
        if self.head_dim % 8:
            raise bad("head_dim", "it must be a multiple of 8 (3-D RoPE: head_dim/8 bands per axis)")
        if (2 * self.num_heads * self.head_dim) % (2 * self.proj_interleave_blocks):
            raise bad("proj_interleave_blocks", f"it must divide num_heads*head_dim={self.num_heads * self.head_dim}")
        if self.caption_max_length < 2:
            raise bad("caption_max_length", "it must be >= 2 (the null caption's last two rows drive adaLN)")
        if self.half_channel_vae and (self.in_channels % 2 or self.out_channels % 2):
            raise bad("in_channels", "half_channel_vae needs an even channel count")

    @property
    def groups(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def rope_bands(self) -> int:
        """Learnable RoPE bands per axis (t, h, w)."""
        return self.head_dim // 8

    @property
    def rotary_dim(self) -> int:
        """Head channels RoPE rotates: the first 3/4 (96 of 128), as rotate-half pairs (i, i + rotary_dim/2)."""
        return 2 * 3 * self.rope_bands

    @property
    def cond_dim(self) -> int:
        return int(self.hidden_size * self.cond_hidden_ratio)

    @property
    def latent_channels(self) -> int:
        """Channels of the VAE latent (the model duplicates them when half_channel_vae)."""
        return self.in_channels // 2 if self.half_channel_vae else self.in_channels

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MagiModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"magi model config keys {unknown} are not allowed; allowed: {sorted(known)}")
        cfg = cls(**dict(values))
        cfg.validate()
        return cfg


_4_5B = MagiModelConfig()
_24B = MagiModelConfig(num_layers=48, hidden_size=6144, ffn_hidden_size=16384, num_heads=48, num_kv_heads=8,
                       in_channels=32, out_channels=32, gated_linear_unit=True, x_rescale_factor=0.1,
                       half_channel_vae=True)
# A seeded random-initialised MAGI-1 for tests and CPU runs: GQA (4 query heads on 2 KV heads), head dim 32
# with 24 rotated channels, gated and plain MLPs both reachable, no weights needed.
_TINY = MagiModelConfig(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_heads=4, num_kv_heads=2,
                        head_dim=32, in_channels=4, out_channels=4, caption_channels=32, caption_max_length=16,
                        proj_interleave_blocks=8)
PRESETS: dict[str, MagiModelConfig] = {
    "4.5B": _4_5B,
    "4.5B_distill": replace(_4_5B, distill=True),
    "24B": _24B,
    "24B_distill": replace(_24B, distill=True),
    "tiny": _TINY,
}


SPATIAL_DOWNSAMPLE = 8  # the ViT VAE: 8x spatial
# The official checkpoint folder (ckpt/magi/<variant>) of each real preset.
PRESET_VARIANTS = {"4.5B": "4.5B_base", "4.5B_distill": "4.5B_distill", "24B": "24B_base", "24B_distill": "24B_distill"}


def model_preset(name: str, prefix: str = "magi.", **overrides: Any) -> MagiModelConfig:
    """Preset ``name`` with ``overrides`` applied, validated (errors name ``prefix + field``)."""
    if name not in PRESETS:
        raise ValueError(f"magi preset={name!r} is not allowed: use one of {tuple(PRESETS)}")
    cfg = replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
    cfg.validate(prefix)
    return cfg




def magi_times(steps: int, shift: float, schedule: str = "sd3") -> torch.Tensor:
    """(steps + 1,) MAGI times from 0 (noise) to 1 (clean): linspace, squared, then the inverse SD3 shift.

    As ``init_t`` in the official pipeline: t <- t^2; t <- (t / shift) / (1 + (1/shift - 1) t).
    """
    if steps < 1:
        raise ValueError(f"steps={steps} is not allowed: it must be >= 1")
    if schedule not in T_SCHEDULES:
        raise ValueError(f"t_schedule={schedule!r} is not allowed: use one of {T_SCHEDULES}")
    t = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float32)
    if schedule in ("sd3", "square"):
        t = t ** 2
    if schedule == "sd3":
        if not shift >= 1.0:
            raise ValueError(f"shift={shift} is not allowed for the sd3 schedule: it must be >= 1")
        inv = 1.0 / shift
        t = inv * t / (1 + (inv - 1) * t)
    return t


def magi_noise_levels(steps: int, shift: float, schedule: str = "sd3") -> torch.Tensor:
    """The generator's noise levels (1 = noise ... 0 = clean): 1 - MAGI time."""
    return 1.0 - magi_times(steps, shift, schedule)
