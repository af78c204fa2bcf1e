"""One scorer per metric of ``eval.metrics``: what a run's videos are scored by, and how a run's value is made.

A scorer states whether it needs the full-precision reference (a BF16 run is its own reference: its value is
missing, with that reason) and whether it reads the generated video; it gives each video's values or the
reason they are missing (``Scorer.score``) and the run's own values beyond the mean of its videos'
(``Scorer.aggregate``: medians over every probe, VBench over the run's videos, the cache's effective bits).
The runner loops over them (``score_video``, ``score_run``); it owns the files, the scorers own the numbers.

    metric          needs reference  reads the video  run value
    psnr, ssim      yes              yes              mean over videos
    lpips           yes              yes              mean over videos
    attention       yes              yes              summaries over every probe of the run
    teacher_forced  yes              no (its chunks)  mean over videos
    content         no               yes              mean over videos
    vbench          no               yes (its files)  VBench over the run's videos
    (cache size)    no               no               mean cache bytes, effective bits (every run)
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

OWN_REFERENCE = "BF16 run: it is its own reference"


@dataclass
class Video:
    """One video to score and what its generation gave beside it."""

    index: int
    prompt: str
    seed: int
    video: Any = None                  # (F, C, H, W) uint8; None when no video was made (teacher-forced alone)
    reference: Any = None              # (F, C, H, W) uint8 full-precision reference; None for a BF16 run
    probes: list[dict] | None = None   # the generator's attention probes
    teacher_forced: list[dict] | None = None  # per-chunk rows (``teacher_forced_rows``) when that metric is on

    @cached_property
    def frames(self) -> Any:
        """(F, C, H, W) float in [0, 1], as saved: what every metric compares."""
        return self.video.float() / 255

    @cached_property
    def reference_frames(self) -> Any:
        return self.reference.float() / 255


@dataclass
class Score:
    """What a scorer gives for one video or for the run."""

    metrics: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)   # metric -> why it has no value
    tables: dict[str, Any] = field(default_factory=dict)    # name -> DataFrame the runner keeps beside it
    extra: dict[str, Any] = field(default_factory=dict)     # further entries of the video's result or the record

    def add(self, other: Score) -> None:
        self.metrics.update(other.metrics)
        self.missing.update(other.missing)
        self.tables.update(other.tables)
        self.extra.update(other.extra)


@dataclass
class RunFiles:
    """What a run's aggregate reads of the run's files (the runner knows where they are)."""

    video_path: Callable[[str], Path]        # a video's file name -> its path
    table: Callable[[int, str], Any]         # (video index, table name) -> the DataFrame kept beside that video


class Scorer:
    """One metric. ``spec``: the run's RunSpec (settings read: ``eval``, ``model``, ``cache``)."""

    metric = ""
    needs_reference = True   # compared with the full-precision reference
    needs_video = True       # reads the generated video
    needs_saved_video = False  # reads the run's mp4 files (the runner saves them)
    needs_chunks = False     # reads teacher-forced chunks (the runner makes them; a BF16 run has none)

    def __init__(self, spec: Any):
        self.spec = spec

    def score(self, video: Video) -> Score:
        """This video's values, or why they are missing."""
        return Score()

    def aggregate(self, results: list[dict], files: RunFiles) -> Score:
        """The run's values beyond the mean of its videos' (``results``: the per-video results, in order)."""
        return Score()

    def provenance(self, run: Score) -> dict | None:
        """What the values were computed from (evaluator weights), for the record's ``computed_from``."""
        return None


class Psnr(Scorer):
    metric = "psnr"

    def score(self, video: Video) -> Score:
        from jensenkv.eval.fidelity import video_psnr

        psnr = video_psnr(video.frames, video.reference_frames)
        if psnr == float("inf"):
            return Score(missing={"psnr": "video identical to its BF16 reference (PSNR is infinite)"})
        return Score(metrics={"psnr": psnr})


class Ssim(Scorer):
    metric = "ssim"

    def score(self, video: Video) -> Score:
        from jensenkv.eval.fidelity import video_ssim

        return Score(metrics={"ssim": video_ssim(video.frames, video.reference_frames)})


