"""The HY-WorldPlay transformer in pure torch: HunyuanVideo-1.5 480p I2V + ``action_in`` + ProPE.

Module and parameter names follow the official ``HunyuanVideo_1_5_DiffusionTransformer`` after WorldPlay's
``add_action_parameters()`` (``hyvideo/models/transformers/worldplay_1_5_transformer.py``), so an official
state dict loads by name (``jensenkv.models.worldplay.checkpoint`` has the key table). Only the AR path is
ported: the text stream once per prompt (``text_stream``) and the vision passes (``vision_forward``), whose
self-attention is delegated to a callable so the caches (``jensenkv.models.worldplay.cache``) and the
tests' masked oracle (``jensenkv.models.worldplay.oracle``) share every other line.

The text stream (``forward_txt``, T l.1245-1298): the prompt's tokens, in WorldPlay's order
[SigLIP image tokens (``vision_in``) | ByT5 glyph tokens (``byt5_in``) | Qwen tokens (``txt_in``, the
refiner at t = 0)], each plus its ``cond_type_embedding`` row (2, 1, 0), padding dropped; then every block
runs text-only self-attention with ``txt_mod`` at t = 0; each block's text k (after RMSNorm, no RoPE) and v
are kept. Vision tokens attend to them and never the reverse.

Checked against WorldPlay's own modules (Tencent-Hunyuan/HY-WorldPlay@da2d0c2, run outside the repo on CPU
with the same random weights, tiny shape with the official ByT5 / refiner / sinusoid widths, 4 chunks with
rebuilt and retrieval-like memories): float32: text K/V identical, velocities and cached RoPE / ProPE K/V
within 3.4e-7 relative; ``WorldPlayPrecision.official()`` against WorldPlay under ``torch.autocast`` (bf16,
CPU) with LayerNorm forced to float32 (CUDA autocast's policy for the ops it runs): bit-identical text K/V,
cached K/V and velocities. Not checked: CUDA itself (no GPU), the real 8B weights.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from jensenkv.models.worldplay.blocks import DoubleStreamBlock, VisionQKV, sdpa
from jensenkv.models.worldplay.config import WorldPlayPrecision, WorldPlayTransformerConfig
from jensenkv.models.worldplay.layers import (ByT5Mapper, FinalLayer, PatchEmbed, SingleTokenRefiner, TimestepEmbedder,
                                              VisionProjection)
from jensenkv.models.worldplay.prope import CameraTransforms
from jensenkv.models.worldplay.rope import rope_table

# attend(layer, qkv) -> (o, o_prope), each (B, H, S, D): one block's self-attention for the vision rows
AttendFn = Callable[[int, VisionQKV], tuple[torch.Tensor, torch.Tensor]]
TextKV = tuple[torch.Tensor, torch.Tensor]  # one block's text (k, v) of one video, each (1, H, L, D)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TextInputs:
    """One prompt per video, already encoded (the encoders are the loop's)."""

    text_states: torch.Tensor                   # (B, L, text_states_dim) Qwen2.5-VL hidden states
    text_mask: torch.Tensor                     # (B, L) 1 = token, 0 = padding
    byt5_states: torch.Tensor | None = None     # (B, L2, byt5_states_dim) ByT5 glyph states (None: no glyph tokens)
    byt5_mask: torch.Tensor | None = None       # (B, L2)
    vision_states: torch.Tensor | None = None   # (B, 729, vision_states_dim) SigLIP tokens of the first frame;
                                                # None or all zero (t2v): no image tokens, as WorldPlay masks them

    @property
    def batch(self) -> int:
        return self.text_states.shape[0]


@dataclass
class CameraInputs:
    """Per latent frame: the camera and the discrete action."""

    viewmats: torch.Tensor  # (B, F, 4, 4) world-to-camera
    ks: torch.Tensor        # (B, F, 3, 3) intrinsics normalised as WorldPlay's (fx / (2 cx), fy / (2 cy), pp 0.5)
    action: torch.Tensor    # (B, F) action labels, translation * 9 + rotation (0..80)

    def frames(self, index: Sequence[int] | slice) -> CameraInputs:
        """The given latent frames (in that order)."""
        index = index if isinstance(index, slice) else list(index)
        return CameraInputs(self.viewmats[:, index], self.ks[:, index], self.action[:, index])

    @property
    def num_frames(self) -> int:
        return self.viewmats.shape[1]


class WorldPlayTransformer(nn.Module):
    """The 54-block (tiny: 2) double-stream transformer; ``precision`` sets the numerics (see config)."""

    def __init__(self, config: WorldPlayTransformerConfig, precision: WorldPlayPrecision | None = None):
        super().__init__()
        config.validate()
        self.config = config
        self.precision = precision or WorldPlayPrecision()
        c = config.hidden_size
        self.img_in = PatchEmbed(config.patch_size, config.in_channels, c)
        self.txt_in = SingleTokenRefiner(config.text_states_dim, c, config.num_heads, config.refiner_depth,
                                         config.frequency_embedding_size)
        self.byt5_in = ByT5Mapper(config.byt5_states_dim, config.byt5_hidden_dim, c)
        self.vision_in = VisionProjection(config.vision_states_dim, c)
        self.cond_type_embedding = nn.Embedding(3, c)  # 0: Qwen text, 1: ByT5, 2: SigLIP
        self.time_in = TimestepEmbedder(c, config.frequency_embedding_size)
        self.action_in = TimestepEmbedder(c, config.frequency_embedding_size)
        self.double_blocks = nn.ModuleList([DoubleStreamBlock(config) for _ in range(config.num_layers)])
        patch = config.patch_size[0] * config.patch_size[1] * config.patch_size[2]
        self.final_layer = FinalLayer(c, patch * config.out_channels, config.eps)

    # numerics -----------------------------------------------------------------------------------------
    @property
    def amp(self) -> bool:
        return self.precision.autocast

    @property
    def dtype(self) -> torch.dtype:
        return self.img_in.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.img_in.proj.weight.device

    def to_precision(self) -> WorldPlayTransformer:
        """Cast the weights to ``precision.dtype`` (returns self)."""
        return self.to(_DTYPES[self.precision.dtype])

    def cast_inputs(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.precision.inputs_dtype
        return x if dtype is None else x.to(_DTYPES[dtype])

    def frame_timesteps(self, t: torch.Tensor | float, batch: int, frames: int) -> torch.Tensor:
        """A float or (B,) / (B, F) timesteps in [0, 1000] -> (B, F) float32 on the model's device."""
        t = torch.as_tensor(t, dtype=torch.float32, device=self.device)
        if t.ndim == 0:
            t = t.expand(batch, frames)
        elif t.ndim == 1:
            t = t[:, None].expand(batch, frames)
        if tuple(t.shape) != (batch, frames):
            raise ValueError(f"timesteps with shape {tuple(t.shape)} are not allowed: expected a float, (B,) or "
                             f"(B, F) = ({batch}, {frames})")
        return t

    # text stream ---------------------------------------------------------------------------------------
    def text_tokens(self, text: TextInputs, b: int) -> torch.Tensor:
        """Video b's text-stream input (1, L_valid, C): [image | glyph | prompt] tokens, padding dropped."""
        fp32 = self.precision.fp32_timesteps
        t0 = torch.zeros(1, dtype=torch.float32, device=self.device)  # the text stream runs at t = 0
        emb = self.cond_type_embedding.weight  # (3, C)
        mask = text.text_mask[b:b + 1].bool()  # (1, L)
        if not bool(mask[0, 0]):
            raise ValueError("text_mask with padding first is not allowed: the prompt's valid tokens come first")
        parts = []
        if text.vision_states is not None and not bool((text.vision_states[b] == 0).all()):
            parts.append(self.vision_in(text.vision_states[b:b + 1], self.amp) + emb[2])
        if text.byt5_states is not None:
            byt5_mask = (torch.ones_like(text.byt5_states[b:b + 1, :, 0], dtype=torch.bool) if text.byt5_mask is None
                         else text.byt5_mask[b:b + 1].bool())
            if bool(byt5_mask.any()):
                parts.append(self.byt5_in(text.byt5_states[b:b + 1][byt5_mask][None], self.amp) + emb[1])
        parts.append(self.txt_in(text.text_states[b:b + 1], mask, t0, self.amp, fp32) + emb[0])
        # cat promotes as WorldPlay's reorder does: under autocast the image tokens leave vision_in's LayerNorm
        # in float32, so the text stream's residual runs in float32 (its K/V still come out of bf16 linears)
        return torch.cat(parts, dim=1)  # (1, L_valid, C)

    def text_stream(self, text: TextInputs) -> list[list[TextKV]]:
        """Per video, per block: the text (k, v), each (1, H, L_valid, D), from text-only attention at t = 0."""
        t0 = torch.zeros(1, dtype=torch.float32, device=self.device)
        vec_txt = self.time_in(t0, self.precision.fp32_timesteps)  # (1, C)
        videos = []
        for b in range(text.batch):
            txt = self.text_tokens(text, b)
            kv = []
            for block in self.double_blocks:
                mods = block.txt_mods(vec_txt)
                q, k, v = block.txt_qkv(txt, mods, self.amp)
                kv.append((k, v))
                txt = block.txt_out(txt, sdpa(q, k, v), mods, self.amp)
            videos.append(kv)
        return videos

    # vision passes -------------------------------------------------------------------------------------
    def frame_vectors(self, timesteps: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """timesteps (B, F) float32, action (B, F) -> vec (B, F, C) = time_in(t) + action_in(action)."""
        b, f = timesteps.shape
        vec = self.time_in(timesteps.reshape(-1), self.precision.fp32_timesteps)
        vec = vec + self.action_in(self.cast_inputs(action).reshape(-1))  # labels: exact in BF16
        return vec.view(b, f, -1)

    def vision_forward(self, x: torch.Tensor, timesteps: torch.Tensor | float, camera: CameraInputs,
                       rope_positions: Sequence[int], attend: AttendFn, final: bool = True) -> torch.Tensor | None:
        """One vision pass: x (B, 2C+1, F, H, W) latent | condition | mask; timesteps per frame (B, F) (or a
        float / (B,)); frame f at temporal RoPE position ``rope_positions[f]``; ``attend`` runs each block's
        attention. Returns the velocity (B, out, F, H, W) in the weight dtype, or None when not ``final``
        (the context pass stops after the last block, as WorldPlay's ``cache_vision``)."""
        cfg = self.config
        b, _, f, h, w = x.shape
        _pt, ph, pw = cfg.patch_size
        if h % ph or w % pw:
            raise ValueError(f"latent size {h}x{w} is not allowed: it must be divisible by the patch {ph}x{pw}")
        if len(rope_positions) != f or camera.num_frames != f:
            raise ValueError(f"{f} frames need {f} RoPE positions and camera frames; got {len(rope_positions)} and "
                             f"{camera.num_frames}")
        th, tw = h // ph, w // pw
        tokens = th * tw
        img = self.img_in(x)  # (B, F * tokens, C)
        vec = self.frame_vectors(self.frame_timesteps(timesteps, b, f), camera.action)  # (B, F, C)
        cams = CameraTransforms.build(self.cast_inputs(camera.viewmats), self.cast_inputs(camera.ks))  # (B, F, 4, 4) each
        cos, sin = (r.to(x.device) for r in rope_table(rope_positions, th, tw, cfg.rope_dim_list, cfg.rope_theta))
        for layer, block in enumerate(self.double_blocks):
            mods = block.img_mods(vec)
            qkv = block.img_qkv(img, mods, tokens, (cos, sin), cams, self.amp)
            o, o_prope = attend(layer, qkv)
            img = block.img_out(img, o, o_prope, mods, tokens, cams, self.amp)
        if not final:
            return None
        out = self.final_layer(img, vec, tokens, self.amp)  # (B, S, pt*ph*pw*out)
        return self.unpatchify(out, f, th, tw)

    def unpatchify(self, x: torch.Tensor, f: int, th: int, tw: int) -> torch.Tensor:
        """(B, F*th*tw, pt*ph*pw*C) -> (B, C, F*pt, th*ph, tw*pw), channels before patch offsets (official)."""
        pt, ph, pw = self.config.patch_size
        c = self.config.out_channels
        x = x.reshape(x.shape[0], f, th, tw, c, pt, ph, pw)
        x = torch.einsum("nthwcopq->nctohpwq", x)
        return x.reshape(x.shape[0], c, f * pt, th * ph, tw * pw)
