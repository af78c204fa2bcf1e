"""Executes one RunSpec: BF16 references (shared, generated once), the quantized videos, metrics, the run
record (written atomically) and W&B (marked done in ``wandb.json`` once logged). Resumable per prompt; a
finished run is a no-op, except that a W&B log lost to a kill is redone."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jensenkv.eval.video_files import save_mp4, save_upscaled
from jensenkv.models.registry import family
from jensenkv.run.done_line import done_line
from jensenkv.spec import RunSpec

if TYPE_CHECKING:
    from jensenkv.tracking import FileLock

log = logging.getLogger("jensenkv.run")
MAX_DEFAULT_THREADS = 4  # the built-in model's ops are small: more threads mostly add contention
VIDEO_METRICS = {"psnr", "ssim", "lpips", "vbench", "attention", "content"}  # scored on the generated video


class NonFiniteVideoError(ValueError):
    """A generated video holds NaN or inf (e.g. broken weights): never scored, never recorded."""


class BatchMemoryError(ValueError):
    """A batch of videos ran out of device memory: a smaller generation.batch_size fits."""


class WeightsFileError(ValueError):
    """A weights file exists but cannot be read (truncated, garbled, empty)."""


def available_cores() -> int:
    """CPU cores this process may use: its affinity (SLURM's cpus_per_task, taskset) and cgroup quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def parallel_jobs() -> int:
    """How many jobs of this sweep run at once on this machine (joblib launcher's n_jobs; 1 otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return 1
        launcher = HydraConfig.get().launcher
        if "joblib" not in str(launcher.get("_target_", "")).lower():
            return 1
        n_jobs = int(launcher.get("n_jobs") or 1)
    except Exception:  # noqa: BLE001 - no Hydra context (notebooks, tests): one job
        return 1
    return available_cores() if n_jobs < 0 else max(1, n_jobs)


def default_threads(model: Any = None) -> int | None:
    """torch threads when ``threads`` is null: None (leave torch alone) if OMP_NUM_THREADS is set; the family's
    own count where it has one (the built-in model: 1, its ops are too small to split); else the cores shared
    out between parallel local jobs, at most MAX_DEFAULT_THREADS (torch's default gives every job every core
    and oversubscribes)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if model is not None and family(model.kind).threads is not None:
        return family(model.kind).threads
    return max(1, min(MAX_DEFAULT_THREADS, available_cores() // parallel_jobs()))


@contextlib.contextmanager
def run_environment(spec: RunSpec) -> Iterator[None]:
    """Library caches and logs of a run under the results directory (W&B's cache and config, matplotlib's
    config), unless the user set them; restored afterwards."""
    wandb_dir = Path(spec.logger.dir or Path(spec.results_dir) / "wandb")
    wanted = {"WANDB_DIR": wandb_dir, "WANDB_CACHE_DIR": wandb_dir / ".cache",
              "WANDB_CONFIG_DIR": wandb_dir / ".config", "WANDB_DATA_DIR": wandb_dir / ".data",
              "MPLCONFIGDIR": Path(spec.results_dir) / ".cache" / "matplotlib"}
    saved = {k: os.environ.get(k) for k in wanted}
    for key, value in wanted.items():
        if saved[key] is None:
            os.environ[key] = str(Path(value).absolute())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def check_finite(video: Any, what: str) -> None:
    """Raise NonFiniteVideoError when a (F, C, H, W) float video holds NaN or inf."""
    import torch

    bad = int((~torch.isfinite(video)).sum())
    if bad:
        raise NonFiniteVideoError(f"the generated video for {what} has {bad} non-finite values (NaN/inf) of "
                                  f"{video.numel()}: the model's weights or settings are broken; nothing was scored "
                                  "or recorded")


def _to_uint8(video: Any) -> Any:
    """(F, C, H, W) float in [0, 1] -> uint8 (what a saved video holds; metrics compare these)."""
    import torch

    return (video.clamp(0, 1) * 255).round().to(torch.uint8)


class Runner:
    """Executes one RunSpec: references, generation, metrics, record, W&B."""

    def __init__(self, spec: RunSpec):
        from jensenkv.tracking import ResultsStore

        self.spec = spec
        self.store = ResultsStore(spec.results_dir)
        self.run_id = spec.run_id
        self.run_dir = self.store.run_dir(self.run_id)
        self._adapter = None
        self._reference_adapter = None  # teacher-forced fidelity's full-precision twin
        self._lpips = None

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
        from jensenkv.tracking import atomic_write, config_hash

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
                        payload = {"video": _to_uint8(result.video), "timings": result.timings,
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
        return [(_to_uint8(r.video), r.probes, r.timings, dict(stats)) for r in results]

    def teacher_forced(self, jobs: list[tuple[str, int]]) -> list[tuple[dict, dict, list[dict]]]:
        """(metrics, missing, per-chunk rows) of teacher-forced fidelity per (prompt, seed): each chunk read with
        the BF16 run's own history, the run's cache against the full-precision one (``jensenkv.generation.teacher_forced``);
        PSNR between the two decoded clean chunks (float frames), mean over chunks >= 1."""
        import dataclasses
        import math

        from jensenkv.attention.config import AttentionConfig
        from jensenkv.eval.fidelity import video_psnr
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
        out = []
        for prompt, seed in jobs:
            chunks = teacher_forced_chunks(self.adapter, self._reference_adapter, prompt, seed)
            rows = [{"chunk": c.chunk, "psnr": video_psnr(c.video.clamp(0, 1), c.reference.clamp(0, 1)),
                     "rel_err": c.rel_err, "latent_rel_err": c.latent_rel_err} for c in chunks]
            if not rows:
                out.append(({}, {"teacher_forced": "one chunk: no chunk reads a cache"}, rows))
                continue
            metrics = {f"tf_{k}": sum(r[k] for r in rows) / len(rows) for k in ("rel_err", "latent_rel_err")}
            finite = [r["psnr"] for r in rows if math.isfinite(r["psnr"])]
            missing = {}
            if len(finite) == len(rows):
                metrics["tf_psnr"] = sum(finite) / len(finite)
            else:
                missing["tf_psnr"] = "a chunk identical to its full-precision twin (PSNR is infinite)"
            out.append((metrics, missing, rows))
        return out

    def lpips(self):
        from jensenkv.eval.fidelity import LpipsScorer

        if self._lpips is None:
            self._lpips = LpipsScorer(self.spec.eval.lpips.net, device=self.spec.model.device)
        return self._lpips

    def score_content(self, prompt: str, video: Any, metrics: dict, missing: dict) -> None:
        """Prompt-content recovery (colour and direction); BF16 runs get it too: it needs no reference."""
        from jensenkv.eval.content import content_match

        limit = family(self.spec.model.kind).metric_limits.get("content")
        if limit is not None:
            missing["content"] = limit
            return
        try:
            metrics.update(content_match(video.float() / 255, prompt))  # video: (F, C, H, W) uint8
        except ValueError as err:
            missing["content"] = f"content recovery needs a prompt in the built-in model's grammar: {err}"

    def prompt_results(self, batch: list[tuple[int, str, int]]) -> None:
        """Generate and score a batch of (index, prompt, seed); each video's result is saved atomically as soon
        as the batch is done, so a rerun regenerates only the videos without one."""
        import torch

        spec = self.spec
        jobs = [(prompt, seed) for _, prompt, seed in batch]
        try:
            if VIDEO_METRICS & set(spec.eval.metrics) or spec.eval.save_videos:
                references = self.references(jobs)
                generated = [(ref, None, {}, {}) for _, ref in references] if spec.is_reference else self.generate(jobs)
            else:  # teacher-forced fidelity alone regenerates what it compares: no video, no reference needed
                references, generated = [(None, None)] * len(jobs), [(None, None, {}, {})] * len(jobs)
        except torch.cuda.OutOfMemoryError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise BatchMemoryError(f"generation.batch_size={spec.generation.batch_size}: a batch of {len(batch)} "
                                   f"videos does not fit on {spec.model.device} ({first}); use "
                                   f"generation.batch_size={max(1, len(batch) // 2)}") from None
        forced = self.teacher_forced(jobs) if "teacher_forced" in spec.eval.metrics and not spec.is_reference \
            else [None] * len(jobs)
        for (index, prompt, seed), (ref_id, ref), made, tf in zip(batch, references, generated, forced):
            self.score(index, prompt, seed, ref_id, ref, *made, **({} if tf is None else {"teacher_forced": tf}))

    def score(self, index: int, prompt: str, seed: int, ref_id: str, ref: Any, video: Any,
              probes: list[dict] | None, timings: dict, stats: dict,
              teacher_forced: tuple[dict, dict, list[dict]] | None = None) -> dict:
        """Score one video against its reference, save its mp4, write its result atomically and return it
        (``teacher_forced``: ``Runner.teacher_forced``'s entry for it, when the metric is on)."""
        from jensenkv.eval.attention import probe_frame, summarize_probes
        from jensenkv.eval.fidelity import lpips_availability, video_psnr, video_ssim
        from jensenkv.tracking import atomic_write_json, file_sha256, sealed

        spec = self.spec
        path = self.store.prompt_result_path(self.run_id, index)
        written = []  # this video's side files: its result lists their digests
        metrics: dict[str, Any] = {}
        missing: dict[str, str] = {}
        if spec.is_reference:
            for m in ("psnr", "ssim", "lpips", "attention"):
                if m in spec.eval.metrics:
                    missing[m] = "BF16 run: it is its own reference"
        elif video is not None:
            x, y = video.float() / 255, ref.float() / 255  # (F, C, H, W) in [0, 1]
            if "psnr" in spec.eval.metrics:
                psnr = video_psnr(x, y)
                if psnr == float("inf"):
                    missing["psnr"] = "video identical to its BF16 reference (PSNR is infinite)"
                else:
                    metrics["psnr"] = psnr
            if "ssim" in spec.eval.metrics:
                metrics["ssim"] = video_ssim(x, y)
            if "lpips" in spec.eval.metrics:
                status = lpips_availability(spec.eval.lpips.net)
                if status.available:
                    metrics["lpips"] = self.lpips()(x, y)
                else:
                    missing["lpips"] = status.reason
            if "attention" in spec.eval.metrics:
                if probes:
                    frame = probe_frame(probes, prompt_index=index, seed=seed)
                    metrics.update(summarize_probes(frame))
                    written.append(atomic_write_json(path.with_suffix(".attention.json"), frame.to_dict(orient="list")))
                else:
                    missing["attention"] = "the generator recorded no probes (a single chunk has no cache)"
        if spec.is_reference and "teacher_forced" in spec.eval.metrics:
            missing["teacher_forced"] = "BF16 run: it is its own reference"
        extra = {}
        if teacher_forced is not None:
            tf_metrics, tf_missing, extra["teacher_forced"] = teacher_forced
            metrics.update(tf_metrics)
            missing.update(tf_missing)
        if "content" in spec.eval.metrics:
            self.score_content(prompt, video, metrics, missing)
        video_file = None
        if spec.eval.save_videos or "vbench" in spec.eval.metrics:
            saved = save_mp4(video, self.run_dir / "videos" / f"{index:04d}_s{seed}.mp4", spec.eval.fps,
                             tmp_dir=self.store.tmp_dir(self.run_id))
            upscaled = save_upscaled(video, saved, spec.eval.fps, tmp_dir=self.store.tmp_dir(self.run_id))  # to watch
            video_file = saved.name
            written += [saved] if upscaled is None else [saved, upscaled]
        result = {"index": index, "prompt": prompt, "seed": seed, "reference_id": ref_id, "video": video_file,
                  "metrics": metrics, "missing": missing, "timings": timings, **stats, **extra}
        files = {p.relative_to(self.run_dir).as_posix(): file_sha256(p) for p in written}
        atomic_write_json(path, sealed({**result, "files": files}))  # a resumed run trusts only what verifies
        return result

    def run(self) -> dict | None:
        """Run (or skip, when finished) and return the record; None if another live process is running it.

        Problems a user can fix (results not writable or disk full, unreadable weights, a non-finite video)
        raise ValueError subclasses with one line; the failure is kept in the run's error.json (sweep
        summaries report it) and removed by the next success.
        """
        with run_environment(self.spec):
            return self._run()

    def _run(self) -> dict | None:
        from jensenkv.tracking import WRITE_ERRNOS, ResultsWriteError, describe_write_error

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

    def execute(self, lock: FileLock | None = None) -> dict | None:
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
            self.adapter  # noqa: B018 - load the weights first: auto divides the memory left free after them
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

    def video_result(self, index: int) -> dict:
        """Video ``index``'s result as the record holds it: its file without the digests that sealed it (the
        record lists every file's)."""
        from jensenkv.tracking import DIGEST, read_json

        result = read_json(self.store.prompt_result_path(self.run_id, index))
        return {k: v for k, v in result.items() if k not in (DIGEST, "files")}

    def prompt_done(self, index: int, prompt: str, seed: int) -> bool:
        """Whether video ``index`` has a sound per-video result to resume from: its own digest and its side
        files' verify; a damaged or unverifiable one is named in one line and made again."""
        from jensenkv.tracking import CorruptRecordError, DamagedRunError, read_json
        from jensenkv.record_check import check_video_result

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
        from jensenkv.tracking import atomic_write_json, portable

        try:
            atomic_write_json(self.store.error_path(self.run_id),
                              {"error": type(error).__name__, "message": portable(str(error)),
                               "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        except OSError:
            pass

    def assemble(self, results: list[dict], seconds: float) -> dict:
        """Aggregate per-prompt results (+ VBench over the run's videos) into the run record."""
        import pandas as pd

        from jensenkv.eval.attention import summarize_probes
        from jensenkv.eval.vbench import evaluate_vbench

        spec = self.spec
        metrics: dict[str, Any] = {}
        missing: dict[str, str] = {}
        per_metric: dict[str, list[float]] = {}
        for r in results:
            for k, v in r["metrics"].items():
                per_metric.setdefault(k, []).append(v)
            for k, reason in r["missing"].items():
                missing.setdefault(k, reason)
        for k, values in per_metric.items():
            if k in missing:  # some prompts lack it: an average over the rest would mislead
                continue
            metrics[k] = float(sum(values) / len(values))
        frames = [pd.DataFrame(json.loads(self.store.prompt_result_path(self.run_id, r["index"])
                                          .with_suffix(".attention.json").read_text()))
                  for r in results if "delta_p_s_mean" in r["metrics"]]
        files = {}  # the side files the record is written with, checked whenever it is read
        if frames:  # medians must be taken over all probes, not averaged per prompt
            attention = pd.concat(frames, ignore_index=True)
            metrics.update(summarize_probes(attention))
            from jensenkv.tracking import ATTENTION_FILE, atomic_write, side_file_entry

            path = atomic_write(self.run_dir / ATTENTION_FILE, lambda f: attention.to_csv(f, index=False), mode="w")
            files[ATTENTION_FILE] = side_file_entry(path, attention)
        used: list[str] = []
        if "vbench" in spec.eval.metrics:
            videos = {str(self.run_dir / "videos" / r["video"]): r["prompt"] for r in results}
            vb = evaluate_vbench(videos, spec.eval.vbench.dimensions, spec.eval.vbench.device or spec.model.device
                                 or "cpu")
            for dim, score in vb.scores.items():
                metrics[f"vbench_{dim}"] = score
                for r in results:
                    r["metrics"][f"vbench_{dim}"] = vb.per_video[dim].get(r["video"])
            for dim, reason in vb.missing.items():
                missing[f"vbench_{dim}"] = reason
            used = vb.used
            if vb.aggregate is None:
                missing["vbench"] = "no VBench dimension could run: " + "; ".join(f"{d}: {r}"
                                                                                 for d, r in vb.missing.items())
            else:
                metrics["vbench"] = vb.aggregate
        bytes_ = [r.get("cache_bytes") for r in results if r.get("cache_bytes")]
        bf16 = [r.get("cache_bf16_bytes") for r in results if r.get("cache_bf16_bytes")]
        if bytes_ and bf16:
            metrics["cache_bytes"] = float(sum(bytes_) / len(bytes_))
            metrics["effective_bits"] = 16.0 * sum(bytes_) / sum(bf16)
        elif spec.is_reference:
            metrics["effective_bits"] = 16.0 if spec.cache.full_precision_dtype != "float32" else 32.0
        from jensenkv.tracking import portable_json

        for r in results:  # reasons name files: no machine paths in records
            r["missing"] = portable_json(r["missing"])
        return {
            "run_id": self.run_id,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "computed_from": portable_json(self.provenance(used)),
            "experiment_name": spec.experiment_name,
            "identity": spec.identity(),
            "labels": spec.labels(),
            "metrics": metrics,
            "missing": portable_json(missing),
            "vbench_dimensions_used": used,
            "per_prompt": results,
            "files": files,
            "seconds": seconds,
            "versions": _versions(),
        }

    def provenance(self, vbench_used: list[str]) -> dict:
        """What the metrics were computed from: the reference, the evaluator weights."""
        from jensenkv.eval.fidelity import lpips_backbone_path
        from jensenkv.eval.vbench import vbench_cache_dir

        spec = self.spec
        out: dict[str, Any] = {"reference": f"same model, prompt and seed with a full-precision "
                                            f"({spec.cache.full_precision_dtype}) cache; per-prompt reference_id "
                                            "names the file under refs/",
                               "videos": "compared as 8-bit frames (F, C, H, W), as saved"}
        if "lpips" in spec.eval.metrics:
            out["lpips"] = {"package": "lpips 0.1 linear heads", "net": spec.eval.lpips.net,
                            "backbone": str(lpips_backbone_path(spec.eval.lpips.net))}
        if "vbench" in spec.eval.metrics:
            out["vbench"] = {"cache_dir": str(vbench_cache_dir()), "dimensions_used": vbench_used,
                             "aggregate": "mean x100 over dimensions_used"}
        return out

    def wandb_pending(self) -> bool:
        """True when W&B is on and this run's record has not been logged to it yet."""
        from jensenkv.tracking import resolve_wandb_mode

        return resolve_wandb_mode(self.spec.logger.mode) != "disabled" and \
            not self.store.wandb_marker_path(self.run_id).exists()

    def log_pending_wandb(self, record: dict) -> None:
        """Log a finished run's record to W&B, holding the run's lock (a parallel rerun logs it once)."""
        lock = self.store.run_lock(self.run_id)
        try:
            acquired = lock.try_acquire()
        except OSError as e:  # e.g. finished results on a read-only disk: the record stands
            log.warning("run %s is not logged to W&B yet and its folder cannot be written (%s); rerun where it can",
                        self.run_id, e)
            return
        if not acquired:
            log.info("run %s: its W&B log is being written elsewhere (%s)", self.run_id, lock.describe_holder())
            return
        try:
            self.store.clean_run_tmp(self.run_id)  # the lock's holder owns the folder: e.g. a killed marker write's
            if self.wandb_pending():
                self.log_wandb(record)
        finally:
            lock.release()

    def log_wandb(self, record: dict) -> None:
        """Config, metrics, one sample video and the attention plot, then the marker ``wandb.json``.

        The W&B id is derived from the record, so a log cut short by a kill is redone under the same id (the
        partial offline folder is replaced). A W&B failure never loses the record: it is retried next time.
        """
        import shutil

        from jensenkv.tracking import WandbRun, atomic_write_json, config_hash

        labels = record["labels"]
        name = f"{labels['model']}/{labels['quantizer']}"
        if labels["method"] != "none":
            name += f"-int{labels['bits']}-g{labels['group_size']}-{labels['correction']}"
        wandb_id = f"{self.run_id}-{config_hash(record.get('created_at'), 6)}"
        logger = dataclasses.asdict(self.spec.logger)
        for partial in WandbRun.offline_runs(logger, wandb_id):  # no marker: an interrupted log
            shutil.rmtree(partial, ignore_errors=True)
        try:
            wb = WandbRun(logger, self.run_id, name, self.spec.experiment_name,
                          {**record["identity"], **labels, "run_id": self.run_id}, wandb_id=wandb_id)
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging skipped (%s: %s); the local record is written, a rerun logs it",
                        type(e).__name__, e)
            return
        try:
            wb.log_metrics(record["metrics"])
            first = record["per_prompt"][0] if record["per_prompt"] else None
            if first and first.get("video"):
                wb.log_video("sample_video", self.run_dir / "videos" / first["video"], caption=first["prompt"])
            csv = self.run_dir / "attention.csv"
            if csv.exists() and wb.log_plots_enabled and wb.mode != "disabled":
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
                import pandas as pd

                from jensenkv.report.figures import plot_attention_mass

                fig = plot_attention_mass({name: pd.read_csv(csv)}, title=f"{record['labels'].get('model')}: "
                                          "attention mass on the cache per layer and step")
                wb.log_figure("attention_mass", fig)
                plt.close(fig)
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging failed (%s: %s); the local record is written, a rerun logs it",
                        type(e).__name__, e)
            with contextlib.suppress(Exception):
                wb.finish(exit_code=1)
            return
        try:  # a full disk here loses only the log: no marker, so the next rerun logs it again
            wb.finish()
            atomic_write_json(self.store.wandb_marker_path(self.run_id),
                              {"wandb_id": wandb_id, "mode": wb.mode, "project": self.spec.logger.project,
                               "logged_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging failed (%s: %s); the local record is written, a rerun logs it",
                        type(e).__name__, e)


def _versions() -> dict:
    import torch

    import jensenkv

    return {"jensenkv": jensenkv.__version__, "torch": torch.__version__}
