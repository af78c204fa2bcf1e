"""VBench through VBench's own code: weight checks before any call (no wget), temporal_flickering on real mp4s."""
from __future__ import annotations

import importlib.util
import subprocess

import pytest
import torch

from jensenkv.eval.vbench import (
    DEFAULT_DIMENSIONS,
    DIMENSION_FILES,
    VBenchResult,
    dimension_missing_reason,
    evaluate_vbench,
    validate_dimensions,
)
from jensenkv.run import save_mp4


def _static_video(frames: int = 8) -> torch.Tensor:
    video = torch.zeros(frames, 3, 32, 32, dtype=torch.uint8)  # (F, C, H, W)
    video[:, :, 8:24, 8:24] = 200
    return video


def _flickering_video(frames: int = 8) -> torch.Tensor:
    video = _static_video(frames)
    video[1::2] = 255 - video[1::2]  # every other frame inverted
    return video


@pytest.fixture
def no_shell(monkeypatch):
    """Fail if anything shells out to a downloader (VBench fetches missing weights with wget / git clone)."""
    real_popen = subprocess.Popen

    class GuardedPopen(real_popen):
        def __init__(self, args, *rest, **kwargs):
            program = str(args[0] if isinstance(args, (list, tuple)) else args).split()[0]
            if program.rsplit("/", 1)[-1] in ("wget", "git", "unzip", "curl"):
                raise AssertionError(f"tried to download with {args}")
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", GuardedPopen)


def test_weight_free_dimension_is_available():
    assert dimension_missing_reason("temporal_flickering") is None


def test_missing_weights_are_named_with_the_cache_dir(tmp_path):
    reason = dimension_missing_reason("dynamic_degree", cache_dir=tmp_path)
    assert "raft_model/models/raft-things.pth" in reason and str(tmp_path) in reason
    (tmp_path / "raft_model" / "models").mkdir(parents=True)
    (tmp_path / "raft_model" / "models" / "raft-things.pth").write_bytes(b"")
    assert dimension_missing_reason("dynamic_degree", cache_dir=tmp_path) is None  # files present -> runnable


def test_unimportable_scorer_and_standard_only_dimensions_are_explained(tmp_path):
    reason = dimension_missing_reason("imaging_quality", cache_dir=tmp_path)
    assert reason is not None and ("pyiqa" in reason or "musiq_spaq" in reason)
    assert "custom_input" in dimension_missing_reason("object_class", cache_dir=tmp_path)


def test_unknown_dimension_is_rejected():
    with pytest.raises(ValueError, match="'sharpness'"):
        validate_dimensions(["temporal_flickering", "sharpness"])
    assert set(DIMENSION_FILES) >= set(DEFAULT_DIMENSIONS)


def test_aggregate_is_the_mean_of_available_dimensions_times_100():
    result = VBenchResult(scores={"a": 0.8, "b": 0.6}, missing={"c": "no weights"})
    assert result.aggregate == pytest.approx(70.0) and result.used == ["a", "b"]
    assert VBenchResult(missing={"c": "no weights"}).aggregate is None


def test_temporal_flickering_scores_real_videos_and_skips_the_rest(tmp_path, monkeypatch, no_shell):
    import vbench.utils

    monkeypatch.setattr(vbench.utils, "CACHE_DIR", str(tmp_path / "empty_cache"))
    folder = tmp_path / "videos"
    still = save_mp4(_static_video(), folder / "still.mp4", fps=8)
    flicker = save_mp4(_flickering_video(), folder / "flicker.mp4", fps=8)
    result = evaluate_vbench({str(still): "a square", str(flicker): "a square"}, list(DEFAULT_DIMENSIONS),
                             work_dir=tmp_path)
    assert result.used == ["temporal_flickering"]
    scores = result.per_video["temporal_flickering"]
    assert scores["still.mp4"] > 0.99 and scores["flicker.mp4"] < 0.5  # (255 - mean |frame diff|) / 255
    assert result.scores["temporal_flickering"] == pytest.approx((scores["still.mp4"] + scores["flicker.mp4"]) / 2)
    assert result.aggregate == pytest.approx(100 * result.scores["temporal_flickering"])
    assert set(result.missing) == set(DEFAULT_DIMENSIONS) - {"temporal_flickering"}
    assert "dino_vitbase16_pretrain.pth" in result.missing["subject_consistency"]
    assert not (tmp_path / "empty_cache").exists() or not any((tmp_path / "empty_cache").rglob("*.pt*"))


