"""The scorers (jensenkv.eval.scoring): one per metric, each stating whether it needs the reference and the video;
per-video values or reasons, and the run's values (means unless a video lacks the metric, then the scorer's own)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jensenkv.eval.config import METRICS
from jensenkv.eval.scoring import (OWN_REFERENCE, SCORERS, RunFiles, Score, Scorer, Video, score_run, score_video,
                                   scorers)


def _spec(*metrics: str, reference: bool = False) -> SimpleNamespace:
    return SimpleNamespace(eval=SimpleNamespace(metrics=list(metrics)), is_reference=reference,
                           cache=SimpleNamespace(full_precision_dtype="bfloat16"))


def _video(index: int = 0, **kwargs) -> Video:
    torch.manual_seed(index)
    frames = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)  # (F, C, H, W)
    return Video(index, "a prompt", 0, video=frames, reference=frames.clone(), **kwargs)


NO_FILES = RunFiles(video_path=lambda name: pytest.fail("read a video file"),
                    table=lambda index, name: pytest.fail("read a table"))


def test_every_metric_has_one_scorer_and_a_run_gets_those_it_asks_for():
    assert set(SCORERS) == set(METRICS)
    names = [s.metric for s in scorers(_spec("ssim", "psnr"))]
    assert names == ["psnr", "ssim", "effective_bits"]  # the cache size: every run
    every = scorers(_spec(*METRICS))
    assert [s.metric for s in every if s.needs_saved_video] == ["vbench"]  # the runner saves the mp4s for it
    assert [s.metric for s in every if s.needs_chunks] == ["teacher_forced"]
    assert [s.metric for s in every if not s.needs_reference] == ["content", "vbench", "effective_bits"]


def test_a_bf16_run_has_a_reason_for_every_metric_that_needs_a_reference():
    active = scorers(_spec("psnr", "ssim", "teacher_forced", reference=True))
    score = score_video(active, _video(), is_reference=True)
    assert score.metrics == {}
    assert score.missing == {"psnr": OWN_REFERENCE, "ssim": OWN_REFERENCE, "teacher_forced": OWN_REFERENCE}


def test_an_identical_video_has_no_psnr_but_a_reason_and_its_ssim():
    score = score_video(scorers(_spec("psnr", "ssim")), _video(), is_reference=False)
    assert "PSNR is infinite" in score.missing["psnr"] and "psnr" not in score.metrics
    assert score.metrics["ssim"] == pytest.approx(1.0)


def test_a_video_that_was_not_made_is_scored_only_by_what_does_not_read_it():
    rows = [{"chunk": 1, "psnr": 30.0, "rel_err": 0.1, "latent_rel_err": 0.2},
            {"chunk": 2, "psnr": 20.0, "rel_err": 0.3, "latent_rel_err": 0.4}]
    item = Video(0, "a prompt", 0, teacher_forced=rows)  # teacher-forced fidelity alone: no video
    score = score_video(scorers(_spec("psnr", "teacher_forced")), item, is_reference=False)
    assert score.metrics == pytest.approx({"tf_rel_err": 0.2, "tf_latent_rel_err": 0.3, "tf_psnr": 25.0})
    assert score.missing == {} and score.extra == {"teacher_forced": rows}


def test_the_run_value_is_the_mean_unless_a_video_lacks_it():
    results = [{"metrics": {"psnr": 30.0, "ssim": 0.5}, "missing": {}},
               {"metrics": {"ssim": 0.7}, "missing": {"psnr": "identical"}}]
    run = score_run([], results, NO_FILES)
    assert run.metrics == {"ssim": pytest.approx(0.6)} and run.missing == {"psnr": "identical"}


def test_a_scorers_own_run_value_replaces_the_mean_of_its_name():
    class Median(Scorer):
        metric = "x"

        def aggregate(self, results, files):
            return Score(metrics={"x": 2.0})

    results = [{"metrics": {"x": v}, "missing": {}} for v in (1.0, 2.0, 6.0)]
    assert score_run([Median(_spec())], results, NO_FILES).metrics == {"x": 2.0}


def test_the_cache_size_gives_effective_bits_from_the_videos_or_the_bf16_dtype():
    results = [{"metrics": {}, "missing": {}, "cache_bytes": 100, "cache_bf16_bytes": 400}] * 2
    assert score_run(scorers(_spec()), results, NO_FILES).metrics == {"cache_bytes": 100.0, "effective_bits": 4.0}
    bf16 = [{"metrics": {}, "missing": {}}]
    assert score_run(scorers(_spec(reference=True)), bf16, NO_FILES).metrics == {"effective_bits": 16.0}
