"""The MAGI-1 DiT in pure torch (no flash-attn, MagiAttention or Triton).

Module and parameter names follow the official ``VideoDiTModel`` (SandAI-org/MAGI-1,
``inference/model/dit/dit_model.py`` / ``dit_module.py``), so an official state dict loads as is (see
``jensenkv.models.magi.checkpoint``). Self-attention is delegated to a callable ``attend(layer, q, k, v)``
so the chunk-wise adapter can run it over a quantized KV cache and the tests over a full sequence.

Numerics follow the official model: per-head q/k LayerNorms with gain (w + 1) in fp32, then RoPE; the
embedders, post-norms, ``linear_proj``, final norm and ``final_linear`` in fp32; everything else in the
parameters' dtype.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from jensenkv.models.magi.config import MagiModelConfig

# attend(layer_index, q (B, H, S, D), k (B, H_kv, S, D), v (B, H_kv, S, D)) -> (B, H, S, D)
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# One chunk's caption: a (L, channels) tensor shared by every video of the batch, or a list of B tensors, one
# per video (lengths may differ: each video's queries attend to its own valid tokens only)
Caption = torch.Tensor | Sequence[torch.Tensor]
TextKV = tuple[torch.Tensor, torch.Tensor]  # (k, v) of one caption, each (1, H_kv, L, D)
FP32_MODULES = ("x_embedder", "t_embedder", "y_embedder", "rope", "final_linear", "final_layernorm",
                "q_layernorm", "k_layernorm", "self_attn_post_norm", "mlp_post_norm")


class LayerNorm1p(nn.Module):
    """LayerNorm whose stored gain is w - 1 (``apply_layernorm_1p``): applied as (w + 1), with a bias."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, (self.weight + 1).to(x.dtype), self.bias.to(x.dtype), self.eps)


