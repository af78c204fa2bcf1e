"""ProPE, the camera branch WorldPlay adds to every block (``hyvideo/prope/camera_rope.py``, MIT, PRoPE authors).

Per latent frame, P = lift(K_norm) @ w2c maps world to image; K_norm keeps fx, fy and sets the principal
point to 0. Every 4-channel block of a head is transformed: queries by P^T, keys and values by P^-1
(= w2c^-1 @ lift(K_norm^-1), w2c inverted as a rigid transform), the attention output by P. WorldPlay
repeats the matrices to every token; here they act per frame on that frame's tokens (the same products).
The matrices are built in the camera inputs' dtype (BF16 in WorldPlay) and applied in the features' dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def _lift(k: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) -> (..., 4, 4) homogeneous."""
    out = torch.zeros(k.shape[:-2] + (4, 4), dtype=k.dtype, device=k.device)
    out[..., :3, :3] = k
    out[..., 3, 3] = 1.0
    return out


def _normalized(ks: torch.Tensor) -> torch.Tensor:
    """Intrinsics with the principal point moved to 0 (fx, fy kept), as PRoPE normalises them."""
    out = torch.zeros_like(ks)
    out[..., 0, 0] = ks[..., 0, 0]
    out[..., 1, 1] = ks[..., 1, 1]
    out[..., 2, 2] = 1.0
    return out


def _invert_k(ks: torch.Tensor) -> torch.Tensor:
    """Inverse of skew-free intrinsics (..., 3, 3)."""
    out = torch.zeros_like(ks)
    out[..., 0, 0] = 1.0 / ks[..., 0, 0]
    out[..., 1, 1] = 1.0 / ks[..., 1, 1]
    out[..., 0, 2] = -ks[..., 0, 2] / ks[..., 0, 0]
    out[..., 1, 2] = -ks[..., 1, 2] / ks[..., 1, 1]
    out[..., 2, 2] = 1.0
    return out


def _invert_se3(m: torch.Tensor) -> torch.Tensor:
    """Inverse of rigid (..., 4, 4) transforms: [R^T, -R^T t]."""
    r_inv = m[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(m)
    out[..., :3, :3] = r_inv
    out[..., :3, 3] = -torch.einsum("...ij,...j->...i", r_inv, m[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


@dataclass
class CameraTransforms:
    """Per-frame ProPE matrices, each (B, F, 4, 4)."""

    p: torch.Tensor      # image <- world
    p_t: torch.Tensor    # P^T, for queries
    p_inv: torch.Tensor  # P^-1, for keys and values

    @classmethod
    def build(cls, viewmats: torch.Tensor, ks: torch.Tensor) -> CameraTransforms:
        """viewmats (B, F, 4, 4) world-to-camera; ks (B, F, 3, 3) -> the matrices, in their dtype."""
        kn = _normalized(ks)
        p = torch.einsum("...ij,...jk->...ik", _lift(kn), viewmats)
        p_inv = torch.einsum("...ij,...jk->...ik", _invert_se3(viewmats), _lift(_invert_k(kn)))
        return cls(p=p, p_t=p.transpose(-1, -2), p_inv=p_inv)

    def select(self, frames: slice | list[int]) -> CameraTransforms:
        return CameraTransforms(self.p[:, frames], self.p_t[:, frames], self.p_inv[:, frames])


def apply_blocks(feats: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """feats (B, H, F * T, D), matrix (B, F, 4, 4) -> (B, H, F * T, D): every 4-channel block of frame f's
    tokens multiplied by matrix[:, f] (in the features' dtype)."""
    b, h, s, d = feats.shape
    frames = matrix.shape[1]
    blocks = feats.reshape(b, h, frames, s // frames, d // 4, 4)  # (B, H, F, T, D/4, 4)
    out = torch.einsum("bfij,bhftkj->bhftki", matrix.to(feats.dtype), blocks)
    return out.reshape(b, h, s, d)
