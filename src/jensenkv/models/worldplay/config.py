"""HY-WorldPlay transformer shape and numeric settings, as dataclasses (no torch-heavy imports).

``WorldPlayTransformerConfig`` mirrors the official ``HunyuanVideo_1_5_DiffusionTransformer`` config of
HunyuanVideo-1.5's ``transformer/480p_i2v`` (the model WorldPlay extends; official argument names in the
comments). ``WorldPlayPrecision`` holds the numeric choices that change results (research/worldplay.md
section 8): each is an explicit switch, nothing is a hidden constant of the forward.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class WorldPlayTransformerConfig:
    """The transformer's shape (defaults: the 8B HunyuanVideo-1.5 480p I2V model WorldPlay runs)."""

    num_layers: int = 54                      # mm_double_blocks_depth (no single-stream blocks)
    hidden_size: int = 2048
    num_heads: int = 16                       # heads_num; head_dim = hidden_size / num_heads = 128
    mlp_width_ratio: float = 4.0
    latent_channels: int = 32                 # in_channels; img_in takes 2 * 32 + 1 = 65 (latent, cond, mask)
    out_channels: int = 32
    patch_size: tuple[int, int, int] = (1, 1, 1)
    rope_dim_list: tuple[int, int, int] = (16, 56, 56)   # RoPE channels per axis (t, h, w); sums to head_dim
    rope_theta: float = 256.0
    qkv_bias: bool = True
    text_states_dim: int = 3584               # Qwen2.5-VL-7B hidden size (txt_in: SingleTokenRefiner)
    refiner_depth: int = 2                    # txt_in.individual_token_refiner.blocks
    byt5_states_dim: int = 1472               # ByT5 (Glyph) hidden size (byt5_in: ByT5Mapper)
    byt5_hidden_dim: int = 2048               # ByT5Mapper hidden_dim and out_dim
    vision_states_dim: int = 1152             # SigLIP image tokens (vision_in: VisionProjection)
    frequency_embedding_size: int = 256       # sinusoid width of time_in / action_in / txt_in.t_embedder
    eps: float = 1e-6                         # LayerNorm / RMSNorm epsilon of the blocks

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def in_channels(self) -> int:
        """Channels of ``img_in``'s input: latent + condition latent + mask."""
        return 2 * self.latent_channels + 1

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_width_ratio)

    def validate(self) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"worldplay.{key}={getattr(self, key)!r} is not allowed: {why}")

        for key in ("num_layers", "hidden_size", "num_heads", "latent_channels", "out_channels", "text_states_dim",
                    "refiner_depth", "byt5_states_dim", "byt5_hidden_dim", "vision_states_dim",
                    "frequency_embedding_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "it must be an integer >= 1")
        if self.hidden_size % self.num_heads:
            raise bad("hidden_size", f"it must be divisible by num_heads={self.num_heads}")
        if self.head_dim % 4:
            raise bad("num_heads", f"head_dim={self.head_dim} must be a multiple of 4 (ProPE acts on 4-channel blocks)")
        if len(self.rope_dim_list) != 3 or sum(self.rope_dim_list) != self.head_dim or any(
                d % 2 or d < 2 for d in self.rope_dim_list):
            raise bad("rope_dim_list", f"it must be 3 even sizes summing to head_dim={self.head_dim}")
        if len(self.patch_size) != 3 or any(int(p) < 1 for p in self.patch_size):
            raise bad("patch_size", "it must be 3 integers >= 1 (t, h, w)")
        if self.patch_size[0] != 1:
            raise bad("patch_size", "a temporal patch other than 1 is not supported (one token frame per latent frame)")
        if not self.rope_theta > 0:
            raise bad("rope_theta", "it must be > 0")

    @classmethod
    def tiny(cls, **overrides: Any) -> WorldPlayTransformerConfig:
        """A seeded-random CPU preset: 2 blocks, 2 heads x 32, every module of the 8B model present."""
        cfg = cls(num_layers=2, hidden_size=64, num_heads=2, mlp_width_ratio=2.0, latent_channels=4,
                  out_channels=4, rope_dim_list=(8, 12, 12), text_states_dim=24, refiner_depth=1,
                  byt5_states_dim=16, byt5_hidden_dim=32, vision_states_dim=20, frequency_embedding_size=32)
        cfg = replace(cfg, **overrides) if overrides else cfg
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> WorldPlayTransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"worldplay transformer config keys {unknown} are not allowed; allowed: {sorted(known)}")
        values = dict(values)
        for key in ("patch_size", "rope_dim_list"):
            if key in values:
                values[key] = tuple(int(x) for x in values[key])
        cfg = cls(**values)
        cfg.validate()
        return cfg


@dataclass(frozen=True)
class WorldPlayPrecision:
    """Numeric choices of WorldPlay's CUDA run that change results (research/worldplay.md section 8).

    dtype: the weights' dtype; linears, attention and the residual stream run in it.
    autocast: emulate ``torch.autocast("cuda", bfloat16)`` on any device: LayerNorms (no affine) and the
        adaLN ``x * (1 + scale) + shift`` in float32, each linear's input cast back to ``dtype``. False: every
        op in ``dtype`` (as diffusers' block). No effect when dtype is float32.
    fp32_timesteps: the timestep stays float32 until the sinusoid, which is cast to the MLP dtype
        (WorldPlay). False: t is rounded to ``dtype`` first (the diffusers pipeline: 937.5 -> 936 in BF16).
    inputs_dtype: camera matrices (viewmats, Ks) and action labels are cast to this before the model
        (WorldPlay: bfloat16); the ProPE matrices P, P^-1 are then built in it. Action labels (0..80) are
        exact in BF16, so only the camera changes numbers. None: they keep the caller's dtype.
    """

    dtype: str = "float32"
    autocast: bool = False
    fp32_timesteps: bool = True
    inputs_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"worldplay precision dtype={self.dtype!r} is not allowed: use one of {DTYPES}")
        if self.inputs_dtype is not None and self.inputs_dtype not in DTYPES:
            raise ValueError(f"worldplay precision inputs_dtype={self.inputs_dtype!r} is not allowed: use one of "
                             f"{DTYPES} or null")
        for key in ("autocast", "fp32_timesteps"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"worldplay precision {key}={getattr(self, key)!r} is not allowed: true or false")

    @classmethod
    def official(cls) -> WorldPlayPrecision:
        """WorldPlay's CUDA run: BF16 weights under autocast, fp32 timesteps, BF16 camera/action inputs."""
        return cls(dtype="bfloat16", autocast=True, fp32_timesteps=True, inputs_dtype="bfloat16")


MEMORY_MODES = ("rebuild", "append")  # the caches' memory modes (the loop's setting picks one)
