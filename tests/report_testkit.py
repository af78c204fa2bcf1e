"""Synthetic run records for the report's statistics tests: real quantizer settings in the identity (so rows and
their tags come from QuantConfig, as in a real store) and per-video metrics from a function of
(prompt index, seed, replicate seed)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from jensenkv.quant import QuantConfig
from jensenkv.hashing import config_hash
from jensenkv.store.results import ResultsStore

MODEL = "synthetic-video-model"
BF16_REASON = "BF16 run: it is its own reference"


def explain_missing(record: dict) -> dict:
    """``record`` as the runner writes it: every metric its identity asks for that a video or the run lacks
    gets a reason (a BF16 run is its own reference), so the store reads as sound (jensenkv.store.record_check)."""
    from jensenkv.store.record_check import has_metric

    reason = BF16_REASON if record["labels"]["method"] == "none" else "not computed in this synthetic store"
    for holder in (record, *record["per_prompt"]):
        holder["missing"] = dict(holder.get("missing") or {})
        for metric in record["identity"].get("metrics", []):
            if not has_metric(metric, holder["metrics"], holder["missing"], record.get("missing", {})):
                holder["missing"][metric] = reason
    return record


def video_means(videos: list[dict]) -> dict:
    """A run's metrics as the runner takes them: each metric's mean over its videos."""
    names = {k for v in videos for k in v["metrics"]}
    return {k: sum(v["metrics"][k] for v in videos) / len(videos) for k in names}


def prompts(n: int) -> tuple[str, ...]:
    return tuple(f"prompt number {i}" for i in range(n))


def write_run(root: Path, key: QuantConfig, correction: str, metrics: Callable[[int, int, int], dict],
              prompt_list: tuple[str, ...], seeds: tuple[int, ...] = (0, 1, 2),
              effective_bits: float | None = None) -> str:
    """One finished run; ``metrics(prompt_index, seed, replicate_seed)`` gives a video's per-video metrics
    (records' names: psnr, delta_p_s_mean, delta_p_s_abs_mean, ...); the replicate seed is the rotation seed,
    or the dither seed for a dithered grid."""
    quantized = key.method != "none"
    replicate = key.rotation_seed if key.rotation != "none" else key.dither_seed
    identity = {"model": {"kind": "synthetic", "name": MODEL}, "weights": "w", "generation": {"steps": 4},
                "key": dataclasses.asdict(key), "value": dataclasses.asdict(key), "sink_chunks": 0,
                "window_chunks": None, "correction": correction, "strength": 1.0, "second_order": False,
                "prompts": list(prompt_list), "seeds": list(seeds), "metrics": ["psnr", "attention"]}
    videos = []
    for i, prompt in enumerate(prompt_list):
        for seed in seeds:
            values = dict(metrics(i, seed, replicate)) if quantized else {}
            videos.append({"index": len(videos), "prompt": prompt, "seed": seed, "metrics": values, "missing": {}})
    names = {k for v in videos for k in v["metrics"]}
    means = {k: sum(v["metrics"][k] for v in videos) / len(videos) for k in names}
    if effective_bits is not None:
        means["effective_bits"] = effective_bits
    run_id = config_hash(identity)
    labels = {"model": MODEL, "quantizer": key.label, "method": key.method, "bits": key.bits if quantized else 16,
              "group_size": key.group_size if quantized else None, "granularity": key.granularity,
              "rotation": key.rotation if quantized else "none", "values": "same", "correction": correction,
              "strength": 1.0, "sink_chunks": 0, "window_chunks": None}
    ResultsStore(root).write_record(explain_missing({
        "run_id": run_id, "created_at": "2026-12-01T00:00:00+00:00", "identity": identity, "labels": labels,
        "metrics": means, "missing": {}, "vbench_dimensions_used": [], "per_prompt": videos}))
    return run_id