class Lpips(Scorer):
    metric = "lpips"

    def __init__(self, spec: Any):
        super().__init__(spec)
        self._model = None  # built on the first video: a run without LPIPS weights never loads it

    def score(self, video: Video) -> Score:
        from jensenkv.eval.fidelity import LpipsScorer, lpips_availability

        status = lpips_availability(self.spec.eval.lpips.net)
        if not status.available:
            return Score(missing={"lpips": status.reason})
        if self._model is None:
            self._model = LpipsScorer(self.spec.eval.lpips.net, device=self.spec.model.device)
        return Score(metrics={"lpips": self._model(video.frames, video.reference_frames)})

    def provenance(self, run: Score) -> dict:
        from jensenkv.eval.fidelity import lpips_backbone_path

        net = self.spec.eval.lpips.net
        return {"package": "lpips 0.1 linear heads", "net": net, "backbone": str(lpips_backbone_path(net))}


class Attention(Scorer):
    """Attention-mass shift from the generator's probes; the run's value is taken over every probe of the run
    (medians cannot be averaged per video), kept as the run's ``attention`` table."""

    metric = "attention"
    key = "delta_p_s_mean"  # a video with probes has it

    def score(self, video: Video) -> Score:
        from jensenkv.eval.attention import probe_frame, summarize_probes

        if not video.probes:
            return Score(missing={"attention": "the generator recorded no probes (a single chunk has no cache)"})
        frame = probe_frame(video.probes, prompt_index=video.index, seed=video.seed)
        return Score(metrics=summarize_probes(frame), tables={"attention": frame})

    def aggregate(self, results: list[dict], files: RunFiles) -> Score:
        import pandas as pd

        from jensenkv.eval.attention import summarize_probes

        frames = [files.table(r["index"], "attention") for r in results if self.key in r["metrics"]]
        if not frames:
            return Score()
        attention = pd.concat(frames, ignore_index=True)
        return Score(metrics=summarize_probes(attention), tables={"attention": attention})


def teacher_forced_rows(chunks: Sequence[Any]) -> list[dict]:
    """One row per teacher-forced chunk (``jensenkv.teacher_forced``): PSNR between the two decoded clean chunks
    (float frames) and the relative errors of the run's cache against the full-precision one."""
    from jensenkv.eval.fidelity import video_psnr

    return [{"chunk": c.chunk, "psnr": video_psnr(c.video.clamp(0, 1), c.reference.clamp(0, 1)),
             "rel_err": c.rel_err, "latent_rel_err": c.latent_rel_err} for c in chunks]


class TeacherForced(Scorer):
    """Teacher-forced fidelity: the means over a video's chunks (chunks >= 1: the first reads no cache)."""

    metric = "teacher_forced"
    needs_video = False
    needs_chunks = True

    def score(self, video: Video) -> Score:
        rows = video.teacher_forced
        if rows is None:
            return Score()
        if not rows:
            return Score(missing={"teacher_forced": "one chunk: no chunk reads a cache"},
                         extra={"teacher_forced": rows})
        metrics = {f"tf_{k}": sum(r[k] for r in rows) / len(rows) for k in ("rel_err", "latent_rel_err")}
        finite = [r["psnr"] for r in rows if math.isfinite(r["psnr"])]
        missing = {}
        if len(finite) == len(rows):
            metrics["tf_psnr"] = sum(finite) / len(finite)
        else:
            missing["tf_psnr"] = "a chunk identical to its full-precision twin (PSNR is infinite)"
        return Score(metrics=metrics, missing=missing, extra={"teacher_forced": rows})


class Content(Scorer):
    """Prompt-content recovery (colour and direction); BF16 runs get it too: it needs no reference."""

    metric = "content"
    needs_reference = False

    def score(self, video: Video) -> Score:
        from jensenkv.eval.content import content_match
        from jensenkv.models.registry import family

        limit = family(self.spec.model.kind).metric_limits.get("content")
        if limit is not None:
            return Score(missing={"content": limit})
        try:
            return Score(metrics=content_match(video.frames, video.prompt))
        except ValueError as err:
            return Score(missing={"content": f"content recovery needs a prompt in the built-in model's grammar: {err}"})


