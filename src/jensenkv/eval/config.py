"""The eval node of the config tree: what a run generates and how it is scored (``eval/`` obeys it)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from jensenkv.checks import check_bool, check_choice, check_int, fail, is_int
from jensenkv.eval.fidelity import LPIPS_BACKBONE_FILES
from jensenkv.eval.vbench import validate_dimensions

# teacher_forced (jensenkv.generation.teacher_forced): each chunk read with the BF16 run's own history, quantized vs full-
# precision cache (per-video tf_psnr, tf_rel_err, tf_latent_rel_err; per chunk in the prompt results). Opt-in: it
# regenerates every chunk twice, so it is not among the defaults.
METRICS = ("psnr", "ssim", "lpips", "vbench", "attention", "content", "teacher_forced")
DEFAULT_METRICS = ("psnr", "ssim", "lpips", "vbench", "attention", "content")


@dataclass
class LpipsConfig:
    net: str = "alex"  # alex (the LPIPS default) | vgg | squeeze; needs the torchvision backbone file

    def __post_init__(self) -> None:
        check_choice("eval.lpips.net", self.net, tuple(LPIPS_BACKBONE_FILES))


@dataclass
class VBenchConfig:
    dimensions: list[str] = field(default_factory=lambda: [  # VBench dimensions scored with metric vbench
        "subject_consistency", "background_consistency", "imaging_quality", "aesthetic_quality",
        "temporal_flickering"])
    device: Optional[str] = None  # null: the run's device; else cpu, cuda or cuda:<n>

    def __post_init__(self) -> None:
        if self.device is not None and not (isinstance(self.device, str)
                                            and re.fullmatch(r"cpu|cuda(:\d+)?", self.device)):
            fail("eval.vbench.device", self.device, "use null (the run's device), cpu, cuda or cuda:<n>")
        validate_dimensions(self.dimensions)
        self.dimensions = list(dict.fromkeys(self.dimensions))


@dataclass
class EvalConfig:
    """What a run generates and how it is scored (configs/eval/*.yaml)."""

    prompts: list[str] = field(default_factory=list)  # the prompts a run generates (configs/eval/*.yaml)
    num_prompts: Optional[int] = None  # use the first n prompts (null: all)
    seeds: list[int] = field(default_factory=lambda: [0])  # every prompt is generated once per seed
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))  # drawn from METRICS
    lpips: LpipsConfig = field(default_factory=LpipsConfig)
    vbench: VBenchConfig = field(default_factory=VBenchConfig)
    fps: int = 8                       # frame rate of the saved mp4 files
    save_videos: bool = True           # keep each quantized video as mp4 next to the run record
    # true: a requested metric or dimension whose weights or packages are absent stops the run before any
    # video is generated (jensenkv.eval.readiness.require_ready); false: it is recorded missing, with the reason
    require_ready: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.prompts, str) or not self.prompts \
                or not all(isinstance(p, str) and p.strip() for p in self.prompts):
            fail("eval.prompts", self.prompts, "must be a non-empty list of non-empty strings")
        check_int("eval.num_prompts", self.num_prompts, 1, optional=True)
        if self.num_prompts is not None and self.num_prompts > len(self.prompts):
            fail("eval.num_prompts", self.num_prompts, f"must be null (all) or an integer in [1, {len(self.prompts)}]")
        if isinstance(self.seeds, str) or not self.seeds or not all(is_int(s) and s >= 0 for s in self.seeds):
            fail("eval.seeds", self.seeds, "must be a non-empty list of integers >= 0")
        if isinstance(self.metrics, str) or any(m not in METRICS for m in self.metrics):
            fail("eval.metrics", self.metrics, f"must be a list drawn from {METRICS}")
        self.metrics = list(dict.fromkeys(self.metrics))
        check_int("eval.fps", self.fps, 1)
        for key in ("save_videos", "require_ready"):
            check_bool(f"eval.{key}", getattr(self, key))

    @property
    def used_prompts(self) -> list[str]:
        return list(self.prompts[:self.num_prompts] if self.num_prompts else self.prompts)

