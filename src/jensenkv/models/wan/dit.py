"""SkyReels-V2's diffusion-forcing transformer in plain torch: the built-in model's network without diffusers.

A drop-in for diffusers' ``SkyReelsV2Transformer3DModel`` in its text-to-video form (no image or fps
conditioning): the same module names and state dict, the same config fields, the same attention-processor API
(``attn_processors`` / ``set_attn_processor``) and the same outputs, bit for bit
(``tests/models/test_wan_dit.py`` checks the forward, the chunk-wise adapter and a Table 1 run against
diffusers). Every op below is diffusers' op in diffusers' order, dtypes included, which is what keeps the bits.

Why it exists: importing diffusers costs about 5 s of CPU (its transformers package imports every model, and
its loaders import transformers and torch._dynamo), ten times a tiny run's own work. The Wan family's real
checkpoints still load diffusers' classes (``jensenkv.models.loaders``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DiTConfig:
    """The constructor's arguments, as diffusers' ``config`` (read by attribute)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 16
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 8192
    num_layers: int = 32
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: int | None = None
    inject_sample_info: bool = False
    num_frame_per_block: int = 1


# image and fps conditioning are diffusers' alone: a config that asks for them fails here, naming the key
_TEXT_TO_VIDEO_ONLY = {"image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None,
                       "inject_sample_info": False, "qk_norm": "rms_norm_across_heads"}


class DiTOutput(NamedTuple):
    sample: torch.Tensor  # (B, C_out, F, H, W)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved-pair RoPE. x (B, S, H, D); cos, sin (1, S, 1, D) with pairs repeated."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (B, S, H, D/2) each
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def qkv_projections(attn: DiTAttention | nn.Module, hidden_states: torch.Tensor,
                    encoder_hidden_states: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Query, key and value (B, S, H*D) each, as diffusers' Wan attention computes them (fused or not); keys and
    values from ``encoder_hidden_states`` in a cross-attention."""
    context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
    if attn.fused_projections:
        if attn.cross_attention_dim_head is None:
            return attn.to_qkv(hidden_states).chunk(3, dim=-1)
        return (attn.to_q(hidden_states), *attn.to_kv(context).chunk(2, dim=-1))
    return attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 and returned in the input's dtype."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(inputs.float(), self.normalized_shape, weight, bias, self.eps).to(inputs.dtype)


class DiTAttnProcessor:
    """The stock attention: SDPA over every key (the caller's mask, if any), RoPE on queries and keys."""

    def __call__(self, attn: DiTAttention, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        query, key, value = qkv_projections(attn, hidden_states, encoder_hidden_states)  # (B, S, H*D) each
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))  # (B, S, H, D)
        if rotary_emb is not None:
            query, key = apply_rotary(query, *rotary_emb), apply_rotary(key, *rotary_emb)
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # (B, H, S, D) views, as diffusers'
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                             enable_gqa=False).permute(0, 2, 1, 3)  # (B, S, H, D)
        out = out.flatten(2, 3).type_as(query)  # (B, S, H*D)
        return attn.to_out[1](attn.to_out[0](out))


class DiTAttention(nn.Module):
    """Self- or cross-attention (``cross_attention_dim_head`` set), the computation in its processor."""

    _default_processor_cls = DiTAttnProcessor
    fused_projections = False

    def __init__(self, dim: int, heads: int, dim_head: int, eps: float, cross_attention_dim_head: int | None = None):
        super().__init__()
        inner = dim_head * heads
        self.heads = heads
        self.cross_attention_dim_head = cross_attention_dim_head
        kv_inner = inner if cross_attention_dim_head is None else cross_attention_dim_head * heads
        self.to_q = nn.Linear(dim, inner, bias=True)
        self.to_k = nn.Linear(dim, kv_inner, bias=True)
        self.to_v = nn.Linear(dim, kv_inner, bias=True)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim, bias=True), nn.Dropout(0.0)])
        self.norm_q = nn.RMSNorm(inner, eps=eps, elementwise_affine=True)
        self.norm_k = nn.RMSNorm(inner, eps=eps, elementwise_affine=True)
        self.processor: Any = DiTAttnProcessor()

    def get_processor(self) -> Any:
        return self.processor

    def set_processor(self, processor: Any) -> None:
        self.processor = processor

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        return self.processor(self, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


class GeluLinear(nn.Module):
    """Linear then GELU (``proj``: diffusers' name for the weights)."""

    def __init__(self, dim_in: int, dim_out: int, approximate: str):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out, bias=True)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate=self.approximate)


