"""HunyuanVideo-1.5's small modules, with the official parameter names (``hyvideo/models/transformers/modules``).

Numerics: every linear reads its input in the weight dtype. ``amp=True`` emulates CUDA autocast over BF16
weights: LayerNorms return float32 and adaLN modulation runs in float32 (``modulate`` does ``type_as(x)``
with x float32); linears, SDPA and the residual stream stay in the weight dtype. ``amp=False``: everything
in the tensors' own dtype.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` with x cast to the weight dtype (what autocast does to a linear's input)."""
    return layer(x.to(layer.weight.dtype))


def layer_norm(x: torch.Tensor, eps: float, amp: bool, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last axis; under ``amp`` in float32 (autocast's fp32 list), else in x's dtype."""
    if amp:
        x = x.float()
        weight = None if weight is None else weight.float()
        bias = None if bias is None else bias.float()
    elif weight is not None:
        weight, bias = weight.to(x.dtype), None if bias is None else bias.to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * (1 + scale) + shift in x's dtype (float32 after an amp LayerNorm); shift, scale broadcast to x."""
    return x * (1 + scale.type_as(x)) + shift.type_as(x)


def per_token(mod: torch.Tensor, tokens_per_frame: int) -> torch.Tensor:
    """(B, F, C) per-frame modulation -> (B, F * T, C): each frame's vector repeated to its tokens."""
    return mod.repeat_interleave(tokens_per_frame, dim=1)


def timestep_sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(N,) -> (N, dim) float32 [cos, sin] of t * exp(-ln(max_period) i / half) (``timestep_embedding``)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half).to(t.device)
    args = t[:, None].float() * freqs[None]  # (N, half)
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    """Sinusoid -> Linear -> SiLU -> Linear (``time_in``, ``action_in``, ``txt_in.t_embedder``)."""

    def __init__(self, hidden: int, frequency_embedding_size: int):
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor, fp32: bool = True) -> torch.Tensor:
        """t (N,) -> (N, hidden) in the weight dtype. fp32: t stays float32 up to the sinusoid, which is then
        cast to the MLP dtype (WorldPlay); False: t is first rounded to the weight dtype (diffusers)."""
        dtype = self.mlp[0].weight.dtype
        if not fp32:
            t = t.to(dtype)
        return self.mlp(timestep_sinusoid(t, self.frequency_embedding_size).to(dtype))


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps)`` in float32, cast back to x's dtype, then times the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class ModulateDiT(nn.Module):
    """SiLU -> Linear to ``factor`` modulation vectors (``img_mod``, ``txt_mod``)."""

    def __init__(self, hidden: int, factor: int):
        super().__init__()
        self.linear = nn.Linear(hidden, factor * hidden)

    def forward(self, vec: torch.Tensor) -> torch.Tensor:
        return linear(self.linear, F.silu(vec))


