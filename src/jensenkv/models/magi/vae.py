"""MAGI-1's ViT VAE decoder (``ViTDecoder`` of ``inference/model/vae/vae_module.py``) in pure torch.

Latent (B, C, T, H, W) -> tokens -> ``proj_in`` -> [cls] + pos_embed (trilinearly resized when the latent
grid differs from the trained one) -> ViT blocks -> norm -> (final_proj, final_norm) -> unpatchify
(patch_length x patch_size x patch_size) -> Conv3d 3x3x3 -> RGB in about [-1, 1]. Parameter names match the
official ``decoder.*`` keys. The official attention is flash-attn in bf16; here SDPA.

Decoding follows the official ``post_chunk_process``: each clean chunk separately, latents divided by
``scale_factor`` (0.18215), in overlapping tiles (``TileProcessor.tiled_decode``: 256 x 256 px spatial tiles
with overlap 0.25 and linear blending, fps // 2 = 12-frame temporal tiles without overlap).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ViTDecoderConfig:
    """The official ``ddconfig`` keys the decoder reads."""

    video_size: int = 256
    video_length: int = 16
    patch_size: int = 8
    patch_length: int = 4
    z_chans: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = False
    with_cls_token: bool = True
    ln_in_attn: bool = False
    use_final_proj: bool = False

    @classmethod
    def from_ddconfig(cls, ddconfig: dict[str, Any]) -> ViTDecoderConfig:
        """Keep the decoder's keys; refuse the RoPE variant (the official code path prints and casts to bf16)."""
        if ddconfig.get("use_rope"):
            raise ValueError("ddconfig use_rope=True is not allowed: the RoPE ViT decoder is not ported")
        if ddconfig.get("conv_last_layer") is False:
            raise ValueError("ddconfig conv_last_layer=False is not allowed: the official decoder requires True")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in ddconfig.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, ln_in_attn: bool):
        super().__init__()
        self.num_heads = num_heads
        self.ln_in_attn = ln_in_attn
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)  # (B, N, 3, H, d)
        if self.ln_in_attn:  # ManualLayerNorm: (x - mean) / (std + eps), no affine, over q, k and v
            qkv = (qkv - qkv.mean(-1, keepdim=True)) / (qkv.std(-1, keepdim=True, unbiased=False) + 1e-5)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) each
        out = F.scaled_dot_product_attention(q, k, v)  # (B, H, N, d)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class _Block(nn.Module):
    def __init__(self, cfg: ViTDecoderConfig):
        super().__init__()
        dim = cfg.embed_dim
        self.norm1 = nn.Identity() if cfg.ln_in_attn else nn.LayerNorm(dim)
        self.attn = _Attention(dim, cfg.num_heads, cfg.qkv_bias, cfg.ln_in_attn)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _Mlp(dim, int(dim * cfg.mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTDecoder(nn.Module):
    def __init__(self, cfg: ViTDecoderConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.embed_dim
        self.latent_size = cfg.video_size // cfg.patch_size
        self.latent_length = cfg.video_length // cfg.patch_length
        self.proj_in = nn.Linear(cfg.z_chans, dim)
        self.cls_token_nums = 1 if cfg.with_cls_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cfg.with_cls_token else None
        num_patches = self.latent_size * self.latent_size * self.latent_length
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.cls_token_nums, dim))
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(dim)
        patch = cfg.patch_size * cfg.patch_size * cfg.patch_length
        self.unpatch_channels = dim // patch
        self.final_proj: nn.Module = nn.Identity()
        self.final_norm: nn.Module = nn.Identity()
        if cfg.use_final_proj:
            self.unpatch_channels = 4
            self.final_proj = nn.Linear(dim, self.unpatch_channels * patch, bias=True)
            self.final_norm = nn.LayerNorm(self.unpatch_channels * patch)
        self.last_layer = nn.Conv3d(self.unpatch_channels, 3, kernel_size=3, stride=1, padding=1)

    def _pos_embed(self, t: int, h: int, w: int) -> torch.Tensor:
        if (t, h, w) == (self.latent_length, self.latent_size, self.latent_size):
            return self.pos_embed
        grid = self.pos_embed[:, self.cls_token_nums:]  # (1, N, dim)
        grid = grid.reshape(1, self.latent_length, self.latent_size, self.latent_size, -1).permute(0, 4, 1, 2, 3)
        grid = F.interpolate(grid, size=(t, h, w), mode="trilinear", align_corners=False)
        grid = grid.permute(0, 2, 3, 4, 1).reshape(1, t * h * w, -1)
        return torch.cat([self.pos_embed[:, : self.cls_token_nums], grid], dim=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, C, T, H, W) -> (B, 3, T*pT, H*p, W*p)."""
        cfg = self.cfg
        b, c, t, h, w = z.shape
        x = self.proj_in(z.permute(0, 2, 3, 4, 1).reshape(b, -1, c))  # (B, N, dim)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        x = x + self._pos_embed(t, h, w)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)[:, self.cls_token_nums:]
        x = self.final_norm(self.final_proj(x))
        p, pt, ch = cfg.patch_size, cfg.patch_length, self.unpatch_channels
        x = x.reshape(b, t, h, w, pt, p, p, ch).permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, C, T, pT, H, p, W, p)
        x = x.reshape(b, ch, t * pt, h * p, w * p)
        return self.last_layer(x)


@dataclass(frozen=True)
class Tiling:
    """The official tiled decode's settings, in pixels / video frames."""

    sample_height: int = 256
    sample_width: int = 256
    sample_length: int = 12       # runtime fps // 2
    spatial_overlap: float = 0.25
    temporal_overlap: float = 0.0


def _blend(a: torch.Tensor, b: torch.Tensor, extent: int, dim: int) -> torch.Tensor:
    """Linear cross-fade of b's first ``extent`` slices along ``dim`` with a's last ones (in place on b)."""
    extent = min(a.shape[dim], b.shape[dim], extent)
    for i in range(extent):
        b.select(dim, i).copy_(a.select(dim, a.shape[dim] - extent + i) * (1 - i / extent) + b.select(dim, i) * (i / extent))
    return b


def tiled_decode(decode, z: torch.Tensor, tiling: Tiling, spatial_factor: int, temporal_factor: int) -> torch.Tensor:
    """``TileProcessor.tiled_decode``: decode overlapping latent tiles, blend each with its raw decoded
    predecessor (time, then height, then width) and crop; z (B, C, T, H, W) -> (B, 3, T', H', W')."""
    lt = tiling.sample_length // temporal_factor
    lh, lw = tiling.sample_height // spatial_factor, tiling.sample_width // spatial_factor
    step_t, step_h = int(lt * (1 - tiling.temporal_overlap)), int(lh * (1 - tiling.spatial_overlap))
    step_w = int(lw * (1 - tiling.spatial_overlap))
    real_t, real_h, real_w = lt * temporal_factor, lh * spatial_factor, lw * spatial_factor
    ext_t, ext_h = int(real_t * tiling.temporal_overlap), int(real_h * tiling.spatial_overlap)
    ext_w = int(real_w * tiling.spatial_overlap)
    counts = [(z.shape[2 + d] + s - 1) // s for d, s in enumerate((step_t, step_h, step_w))]
    raw = {}
    for f in range(counts[0]):
        for i in range(counts[1]):
            for j in range(counts[2]):
                tile = z[:, :, f * step_t:f * step_t + lt, i * step_h:i * step_h + lh, j * step_w:j * step_w + lw]
                raw[f, i, j] = decode(tile)
    rows_t = []
    for f in range(counts[0]):
        rows_h = []
        for i in range(counts[1]):
            row = []
            for j in range(counts[2]):
                tile = raw[f, i, j].clone()
                if f > 0:
                    tile = _blend(raw[f - 1, i, j], tile, ext_t, 2)
                if i > 0:
                    tile = _blend(raw[f, i - 1, j], tile, ext_h, 3)
                if j > 0:
                    tile = _blend(raw[f, i, j - 1], tile, ext_w, 4)
                row.append(tile[:, :, : real_t - ext_t, : real_h - ext_h, : real_w - ext_w])
            rows_h.append(torch.cat(row, dim=4))
        rows_t.append(torch.cat(rows_h, dim=3))
    return torch.cat(rows_t, dim=2)


class MagiVaeDecoder:
    """(1, C, F, H, W) latents -> (F*pT, 3, H*p, W*p) video in [0, 1], as the official pipeline decodes:
    chunk by chunk (``chunk_frames`` latent frames), latents / ``latent_scale``, tiled, then (x + 1) / 2.

    tiling=None decodes each chunk whole (the tiny model).
    """

    def __init__(self, decoder: ViTDecoder, latent_scale: float = 0.18215, tiling: Tiling | None = Tiling(),
                 chunk_frames: int | None = None):
        self.decoder = decoder.eval()
        self.latent_scale = latent_scale
        self.tiling = tiling
        self.chunk_frames = chunk_frames

    def _decode_tile(self, z: torch.Tensor) -> torch.Tensor:
        out = self.decoder(z)
        return out[:, :, :1] if z.shape[2] == 1 else out  # the official decode keeps one frame of a 1-frame tile

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        param = next(self.decoder.parameters())
        z = (latents.float() / self.latent_scale).to(param.device, param.dtype)  # (1, C, F, H, W)
        step = self.chunk_frames or z.shape[2]
        cfg = self.decoder.cfg
        parts = []
        for start in range(0, z.shape[2], step):
            chunk = z[:, :, start:start + step]
            if self.tiling is None:
                parts.append(self._decode_tile(chunk))
            else:
                parts.append(tiled_decode(self._decode_tile, chunk, self.tiling, cfg.patch_size, cfg.patch_length))
        video = torch.cat(parts, dim=2)[0].float()  # (3, F', H', W')
        return ((video.permute(1, 0, 2, 3) + 1) / 2).clamp(0, 1).cpu()
