"""Helpers for the WorldPlay transformer / cache tests: a seeded tiny model, inputs, and a chunk driver that
runs the cached path and the masked oracle side by side."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from jensenkv.attention.config import AttentionConfig
from jensenkv.cache import CacheConfig
from jensenkv.models.worldplay.cache import WorldPlayCaches
from jensenkv.models.worldplay.config import WorldPlayPrecision, WorldPlayTransformerConfig
from jensenkv.models.worldplay.model import CameraInputs, TextInputs, WorldPlayTransformer
from jensenkv.models.worldplay.oracle import KV_NAMES, masked_forward
from jensenkv.quant import QuantConfig

H, W = 2, 3          # latent size: 6 tokens per frame
CHUNK = 4            # latent frames per chunk
CONTEXT_T = 14.0     # WorldPlay's stabilization_level - 1
# rebuild memories of 5 chunks: growing past, then retrieval-like non-contiguous sets (sink 0-3 + recent)
REBUILD_MEMORIES = [[], [0, 1, 2, 3], list(range(8)), [0, 1, 2, 3, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]]


def tiny_model(seed: int = 0, precision: WorldPlayPrecision | None = None, **overrides) -> WorldPlayTransformer:
    """The tiny config with every parameter random (the official zero-inits would hide the branches)."""
    torch.manual_seed(seed)
    model = WorldPlayTransformer(WorldPlayTransformerConfig.tiny(**overrides), precision)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                p.uniform_(0.8, 1.2)
            elif p.ndim == 1:
                p.normal_(0.0, 0.05)
            elif name == "cond_type_embedding.weight":
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
    return model.to_precision().eval()


def text_inputs(model: WorldPlayTransformer, batch: int = 1, lengths=(5,), seed: int = 1, pad: int = 2,
                vision: bool = True, byt5: bool = True) -> TextInputs:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    longest = max(lengths) + pad
    mask = torch.zeros(batch, longest, dtype=torch.long)
    for b in range(batch):
        mask[b, :lengths[b % len(lengths)]] = 1
    return TextInputs(
        text_states=torch.randn(batch, longest, cfg.text_states_dim, generator=g),
        text_mask=mask,
        byt5_states=torch.randn(batch, 3, cfg.byt5_states_dim, generator=g) if byt5 else None,
        byt5_mask=torch.tensor([[1, 1, 0]] * batch) if byt5 else None,
        vision_states=torch.randn(batch, 4, cfg.vision_states_dim, generator=g) if vision else None)


def rotation(angles: torch.Tensor) -> torch.Tensor:
    """(..., 3) Euler angles -> (..., 3, 3) rotation (z y x)."""
    a, b, c = angles.unbind(-1)
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    rz = torch.stack([a.cos(), -a.sin(), zero, a.sin(), a.cos(), zero, zero, zero, one], -1).view(*a.shape, 3, 3)
    ry = torch.stack([b.cos(), zero, b.sin(), zero, one, zero, -b.sin(), zero, b.cos()], -1).view(*a.shape, 3, 3)
    rx = torch.stack([one, zero, zero, zero, c.cos(), -c.sin(), zero, c.sin(), c.cos()], -1).view(*a.shape, 3, 3)
    return rz @ ry @ rx


def camera(batch: int, frames: int, seed: int = 2) -> CameraInputs:
    """Random rigid world-to-camera poses, WorldPlay-normalised intrinsics, random action labels."""
    g = torch.Generator().manual_seed(seed)
    view = torch.zeros(batch, frames, 4, 4)
    view[..., :3, :3] = rotation(0.6 * torch.randn(batch, frames, 3, generator=g))
    view[..., :3, 3] = torch.randn(batch, frames, 3, generator=g)
    view[..., 3, 3] = 1.0
    ks = torch.zeros(batch, frames, 3, 3)
    ks[..., 0, 0] = 0.4 + 0.3 * torch.rand(batch, frames, generator=g)
    ks[..., 1, 1] = 0.6 + 0.3 * torch.rand(batch, frames, generator=g)
    ks[..., :2, 2] = 0.5
    ks[..., 2, 2] = 1.0
    action = torch.randint(0, 81, (batch, frames), generator=g).float()
    return CameraInputs(view, ks, action)


def latents(model: WorldPlayTransformer, batch: int, frames: int, seed: int) -> torch.Tensor:
    """(B, 2C+1, F, H, W): latent, condition latent, mask (as the loop would concatenate them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, model.config.in_channels, frames, H, W, generator=g).to(model.dtype)


