"""VBench dimensions through VBench's own code (``from vbench import VBench``, mode="custom_input").

VBench's ``init_submodules`` shells out to ``wget`` / ``git clone`` whenever a weight file is missing. So
before calling it, every requested dimension is checked here: its weight files under ``$VBENCH_CACHE_DIR``
(VBench's local mode, ``local=True``) and the Python packages its scorer imports. Dimensions that fail
the check are reported missing with the reason and never reach VBench; the aggregate score is the mean
(x100) over the dimensions that ran, and the record says which those were. ``temporal_flickering`` needs
no weights and always runs.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Weight files VBench reads in local mode, relative to $VBENCH_CACHE_DIR (vbench 0.1.5 utils.init_submodules).
DIMENSION_FILES: dict[str, tuple[str, ...]] = {
    "subject_consistency": ("dino_model/facebookresearch_dino_main/hubconf.py",
                            "dino_model/dino_vitbase16_pretrain.pth"),
    "background_consistency": ("clip_model/ViT-B-32.pt",),
    "aesthetic_quality": ("clip_model/ViT-L-14.pt", "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth"),
    "imaging_quality": ("pyiqa_model/musiq_spaq_ckpt-358bb6af.pth",),
    "motion_smoothness": ("amt_model/amt-s.pth",),
    "dynamic_degree": ("raft_model/models/raft-things.pth",),
    "temporal_style": ("ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"),
    "overall_consistency": ("ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"),
    "human_action": ("umt_model/l16_ptk710_ftk710_ftk400_f16_res224.pth",),
    "temporal_flickering": (),
}
# VBench refuses these in custom_input mode: they need its own prompt suite and auxiliary info.
STANDARD_ONLY_DIMENSIONS = ("object_class", "multiple_objects", "color", "spatial_relationship", "scene",
                            "appearance_style")
ALL_DIMENSIONS = tuple(DIMENSION_FILES) + STANDARD_ONLY_DIMENSIONS
DEFAULT_DIMENSIONS = ("subject_consistency", "background_consistency", "imaging_quality", "aesthetic_quality",
                      "temporal_flickering")


def validate_dimensions(dimensions: Sequence[str]) -> None:
    """Config check (before any work): every name must be a VBench dimension."""
    if isinstance(dimensions, str) or not all(isinstance(d, str) for d in dimensions):
        raise ValueError(f"eval.vbench.dimensions={dimensions!r} is not allowed: a list of dimension names")
    for dim in dimensions:
        if dim not in ALL_DIMENSIONS:
            raise ValueError(f"eval.vbench.dimensions contains {dim!r}, which is not allowed: choose from "
                             f"{list(ALL_DIMENSIONS)}")


def vbench_cache_dir() -> Path:
    """The directory VBench reads weights from: $VBENCH_CACHE_DIR, default ~/.cache/vbench.

    VBench freezes it at import (``vbench.utils.CACHE_DIR``); when vbench is already imported that value is
    the one it will use, so it wins.
    """
    utils = sys.modules.get("vbench.utils")
    if utils is not None:
        return Path(utils.CACHE_DIR)
    return Path(os.environ.get("VBENCH_CACHE_DIR") or Path.home() / ".cache" / "vbench")


def dimension_missing_reason(dimension: str, cache_dir: Path | None = None) -> str | None:
    """Why a dimension cannot run here (None when it can). Checks files and imports; downloads nothing."""
    if dimension in STANDARD_ONLY_DIMENSIONS:
        return (f"VBench refuses {dimension} in custom_input mode (it needs VBench's standard prompt suite and "
                "auxiliary info)")
    if dimension not in DIMENSION_FILES:
        return f"{dimension} is not a VBench dimension"
    try:
        importlib.import_module(f"vbench.{dimension}")
    except Exception as e:  # noqa: BLE001 - any import failure means the scorer cannot run
        return f"VBench's {dimension} scorer cannot be imported ({type(e).__name__}: {e})"
    cache_dir = cache_dir if cache_dir is not None else vbench_cache_dir()
    absent = [rel for rel in DIMENSION_FILES[dimension] if not (cache_dir / rel).exists()]
    if absent:
        return (f"weights missing under VBENCH_CACHE_DIR={cache_dir}: {', '.join(absent)} "
                "(run `make fetch-weights` on a machine with internet)")
    return None


@dataclass
class VBenchResult:
    """Per-dimension mean scores in [0, 1], per-video scores, what was missing and why."""

    scores: dict[str, float] = field(default_factory=dict)          # dimension -> mean over videos
    per_video: dict[str, dict[str, float]] = field(default_factory=dict)  # dimension -> {video file: score}
    missing: dict[str, str] = field(default_factory=dict)           # dimension -> reason

    @property
    def used(self) -> list[str]:
        return sorted(self.scores)

    @property
    def aggregate(self) -> float | None:
        """Mean of the available dimensions, x100 (VBench's percentage convention); None if none ran."""
        if not self.scores:
            return None
        return 100.0 * sum(self.scores.values()) / len(self.scores)


def evaluate_vbench(videos: Mapping[str, str], dimensions: Sequence[str], device: str = "cpu",
                    work_dir: str | os.PathLike | None = None) -> VBenchResult:
    """Score mp4 files with VBench, one call for all available dimensions.

    videos: {path to an .mp4 file: its prompt}; all files must sit in one directory, which must hold no
        other videos (VBench's custom_input mode scores the whole directory).
    """
    validate_dimensions(dimensions)
    result = VBenchResult()
    runnable = []
    for dim in dict.fromkeys(dimensions):
        reason = dimension_missing_reason(dim)
        if reason is None:
            runnable.append(dim)
        else:
            result.missing[dim] = reason
    if not runnable or not videos:
        return result
    folders = {str(Path(p).resolve().parent) for p in videos}
    if len(folders) != 1:
        raise ValueError(f"videos={list(videos)} is not allowed: VBench scores one folder, got {sorted(folders)}")
    folder = Path(folders.pop())

    from vbench import VBench

    full_info = Path(importlib.import_module("vbench").__file__).parent / "VBench_full_info.json"
    with tempfile.TemporaryDirectory(dir=work_dir) as out_dir:
        bench = VBench(device, str(full_info), out_dir)
        bench.evaluate(videos_path=str(folder), name="run", prompt_list={Path(p).name: t for p, t in videos.items()},
                       dimension_list=runnable, local=True, mode="custom_input")
        with open(Path(out_dir) / "run_eval_results.json") as f:
            raw = json.load(f)
    for dim in runnable:
        mean, rows = raw[dim]
        result.scores[dim] = float(mean)
        result.per_video[dim] = {Path(r["video_path"]).name: float(r["video_results"]) for r in rows}
    return result
