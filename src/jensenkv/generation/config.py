"""The loop's node of the config tree: how one video is sampled chunk by chunk (``generation.loop`` obeys it).

A family's own generation settings (MAGI-1's ``generation.magi``, HY-WorldPlay's ``generation.worldplay``) live
in its package; the run's node composes them with this one (``jensenkv.models.config.RunGenerationConfig``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from jensenkv.checks import check_choice, check_finite, check_int, fail, is_int

SAMPLERS = ("euler", "x0_renoise")


def check_kv_range(value: Any, key: str = "generation.kv_range") -> None:
    """A kv-range is null (no limit) or an integer >= 0 (number of visible cached chunks)."""
    check_int(key, value, 0, optional=True)


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

    num_chunks: int = 4                # chunks generated one after the other: the video's length
    frames_per_chunk: int = 2          # (latent) frames of one chunk
    steps: int = 10                    # denoising steps per chunk
    shift: float = 2.0                 # flow-matching timestep shift (larger: more time at high noise)
    guidance_scale: float = 1.0
    sampler: str = "euler"
    kv_range: Optional[list[Optional[int]]] = None
    commit_kv_range: Optional[int] = None
    negative_prompt: str = ""          # the unconditional branch's prompt of classifier-free guidance
    window_size: int = 1
    batch_size: Any = "auto"  # int >= 1 or "auto"; how the videos are run, not what they are

    def __post_init__(self) -> None:
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

    EXECUTION_FIELDS: ClassVar[tuple[str, ...]] = ("batch_size",)  # how the videos are run: no video depends on them
    # fields added after the committed run ids (a composed node's late families): absent unless set, so they stay
    LATER_FIELDS: ClassVar[tuple[str, ...]] = ()

    def sampling(self) -> dict[str, Any]:
        """The fields that decide the videos (what run ids and calibration files record)."""
        values = dataclasses.asdict(self)
        for name in self.EXECUTION_FIELDS:
            values.pop(name)
        for name in self.LATER_FIELDS:
            if values[name] is None:
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