class TimestepEmbedder(nn.Module):
    """Sinusoid of 1000 t (cos first, then sin) -> Linear -> SiLU -> Linear, in fp32."""

    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        self.frequency_embedding_size = cfg.frequency_embedding_size
        self.freq_dtype = torch.float32  # the official code rounds the sinusoid to params_dtype before the MLP
        self.mlp = nn.Sequential(nn.Linear(cfg.frequency_embedding_size, cfg.cond_dim), nn.SiLU(),
                                 nn.Linear(cfg.cond_dim, cfg.cond_dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t (N,) MAGI time -> (N, cond_dim) float32."""
        half = self.frequency_embedding_size // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None] * 1000.0  # (N, half)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (N, 2*half)
        if self.frequency_embedding_size % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        w = self.mlp[0].weight
        return self.mlp(emb.to(self.freq_dtype).to(w.dtype)).float()


class CaptionEmbedder(nn.Module):
    """Text -> cross-attention states (Linear + SiLU); adaLN caption vector from the null caption's last rows."""

    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        xattn_dim = int(cfg.hidden_size * cfg.xattn_cond_hidden_ratio)
        self.y_proj_xattn = nn.Sequential(nn.Linear(cfg.caption_channels, xattn_dim), nn.SiLU())
        self.y_proj_adaln = nn.Sequential(nn.Linear(cfg.caption_channels, cfg.cond_dim))
        self.null_caption_embedding = nn.Parameter(torch.zeros(cfg.caption_max_length, cfg.caption_channels))

    def adaln(self, dropped: torch.Tensor) -> torch.Tensor:
        """(N,) bool -> (N, cond_dim): at inference the official model feeds adaLN the null caption's row -1
        (caption dropped) or row -2 (caption kept), never the text itself."""
        rows = torch.where(dropped[:, None], self.null_caption_embedding[-1][None], self.null_caption_embedding[-2][None])
        return self.y_proj_adaln(rows.to(self.y_proj_adaln[0].weight.dtype)).float()  # (N, cond_dim)


class LearnableRope3D(nn.Module):
    """MAGI-1's ``LearnableRotaryEmbeddingCat`` (in_pixels=False): learnable bands, head_dim/8 per axis.

    Angles are axis-major [t*b, h*b, w*b]; t is the absolute latent-frame index, h and w are centred and
    rescaled to a 16 x 16 reference grid (``ref_feat_shape``), with the official float expression.
    """

    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        n = cfg.rope_bands
        exponent = torch.arange(0, n, 1, dtype=torch.int64).float() / n
        self.bands = nn.Parameter(1.0 / (cfg.rope_temperature ** exponent))  # (n,)

    def forward(self, frames_total: int, height: int, width: int, last_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sin, cos), each (last_frames*H*W, 3n): the last ``last_frames`` of a grid of ``frames_total`` frames."""
        device = self.bands.device
        scale = math.sqrt(height * width / 256.0)
        shape = (frames_total, height, width)
        ref = (frames_total, height / scale, width / scale)
        axes = [torch.arange(s, device=device, dtype=torch.int64).to(torch.float32) for s in shape]
        axes[1] = axes[1] - (height - 1) / 2
        axes[2] = axes[2] - (width - 1) / 2
        rescaled = []
        for x, f, r in zip(axes, shape, ref):
            if f == 1:
                if r != 1:
                    raise ValueError(f"a latent grid of {shape} tokens cannot be RoPE-rescaled: an axis of size 1 "
                                     f"needs a reference size of 1, got {r}")
                rescaled.append(x)
            else:
                rescaled.append(x / (f - 1) * (r - 1))
        grid = torch.stack(torch.meshgrid(*rescaled, indexing="ij"), dim=-1)  # (T, H, W, 3)
        pos = grid.unsqueeze(-1) * self.bands.float()  # (T, H, W, 3, n)
        pos = pos[frames_total - last_frames:].reshape(last_frames * height * width, -1)  # (S, 3n)
        return pos.sin(), pos.cos()


def apply_rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first 2*R channels, pairs (i, i + R); the rest pass through.

    x (B, H, S, D) float; sin, cos (S, R).
    """
    r = sin.shape[-1]
    x1, x2, rest = x[..., :r], x[..., r:2 * r], x[..., 2 * r:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


class LinearQKV(nn.Module):
    """Plain pre-LayerNorm and the four bias-free projections q, qx (cross-attention query), k, v."""

    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.q = nn.Linear(cfg.hidden_size, q_size, bias=False)
        self.qx = nn.Linear(cfg.hidden_size, q_size, bias=False)
        self.k = nn.Linear(cfg.hidden_size, kv_size, bias=False)
        self.v = nn.Linear(cfg.hidden_size, kv_size, bias=False)


class MagiAttention(nn.Module):
    """Self-attention (cached, GQA, RoPE) and parallel cross-attention to the caption, one output projection."""

    def __init__(self, cfg: MagiModelConfig, layer_index: int):
        super().__init__()
        self.cfg = cfg
        self.layer_index = layer_index
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.linear_qkv = LinearQKV(cfg)
        self.linear_kv_xattn = nn.Linear(int(cfg.hidden_size * cfg.xattn_cond_hidden_ratio), 2 * kv_size, bias=False)
        self.linear_proj = nn.Linear(2 * q_size, cfg.hidden_size, bias=False)
        self.q_layernorm = LayerNorm1p(cfg.head_dim, cfg.layernorm_epsilon)
        self.q_layernorm_xattn = LayerNorm1p(cfg.head_dim, cfg.layernorm_epsilon)
        self.k_layernorm = LayerNorm1p(cfg.head_dim, cfg.layernorm_epsilon)
        self.k_layernorm_xattn = LayerNorm1p(cfg.head_dim, cfg.layernorm_epsilon)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, n*D) -> (B, n, S, D); one video's (S, n*D) -> (1, n, S, D)."""
        x = x.unsqueeze(0) if x.ndim == 2 else x
        return x.unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2)

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], text_kv: list[TextKV | list[TextKV]],
                chunk_tokens: int, attend: AttendFn) -> torch.Tensor:
        """h (B, S, hidden) -> (B, S, hidden); text_kv[j]: chunk j's caption (k, v), each (1, H_kv, L_j, D),
        shared by every video, or a list of B such pairs, one per video."""
        dtype = h.dtype
        x = self.linear_qkv.layer_norm(h)
        sin, cos = rope
        q = self._heads(self.linear_qkv.q(x))  # (B, H, S, D)
        k = self._heads(self.linear_qkv.k(x))  # (B, H_kv, S, D)
        v = self._heads(self.linear_qkv.v(x))  # (B, H_kv, S, D)
        q = apply_rope(self.q_layernorm(q.float()), sin, cos).to(dtype)  # fp32 norm + RoPE, then back
        k = apply_rope(self.k_layernorm(k.float()), sin, cos).to(dtype)
        core = attend(self.layer_index, q, k, v)  # (B, H, S, D)
        core = core.transpose(1, 2).flatten(2).to(dtype)  # (B, S, H*D)

        qx = self.q_layernorm_xattn(self._heads(self.linear_qkv.qx(x)))  # (B, H, S, D), model dtype
        cross = []
        for j, kv in enumerate(text_kv):  # one chunk's queries over its own caption tokens
            qj = qx[:, :, j * chunk_tokens:(j + 1) * chunk_tokens]  # (B, H, T, D)
            if isinstance(kv, tuple):  # one caption for every video: one call for the batch
                cross.append(self._cross(qj, *kv))
            else:  # one caption per video, each of its own length: each video over its own tokens, exactly
                cross.append(torch.cat([self._cross(qj[b:b + 1], *kv_b) for b, kv_b in enumerate(kv)]))
        cross = torch.cat(cross, dim=2).transpose(1, 2).flatten(2)  # (B, S, H*D)

        blocks = self.cfg.proj_interleave_blocks
        out = torch.cat([core, cross], dim=-1)  # (B, S, 2*H*D)
        out = out.unflatten(-1, (2, blocks, -1)).transpose(-3, -2).flatten(-3)  # (n hn hd) -> (hn n hd)
        return F.linear(out.float(), self.linear_proj.weight.float())  # fp32, as the official autocast

    def _cross(self, q: torch.Tensor, kx: torch.Tensor, vx: torch.Tensor) -> torch.Tensor:
        """Cross-attention of q (B, H, T, D) to one caption's kx, vx (1, H_kv, L, D) -> (B, H, T, D)."""
        groups, batch = self.cfg.groups, q.shape[0]
        kx, vx = (x.repeat_interleave(groups, dim=1).to(q.dtype).expand(batch, -1, -1, -1) for x in (kx, vx))
        return F.scaled_dot_product_attention(q, kx, vx)  # kx, vx (B, H, L, D)

    def text_kv(self, y_xattn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """y_xattn (L, xattn_dim) valid caption tokens -> (k, v), each (1, H_kv, L, D); only k is normed."""
        kv = self.linear_kv_xattn(y_xattn.to(self.linear_kv_xattn.weight.dtype))  # (L, 2*H_kv*D)
        kv = kv.unflatten(-1, (self.cfg.num_kv_heads, 2 * self.cfg.head_dim))  # per KV head [k(D), v(D)]
        k, v = kv.split(self.cfg.head_dim, dim=-1)  # (L, H_kv, D) each
        k = self.k_layernorm_xattn(k)
        return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)


