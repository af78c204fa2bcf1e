"""MAGI-1's own node of the generation config (``generation.magi``): its sampling beyond the generator's staircase.

``MagiGenerationNode`` is what the family adds to the run's generation node (``jensenkv.models.config.
RunGenerationConfig``); the MAGI-1 family requires it and every other family refuses it
(``ModelFamily.check_generation``). Pure data: no model code, no torch at import.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from jensenkv.checks import check_choice, check_finite, check_int, fail
from jensenkv.models.family import node_from_dict

T_SCHEDULES = ("sd3", "square", "identity")  # MAGI-1 time schedules


def _default(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


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
        if not 0.0 == self.cfg_t_range[0] <= self.cfg_t_range[-1] <= 1.0:  # guidance_scales' searchsorted rule
            fail("generation.magi.cfg_t_range", self.cfg_t_range, "it must start at 0 and stay in [0, 1]: a chunk "
                 "time below its first entry would have no guidance scale")
        check_choice("generation.magi.t_schedule", self.t_schedule, T_SCHEDULES)
        check_int("generation.magi.null_caption_tokens", self.null_caption_tokens, 1)
        if self.distill_nearly_clean_chunk_threshold is not None and \
                not 0.0 <= self.distill_nearly_clean_chunk_threshold <= 1.0:
            fail("generation.magi.distill_nearly_clean_chunk_threshold", self.distill_nearly_clean_chunk_threshold,
                 "use null or a MAGI time in [0, 1]")
        if self.distill_dt is not None:
            check_finite("generation.magi.distill_dt", self.distill_dt, 0, strict=True)

    DISTILL_FIELDS = ("distill_nearly_clean_chunk_threshold", "distill_prev_chunks_scale", "distill_dt")

    def distill_changes(self) -> list[str]:
        """The distilled-only fields set away from their defaults (a non-distilled model never reads them)."""
        defaults = MagiScheduleConfig.__dataclass_fields__
        return [k for k in self.DISTILL_FIELDS if getattr(self, k) != _default(defaults[k])]

    def validate(self) -> None:
        self.__post_init__()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MagiScheduleConfig:
        return node_from_dict(cls, "generation.magi", values)

    def guidance_scales(self, t: float) -> tuple[float, float]:
        """(prev_chunk_scale, text_scale) of a chunk at MAGI time t (the official searchsorted rule)."""
        import torch

        ranges = torch.tensor(self.cfg_t_range, dtype=torch.float32) - 1e-7
        index = int(torch.searchsorted(ranges, torch.tensor([t], dtype=torch.float32)).item()) - 1
        if not 0 <= index < len(self.prev_chunk_scales):
            raise ValueError(f"chunk time t={t} falls outside generation.magi.cfg_t_range={self.cfg_t_range}")
        return self.prev_chunk_scales[index], self.text_scales[index]


@dataclass
class MagiGenerationNode:
    """The MAGI-1 family's part of the run's generation node: ``generation.magi`` (null for every other family)."""

    magi: Optional[MagiScheduleConfig] = None  # MAGI-1's refresh pass, 3-way / distilled guidance, time schedule

    def __post_init__(self) -> None:
        if isinstance(self.magi, dict):
            self.magi = MagiScheduleConfig.from_dict(self.magi)