def test_videos_must_share_one_folder(tmp_path):
    a = save_mp4(_static_video(), tmp_path / "a" / "x.mp4", fps=8)
    b = save_mp4(_static_video(), tmp_path / "b" / "y.mp4", fps=8)
    with pytest.raises(ValueError, match="one folder"):
        evaluate_vbench({str(a): "p", str(b): "p"}, ["temporal_flickering"])


def _fake_subject_consistency_weights(cache, torch_home, in_hub: bool = True, recorded: bool = False) -> None:
    """Empty stand-ins for every file subject_consistency reads (VBench cache and torch hub); ``recorded``: in
    the manifests, as `make fetch-weights` leaves them."""
    from jensenkv.eval.checksums import record

    for rel in DIMENSION_FILES["subject_consistency"]:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(b"")
        if recorded:
            record(cache, cache / rel, "test")
    if in_hub:
        hub = torch_home / "hub" / "checkpoints"
        hub.mkdir(parents=True)
        (hub / "dino_vitbase16_pretrain.pth").write_bytes(b"")
        if recorded:
            record(hub, hub / "dino_vitbase16_pretrain.pth", "test")


def test_dino_weights_are_looked_for_where_dinos_hubconf_reads_them(tmp_path, monkeypatch):
    """DINO's hubconf loads $TORCH_HOME/hub/checkpoints/dino_vitbase16_pretrain.pth (VBench's `path` is ignored):
    with the file only in VBench's cache the dimension is missing, naming the torch hub path."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    _fake_subject_consistency_weights(tmp_path / "vb", tmp_path / "torch", in_hub=False)
    reason = dimension_missing_reason("subject_consistency", cache_dir=tmp_path / "vb")
    hub_file = tmp_path / "torch" / "hub" / "checkpoints" / "dino_vitbase16_pretrain.pth"
    assert reason is not None and str(hub_file) in reason
    (tmp_path / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "torch" / "hub" / "checkpoints" / "dino_vitbase16_pretrain.pth").write_bytes(b"")
    assert dimension_missing_reason("subject_consistency", cache_dir=tmp_path / "vb") is None


def test_a_failing_dimension_is_recorded_missing_and_the_others_still_score(tmp_path, monkeypatch, no_shell):
    import vbench.subject_consistency
    import vbench.utils

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(vbench.utils, "CACHE_DIR", str(tmp_path / "vb"))
    _fake_subject_consistency_weights(tmp_path / "vb", tmp_path / "torch", recorded=True)

    def broken(*args, **kwargs):
        raise RuntimeError("DINO checkpoint is not a state dict")

    monkeypatch.setattr(vbench.subject_consistency, "compute_subject_consistency", broken)
    folder = tmp_path / "videos"
    still = save_mp4(_static_video(), folder / "still.mp4", fps=8)
    result = evaluate_vbench({str(still): "a square"}, ["subject_consistency", "temporal_flickering"],
                             work_dir=tmp_path)
    assert result.used == ["temporal_flickering"] and result.per_video["temporal_flickering"]["still.mp4"] > 0.99
    assert "RuntimeError: DINO checkpoint is not a state dict" in result.missing["subject_consistency"]


_SCORER_PACKAGES = ("clip", "pyiqa", "timm", "pkg_resources")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in _SCORER_PACKAGES),
                    reason="VBench's scorer packages are not in this environment (`make setup` installs them)")
def test_default_dimension_scorers_import():
    """In a `make setup` environment every default dimension's scorer imports (openai-clip needs pkg_resources,
    i.e. setuptools < 81; imaging_quality needs pyiqa and timm)."""
    import importlib

    for dim in DEFAULT_DIMENSIONS:
        importlib.import_module(f"vbench.{dim}")
