"""WorldPlay's caches on the suite's ``ChunkedKVCache``: per block a RoPE cache and a ProPE cache, plus text K/V.

What a block holds (one CFG branch; the negative prompt gets its own ``WorldPlayCaches``):
- ``rope[l]``: keys after RMSNorm and RoPE, and values, of the memory frames;
- ``prope[l]``: P^-1 k and P^-1 v of the same frames (WorldPlay stacks the two on the batch axis; here they are
  two caches, each with its own quantizers, steps and correction: different tensors, different statistics);
- ``text[b][l]``: the prompt's (k, v) from the text stream, full precision, attended as current keys (never
  quantized or corrected) unless ``text_as_cache``: then they are stored in ``text_caches[l]`` with the key
  quantizer and attended as a cached segment (quantized and corrected like the video keys).

Memory modes (``MEMORY_MODES``):
- ``rebuild`` (WorldPlay): ``write_memory`` runs the selected clean frames (any sorted frame list, e.g. the
  sink, a retrieved chunk and the recent frames) through one bidirectional pass over [text | context] at the
  given timestep (WorldPlay: stabilization_level - 1 = 14), temporal RoPE positions renumbered 0..n-1; every
  cache is cleared and the pass's K/V committed afresh (quantized again, every chunk).
- ``append`` (QuantVideoGen's variant): the frames must be the whole past 0..n-1; the pass still recomputes
  every frame, but only the frames not yet held are committed, so held frames keep their codes bit for bit.
Frames are committed in groups of ``commit_frames`` (a chunk's 4 latent frames): a commit is one quantizer call.
A rebuild clears the caches (``ChunkedKVCache.clear``): each chunk's memory is quantized as a new video's
would be (QVG's warm start forgotten, the dither counter restarted), and ``cache.sink_chunks=1`` keeps the
memory's first group, frames 0-3 (WorldPlay's sink), in full precision in both modes. ``cache.window_chunks``
is refused: the memory selection decides what is held.

``denoise``: the current frames (temporal RoPE positions n..n+F-1) attend non-causally to
[text | cached memory | current] in both branches through the suite's attention backends, with the correction
on the cached video keys only; the probes see the same inputs.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from jensenkv.attention.backends import get_backend
from jensenkv.attention.config import AttentionConfig, layer_strengths
from jensenkv.attention.videos import attend_videos, probe_videos
from jensenkv.cache import BF16_BYTES, CacheConfig, ChunkedKVCache
from jensenkv.models.worldplay.blocks import VisionQKV, sdpa
from jensenkv.models.worldplay.config import MEMORY_MODES
from jensenkv.models.worldplay.model import CameraInputs, TextInputs, TextKV, WorldPlayTransformer

STREAMS = ("rope", "prope")


class TextStore:
    """The text K/V of one block (every video), held in full precision: its bytes for the memory count."""

    def __init__(self, kv: Sequence[TextKV]):
        self.kv = list(kv)  # per video: (k, v), each (1, H, L_b, D)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)

    @property
    def bf16_nbytes(self) -> int:
        return sum(BF16_BYTES * (k.numel() + v.numel()) for k, v in self.kv)


class WorldPlayCaches:
    """Every cache of one CFG branch of a batch of videos, and the settings that read them."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, cache_config: CacheConfig,
                 attention: AttentionConfig, *, memory: str = "rebuild", commit_frames: int = 4,
                 text_as_cache: bool = False, prope_cache_config: CacheConfig | None = None,
                 device: torch.device | str = "cpu"):
        if memory not in MEMORY_MODES:
            raise ValueError(f"worldplay memory={memory!r} is not allowed: use one of {MEMORY_MODES}")
        if isinstance(commit_frames, bool) or not isinstance(commit_frames, int) or commit_frames < 1:
            raise ValueError(f"commit_frames={commit_frames!r} is not allowed: an integer >= 1")
        if not isinstance(text_as_cache, bool):
            raise ValueError(f"text_as_cache={text_as_cache!r} is not allowed: true or false")
        self.num_layers, self.num_heads, self.head_dim = num_layers, num_heads, head_dim
        self.memory = memory
        self.commit_frames = commit_frames
        self.text_as_cache = text_as_cache
        self.device = device
        self.configure(cache_config, attention, prope_cache_config)

    # settings ------------------------------------------------------------------------------------------
    def configure(self, cache_config: CacheConfig | None = None, attention: AttentionConfig | None = None,
                  prope_cache_config: CacheConfig | None = None) -> None:
        """Swap settings (None: keep); clears every cache. The ProPE cache uses ``cache_config`` unless given."""
        cache_config = cache_config or self.cache_config
        attention = attention or self.attention
        prope = prope_cache_config or getattr(self, "_prope_given", None) or cache_config
        attention.validate()
        configs = []
        for cfg in (cache_config, prope):
            if cfg.window_chunks is not None:
                raise ValueError(f"cache.window_chunks={cfg.window_chunks} is not allowed for HY-WorldPlay: its memory "
                                 "selection decides which frames are held (set generation.worldplay.memory_frames)")
            cfg.key.validate(self.head_dim)
            cfg.value.validate(self.head_dim)
            if attention.probes and not cfg.keep_reference:
                cfg = replace(cfg, keep_reference=True)  # probes compare with the full-precision cache
            configs.append(cfg)
        self._prope_given = prope_cache_config or getattr(self, "_prope_given", None)
        self.cache_config, self.prope_cache_config = configs
        self.attention = attention
        self.strengths = layer_strengths(attention, self.num_layers, self.num_heads, self.device)
        self.reset()

    def reset(self) -> None:
        """A new video: no text, no memory, fresh quantizers, no probes."""
        self.rope = [ChunkedKVCache(self.cache_config, self.head_dim) for _ in range(self.num_layers)]
        self.prope = [ChunkedKVCache(self.prope_cache_config, self.head_dim) for _ in range(self.num_layers)]
        self.text_caches: list[ChunkedKVCache] = []
        self.text: list[TextStore] = []
        self.frames: list[int] = []
        self.probe_records: list[dict] = []
        self.quantize_seconds = 0.0
        self.writes = 0  # memory passes so far (one per chunk after the first)

    # what is held --------------------------------------------------------------------------------------
    def video_caches(self) -> list[ChunkedKVCache]:
        """The RoPE and ProPE caches of every block (2 x num_layers)."""
        return self.rope + self.prope

    def stores(self) -> list:
        """Everything held, each with ``nbytes`` / ``bf16_nbytes``: the video caches and the text K/V."""
        return self.video_caches() + (self.text_caches if self.text_as_cache else self.text)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.stores())

    @property
    def bf16_nbytes(self) -> int:
        return sum(s.bf16_nbytes for s in self.stores())

    @property
    def num_frames(self) -> int:
        """Frames in memory: the current chunk's first temporal RoPE position."""
        return len(self.frames)

    # text ----------------------------------------------------------------------------------------------
    def set_text(self, model: WorldPlayTransformer, text: TextInputs) -> None:
        """Run the text stream once (t = 0) and keep every block's text K/V; clears the memory."""
        videos = model.text_stream(text)  # [video][layer] -> (k, v)
        self.reset()
        self.text = [TextStore([videos[b][layer] for b in range(len(videos))]) for layer in range(self.num_layers)]
        if self.text_as_cache:
            lengths = {k.shape[2] for k, _ in self.text[0].kv}
            if len(lengths) > 1:
                raise ValueError(f"text_as_cache with prompts of different lengths {sorted(lengths)} is not allowed: "
                                 "a cache holds one length per commit")
            self.text_caches = [ChunkedKVCache(self.cache_config, self.head_dim) for _ in range(self.num_layers)]
            for layer, store in enumerate(self.text):
                k = torch.cat([k for k, _ in store.kv])  # (B, H, L, D)
                v = torch.cat([v for _, v in store.kv])
                self.text_caches[layer].reserve_chunks(1, k.shape[2])  # the prompt is its one commit
                self.text_caches[layer].commit(k, v)

    def _text_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The block's text (k, v) stacked over the batch (B, H, L, D), or None when the lengths differ."""
        kv = self.text[layer].kv
        if len({k.shape[2] for k, _ in kv}) > 1:
            return None
        return torch.cat([k for k, _ in kv]), torch.cat([v for _, v in kv])

    # memory pass ---------------------------------------------------------------------------------------
    def write_memory(self, model: WorldPlayTransformer, x: torch.Tensor, frames: Sequence[int], camera: CameraInputs,
                     timestep: float | torch.Tensor) -> None:
        """The context pass: x (B, 2C+1, n, H, W) the clean frames ``frames`` (sorted frame indices) with their
        condition channels, camera per frame; one bidirectional pass over [text | context] at ``timestep``
        (WorldPlay: 14), RoPE positions 0..n-1; commits per the memory mode (see the module docstring)."""
        frames = [int(f) for f in frames]
        if not self.text:
            raise ValueError("write_memory before set_text is not allowed: the context attends to the prompt")
        if frames != sorted(set(frames)) or not frames:
            raise ValueError(f"memory frames={frames} are not allowed: a non-empty, strictly increasing list")
        if x.shape[2] != len(frames):
            raise ValueError(f"x with {x.shape[2]} frames is not allowed: {len(frames)} memory frames given")
        if self.memory == "append" and (frames != list(range(len(frames))) or len(frames) < len(self.frames)):
            raise ValueError(f"memory frames={frames} are not allowed in append mode: the whole past 0..n-1, "
                             f"n >= {len(self.frames)} held")
        new = list(range(len(frames))) if self.memory == "rebuild" else \
            [i for i, f in enumerate(frames) if f not in set(self.frames)]
        tokens = x.shape[3] * x.shape[4] // (model.config.patch_size[1] * model.config.patch_size[2])
        if self.memory == "rebuild":
            for cache in self.video_caches():
                cache.clear()
            self.reserve_memory(len(frames), tokens)  # this write's frames are all the caches will hold
        groups = [new[i:i + self.commit_frames] for i in range(0, len(new), self.commit_frames)]

        def attend(layer: int, qkv: VisionQKV) -> tuple[torch.Tensor, torch.Tensor]:
            o = self._text_attention(layer, qkv.q, qkv.k, qkv.v)
            o_prope = self._text_attention(layer, qkv.q_prope, qkv.k_prope, qkv.v_prope)
            for group in groups:
                rows = slice(group[0] * tokens, (group[-1] + 1) * tokens)  # groups are contiguous in memory order
                self.store_group(layer, *(t[:, :, rows] for t in (qkv.k, qkv.v, qkv.k_prope, qkv.v_prope)))
            return o, o_prope

        model.vision_forward(x, timestep, camera, range(len(frames)), attend, final=False)
        self.frames = frames
        self.writes += 1

    def reserve_memory(self, frames: int, tokens_per_frame: int) -> None:
        """Size every video cache for a memory of ``frames`` frames, committed in groups of ``commit_frames``
        (the first ``cache.sink_chunks`` groups in the sink buffers)."""
        groups = [min(self.commit_frames, frames - s) * tokens_per_frame for s in range(0, frames, self.commit_frames)]
        for cache in self.video_caches():
            sinks = cache.cfg.sink_chunks
            cache.reserve(sum(groups[sinks:]), sum(groups[:sinks]))

    def _text_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Full-precision attention of q (B, H, S, D) over [text | k]: the context pass (WorldPlay's SDPA)."""
        rows = self._text_rows(layer)
        if rows is not None:
            return sdpa(q, torch.cat([rows[0].to(k.dtype), k], 2), torch.cat([rows[1].to(v.dtype), v], 2))
        outs = []
        for b, (tk, tv) in enumerate(self.text[layer].kv):
            own = slice(b, b + 1)
            outs.append(sdpa(q[own], torch.cat([tk.to(k.dtype), k[own]], 2), torch.cat([tv.to(v.dtype), v[own]], 2)))
        return torch.cat(outs)

    def store_group(self, layer: int, k: torch.Tensor, v: torch.Tensor, k_prope: torch.Tensor, v_prope: torch.Tensor) -> None:
        """Commit one group of frames (B, H, S_g, D each) to the block's two caches, each quantized on its own."""
        self._commit(self.rope[layer], k, v)
        self._commit(self.prope[layer], k_prope, v_prope)

    def segments(self, layer: int, stream: str) -> list:
        """The block's cached memory of one stream ("rope" | "prope"), oldest first."""
        return (self.rope if stream == "rope" else self.prope)[layer].segments()

    def _commit(self, cache: ChunkedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        start = time.perf_counter()
        cache.commit(k, v)  # (B, H, group tokens, D) each: quantized once, here (per video)
        if k.is_cuda:
            torch.cuda.synchronize(k.device)
        self.quantize_seconds += time.perf_counter() - start

    # denoising -----------------------------------------------------------------------------------------
    def denoise(self, model: WorldPlayTransformer, x: torch.Tensor, timesteps: float | torch.Tensor,
                camera: CameraInputs, *, step: int | None = None, chunk: int | None = None,
                branch: str = "cond") -> torch.Tensor:
        """The current frames x (B, 2C+1, F, H, W) at ``timesteps`` (float, (B,) or (B, F)) -> velocity
        (B, out, F, H, W): RoPE positions n..n+F-1 (n frames in memory); keys [text | memory | current].
        ``step`` / ``chunk`` / ``branch`` label the probe records (probes only when ``step`` is given)."""
        if not self.text:
            raise ValueError("denoise before set_text is not allowed: the chunk attends to the prompt")
        fn = get_backend(self.attention.backend)
        n = self.num_frames

        def attend(layer: int, qkv: VisionQKV) -> tuple[torch.Tensor, torch.Tensor]:
            outs = []
            for stream, (q, k, v) in zip(STREAMS, ((qkv.q, qkv.k, qkv.v), (qkv.q_prope, qkv.k_prope, qkv.v_prope))):
                segments = self.segments(layer, stream)
                outs.append(self._cached_attention(fn, layer, q, k, v, segments, step, chunk, branch, stream))
            return outs[0], outs[1]

        return model.vision_forward(x, timesteps, camera, range(n, n + x.shape[2]), attend)

    def _cached_attention(self, fn, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list,
                          step: int | None, chunk: int | None, branch: str, stream: str) -> torch.Tensor:
        """q (B, H, S, D) over [text | segments | current k, v]; text as current keys (never corrected) or, with
        ``text_as_cache``, as the first cached segment."""
        strength = self.strengths[layer]
        probing = step is not None and self.attention.probes_at(layer, step)
        if self.text_as_cache:
            segments = self.text_caches[layer].segments() + segments
            parts = [(q, k, v, segments)]
        else:
            rows = self._text_rows(layer)
            if rows is not None:
                parts = [(q, torch.cat([rows[0].to(k.dtype), k], 2), torch.cat([rows[1].to(v.dtype), v], 2), segments)]
            else:  # prompts of different lengths: one video at a time, each on its own stored rows
                parts = [(q[b:b + 1], torch.cat([tk.to(k.dtype), k[b:b + 1]], 2), torch.cat([tv.to(v.dtype), v[b:b + 1]], 2),
                          [s.video(b) for s in segments]) for b, (tk, tv) in enumerate(self.text[layer].kv)]
        outs = []
        for b, (q_b, k_b, v_b, segs) in enumerate(parts):
            outs.append(attend_videos(fn, q_b, k_b, v_b, segs, self.attention, strength))
            if probing and segs:
                for record in probe_videos(q_b, k_b, v_b, segs, self.attention, strength, outs[-1], step=step):
                    if len(parts) > 1:
                        record["sample"] = b
                    self.probe_records.append({"layer": layer, "step": step, "chunk": chunk, "branch": branch,
                                               "stream": stream, **record})
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def memory_bytes(num_layers: int, num_heads: int, head_dim: int, cache_config: CacheConfig, memory_frames: int,
                 tokens_per_frame: int, *, commit_frames: int = 4, batch: int = 1,
                 prope_cache_config: CacheConfig | None = None) -> dict[str, int]:
    """Bytes the video caches hold for ``memory_frames`` frames, from the settings alone (no model run):
    {"stored": both streams' K and V as stored, "bf16": the same in BF16}, per CFG branch. Frames are
    committed in groups of ``commit_frames`` (the last group may be shorter), as ``write_memory`` does.
    Exact for the quantizers whose bytes ``quant.budget.bits_per_element`` states (all of the suite's)."""
    from jensenkv.quant.budget import bits_per_element

    groups = [min(commit_frames, memory_frames - s) * tokens_per_frame for s in range(0, memory_frames, commit_frames)]
    slices = num_layers * batch * num_heads  # (layer, video, head) slices of one stream
    stored = 0.0
    for cfg in (cache_config, prope_cache_config or cache_config):
        for tokens in groups:
            for q in (cfg.key, cfg.value):
                stored += bits_per_element(q, head_dim, tokens) * tokens * head_dim * slices / 8
    bf16 = 2 * 2 * BF16_BYTES * slices * memory_frames * tokens_per_frame * head_dim  # streams, K+V
    return {"stored": round(stored), "bf16": bf16}
