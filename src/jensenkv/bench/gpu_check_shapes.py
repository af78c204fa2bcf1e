"""The shapes `make gpu-check` runs at: SkyReels-V2-1.3B at 544x960 (a 5-frame chunk over some cached frames),
MAGI-1-4.5B and HY-WorldPlay at their chunk sizes (``oracle_shapes``, ``kernel_shapes``), and the
interpreter-sized stand-in of each for the dry run (``toy_shape``).
"""
from __future__ import annotations

import math


from jensenkv.bench.gpu import GpuShape

SKYREELS_FRAME_TOKENS = 2040  # 544x960: 68x120 latents, 2x2 patches -> 34x60 tokens per latent frame
SKYREELS_CHUNK_FRAMES = 5  # SkyReels-V2-DF's causal block
WORLDPLAY_CHUNK = 6240  # HY-WorldPlay: a 4-latent-frame chunk of 1,560 tokens per frame
MAGI_CHUNK = 12_150  # MAGI-1-4.5B: one chunk's tokens (jensenkv.bench.gpu)


def skyreels_shape(cached_frames: int) -> GpuShape:
    """SkyReels-V2-1.3B: a 5-frame chunk (10,200 queries) over ``cached_frames`` cached latent frames."""
    chunk = SKYREELS_CHUNK_FRAMES * SKYREELS_FRAME_TOKENS
    return GpuShape(f"skyreels-v2-1.3b {cached_frames} cached frames", 12, 12, chunk,
                    cached_frames * SKYREELS_FRAME_TOKENS, chunk)


def oracle_shapes() -> list[GpuShape]:
    """The issue's real shapes: SkyReels at 21 cached frames, MAGI-1-4.5B (24q/8kv, 1 cached + 3 in flight),
    WorldPlay (16 x 128, 6,240-token chunks over 20 memory frames)."""
    return [skyreels_shape(21),
            GpuShape("magi1-4.5b", 24, 8, MAGI_CHUNK, MAGI_CHUNK, 3 * MAGI_CHUNK),
            GpuShape("worldplay", 16, 16, WORLDPLAY_CHUNK, 5 * WORLDPLAY_CHUNK, WORLDPLAY_CHUNK)]


def kernel_shapes() -> list[GpuShape]:
    """Kernel against SDPA flash: SkyReels at 5, 13 and 21 cached frames, then the other two models."""
    return [skyreels_shape(f) for f in (5, 13, 21)] + oracle_shapes()[1:]


def toy_shape(shape: GpuShape) -> GpuShape:
    """The interpreter-sized stand-in of a shape: the same GQA group and chunk counts, 16-token chunks, d 64."""
    group = shape.heads_q // shape.heads_kv
    heads_kv = 1 if group > 1 else 2
    chunks = math.ceil(shape.cached / shape.queries)
    return GpuShape(f"{shape.name} (toy)", heads_kv * group, heads_kv, 16, 16 * chunks,
                    16 * (shape.in_flight // shape.queries), 64)
