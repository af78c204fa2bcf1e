"""What the processors, the RoPE hook and the adapter share: the attention settings (the config tree's
AttentionConfig) and the forward's layout."""
from __future__ import annotations

from dataclasses import dataclass, field


PROCESSOR_MODES = ("cached", "commit", "full")
BRANCHES = ("cond", "uncond")


@dataclass(frozen=True)
class InFlightChunk:
    """One chunk of a "cached" / "commit" forward.

    index: the chunk's position in the video; step: its denoising step (None for a commit pass);
    kv_range: how many of the most recent preceding chunks it attends to, counting earlier in-flight
        chunks of the same forward first, then cached ones (MAGI-1's k_range; None: all).
    """

    index: int
    step: int | None = None
    kv_range: int | None = None


@dataclass
class ChunkState:
    """What the processors and the RoPE hook need to know about the forward being run (shared by all layers).

    mode: "cached" (denoise over the cache), "commit" (attend like "cached", then commit this forward's
        K/V to the branch's cache) or "full" (no cache: full-sequence block-causal attention, the reference).
    window: the consecutive chunks of a "cached" / "commit" forward, oldest first: one chunk, or the
        chunks in flight of a staircase tick (MAGI-1), each attending to the cache and block-causally to
        the window.
    start_frame: latent frame index of the first frame of the forward's input (shifts RoPE).
    time_quantize: time every commit's quantization into ``quantize_seconds`` (off by default: on CUDA
        it synchronizes the device twice per commit and layer).
    """

    mode: str = "cached"
    branches: tuple[str, ...] = ("cond",)  # the CFG branches of the forward: its batch, split equally, in order
    window: tuple[InFlightChunk, ...] = (InFlightChunk(0),)
    start_frame: int = 0
    frames_per_chunk: int = 1
    tokens_per_frame: int = 1
    probe_records: list[dict] = field(default_factory=list)
    time_quantize: bool = False
    quantize_seconds: float = 0.0