class FeedForward(nn.Module):
    """``net``: [GELU-tanh projection in, dropout, projection out], diffusers' layout."""

    def __init__(self, dim: int, inner_dim: int):
        super().__init__()
        self.net = nn.ModuleList([GeluLinear(dim, inner_dim, "tanh"), nn.Dropout(0.0), nn.Linear(inner_dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            x = module(x)
        return x


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class TextProjection(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, dim, bias=True)
        self.act_1 = nn.GELU(approximate="tanh")
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act_1(self.linear_1(x)))


def sincos_timestep_embedding(channels: int, timesteps: torch.Tensor) -> torch.Tensor:
    """timesteps (...) -> (..., channels): [cos, sin] of t / 10000^(i / (channels/2)), worked in float64
    (float32 on MPS), as diffusers' ``get_1d_sincos_pos_embed_from_grid`` with flip_sin_to_cos."""
    dtype = torch.float32 if timesteps.device.type == "mps" else torch.float64
    omega = torch.arange(channels // 2, device=timesteps.device, dtype=dtype)
    omega /= channels / 2.0
    omega = 1.0 / 10000**omega  # (C/2,)
    out = torch.outer(timesteps.reshape(-1), omega)  # (M, C/2)
    emb = torch.concat([torch.sin(out), torch.cos(out)], dim=1)  # (M, C)
    emb = torch.cat([emb[:, channels // 2:], emb[:, :channels // 2]], dim=1)  # cos first
    return emb.reshape(*timesteps.shape, channels) if timesteps.dim() > 1 else emb


class ConditionEmbedder(nn.Module):
    def __init__(self, dim: int, time_freq_dim: int, text_embed_dim: int):
        super().__init__()
        self.time_freq_dim = time_freq_dim
        self.time_embedder = TimestepEmbedding(time_freq_dim, dim)
        self.act_fn = nn.SiLU()
        self.time_proj = nn.Linear(dim, dim * 6)
        self.text_embedder = TextProjection(text_embed_dim, dim)

    def forward(self, timestep: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """timestep (B,) or (B, F); text (B, L, text_dim) -> temb (..., D), its projection (..., 6 D), text (B, L, D)."""
        t_emb = sincos_timestep_embedding(self.time_freq_dim, timestep)
        embedder_dtype = self.time_embedder.linear_1.weight.dtype  # fp32-kept: diffusers casts t into it
        if t_emb.dtype != embedder_dtype and embedder_dtype != torch.int8:
            t_emb = t_emb.to(embedder_dtype)
        temb = self.time_embedder(t_emb).type_as(text)
        return temb, self.time_proj(self.act_fn(temb)), self.text_embedder(text)


class RotaryPosEmbed(nn.Module):
    """Per-token RoPE tables (1, S, 1, D) for a (B, C, F, H, W) input, frames counted from 0: split into
    temporal, height and width parts of the head dim, tables computed in float64 (float32 on MPS)."""

    def __init__(self, attention_head_dim: int, patch_size: tuple[int, int, int], max_seq_len: int,
                 theta: float = 10000.0):
        super().__init__()
        self.patch_size = patch_size
        self.max_seq_len = max_seq_len
        h_dim = w_dim = 2 * (attention_head_dim // 6)
        self.split_sizes = [attention_head_dim - h_dim - w_dim, h_dim, w_dim]
        dtype = torch.float32 if torch.backends.mps.is_available() else torch.float64
        cos, sin = [], []
        for dim in self.split_sizes:
            freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))  # (dim/2,)
            freqs = torch.outer(torch.arange(max_seq_len), freqs)  # (max_seq_len, dim/2)
            cos.append(freqs.cos().repeat_interleave(2, dim=1, output_size=freqs.shape[1] * 2).float())
            sin.append(freqs.sin().repeat_interleave(2, dim=1, output_size=freqs.shape[1] * 2).float())
        self.register_buffer("freqs_cos", torch.cat(cos, dim=1), persistent=False)  # (max_seq_len, D)
        self.register_buffer("freqs_sin", torch.cat(sin, dim=1), persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = frames // p_t, height // p_h, width // p_w
        tables = []
        for table in (self.freqs_cos, self.freqs_sin):
            t, h, w = table.split(self.split_sizes, dim=1)
            parts = [t[:ppf].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1),
                     h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1),
                     w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)]
            tables.append(torch.cat(parts, dim=-1).reshape(1, ppf * pph * ppw, 1, -1))  # (1, S, 1, D)
        return tables[0], tables[1]


class DiTBlock(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, num_heads: int, cross_attn_norm: bool, eps: float):
        super().__init__()
        self.norm1 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.attn1 = DiTAttention(dim, num_heads, dim // num_heads, eps)
        self.attn2 = DiTAttention(dim, num_heads, dim // num_heads, eps, cross_attention_dim_head=dim // num_heads)
        self.norm2 = FP32LayerNorm(dim, eps, elementwise_affine=True) if cross_attn_norm else nn.Identity()
        self.ffn = FeedForward(dim, ffn_dim)
        self.norm3 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, hidden_states: torch.Tensor, text: torch.Tensor, temb: torch.Tensor,
                rotary_emb: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """hidden_states (B, S, D); text (B, L, D); temb (B, 6, D) or, per token, (B, 6, S, D)."""
        if temb.dim() == 3:
            modulation = (self.scale_shift_table + temb.float()).chunk(6, dim=1)  # (B, 1, D) each
        else:
            modulation = [m.squeeze(1) for m in (self.scale_shift_table.unsqueeze(2) + temb.float()).chunk(6, dim=1)]
        shift, scale, gate, c_shift, c_scale, c_gate = modulation
        norm = (self.norm1(hidden_states.float()) * (1 + scale) + shift).type_as(hidden_states)
        hidden_states = (hidden_states.float() + self.attn1(norm, None, mask, rotary_emb) * gate).type_as(hidden_states)
        norm = self.norm2(hidden_states.float()).type_as(hidden_states)
        hidden_states = hidden_states + self.attn2(norm, text, None, None)
        norm = (self.norm3(hidden_states.float()) * (1 + c_scale) + c_shift).type_as(hidden_states)
        return (hidden_states.float() + self.ffn(norm).float() * c_gate).type_as(hidden_states)


class SkyReelsV2DiT(nn.Module):
    """SkyReels-V2's transformer (text to video). Arguments: ``DiTConfig``'s fields, diffusers' names."""

    # as diffusers' class: what its loader keeps in float32 (``loaders.cast_like_diffusers`` reads it)
    _keep_in_fp32_modules = ["rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"]

    def __init__(self, **config: Any):
        super().__init__()
        known = {f.name for f in fields(DiTConfig)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"config keys {unknown} are not allowed: SkyReelsV2DiT takes {sorted(known)}")
        for key, allowed in _TEXT_TO_VIDEO_ONLY.items():
            if key in config and config[key] != allowed:
                raise ValueError(f"{key}={config[key]!r} is not allowed: SkyReelsV2DiT is the text-to-video model "
                                 f"({key}={allowed!r}); load diffusers' SkyReelsV2Transformer3DModel for it")
        if "patch_size" in config:
            config["patch_size"] = tuple(int(p) for p in config["patch_size"])
        self.config = DiTConfig(**config)
        cfg = self.config
        dim = cfg.num_attention_heads * cfg.attention_head_dim
        self.rope = RotaryPosEmbed(cfg.attention_head_dim, cfg.patch_size, cfg.rope_max_seq_len)
        self.patch_embedding = nn.Conv3d(cfg.in_channels, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.condition_embedder = ConditionEmbedder(dim, cfg.freq_dim, cfg.text_dim)
        self.blocks = nn.ModuleList([DiTBlock(dim, cfg.ffn_dim, cfg.num_attention_heads, cfg.cross_attn_norm, cfg.eps)
                                     for _ in range(cfg.num_layers)])
        self.norm_out = FP32LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.proj_out = nn.Linear(dim, (cfg.out_channels or cfg.in_channels) * math.prod(cfg.patch_size))
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    # --- diffusers' model API, the part the chunk-wise adapter uses -------------------------------------------
    def register_to_config(self, **changes: Any) -> None:
        self.config = replace(self.config, **changes)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (diffusers': the first parameter outside the fp32-kept modules)."""
        return self.patch_embedding.weight.dtype

    @property
    def attn_processors(self) -> dict[str, Any]:
        """"blocks.{i}.attn{1,2}.processor" -> processor."""
        return {f"{name}.processor": m.get_processor() for name, m in self.named_modules()
                if isinstance(m, DiTAttention)}

    def set_attn_processor(self, processors: dict[str, Any]) -> None:
        expected = self.attn_processors
        if set(processors) != set(expected):
            raise ValueError(f"processors for {sorted(processors)} are not allowed: expected exactly "
                             f"{sorted(expected)}")
        for name, m in self.named_modules():
            if isinstance(m, DiTAttention):
                m.set_processor(processors[f"{name}.processor"])

    # --- forward ----------------------------------------------------------------------------------------
    def _block_causal_mask(self, frames: int, tokens_per_frame: int, device: torch.device) -> torch.Tensor | None:
        """(1, 1, S, S) bool, chunks of ``num_frame_per_block`` frames attending to themselves and earlier ones."""
        per_block = self.config.num_frame_per_block
        if per_block <= 1:
            return None
        block = torch.arange(frames // per_block, device=device).repeat_interleave(per_block)  # (F,)
        frame_mask = block[None, :] <= block[:, None]  # (F, F)
        return frame_mask.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)[None, None]

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                enable_diffusion_forcing: bool = False, return_dict: bool = True) -> DiTOutput | tuple[torch.Tensor]:
        """hidden_states (B, C, F, H, W); timestep (B,), or (B, F) with ``enable_diffusion_forcing`` (one per
        latent frame); encoder_hidden_states (B, L, text_dim) -> velocity (B, C_out, F, H, W)."""
        batch, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config.patch_size
        ppf, pph, ppw = frames // p_t, height // p_h, width // p_w
        rotary_emb = self.rope(hidden_states)
        hidden_states = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2)  # (B, S, D)
        mask = self._block_causal_mask(ppf, pph * ppw, hidden_states.device)
        temb, timestep_proj, text = self.condition_embedder(timestep, encoder_hidden_states)
        timestep_proj = timestep_proj.unflatten(-1, (6, -1))  # (B[, F], 6, D)
        if enable_diffusion_forcing:  # per token: (B, 6, S, D); temb (B, S, D)
            b, f = timestep.shape
            temb = temb.view(b, f, 1, 1, -1).repeat(1, 1, pph, ppw, 1).flatten(1, 3)
            timestep_proj = timestep_proj.view(b, f, 1, 1, 6, -1).repeat(1, 1, pph, ppw, 1, 1).flatten(1, 3)
            timestep_proj = timestep_proj.transpose(1, 2).contiguous()
        for block in self.blocks:
            hidden_states = block(hidden_states, text, timestep_proj, rotary_emb, mask)
        if temb.dim() == 2:
            shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)  # (B, 1, D) each
        else:
            shift, scale = (self.scale_shift_table.unsqueeze(2) + temb.unsqueeze(1)).chunk(2, dim=1)
            shift, scale = shift.squeeze(1), scale.squeeze(1)  # (B, S, D) each
        hidden_states = (self.norm_out(hidden_states.float()) * (1 + scale) + shift).type_as(hidden_states)
        hidden_states = self.proj_out(hidden_states)  # (B, S, C_out * p_t * p_h * p_w)
        hidden_states = hidden_states.reshape(batch, ppf, pph, ppw, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        output = hidden_states.flatten(6, 7).flatten(4, 5).flatten(2, 3)  # (B, C_out, F, H, W)
        return DiTOutput(output) if return_dict else (output,)