class MagiMLP(nn.Module):
    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        self.gated = cfg.gated_linear_unit
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        fc1_out = 2 * cfg.ffn_hidden_size if self.gated else cfg.ffn_hidden_size
        self.linear_fc1 = nn.Linear(cfg.hidden_size, fc1_out, bias=False)
        self.linear_fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_fc1(self.layer_norm(x))
        if self.gated:
            a, b = x.chunk(2, dim=-1)
            x = F.silu(a) * b  # flashinfer's silu_and_mul
        else:
            x = F.gelu(x)  # exact erf
        return self.linear_fc2(x)


class AdaModulateLayer(nn.Module):
    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        self.act = nn.SiLU()
        self.proj = nn.Sequential(nn.Linear(cfg.cond_dim, int(cfg.hidden_size * cfg.cond_gating_ratio * 2)))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(c))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: MagiModelConfig, layer_index: int):
        super().__init__()
        self.ada_modulate_layer = AdaModulateLayer(cfg)
        self.self_attention = MagiAttention(cfg, layer_index)
        self.self_attn_post_norm = LayerNorm1p(cfg.hidden_size, cfg.layernorm_epsilon)
        self.mlp = MagiMLP(cfg)
        self.mlp_post_norm = LayerNorm1p(cfg.hidden_size, cfg.layernorm_epsilon)

    def forward(self, h: torch.Tensor, condition: torch.Tensor, chunk_tokens: int, rope: tuple[torch.Tensor, torch.Tensor],
                text_kv: list[TextKV | list[TextKV]], attend: AttendFn) -> torch.Tensor:
        """h (B, S, hidden); condition (n, cond_dim) one row per chunk, the same for every video."""
        dtype = h.dtype
        gates = self.ada_modulate_layer(condition.to(self.ada_modulate_layer.proj[0].weight.dtype))  # (n, 2*hidden)
        gates = torch.tanh(gates.float()).to(dtype)  # softcap with cap 1
        gate_msa, gate_mlp = (g.repeat_interleave(chunk_tokens, dim=0) for g in gates.chunk(2, dim=-1))  # (S, hidden)
        attn = self.self_attention(h, rope, text_kv, chunk_tokens, attend)  # (B, S, hidden) fp32
        h = (self.self_attn_post_norm(attn.float() * gate_msa.float()) + h.float()).to(dtype)
        mlp = self.mlp(h)
        return (self.mlp_post_norm(mlp.float() * gate_mlp.float()) + h.float()).to(dtype)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg, i) for i in range(cfg.num_layers))
        self.final_layernorm = LayerNorm1p(cfg.hidden_size, cfg.layernorm_epsilon)


