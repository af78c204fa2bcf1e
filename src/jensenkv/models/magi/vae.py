"""MAGI-1's ViT VAE decoder (``ViTDecoder`` of ``inference/model/vae/vae_module.py``) in pure torch.

Latent (B, C, T, H, W) -> tokens -> ``proj_in`` -> [cls] + pos_embed (trilinearly resized when the latent
grid differs from the trained one) -> ViT blocks -> norm -> (final_proj, final_norm) -> unpatchify
(patch_length x patch_size x patch_size) -> Conv3d 3x3x3 -> RGB in about [-1, 1]. Parameter names match the
official ``decoder.*`` keys. The official attention is flash-attn in bf16; here SDPA. The official decode
also tiles (256 px, 16 frames, overlap 0.25) to bound memory; this decodes the whole latent at once.
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


class MagiVaeDecoder:
    """(1, C, F, H, W) latents -> (F*pT, 3, H*p, W*p) video in [0, 1] (official decode then (x + 1) / 2).

    latent_scale: latents are divided by it before decoding (the official decode path applies none: 1.0).
    """

    def __init__(self, decoder: ViTDecoder, latent_scale: float = 1.0):
        self.decoder = decoder.eval()
        self.latent_scale = latent_scale

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        param = next(self.decoder.parameters())
        z = (latents.float() / self.latent_scale).to(param.device, param.dtype)
        video = self.decoder(z)[0].float()  # (3, F', H', W')
        return ((video.permute(1, 0, 2, 3) + 1) / 2).clamp(0, 1).cpu()
