"""VBench dimensions through VBench's own code (``from vbench import VBench``, mode="custom_input").

VBench's ``init_submodules`` shells out to ``wget`` / ``git clone`` whenever a weight file is missing. So
before calling it, every requested dimension is checked here: its weight files under ``$VBENCH_CACHE_DIR``
(VBench's local mode, ``local=True``), the files its model code reads from the torch hub cache (DINO's
``hubconf.dino_vitb16`` ignores VBench's ``path`` and loads ``$TORCH_HOME/hub/checkpoints/
dino_vitbase16_pretrain.pth``, downloading it when absent) and the Python packages its scorer imports.
Dimensions that fail the check are reported missing with the reason and never reach VBench. The others
are scored one VBench call each, so a dimension that fails while scoring is recorded missing with its
error instead of losing the rest. The scorers unpickle their weight files (``torch.load(weights_only=False)``),
so each file is checked first (``jensenkv.eval.checksums``): a changed or unknown file makes the dimension
missing, with the line that names it. The aggregate score is the mean (x100) over the dimensions that ran,
and the record says which those were. ``temporal_flickering`` needs no weights and always runs.
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
# Files the dimension's model code reads from torch.hub.get_dir()/checkpoints ($TORCH_HOME/hub/checkpoints):
# DINO's hubconf.dino_vitb16 calls torch.hub.load_state_dict_from_url(<dl.fbaipublicfiles.com URL>), whose
# file name is the URL's last part; VBench's own dino_model/ copy only stops its wget.
TORCH_HUB_FILES: dict[str, tuple[str, ...]] = {"subject_consistency": ("dino_vitbase16_pretrain.pth",)}
# Downloaded Python code a dimension imports (DINO's GitHub repo, through torch.hub.load(source="local")): every
# .py file in these folders is checked like a weight file before VBench runs.
DIMENSION_CODE_DIRS: dict[str, tuple[str, ...]] = {"subject_consistency": ("dino_model/facebookresearch_dino_main",)}
# Third-party modules each scorer imports beyond the suite's own dependencies: (module, pip requirement).
# `make setup` installs them for DEFAULT_DIMENSIONS; human_action's UMT code also imports
# numpy.lib.function_base, which numpy 2 removed, so it needs a numpy<2 environment of its own.
DIMENSION_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "subject_consistency": (("cv2", "opencv-python-headless"),),
    "background_consistency": (("clip", "openai-clip"), ("pkg_resources", "setuptools<81")),
    "aesthetic_quality": (("clip", "openai-clip"), ("pkg_resources", "setuptools<81")),
    "imaging_quality": (("pyiqa", "pyiqa"), ("timm", "timm")),
    "motion_smoothness": (("cv2", "opencv-python-headless"), ("omegaconf", "omegaconf")),
    "dynamic_degree": (("cv2", "opencv-python-headless"), ("easydict", "easydict")),
    "temporal_style": (("clip", "openai-clip"), ("pkg_resources", "setuptools<81")),
    "overall_consistency": (("clip", "openai-clip"), ("pkg_resources", "setuptools<81")),
    "human_action": (("clip", "openai-clip"), ("timm", "timm"),
                     ("numpy.lib.function_base", "numpy<2, in a separate environment")),
    "temporal_flickering": (("cv2", "opencv-python-headless"),),
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


def torch_hub_checkpoints_dir() -> Path:
    """Where torch.hub.load_state_dict_from_url keeps files: $TORCH_HOME/hub/checkpoints (torch.hub.get_dir())."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def dimension_weight_paths(dimension: str, cache_dir: Path | None = None) -> list[Path]:
    """Every weight file a dimension reads, as absolute paths (VBench cache files, then torch hub files)."""
    cache_dir = cache_dir if cache_dir is not None else vbench_cache_dir()
    paths = [cache_dir / rel for rel in DIMENSION_FILES.get(dimension, ())]
    return paths + [torch_hub_checkpoints_dir() / name for name in TORCH_HUB_FILES.get(dimension, ())]


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
    absent = [str(path) for path in dimension_weight_paths(dimension, cache_dir) if not path.exists()]
    if absent:
        return f"weights missing: {', '.join(absent)} (run `make fetch-weights` on a machine with internet)"
    return None


def dimension_untrusted_reason(dimension: str, cache_dir: Path | None = None) -> str | None:
    """Why a dimension's weight files (and downloaded code) must not be loaded (None when each matches its
    published SHA256, the hash in its name or the manifest `make fetch-weights` wrote); call it once the files
    are known to be present."""
    from jensenkv.eval.checksums import untrusted_reason

    cache_dir = cache_dir if cache_dir is not None else vbench_cache_dir()
    code = [p for folder in DIMENSION_CODE_DIRS.get(dimension, ()) for p in sorted((cache_dir / folder).rglob("*.py"))]
    for path in [*dimension_weight_paths(dimension, cache_dir), *code]:
        reason = untrusted_reason(path) if path.is_file() else None
        if reason is not None:
            return reason
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
    """Score mp4 files with VBench, one VBench call per available dimension.

    videos: {path to an .mp4 file: its prompt}; all files must sit in one directory, which must hold no
        other videos (VBench's custom_input mode scores the whole directory).
    A dimension whose check fails, or whose scoring raises, is recorded in ``missing`` with the reason.
    """
    validate_dimensions(dimensions)
    result = VBenchResult()
    runnable = []
    for dim in dict.fromkeys(dimensions):
        reason = dimension_missing_reason(dim) or dimension_untrusted_reason(dim)
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
    prompts = {Path(p).name: t for p, t in videos.items()}
    with tempfile.TemporaryDirectory(dir=work_dir) as out_dir:
        bench = VBench(device, str(full_info), out_dir)
        for dim in runnable:
            try:
                bench.evaluate(videos_path=str(folder), name=f"run_{dim}", prompt_list=prompts, dimension_list=[dim],
                               local=True, mode="custom_input")
                with open(Path(out_dir) / f"run_{dim}_eval_results.json") as f:
                    mean, rows = json.load(f)[dim]
                per_video = {Path(r["video_path"]).name: float(r["video_results"]) for r in rows}
                score = float(mean)
            except Exception as e:  # noqa: BLE001 - one dimension's failure must not lose the others
                result.missing[dim] = f"VBench's {dim} scorer failed: {type(e).__name__}: {e}"
                continue
            result.scores[dim] = score
            result.per_video[dim] = per_video
    return result
