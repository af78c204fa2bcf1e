"""Executes one RunSpec: BF16 references (shared, generated once), the quantized videos, metrics, the run
record (written atomically) and W&B (marked done in ``wandb.json`` once logged). Resumable per prompt; a
finished run is a no-op, except that a W&B log lost to a kill is redone."""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from jensenkv.eval.scoring import RunFiles, Video, score_run, score_video, scorers
from jensenkv.eval.video_files import save_mp4, save_upscaled
from jensenkv.models.registry import family
from jensenkv.run import wandb
from jensenkv.run.done_line import done_line
from jensenkv.run.environment import default_threads, run_environment
from jensenkv.run.videos import BatchMemoryError, VideoMaker
from jensenkv.config.resolve import RunSpec

if TYPE_CHECKING:
    from jensenkv.store.lock import FileLock
    from jensenkv.store.record import Record, SealedRecord, VideoResult

log = logging.getLogger("jensenkv.run")


class Runner:
    """Executes one RunSpec: references, generation, metrics, record, W&B."""

    def __init__(self, spec: RunSpec):
        from jensenkv.store.results import ResultsStore

        self.spec = spec
        self.store = ResultsStore(spec.results_dir)
        self.run_id = spec.run_id
        self.run_dir = self.store.run_dir(self.run_id)
        self.videos = VideoMaker(spec, self.store)
        self.scorers = scorers(spec)

    def prompt_results(self, batch: list[tuple[int, str, int]]) -> None:
        """Generate and score a batch of (index, prompt, seed); each video's result is saved atomically as soon
        as the batch is done, so a rerun regenerates only the videos without one."""
        import torch

        spec = self.spec
        jobs = [(prompt, seed) for _, prompt, seed in batch]
        try:
            if any(scorer.needs_video for scorer in self.scorers) or spec.eval.save_videos:
                references = self.videos.references(jobs)
                generated = [(ref, None, {}, {}) for _, ref in references] if spec.is_reference else \
                    self.videos.generate(jobs)
            else:  # teacher-forced fidelity alone regenerates what it compares: no video, no reference needed
                references, generated = [(None, None)] * len(jobs), [(None, None, {}, {})] * len(jobs)
        except torch.cuda.OutOfMemoryError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise BatchMemoryError(f"generation.batch_size={spec.generation.batch_size}: a batch of {len(batch)} "
                                   f"videos does not fit on {spec.model.device} ({first}); use "
                                   f"generation.batch_size={max(1, len(batch) // 2)}") from None
        chunks = any(scorer.needs_chunks for scorer in self.scorers) and not spec.is_reference
        forced = self.videos.teacher_forced(jobs) if chunks else [None] * len(jobs)
        for (index, prompt, seed), (ref_id, ref), made, tf in zip(batch, references, generated, forced):
            self.score(Video(index, prompt, seed, made[0], None if spec.is_reference else ref, made[1], tf), ref_id,
                       *made[2:])

    def score(self, item: Video, ref_id: str, timings: dict, stats: dict) -> VideoResult:
        """Score one video (``eval.scoring``), save its mp4 and its tables, write its result atomically and return
        it."""
        from jensenkv.store.files import atomic_write_json, file_sha256, sealed

        spec = self.spec
        path = self.store.prompt_result_path(self.run_id, item.index)
        scored = score_video(self.scorers, item, spec.is_reference)
        written = [atomic_write_json(path.with_suffix(f".{name}.json"), frame.to_dict(orient="list"))
                   for name, frame in scored.tables.items()]  # this video's side files: its result lists them
        video_file = None
        if spec.eval.save_videos or any(scorer.needs_saved_video for scorer in self.scorers):
            tmp_dir = self.store.tmp_dir(self.run_id)
            saved = save_mp4(item.video, self.run_dir / "videos" / f"{item.index:04d}_s{item.seed}.mp4", spec.eval.fps,
                             tmp_dir=tmp_dir)
            upscaled = save_upscaled(item.video, saved, spec.eval.fps, tmp_dir=tmp_dir)  # to watch
            video_file = saved.name
            written += [saved] if upscaled is None else [saved, upscaled]
        result = {"index": item.index, "prompt": item.prompt, "seed": item.seed, "reference_id": ref_id,
                  "video": video_file, "metrics": scored.metrics, "missing": scored.missing, "timings": timings,
                  **stats, **scored.extra}
        files = {p.relative_to(self.run_dir).as_posix(): file_sha256(p) for p in written}
        atomic_write_json(path, sealed({**result, "files": files}))  # a resumed run trusts only what verifies
        return result

    def run(self) -> SealedRecord | None:
        """Run (or skip, when finished) and return the record; None if another live process is running it.

        Problems a user can fix (results not writable or disk full, unreadable weights, a non-finite video)
        raise ValueError subclasses with one line; the failure is kept in the run's error.json (sweep
        summaries report it) and removed by the next success.
        """
        with run_environment(self.spec):
            return self._run()

    def _run(self) -> SealedRecord | None:
        from jensenkv.store.files import WRITE_ERRNOS, ResultsWriteError, describe_write_error

        self.store.remove_leftovers(self.run_id)
        damage = self.store.damage(self.run_id)
        if damage is not None:  # a record or side file changed since the run wrote it: made again, never kept
            log.warning("%s: regenerating the run", damage)
        elif self.store.record_path(self.run_id).exists():  # finished, and sound
            log.info("run %s already finished: nothing to do (%s)", self.run_id, self.store.record_path(self.run_id))
            record = self.store.read_record(self.run_id)
            if self.wandb_pending():  # killed between its record and its W&B log: log it now
                self.log_pending_wandb(record)
            return record
        self.store.check_writable(self.run_id)
        lock = self.store.run_lock(self.run_id)
        if not lock.try_acquire():  # e.g. bf16 x {none, taylor} in one parallel sweep: the same run twice
            log.info("run %s is in progress elsewhere (%s): skipping it here", self.run_id, lock.describe_holder())
            return None
        try:
            if self.store.has_record(self.run_id):  # finished while we waited for the lock
                record = self.store.read_record(self.run_id)
            else:
                record = self.execute(lock)
            if record is None:  # another process took the run over (our lease went stale): it writes the record
                log.warning("run %s was taken over by another process (%s): leaving the run to it", self.run_id,
                            lock.describe_holder())
                return None
            if self.wandb_pending():
                self.log_wandb(record)
        except OSError as e:
            if e.errno not in WRITE_ERRNOS:
                self.note_failure(e)
                raise
            error = ResultsWriteError(describe_write_error(e, self.store.root))
            self.note_failure(error)
            raise error from None
        except Exception as e:
            self.note_failure(e)
            raise
        finally:
            lock.release()
        log.info("run %s done: %s", self.run_id, done_line(record))
        return record

    def execute(self, lock: FileLock | None = None) -> SealedRecord | None:
        """Generate and score every prompt (resuming), write the record; call it holding the run's lock. None,
        with nothing more written, once ``lock.lost`` says another process took the run over."""
        import torch
        from tqdm.auto import tqdm

        self.store.clean_run_tmp(self.run_id)
        threads = self.spec.threads or default_threads(self.spec.model)
        if threads:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        pairs = [(p, s) for p in self.spec.prompts for s in self.spec.eval.seeds]
        jobs = [(index, prompt, seed) for index, (prompt, seed) in enumerate(pairs)]
        todo = [job for job in jobs if not self.prompt_done(*job)]
        if todo and self.spec.generation.batch_size == "auto" and torch.device(self.spec.model.device).type == "cuda":
            self.videos.adapter  # noqa: B018 - load the weights first: auto divides the memory left free after them
        size = family(self.spec.model.kind).batch_size(self.spec, len(todo))
        with tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=f"run {self.run_id} ({self.spec.key.label})",
                  unit="video", leave=False) as bar:
            for first in range(0, len(todo), size):
                if lock is not None and lock.lost:
                    return None
                batch = todo[first:first + size]
                self.prompt_results(batch)
                bar.update(len(batch))
        if lock is not None and lock.lost:
            return None
        results = [self.video_result(index) for index, _, _ in jobs]
        self.store.write_record(self.assemble(results, time.perf_counter() - start))
        self.store.error_path(self.run_id).unlink(missing_ok=True)
        self.store.clean_run_tmp(self.run_id)
        return self.store.read_record(self.run_id)  # exactly what a later rerun returns

    def video_result(self, index: int) -> VideoResult:
        """Video ``index``'s result as the record holds it: its file without the digests that sealed it (the
        record lists every file's)."""
        from jensenkv.store.files import read_json
        from jensenkv.store.record import DIGEST

        result = read_json(self.store.prompt_result_path(self.run_id, index))
        return {k: v for k, v in result.items() if k not in (DIGEST, "files")}

    def prompt_done(self, index: int, prompt: str, seed: int) -> bool:
        """Whether video ``index`` has a sound per-video result to resume from: its own digest and its side
        files' verify; a damaged or unverifiable one is named in one line and made again."""
        from jensenkv.store.files import read_json
        from jensenkv.store.record import CorruptRecordError, DamagedRunError
        from jensenkv.store.record_check import check_video_result

        path = self.store.prompt_result_path(self.run_id, index)
        if not path.exists():
            return False
        try:
            result = read_json(path)
        except CorruptRecordError as e:
            log.warning("%s: regenerating that video", e)
            return False
        try:
            check_video_result(self.run_id, path, result, self.run_dir)
        except DamagedRunError as e:
            log.warning("%s: making that video again", e)
            return False
        if not isinstance(result, dict) or (result.get("prompt"), result.get("seed")) != (prompt, seed) or \
                not isinstance(result.get("metrics"), dict) or not isinstance(result.get("missing"), dict):
            log.warning("per-video result %s does not hold video %d (%r seed %d): regenerating it", path, index,
                        prompt, seed)
            return False
        return True

    def note_failure(self, error: BaseException) -> None:
        """Keep the failure next to the run (best effort: the disk may be what failed)."""
        from jensenkv.store.files import atomic_write_json, portable

        try:
            atomic_write_json(self.store.error_path(self.run_id),
                              {"error": type(error).__name__, "message": portable(str(error)),
                               "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        except OSError:
            pass

    def assemble(self, results: list[VideoResult], seconds: float) -> Record:
        """Aggregate the per-video results (``eval.scoring.score_run``: means, probe summaries, VBench over the
        run's videos, cache size) into the run record, writing the run's tables beside it."""
        import pandas as pd

        from jensenkv.store.files import atomic_write, portable_json
        from jensenkv.store.record_check import side_file_entry

        def table(index: int, name: str) -> pd.DataFrame:
            path = self.store.prompt_result_path(self.run_id, index).with_suffix(f".{name}.json")
            return pd.DataFrame(json.loads(path.read_text()))

        spec = self.spec
        run = score_run(self.scorers, results, RunFiles(lambda name: self.run_dir / "videos" / name, table))
        files = {}  # the side files the record is written with, checked whenever it is read
        for name, frame in run.tables.items():  # e.g. attention.csv: medians are taken over all its probes
            path = atomic_write(self.run_dir / f"{name}.csv", lambda f, frame=frame: frame.to_csv(f, index=False),
                                mode="w")
            files[path.name] = side_file_entry(path, frame)
        used = run.extra.get("vbench_dimensions_used", [])
        computed_from = {"reference": f"same model, prompt and seed with a full-precision "
                                      f"({spec.cache.full_precision_dtype}) cache; per-prompt reference_id "
                                      "names the file under refs/",
                         "videos": "compared as 8-bit frames (F, C, H, W), as saved"}
        computed_from.update({s.metric: p for s in self.scorers if (p := s.provenance(run)) is not None})
        for r in results:  # reasons name files: no machine paths in records
            r["missing"] = portable_json(r["missing"])
        return {
            "run_id": self.run_id,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "computed_from": portable_json(computed_from),
            "experiment_name": spec.experiment_name,
            "identity": spec.identity(),
            "labels": spec.labels(),
            "metrics": run.metrics,
            "missing": portable_json(run.missing),
            "vbench_dimensions_used": used,
            "per_prompt": results,
            "files": files,
            "seconds": seconds,
            "versions": _versions(),
        }

    def wandb_pending(self) -> bool:
        """True when W&B is on and this run's record has not been logged to it yet."""
        return wandb.pending(self.store, self.run_id, self.spec.logger)

    def log_pending_wandb(self, record: dict) -> None:
        """Log a finished run's record to W&B, holding the run's lock (a parallel rerun logs it once)."""
        wandb.log_when_free(self.store, self.run_id, self.wandb_pending, lambda: self.log_wandb(record))

    def log_wandb(self, record: dict) -> None:
        """Log the record to W&B, then mark it logged (``run.wandb.log_record``)."""
        wandb.log_record(self.store, self.spec.logger, record)


def _versions() -> dict:
    import torch

    import jensenkv

    return {"jensenkv": jensenkv.__version__, "torch": torch.__version__}
