"""The generation node of the config tree: how one video is sampled chunk by chunk (``generate.py`` obeys it),
and MAGI-1's schedule options beyond the staircase (``generation.magi``, which the MAGI-1 family requires)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from jensenkv.checks import check_choice, check_finite, check_int, fail, is_int

SAMPLERS = ("euler", "x0_renoise")
T_SCHEDULES = ("sd3", "square", "identity")  # MAGI-1 time schedules


def check_kv_range(value: Any, key: str = "generation.kv_range") -> None:
    """A kv-range is null (no limit) or an integer >= 0 (number of visible cached chunks)."""
    check_int(key, value, 0, optional=True)


@dataclass
class MagiScheduleConfig:
    """MAGI-1 sampling beyond the generator's staircase (``generation.magi``; official runtime/engine names).

    cfg_number: 3 = cond (text + cache), prefix (null caption + cache, the only pass that writes the cache)
        and uncond (null caption, each chunk alone); 1 = one pass that writes the cache (distilled models).
    cfg_t_range / prev_chunk_scales / text_scales: piecewise guidance scales by each chunk's MAGI time
        (0 = noise, 1 = clean): v = (1 - p) u + (p - s) prefix + s cond.
    clean_t: the time at which a finished chunk is re-run (null caption) to write its K/V to the cache.
    t_schedule: "sd3" (linspace^2 then the SD3 shift, MAGI's default) | "square" | "identity".
    distill_nearly_clean_chunk_threshold / distill_prev_chunks_scale: distilled models re-run the oldest
        in-flight chunk alone once its time exceeds the threshold and mix the outputs
        scale * (with context) + (1 - scale) * (alone); None disables it.
    """

    cfg_number: int = 3
    cfg_t_range: list[float] = field(default_factory=lambda: [0.0, 0.0217, 0.1, 0.3, 0.999])
    prev_chunk_scales: list[float] = field(default_factory=lambda: [1.5, 1.5, 1.5, 1.0, 1.0])
    text_scales: list[float] = field(default_factory=lambda: [7.5, 7.5, 7.5, 0.0, 0.0])
    clean_t: float = 0.9999
    t_schedule: str = "sd3"
    distill_nearly_clean_chunk_threshold: Optional[float] = 0.3
    distill_prev_chunks_scale: float = 0.7
    null_caption_tokens: int = 50       # valid tokens of the null caption in cross-attention
    distill_dt: Optional[float] = None  # distilled models' shortcut step input; None: steps / 4 * 2 (official)

    def __post_init__(self) -> None:
        for key in ("cfg_t_range", "prev_chunk_scales", "text_scales"):
            setattr(self, key, [float(x) for x in getattr(self, key)])
        check_choice("generation.magi.cfg_number", self.cfg_number, (1, 3))
        n = len(self.cfg_t_range)
        if n < 1 or len(self.prev_chunk_scales) != n or len(self.text_scales) != n:
            fail("generation.magi.cfg_t_range / prev_chunk_scales / text_scales",
                 (n, len(self.prev_chunk_scales), len(self.text_scales)), "they need the same length >= 1")
        if self.cfg_t_range != sorted(self.cfg_t_range):
            fail("generation.magi.cfg_t_range", self.cfg_t_range, "it must be ascending")
        if not (isinstance(self.clean_t, (int, float)) and 0.0 <= self.clean_t <= 1.0):
            fail("generation.magi.clean_t", self.clean_t, "it must be in [0, 1]")
        check_choice("generation.magi.t_schedule", self.t_schedule, T_SCHEDULES)
        check_int("generation.magi.null_caption_tokens", self.null_caption_tokens, 1)

    def validate(self) -> None:
        self.__post_init__()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MagiScheduleConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            fail("generation.magi", unknown, f"unknown keys; allowed: {sorted(known)}")
        return cls(**dict(values))

    def guidance_scales(self, t: float) -> tuple[float, float]:
        """(prev_chunk_scale, text_scale) of a chunk at MAGI time t (the official searchsorted rule)."""
        import torch

        ranges = torch.tensor(self.cfg_t_range, dtype=torch.float32) - 1e-7
        index = int(torch.searchsorted(ranges, torch.tensor([t], dtype=torch.float32)).item()) - 1
        if not 0 <= index < len(self.prev_chunk_scales):
            raise ValueError(f"chunk time t={t} falls outside generation.magi.cfg_t_range={self.cfg_t_range}")
        return self.prev_chunk_scales[index], self.text_scales[index]


@dataclass
class GenerationConfig:
    """How one video is sampled chunk by chunk (model presets in configs/model/ set their own).

    kv_range: optional per-denoising-stage limit on the number of preceding chunks a chunk may attend to:
        the most recent ones, earlier in-flight chunks first (window_size > 1), then the ones the cache shows;
        ``None`` entries mean no limit. The steps are split into ``len(kv_range)`` equal stages, e.g.
        MAGI-1's noise2clean_kvrange=[5, 4, 3, 2] (which counts the chunk itself) is ``kv_range=[4, 3, 2, 1]``.
        A limit larger than the chunks that exist shows all of them.
    commit_kv_range: the same limit (cached chunks) for the clean commit pass.
    window_size: chunks denoised concurrently in MAGI-1's pipelined staircase (1: one chunk at a time).
        It must divide ``steps``; chunk i is ``steps // window_size`` steps ahead of chunk i + 1.
    sampler: "euler" (x <- x + (t_next - t) v) or "x0_renoise" (predict x0, re-noise to t_next with
        fresh noise; the few-step consistency / DMD sampler of Self-Forcing).
    guidance_scale: classifier-free guidance; 1.0 disables it (and the "uncond" caches).
    batch_size: videos generated together in one forward per step, each exactly what it is alone (its own
        noise, cache and probes): an integer >= 1, or "auto" (the model family's choice for the device:
        ``ModelFamily.auto_batch_size``). A batch larger than the run's videos is clipped to them. It changes
        no video, so run ids leave it out (``sampling``).
    """

    num_chunks: int = 4
    frames_per_chunk: int = 2
    steps: int = 10
    shift: float = 2.0
    guidance_scale: float = 1.0
    sampler: str = "euler"
    kv_range: Optional[list[Optional[int]]] = None
    commit_kv_range: Optional[int] = None
    negative_prompt: str = ""
    window_size: int = 1
    magi: Optional[MagiScheduleConfig] = None  # MAGI-1's refresh pass, 3-way / distilled guidance, time schedule
    batch_size: Any = "auto"  # int >= 1 or "auto"; how the videos are run, not what they are

    def __post_init__(self) -> None:
        if isinstance(self.magi, dict):
            self.magi = MagiScheduleConfig.from_dict(self.magi)
        for key in ("num_chunks", "frames_per_chunk", "steps", "window_size"):
            check_int(f"generation.{key}", getattr(self, key), 1)
        if self.steps % self.window_size:
            fail("generation.window_size", self.window_size, f"it must divide generation.steps={self.steps} "
                 "(each in-flight chunk is steps // window_size steps ahead of the next)")
        check_finite("generation.shift", self.shift, 0, strict=True)
        check_finite("generation.guidance_scale", self.guidance_scale, 0)
        check_choice("generation.sampler", self.sampler, SAMPLERS)
        if self.kv_range is not None:
            if isinstance(self.kv_range, (str, bytes)) or not 1 <= len(self.kv_range) <= self.steps:
                fail("generation.kv_range", self.kv_range,
                     f"use null or a list of 1..steps={self.steps} entries (one per denoising stage)")
            self.kv_range = list(self.kv_range)
            for r in self.kv_range:
                check_kv_range(r)
        check_kv_range(self.commit_kv_range, "generation.commit_kv_range")
        if not isinstance(self.negative_prompt, str):
            fail("generation.negative_prompt", self.negative_prompt, "must be a string")
        if self.batch_size != "auto" and not (is_int(self.batch_size) and self.batch_size >= 1):
            fail("generation.batch_size", self.batch_size, 'use "auto" or an integer >= 1 (videos per forward)')

    def validate(self) -> None:
        """Re-check after a field was changed in place (construction already checks)."""
        self.__post_init__()

    EXECUTION_FIELDS = ("batch_size",)  # how the videos are run: no video depends on them

    def sampling(self) -> dict[str, Any]:
        """The fields that decide the videos (what run ids and calibration files record)."""
        values = dataclasses.asdict(self)
        for name in self.EXECUTION_FIELDS:
            values.pop(name)
        return values

    @property
    def use_cfg(self) -> bool:
        return self.guidance_scale != 1.0

    def kv_range_at(self, step: int) -> int | None:
        """The kv-range of denoising step ``step`` (0-based): stage = step * stages // steps."""
        if self.kv_range is None:
            return None
        return self.kv_range[step * len(self.kv_range) // self.steps]