def full_precision() -> CacheConfig:
    return CacheConfig(key=QuantConfig(method="none"), value=QuantConfig(method="none"))


def int2(granularity: str = "token_group", group_size: int = 16) -> CacheConfig:
    return CacheConfig(key=QuantConfig(method="rtn", bits=2, granularity=granularity, group_size=group_size),
                       value=QuantConfig(method="none", store_dtype="bfloat16"))  # as the suite pairs them


def make_caches(model: WorldPlayTransformer, cache: CacheConfig | None = None, memory: str = "rebuild",
                correction: str = "none", cls=WorldPlayCaches, **kwargs) -> WorldPlayCaches:
    cfg = model.config
    return cls(cfg.num_layers, cfg.num_heads, cfg.head_dim, cache or full_precision(),
               AttentionConfig(correction=correction, **kwargs.pop("attention", {})), memory=memory,
               commit_frames=CHUNK, **kwargs)


@dataclass
class ChunkRun:
    """What a driven chunk produced: the cached path's velocity and the oracle's (None when not asked)."""

    v: torch.Tensor
    ref: torch.Tensor | None
    memory: list[int]
    ref_kv: list | None = None


@dataclass
class Driver:
    """Drives ``chunks`` chunks of one video batch through the caches: memory pass, one denoising forward;
    optionally the oracle over the same inputs (append: the held frames' K/V as the oracle wrote them)."""

    model: WorldPlayTransformer
    caches: WorldPlayCaches
    batch: int = 1
    chunks: int = 5
    seed: int = 3
    text: TextInputs | None = None
    written: dict = field(default_factory=dict)  # frame -> per video per layer {k, v, k_prope, v_prope} (oracle)

    def __post_init__(self):
        frames = self.chunks * CHUNK
        self.clean = latents(self.model, self.batch, frames, self.seed)
        self.noisy = latents(self.model, self.batch, frames, self.seed + 1)
        self.cam = camera(self.batch, frames, self.seed + 2)
        self.text = self.text or text_inputs(self.model, self.batch, lengths=(5, 3)[: max(1, min(2, self.batch))])
        self.caches.set_text(self.model, self.text)
        self.t_cur = torch.linspace(600.0, 900.0, self.batch)[:, None].expand(self.batch, CHUNK).contiguous()

    def memory(self, i: int) -> list[int]:
        return REBUILD_MEMORIES[i] if self.caches.memory == "rebuild" else list(range(i * CHUNK))

    @torch.no_grad()
    def run(self, i: int, oracle: bool = False) -> ChunkRun:
        mem = self.memory(i)
        cur = list(range(i * CHUNK, (i + 1) * CHUNK))
        held = list(self.caches.frames)
        if mem:
            self.caches.write_memory(self.model, self.clean[:, :, mem], mem, self.cam.frames(mem), CONTEXT_T)
        x_cur = self.noisy[:, :, cur]
        v = self.caches.denoise(self.model, x_cur, self.t_cur, self.cam.frames(cur), step=0, chunk=i)
        if not oracle:
            return ChunkRun(v, None, mem)
        frozen = None
        if self.caches.memory == "append" and held:
            frozen = [[{n: torch.cat([self.written[f][b][layer][n] for f in held], 2) for n in KV_NAMES}
                       for layer in range(self.model.config.num_layers)] for b in range(self.batch)]
        ref, kv = masked_forward(self.model, self.text, self.clean[:, :, mem] if mem else None, CONTEXT_T,
                                 self.cam.frames(mem) if mem else None, x_cur, self.t_cur, self.cam.frames(cur), frozen)
        tokens = H * W
        for pos, f in enumerate(mem):
            if f not in held or self.caches.memory == "rebuild":
                self.written[f] = [[{n: kv[b][layer][n][:, :, pos * tokens:(pos + 1) * tokens] for n in KV_NAMES}
                                    for layer in range(self.model.config.num_layers)] for b in range(self.batch)]
        return ChunkRun(v, ref, mem, kv)


def cached_kv(caches: WorldPlayCaches, layer: int) -> dict[str, torch.Tensor]:
    """The block's memory as stored, dequantized: {k, v, k_prope, v_prope} each (B, H, n*T, D)."""
    out = {}
    for stream, (kn, vn) in (("rope", ("k", "v")), ("prope", ("k_prope", "v_prope"))):
        segs = caches.segments(layer, stream)
        out[kn] = torch.cat([s.k for s in segs], 2)
        out[vn] = torch.cat([s.v for s in segs], 2)
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max() / b.detach().double().abs().max())