class FinalLinear(nn.Module):
    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        self.linear = nn.Linear(cfg.hidden_size, cfg.patch_size ** 2 * cfg.t_patch_size * cfg.out_channels, bias=False)


class MagiDiT(nn.Module):
    """MAGI-1's VideoDiT. ``forward`` runs n consecutive chunks of B videos in one pass.

    Inputs are MAGI-convention: time 0 = noise, 1 = clean; the output is the velocity towards clean.
    """

    def __init__(self, cfg: MagiModelConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        p, pt = cfg.patch_size, cfg.t_patch_size
        self.x_embedder = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=(pt, p, p), stride=(pt, p, p), bias=False)
        self.t_embedder = TimestepEmbedder(cfg)
        self.y_embedder = CaptionEmbedder(cfg)
        self.rope = LearnableRope3D(cfg)
        self.videodit_blocks = TransformerBlock(cfg)
        self.final_linear = FinalLinear(cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.videodit_blocks.layers[0].self_attention.linear_qkv.q.weight.dtype

    def to_dtype(self, dtype: torch.dtype) -> MagiDiT:
        """Cast to ``dtype`` but keep the official fp32 modules (embedders, q/k and post norms, final layers) fp32."""
        for name, module in self.named_modules():
            if not name or any(child for child in module.children()):
                continue
            parts = set(name.split("."))
            keep = bool(parts & set(FP32_MODULES))
            for param in module.parameters(recurse=False):
                param.data = param.data.to(torch.float32 if keep else dtype)
        self.t_embedder.freq_dtype = dtype
        return self

    def token_grid(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        cfg = self.config
        if frames % cfg.t_patch_size or height % cfg.patch_size or width % cfg.patch_size:
            raise ValueError(f"latent (F, H, W)=({frames}, {height}, {width}) is not allowed: it must be divisible by "
                             f"the patch ({cfg.t_patch_size}, {cfg.patch_size}, {cfg.patch_size})")
        return frames // cfg.t_patch_size, height // cfg.patch_size, width // cfg.patch_size

    def forward(self, x: torch.Tensor, chunk_t: torch.Tensor, captions: Sequence[Caption], dropped: torch.Tensor,
                start_frame: int, attend: AttendFn, distill_dt: float | None = None) -> torch.Tensor:
        """Velocity of n chunks of B videos in lock step (each video's rows computed as if alone).

        x: (B, C, n*F, H, W) latents (VAE channels); chunk_t: (n,) MAGI time per chunk; captions[j]: chunk j's
        valid caption tokens (L_j, caption_channels), one tensor for every video or a list of B, one per video;
        dropped: (n,) bool, adaLN from the null caption's row -1 (True) or -2; start_frame: latent frame index
        of the first chunk (RoPE offset = frames before it); distill_dt: the shortcut step embedding of
        distilled models (required iff config.distill). Returns (B, C, n*F, H, W) float32.
        """
        cfg = self.config
        n = int(chunk_t.shape[0])
        if x.ndim != 5:
            raise ValueError(f"x.shape={tuple(x.shape)} is not allowed: expected (B, C, F, H, W)")
        batch = x.shape[0]
        if len(captions) != n or dropped.shape != (n,):
            raise ValueError(f"captions ({len(captions)}) and dropped {tuple(dropped.shape)} need one entry per chunk ({n})")
        for j, c in enumerate(captions):
            if not isinstance(c, torch.Tensor) and len(c) != batch:
                raise ValueError(f"captions[{j}] with {len(c)} per-video captions is not allowed: x has {batch} videos")
        if cfg.distill != (distill_dt is not None):
            raise ValueError(f"distill_dt={distill_dt!r} is not allowed: distilled models need it, others must not get it "
                             f"(config.distill={cfg.distill})")
        if x.shape[2] % n:
            raise ValueError(f"{x.shape[2]} frames do not split into {n} equal chunks")
        dtype = self.dtype
        x = x.float() * cfg.x_rescale_factor
        if cfg.half_channel_vae:
            x = torch.cat([x, x], dim=1)
        # video by video: on CPU a batched Conv3d rounds a video differently from the same video alone (the
        # linear layers, norms and SDPA do not), and an INT2 commit can turn a 1e-7 difference into a flipped code
        x = x.to(self.x_embedder.weight.dtype)
        x = torch.cat([self.x_embedder(x[b:b + 1]) for b in range(batch)])  # (B, hidden, T, H', W')
        _, _, t_tok, h_tok, w_tok = x.shape
        if start_frame % cfg.t_patch_size:
            raise ValueError(f"start_frame={start_frame} must be a multiple of t_patch_size={cfg.t_patch_size}")
        first = start_frame // cfg.t_patch_size
        rope = self.rope(first + t_tok, h_tok, w_tok, t_tok)  # (S, 3n) each
        h = x.flatten(2).transpose(1, 2).to(dtype)  # (B, S, hidden), token order (T, H, W)
        chunk_tokens = h.shape[1] // n

        condition = self.t_embedder(chunk_t.float())  # (n, cond_dim)
        if distill_dt is not None:
            condition = condition + self.t_embedder(torch.full_like(chunk_t.float(), float(distill_dt)))
        condition = (condition + self.y_embedder.adaln(dropped.to(condition.device))).to(dtype)  # (n, cond_dim)
        y_xattn = [per_caption(c, self._embed_caption) for c in captions]  # (L_j, xattn_dim) each

        for layer in self.videodit_blocks.layers:
            text_kv = [per_caption(y, layer.self_attention.text_kv) for y in y_xattn]
            h = layer(h, condition, chunk_tokens, rope, text_kv, attend)
        h = self.videodit_blocks.final_layernorm(h.float())
        out = F.linear(h, self.final_linear.linear.weight.float())  # (B, S, pT*pH*pW*C) fp32
        p, pt, c = cfg.patch_size, cfg.t_patch_size, cfg.out_channels
        out = out.reshape(batch, t_tok, h_tok, w_tok, pt, p, p, c)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, C, T, pT, H, pH, W, pW)
        out = out.reshape(batch, c, t_tok * pt, h_tok * p, w_tok * p)
        if cfg.half_channel_vae:
            out = out[:, : c // 2]
        return out / cfg.x_rescale_factor

    def _embed_caption(self, caption: torch.Tensor) -> torch.Tensor:
        """(L, caption_channels) -> (L, xattn_dim) cross-attention states, model dtype."""
        proj = self.y_embedder.y_proj_xattn
        return proj(caption.to(proj[0].weight.dtype)).to(self.dtype)


def per_caption(caption: Caption | list, fn: Callable):
    """fn applied to one caption: shared (a tensor) -> fn(caption); per video (a list) -> one result each."""
    return fn(caption) if isinstance(caption, torch.Tensor) else [fn(c) for c in caption]


def range_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_tokens: int,
                    key_ranges: list[tuple[int, int]]) -> torch.Tensor:
    """MAGI's q_range / k_range attention without a cache: chunk j's queries attend keys [start_j, end_j).

    q (B, H, S, D); k, v (B, H_kv, S, D) with KV heads shared by H / H_kv consecutive query heads.
    """
    groups = q.shape[1] // k.shape[1]
    outs = []
    for j, (start, end) in enumerate(key_ranges):
        qj = q[:, :, j * chunk_tokens:(j + 1) * chunk_tokens]
        kj = k[:, :, start:end].repeat_interleave(groups, dim=1)  # (B, H, K, D)
        vj = v[:, :, start:end].repeat_interleave(groups, dim=1)
        outs.append(F.scaled_dot_product_attention(qj, kj, vj))  # (B, H, T, D)
    return torch.cat(outs, dim=2)  # (B, H, S, D)