class VBench(Scorer):
    """VBench over the run's saved videos: a run value per dimension and their aggregate, each video's own score."""

    metric = "vbench"
    needs_reference = False
    needs_saved_video = True

    def aggregate(self, results: list[dict], files: RunFiles) -> Score:
        from jensenkv.eval.vbench import evaluate_vbench

        spec = self.spec
        videos = {str(files.video_path(r["video"])): r["prompt"] for r in results}
        vb = evaluate_vbench(videos, spec.eval.vbench.dimensions, spec.eval.vbench.device or spec.model.device
                             or "cpu")
        out = Score(extra={"vbench_dimensions_used": vb.used})
        for dim, score in vb.scores.items():
            out.metrics[f"vbench_{dim}"] = score
            for r in results:  # each video's own score, beside its other values
                r["metrics"][f"vbench_{dim}"] = vb.per_video[dim].get(r["video"])
        for dim, reason in vb.missing.items():
            out.missing[f"vbench_{dim}"] = reason
        if vb.aggregate is None:
            out.missing["vbench"] = "no VBench dimension could run: " + "; ".join(f"{d}: {r}"
                                                                                 for d, r in vb.missing.items())
        else:
            out.metrics["vbench"] = vb.aggregate
        return out

    def provenance(self, run: Score) -> dict:
        from jensenkv.eval.vbench import vbench_cache_dir

        return {"cache_dir": str(vbench_cache_dir()), "dimensions_used": run.extra.get("vbench_dimensions_used", []),
                "aggregate": "mean x100 over dimensions_used"}


class CacheSize(Scorer):
    """The cache's mean size per video and its effective bits per value (16 x its bytes over BF16's); every
    run has it, a BF16 run by its full-precision dtype."""

    metric = "effective_bits"
    needs_reference = False
    needs_video = False

    def aggregate(self, results: list[dict], files: RunFiles) -> Score:
        bytes_ = [r.get("cache_bytes") for r in results if r.get("cache_bytes")]
        bf16 = [r.get("cache_bf16_bytes") for r in results if r.get("cache_bf16_bytes")]
        if bytes_ and bf16:
            return Score(metrics={"cache_bytes": float(sum(bytes_) / len(bytes_)),
                                  "effective_bits": 16.0 * sum(bytes_) / sum(bf16)})
        if self.spec.is_reference:
            return Score(metrics={"effective_bits": 16.0 if self.spec.cache.full_precision_dtype != "float32"
                                  else 32.0})
        return Score()


SCORERS: dict[str, type[Scorer]] = {s.metric: s for s in (Psnr, Ssim, Lpips, Attention, TeacherForced, Content,
                                                          VBench)}


def scorers(spec: Any) -> list[Scorer]:
    """The scorers of a run: one per metric of ``spec.eval.metrics``, and the cache size of every run."""
    return [SCORERS[m](spec) for m in SCORERS if m in spec.eval.metrics] + [CacheSize(spec)]


def score_video(active: Sequence[Scorer], video: Video, is_reference: bool) -> Score:
    """Every scorer's values for one video; a BF16 run has no value of a metric that needs a reference, and a
    video that was not made has none of a metric that reads it."""
    out = Score()
    for scorer in active:
        if is_reference and scorer.needs_reference:
            out.missing[scorer.metric] = OWN_REFERENCE
        elif video.video is not None or not scorer.needs_video:
            out.add(scorer.score(video))
    return out


def score_run(active: Sequence[Scorer], results: list[dict], files: RunFiles) -> Score:
    """The run's values: each metric's mean over its videos (none where a video lacks it: a mean over the rest
    would mislead), then each scorer's own run values (which replace a mean of the same name)."""
    out = Score()
    per_metric: dict[str, list[float]] = {}
    for r in results:
        for k, v in r["metrics"].items():
            per_metric.setdefault(k, []).append(v)
        for k, reason in r["missing"].items():
            out.missing.setdefault(k, reason)
    for k, values in per_metric.items():
        if k not in out.missing:
            out.metrics[k] = float(sum(values) / len(values))
    for scorer in active:
        out.add(scorer.aggregate(results, files))
    return out
