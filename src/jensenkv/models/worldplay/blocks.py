"""WorldPlay's double-stream block (``MMDoubleStreamBlock`` + ``img_attn_prope_proj``), official names.

The block is split at its attention so one set of weights serves every pass: the text stream (text-only
self-attention at t = 0), the context pass (rebuild), the cached denoising pass and the tests' masked
oracle. ``img_qkv`` returns both branches' inputs (RoPE: q, k after RMSNorm and RoPE, v; ProPE: P^T q,
P^-1 k, P^-1 v after RMSNorm, no RoPE); the caller attends; ``img_out`` maps the ProPE output back by P,
adds both projections under one gate and runs the MLP.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jensenkv.models.worldplay.config import WorldPlayTransformerConfig
from jensenkv.models.worldplay.layers import MLP, ModulateDiT, RMSNorm, layer_norm, linear, modulate, per_token
from jensenkv.models.worldplay.prope import CameraTransforms, apply_blocks
from jensenkv.models.worldplay.rope import apply_rope


@dataclass
class VisionQKV:
    """One block's attention inputs for the vision tokens, each (B, H, S, D)."""

    q: torch.Tensor        # RoPE branch: q after RMSNorm and RoPE
    k: torch.Tensor        # k after RMSNorm and RoPE
    v: torch.Tensor
    q_prope: torch.Tensor  # ProPE branch: P^T q (RMSNorm, no RoPE)
    k_prope: torch.Tensor  # P^-1 k
    v_prope: torch.Tensor  # P^-1 v


class DoubleStreamBlock(nn.Module):
    def __init__(self, cfg: WorldPlayTransformerConfig):
        super().__init__()
        c, d, bias = cfg.hidden_size, cfg.head_dim, cfg.qkv_bias
        self.heads = cfg.num_heads
        self.eps = cfg.eps
        for stream in ("img", "txt"):
            setattr(self, f"{stream}_mod", ModulateDiT(c, 6))
            for name in ("q", "k", "v"):
                setattr(self, f"{stream}_attn_{name}", nn.Linear(c, c, bias=bias))
            setattr(self, f"{stream}_attn_q_norm", RMSNorm(d, cfg.eps))
            setattr(self, f"{stream}_attn_k_norm", RMSNorm(d, cfg.eps))
            setattr(self, f"{stream}_attn_proj", nn.Linear(c, c, bias=bias))
            setattr(self, f"{stream}_mlp", MLP(c, cfg.mlp_hidden, "tanh"))
        self.img_attn_prope_proj = nn.Linear(c, c, bias=bias)  # WorldPlay's camera branch output (zero-init)

    def _qkv(self, stream: str, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (B, S, C) modulated -> q, k, v (B, H, S, D); q, k RMS-normed (cast to v's dtype)."""
        b, s, _ = h.shape
        q, k, v = (linear(getattr(self, f"{stream}_attn_{n}"), h).view(b, s, self.heads, -1) for n in "qkv")
        q = getattr(self, f"{stream}_attn_q_norm")(q).to(v.dtype)
        k = getattr(self, f"{stream}_attn_k_norm")(k).to(v.dtype)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) each

    def _residual(self, stream: str, x: torch.Tensor, attn_out: torch.Tensor, mods: tuple[torch.Tensor, ...],
                  tokens: int, amp: bool) -> torch.Tensor:
        """x + gate1 * attn_out, then x + gate2 * MLP(modulate(LN(x))); mods per frame (B, F, C) x 6."""
        _, _, gate1, shift2, scale2, gate2 = (per_token(m, tokens) for m in mods)  # (B, S, C) each
        x = x + attn_out * gate1.type_as(attn_out)
        h = modulate(layer_norm(x, self.eps, amp), shift2, scale2)
        mlp = getattr(self, f"{stream}_mlp")(h)
        return x + mlp * gate2.type_as(mlp)

    @staticmethod
    def _merge_heads(o: torch.Tensor) -> torch.Tensor:
        return o.transpose(1, 2).flatten(2)  # (B, H, S, D) -> (B, S, H*D)

    # text stream (t = 0; mods (1, 1, C) x 6 broadcast over the tokens)
    def txt_mods(self, vec_txt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """vec_txt (B, C) -> 6 x (B, 1, C)."""
        return tuple(m[:, None] for m in self.txt_mod(vec_txt).chunk(6, dim=-1))

    def txt_qkv(self, txt: torch.Tensor, mods: tuple[torch.Tensor, ...], amp: bool):
        """txt (B, L, C) -> q, k, v (B, H, L, D)."""
        shift1, scale1 = (m.expand(-1, txt.shape[1], -1) for m in mods[:2])
        return self._qkv("txt", modulate(layer_norm(txt, self.eps, amp), shift1, scale1))

    def txt_out(self, txt: torch.Tensor, o: torch.Tensor, mods: tuple[torch.Tensor, ...], amp: bool) -> torch.Tensor:
        """o (B, H, L, D) -> the next text states (B, L, C)."""
        return self._residual("txt", txt, linear(self.txt_attn_proj, self._merge_heads(o)), mods, txt.shape[1], amp)

    # vision stream (per-frame modulation)
    def img_mods(self, vec: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """vec (B, F, C) per frame -> 6 x (B, F, C): shift1, scale1, gate1, shift2, scale2, gate2."""
        return tuple(self.img_mod(vec).chunk(6, dim=-1))

    def img_qkv(self, img: torch.Tensor, mods: tuple[torch.Tensor, ...], tokens: int, rope: tuple[torch.Tensor, torch.Tensor],
                cams: CameraTransforms, amp: bool) -> VisionQKV:
        """img (B, S, C), S = F * tokens; rope cos, sin (S, D); cams per frame -> both branches' q, k, v."""
        shift1, scale1 = per_token(mods[0], tokens), per_token(mods[1], tokens)
        q, k, v = self._qkv("img", modulate(layer_norm(img, self.eps, amp), shift1, scale1))
        # ProPE on the normed q, k, v before RoPE (the RoPE branch rotates the same q, k)
        q_p, k_p, v_p = apply_blocks(q, cams.p_t), apply_blocks(k, cams.p_inv), apply_blocks(v, cams.p_inv)
        cos, sin = rope
        return VisionQKV(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, q_p, k_p, v_p)

    def img_out(self, img: torch.Tensor, o: torch.Tensor, o_prope: torch.Tensor, mods: tuple[torch.Tensor, ...], tokens: int,
                cams: CameraTransforms, amp: bool) -> torch.Tensor:
        """o, o_prope (B, H, S, D) -> the next vision states (B, S, C)."""
        o_prope = apply_blocks(o_prope, cams.p)  # back to the feature basis
        attn = linear(self.img_attn_proj, self._merge_heads(o)) + linear(self.img_attn_prope_proj,
                                                                          self._merge_heads(o_prope))
        return self._residual("img", img, attn, mods, tokens, amp)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain attention (B, H, Q, D) x (B, H, K, D) -> (B, H, Q, D); mask (Q, K) or broadcastable bool."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
