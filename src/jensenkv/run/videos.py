"""Making a run's videos: the shared BF16 references (generated once, stored under ``refs/``), the quantized
videos of a batch with their probes and cache sizes, and teacher-forced fidelity's chunks. The model is loaded on
first use, so a finished run never loads it."""
from __future__ import annotations

import json
import logging
from typing import Any

from jensenkv.eval.scoring import teacher_forced_rows
from jensenkv.config.resolve import RunSpec
from jensenkv.store.results import ResultsStore

log = logging.getLogger("jensenkv.run")


class NonFiniteVideoError(ValueError):
    """A generated video holds NaN or inf (e.g. broken weights): never scored, never recorded."""


class BatchMemoryError(ValueError):
    """A batch of videos ran out of device memory: a smaller generation.batch_size fits."""


class WeightsFileError(ValueError):
    """A weights file exists but cannot be read (truncated, garbled, empty)."""


def check_finite(video: Any, what: str) -> None:
    """Raise NonFiniteVideoError when a (F, C, H, W) float video holds NaN or inf."""
    import torch

    bad = int((~torch.isfinite(video)).sum())
    if bad:
        raise NonFiniteVideoError(f"the generated video for {what} has {bad} non-finite values (NaN/inf) of "
                                  f"{video.numel()}: the model's weights or settings are broken; nothing was scored "
                                  "or recorded")


def to_uint8(video: Any) -> Any:
    """(F, C, H, W) float in [0, 1] -> uint8 (what a saved video holds; metrics compare these)."""
    import torch

    return (video.clamp(0, 1) * 255).round().to(torch.uint8)


class VideoMaker:
    """The videos of one RunSpec, made with its model (built once, on first use)."""

    def __init__(self, spec: RunSpec, store: ResultsStore):
        self.spec = spec
        self.store = store
        self._adapter = None
        self._reference_adapter = None  # teacher-forced fidelity's full-precision twin

    # lazily built so a finished run never loads the model
    @property
    def adapter(self):
        if self._adapter is None:
            from safetensors import SafetensorError

            from jensenkv.models import build_adapter

            try:
                self._adapter = build_adapter(self.spec.model, cache=self.spec.reference_cache_config(),
                                              generation=self.spec.generation)
            except SafetensorError as e:
                where = self.spec.model.weights_dir or self.spec.model.path or "the packaged weights"
                raise WeightsFileError(f"the weights of model {self.spec.model.name!r} ({where}) cannot be read, "
                                       f"the file is truncated, garbled or empty ({e}); restore or re-download it "
                                       "(`make fetch-weights`, `make train-tiny`)") from None
        return self._adapter

    def references(self, jobs: list[tuple[str, int]]) -> list[tuple[str, Any]]:
        """(ref id, (F, C, H, W) uint8 video) per (prompt, seed): loaded from results/refs/, the missing ones
        generated together as one batch and each stored as it is finished."""
        import contextlib

        import torch

        from jensenkv.generation.loop import generate_videos
        from jensenkv.attention.config import AttentionConfig
        from jensenkv.hashing import config_hash
        from jensenkv.store.files import atomic_write

        ids = [config_hash(self.spec.reference_identity(p, s)) for p, s in jobs]
        missing = sorted({ref_id for ref_id in ids if not self.store.ref_path(ref_id).exists()})
        if missing:
            with contextlib.ExitStack() as locks:  # parallel jobs making the same references: wait, then reuse
                for ref_id in missing:  # one order everywhere: two jobs never wait on each other
                    locks.enter_context(self.store.ref_lock(ref_id))
                    self.store.clean_ref_tmp(ref_id)
                todo = [(ref_id, job) for ref_id, job in dict(zip(ids, jobs)).items()
                        if ref_id in missing and not self.store.ref_path(ref_id).exists()]
                if todo:
                    self.adapter.configure(cache=self.spec.reference_cache_config(),
                                           attention=AttentionConfig(backend=self.spec.attention.backend))
                    results = generate_videos(self.adapter, [p for _, (p, _) in todo], [s for _, (_, s) in todo])
                    for (ref_id, (prompt, seed)), result in zip(todo, results):
                        check_finite(result.video, f"the BF16 reference of {prompt!r} seed {seed}")  # (F, C, H, W)
                        payload = {"video": to_uint8(result.video), "timings": result.timings,
                                   "identity": json.dumps(self.spec.reference_identity(prompt, seed),
                                                          sort_keys=True, default=str)}
                        atomic_write(self.store.ref_path(ref_id), lambda f, payload=payload: torch.save(payload, f))
                        log.info("stored BF16 reference %s for %r seed %d", ref_id, prompt, seed)
        return [(ref_id, torch.load(self.store.ref_path(ref_id), weights_only=True)["video"]) for ref_id in ids]

    def generate(self, jobs: list[tuple[str, int]]) -> list[tuple[Any, list[dict] | None, dict, dict]]:
        """(uint8 video, probes, timings, cache stats) of the quantized run, per (prompt, seed), as one batch."""
        from jensenkv.generation.loop import generate_videos
        attention = self.spec.attention  # probes on iff eval.metrics has "attention"
        self.adapter.configure(cache=self.spec.cache_config(keep_reference=attention.probes), attention=attention)
        results = generate_videos(self.adapter, [p for p, _ in jobs], [s for _, s in jobs])
        for (prompt, seed), result in zip(jobs, results):
            check_finite(result.video, f"{prompt!r} seed {seed}")  # (F, C, H, W)
        # every video of a batch has the same shapes, so each holds an equal share of the stacked caches
        caches = self.adapter.caches("cond")
        stats = {"cache_bytes": sum(c.nbytes for c in caches) // len(jobs),
                 "cache_bf16_bytes": sum(c.bf16_nbytes for c in caches) // len(jobs)}
        return [(to_uint8(r.video), r.probes, r.timings, dict(stats)) for r in results]

    def teacher_forced(self, jobs: list[tuple[str, int]]) -> list[list[dict]]:
        """Teacher-forced fidelity's per-chunk rows per (prompt, seed): each chunk read with the BF16 run's own
        history, the run's cache against the full-precision one (``jensenkv.generation.teacher_forced``)."""
        import dataclasses

        from jensenkv.attention.config import AttentionConfig
        from jensenkv.models import build_adapter
        from jensenkv.generation.teacher_forced import teacher_forced_chunks

        spec = self.spec
        if self._reference_adapter is None:
            self._reference_adapter = build_adapter(spec.model, cache=spec.reference_cache_config(),
                                                    generation=spec.generation)
        self._reference_adapter.configure(cache=spec.reference_cache_config(),
                                          attention=AttentionConfig(backend=spec.attention.backend))
        plain = dataclasses.replace(spec.attention, probes=False, diagnostics=False, head_moments=False)
        self.adapter.configure(cache=spec.cache_config(keep_reference=False), attention=plain)
        return [teacher_forced_rows(teacher_forced_chunks(self.adapter, self._reference_adapter, prompt, seed))
                for prompt, seed in jobs]