class MLP(nn.Module):
    """fc1 -> activation -> fc2."""

    def __init__(self, dim: int, hidden: int, approximate: str | None, silu: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.silu = silu
        self.approximate = approximate or "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = linear(self.fc1, x)
        h = F.silu(h) if self.silu else F.gelu(h, approximate=self.approximate)
        return linear(self.fc2, h)


class TextProjection(nn.Module):
    """linear_1 -> SiLU -> linear_2 (``txt_in.c_embedder``)."""

    def __init__(self, dim_in: int, hidden: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim_in, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.linear_2, F.silu(linear(self.linear_1, x)))


class RefinerBlock(nn.Module):
    """``IndividualTokenRefinerBlock``: affine LayerNorms, fused qkv (no qk-norm), SiLU MLP, gated by c."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden, eps=1e-6)
        self.self_attn_qkv = nn.Linear(hidden, 3 * hidden)
        self.self_attn_proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-6)
        self.mlp = MLP(hidden, int(hidden * mlp_ratio), None, silu=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor, amp: bool) -> torch.Tensor:
        """x (1, L, C) valid tokens only (the official key mask, applied by dropping); c (1, C)."""
        gate_msa, gate_mlp = linear(self.adaLN_modulation[1], F.silu(c)).chunk(2, dim=-1)  # (1, C) each
        h = layer_norm(x, self.norm1.eps, amp, self.norm1.weight, self.norm1.bias)
        qkv = linear(self.self_attn_qkv, h)  # (1, L, 3C)
        b, n, _ = qkv.shape
        q, k, v = qkv.view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # each (1, H, L, D)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)  # (1, L, C)
        x = x + linear(self.self_attn_proj, attn) * gate_msa[:, None].type_as(x)
        h = layer_norm(x, self.norm2.eps, amp, self.norm2.weight, self.norm2.bias)
        return x + self.mlp(h) * gate_mlp[:, None].type_as(x)


class IndividualTokenRefiner(nn.Module):
    def __init__(self, hidden: int, heads: int, depth: int, mlp_ratio: float):
        super().__init__()
        self.blocks = nn.ModuleList([RefinerBlock(hidden, heads, mlp_ratio) for _ in range(depth)])


class SingleTokenRefiner(nn.Module):
    """``txt_in``: Qwen states -> hidden, refined by self-attention over the prompt's valid tokens."""

    def __init__(self, dim_in: int, hidden: int, heads: int, depth: int, frequency_embedding_size: int,
                 mlp_ratio: float = 4.0):
        super().__init__()
        self.input_embedder = nn.Linear(dim_in, hidden)
        self.t_embedder = TimestepEmbedder(hidden, frequency_embedding_size)
        self.c_embedder = TextProjection(dim_in, hidden)
        self.individual_token_refiner = IndividualTokenRefiner(hidden, heads, depth, mlp_ratio)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor, amp: bool,
                fp32_timesteps: bool = True) -> torch.Tensor:
        """x (1, L, dim_in) one prompt with padding; mask (1, L) bool; t (1,) -> (1, L_valid, hidden).

        The official refiner masks padded keys (and its padded rows are dropped right after): running the
        blocks on the valid tokens alone is the same computation. The pooled context is the official masked
        mean over the padded tensor."""
        c = self.t_embedder(t, fp32_timesteps)  # (1, hidden)
        m = mask.float().unsqueeze(-1)  # (1, L, 1)
        pooled = (x * m).sum(dim=1) / m.sum(dim=1)  # (1, dim_in)
        c = c + self.c_embedder(pooled)
        h = linear(self.input_embedder, x[:, mask[0]])  # (1, L_valid, hidden)
        for block in self.individual_token_refiner.blocks:
            h = block(h, c, amp)
        return h


class ByT5Mapper(nn.Module):
    """``byt5_in``: LayerNorm -> fc1 -> GELU -> fc2 -> GELU -> fc3 (no residual in HunyuanVideo-1.5)."""

    def __init__(self, dim_in: int, hidden: int, out: int):
        super().__init__()
        self.layernorm = nn.LayerNorm(dim_in)
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor, amp: bool) -> torch.Tensor:
        h = layer_norm(x, self.layernorm.eps, amp, self.layernorm.weight, self.layernorm.bias)
        h = F.gelu(linear(self.fc2, F.gelu(linear(self.fc1, h))))
        return linear(self.fc3, h)


class VisionProjection(nn.Module):
    """``vision_in``: proj = [LayerNorm, Linear, GELU, Linear, LayerNorm] over SigLIP tokens."""

    def __init__(self, dim_in: int, out: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(dim_in), nn.Linear(dim_in, dim_in), nn.GELU(), nn.Linear(dim_in, out),
                                  nn.LayerNorm(out))

    def forward(self, x: torch.Tensor, amp: bool) -> torch.Tensor:
        n0, l1, _, l3, n4 = self.proj
        h = layer_norm(x, n0.eps, amp, n0.weight, n0.bias)
        h = linear(l3, F.gelu(linear(l1, h)))
        return layer_norm(h, n4.eps, amp, n4.weight, n4.bias)


class PatchEmbed(nn.Module):
    """``img_in``: Conv3d with kernel = stride = patch over the 2C+1 input channels."""

    def __init__(self, patch: tuple[int, int, int], in_channels: int, hidden: int):
        super().__init__()
        self.proj = nn.Conv3d(in_channels, hidden, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, F, H, W) -> (B, F * H' * W', hidden), tokens in (t, h, w) order."""
        return self.proj(x.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)


class FinalLayer(nn.Module):
    """``final_layer``: LayerNorm (no affine), per-frame adaLN (shift, scale), linear to patch x out channels."""

    def __init__(self, hidden: int, out: int, eps: float):
        super().__init__()
        self.eps = eps
        self.linear = nn.Linear(hidden, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, vec: torch.Tensor, tokens_per_frame: int, amp: bool) -> torch.Tensor:
        """x (B, S, hidden); vec (B, F, hidden) per frame -> (B, S, out)."""
        shift, scale = linear(self.adaLN_modulation[1], F.silu(vec)).chunk(2, dim=-1)  # (B, F, hidden) each
        h = modulate(layer_norm(x, self.eps, amp), per_token(shift, tokens_per_frame), per_token(scale, tokens_per_frame))
        return linear(self.linear, h)
