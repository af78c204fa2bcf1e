"""HY-WorldPlay's KV cache at 480p: stored bytes per chunk and held memory, measured through its real caches.

Geometry (configs/model/worldplay_8b_distilled.yaml): 832 x 480 video -> 30 x 52 = 1,560 tokens per latent
frame, 54 blocks of 16 heads x 128, chunks of 4 latent frames, 8 chunks, memory of at most 20 frames. Each
block holds two caches (``WorldPlayCaches.rope`` and ``.prope``), each with K and V.

``held(...)`` runs in a fresh process (``python -m jensenkv.bench.worldplay_memory held bf16|rtn rebuild|append``,
started by ``jensenkv.bench.memory.measure`` with glibc's mmap threshold fixed so a freed buffer leaves RSS at
once; it prints one JSON line). It builds a ``WorldPlayCaches`` of ``layers`` blocks and
replays the memory writes of a whole video before each chunk, committing random K/V of the real size through
``store_group`` in groups of 4 frames, both streams: ``rebuild`` clears the caches and commits every selected
frame again (min(4c, 20) frames before chunk c, as WorldPlay's selection holds), ``append`` commits only the
frames not yet held (4c); each cache is sized as generation sizes it (``WorldPlayCaches.reserve_memory``: per
write in ``rebuild``, the final memory up front in ``append``). No transformer runs (its 8B weights do not fit
here); the bytes do not depend on the values. After the last write (before the last chunk) it reports the
caches' ``nbytes``, the storage bytes of the tensors they reach, and the RSS growth over a baseline taken
after a warm-up. 54 blocks in BF16 (13.5 GiB rebuild, 18.8 GiB append) do not fit the bench machine, so the
suite measures one block and scales by 54 (every block holds the same shapes). The text K/V (full precision,
a few hundred tokens) are not included, as in ``memory_bytes``.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import torch

from jensenkv.bench.memory import rss_bytes, tensor_bytes


@dataclass(frozen=True)
class WorldPlayGeometry:
    """The cache's shape: ``layers`` blocks of ``heads`` x ``head_dim``, ``frame_tokens`` per latent frame."""

    layers: int = 54
    heads: int = 16
    head_dim: int = 128
    frame_tokens: int = 30 * 52  # 480 x 832 / (VAE stride 16) / (patch 1 x 1)
    chunk_frames: int = 4
    chunks: int = 8
    memory_frames: int = 20

    def held_frames(self, chunk: int, memory: str) -> int:
        """Frames in memory before chunk ``chunk`` (0-based): all of the past, capped in ``rebuild``."""
        past = chunk * self.chunk_frames
        return min(past, self.memory_frames) if memory == "rebuild" else past

    def describe(self) -> str:
        return (f"{self.layers} layers x 2 streams, {self.heads} heads x {self.head_dim}, "
                f"{self.frame_tokens} tokens/frame, {self.chunks} chunks of {self.chunk_frames} frames")


WORLDPLAY_480P = WorldPlayGeometry()
TOY = WorldPlayGeometry(layers=2, heads=2, head_dim=64, frame_tokens=16, chunks=4, memory_frames=8)
QUANTS = (("bf16", {}), ("rtn", {"bits": 2, "group_size": 32}))  # the suite's BF16 and RTN INT2 g=32 presets


def held(geometry: WorldPlayGeometry, quant: str, memory: str, measured_layers: int) -> dict:
    """Replay one video's memory writes into ``measured_layers`` real blocks; bytes after the last write."""
    from jensenkv.attention.config import AttentionConfig
    from jensenkv.bench.presets import preset
    from jensenkv.models.worldplay.cache import WorldPlayCaches, memory_bytes

    g = geometry
    overrides = dict(dict(QUANTS)[quant])
    cfg = preset(quant, g.head_dim, **overrides)
    gen = torch.Generator().manual_seed(0)

    def group(frames: int) -> list[torch.Tensor]:  # k, v, k_prope, v_prope: (1, H, frames x tokens, D)
        return [torch.randn(1, g.heads, frames * g.frame_tokens, g.head_dim, generator=gen) for _ in range(4)]

    warm = WorldPlayCaches(1, g.heads, g.head_dim, cfg, AttentionConfig(), memory=memory)  # load kernels, pools
    warm.store_group(0, *(t[:, :, :64] for t in group(1)))
    del warm
    before = rss_bytes()
    caches = WorldPlayCaches(measured_layers, g.heads, g.head_dim, cfg, AttentionConfig(), memory=memory,
                             commit_frames=g.chunk_frames)
    if memory == "append":  # as the adapter's reserve_caches: the final memory, sized when the video starts
        caches.reserve_memory(g.held_frames(g.chunks - 1, memory), g.frame_tokens)
    chunk_bytes = []
    for chunk in range(1, g.chunks):  # the memory write before chunk `chunk` (chunk 0 has no memory)
        n = g.held_frames(chunk, memory)
        if memory == "rebuild":  # as write_memory: clear, then commit every selected frame afresh
            for cache in caches.video_caches():
                cache.clear()
            caches.reserve_memory(n, g.frame_tokens)  # this write's frames, sized before they are committed
            new = range(n)
        else:  # only the frames not yet held; held ones keep their codes
            new = range(len(caches.frames), n)
        new = list(new)
        for start in range(0, len(new), g.chunk_frames):
            frames = min(g.chunk_frames, len(new) - start)
            before_group = caches.nbytes
            for layer in range(measured_layers):
                k, v, kp, vp = group(frames)
                caches.store_group(layer, k, v, kp, vp)
                del k, v, kp, vp
            if frames == g.chunk_frames:
                chunk_bytes.append(caches.nbytes - before_group)
        caches.frames = list(range(n))
    growth = rss_bytes() - before
    stores = caches.video_caches()
    frames = caches.num_frames
    theory = memory_bytes(measured_layers, g.heads, g.head_dim, cfg, frames, g.frame_tokens,
                          commit_frames=g.chunk_frames)
    return {"frames": frames, "measured_layers": measured_layers, "rss_growth": growth,
            "live": tensor_bytes(stores), "stored": sum(c.nbytes for c in stores),
            "held_nbytes": sum(c.held_nbytes for c in stores), "bf16": sum(c.bf16_nbytes for c in stores),
            "memory_bytes": theory["stored"], "memory_bytes_bf16": theory["bf16"],
            "chunk_bytes_min": min(chunk_bytes), "chunk_bytes_max": max(chunk_bytes)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    cmd = sub.add_parser("held")
    cmd.add_argument("quant", choices=[q for q, _ in QUANTS])
    cmd.add_argument("memory", choices=["rebuild", "append"])
    cmd.add_argument("--layers", type=int, default=1, help="blocks measured (the bench row scales them)")
    cmd.add_argument("--toy", action="store_true", help="the toy geometry (the quick run)")
    args = parser.parse_args(argv)
    if args.layers < 1:
        parser.error(f"--layers={args.layers} is not allowed: it must be >= 1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))
    print(json.dumps(held(TOY if args.toy else WORLDPLAY_480P, args.quant, args.memory, args.layers)))


if __name__ == "__main__":
    main()
