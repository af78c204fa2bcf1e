"""What a command's runs came to: done / skipped (already finished) / failed / missing, and its exit status.

Hydra reports neither runs skipped because another process holds them nor runs a stopped sweep never
reached, so the command plans its runs first (every job of the sweep, with its run id) and checks the
results store after Hydra returns. A run still held by a live process elsewhere (another sweep, a SLURM
job) is waited for, with a message. The exit status (``jensenkv.exit_codes``): 0 when every run has its
record, 1 (partial) when runs are missing (not reached, held elsewhere), 3 when a run failed or is damaged, 2
for bad input; a job's unexpected error (Hydra's own exit 1) counts as failed.

Ctrl-C prints one line and the summary (exit 130). A run whose record is written counts as done even when its
W&B log failed (a full disk, W&B down): the summary says so, and any rerun logs it (exit 0: every result is
in the store).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("jensenkv.run")
from jensenkv.exit_codes import BAD_INPUT, DONE, FAILED, INTERRUPTED, PARTIAL

MISSING_EXIT = PARTIAL  # runs missing at the end of the command (none failed)
INTERRUPTED_EXIT = INTERRUPTED  # Ctrl-C (128 + SIGINT), as a shell reports it


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    results_dir: Path
    label: str
    finished_before: bool
    videos: int = 0           # the run's videos (prompts x seeds)
    videos_kept: int = 0      # of them, finished by an earlier, interrupted command (resumed, not redone)
    wandb: bool = False       # W&B is on: a finished run must also have its W&B log


def _job_overrides(args: Sequence[str]) -> list[list[str]] | None:
    """The override list of every job the command launches (the product of swept values, as Hydra's basic
    sweeper builds it); None when the arguments are not plain overrides."""
    return _job_plan(args)[0]


def _job_plan(args: Sequence[str]) -> tuple[list[list[str]] | None, Any]:
    """(``_job_overrides``, the launcher that runs the jobs: None for a single run, which runs here)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from jensenkv.config.resolve import compose_config

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return None, None
    plain = [a for a in args if not a.startswith("-")]
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(plain)
    base = compose_config([o.input_line for o in parsed if not o.is_sweep_override()], hydra_config=True)
    multirun = "-m" in args or "--multirun" in args or "MULTIRUN" in str(base.hydra.get("mode"))
    if not multirun:
        return [plain], None
    params = base.hydra.sweeper.get("params") or {}
    declared = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    by_key = {o.key_or_group: o for o in [*declared, *parsed]}  # command line last: it wins, as in Hydra
    return BasicSweeper.split_arguments(list(by_key.values()), None)[0], base.hydra.get("launcher")


def _label(spec) -> str:
    labels = spec.labels()
    if labels["quantizer"] == "bf16":
        return "bf16"
    return f"{labels['quantizer']} INT{labels['bits']} g{labels['group_size']} {labels['correction']}"


def plan_runs(args: Sequence[str]) -> list[PlannedRun] | None:
    """The distinct runs of the command, and whether each was finished before it started; None if unknown."""
    from jensenkv.config.resolve import build_spec, compose_config
    from jensenkv.config.logger import resolve_wandb_mode
    from jensenkv.run.slurm_resources import planned_node_of
    from jensenkv.store.results import ResultsStore

    try:
        jobs, launcher = _job_plan(args)
        if jobs is None:
            return None
        planned: dict[str, PlannedRun] = {}
        for overrides in jobs:
            with planned_node_of(launcher):  # the run ids the jobs write: devices resolved as on their node
                spec = build_spec(compose_config(overrides))
            if spec.run_id not in planned:
                store = ResultsStore(spec.results_dir)
                finished = store.has_record(spec.run_id)  # a damaged run counts as unfinished
                videos = len(spec.prompts) * len(spec.eval.seeds)
                kept = 0 if finished else sum(store.prompt_result_path(spec.run_id, i).exists() for i in range(videos))
                planned[spec.run_id] = PlannedRun(spec.run_id, Path(spec.results_dir), _label(spec), finished,
                                                  videos, kept, resolve_wandb_mode(spec.logger.mode) != "disabled")
    except Exception as e:  # noqa: BLE001 - range sweeps and the like: Hydra runs them, without a summary
        print(f"note: no run summary for this command ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    return list(planned.values())


def outcome(run: PlannedRun, started_at: float, wait: bool = True) -> tuple[str, str]:
    """("done" | "skipped" | "failed" | "missing" | "queued", detail) of one planned run after the command ran;
    a done or skipped run whose W&B log is still missing (read after any wait) has the detail "wandb pending".
    ``wait``: wait for a run in progress elsewhere (not after Ctrl-C). A run of a SLURM sweep whose job is
    still queued or running is "queued"; one whose job ended without a record says how (sacct's state and
    the job's one-line reason)."""
    from jensenkv.run.slurm_launcher import ACTIVE_STATES, sweep_jobs
    from jensenkv.store.files import ResultsWriteError, read_json
    from jensenkv.store.record import CorruptRecordError
    from jensenkv.store.results import ResultsStore

    store = ResultsStore(run.results_dir)
    job = sweep_jobs().get(run.run_id)

    def wandb_pending() -> bool:  # read only once the run is over: a log still being written is not a failure
        return run.wandb and not store.wandb_marker_path(run.run_id).exists()

    try:
        if run.finished_before:
            return "skipped", "wandb pending" if wandb_pending() else "already finished"
        lock = store.run_lock(run.run_id)
        if not wait and job is not None and job.state in ACTIVE_STATES and not store.has_record(run.run_id):
            return "queued", _queued(job.job_id)
        if not store.has_record(run.run_id) and lock.is_held_elsewhere():
            if not wait:
                return "missing", f"in progress elsewhere: {lock.describe_holder()}"
            log.warning("run %s (%s) is in progress elsewhere: waiting for it", run.run_id, run.label)
            print(f"waiting for run {run.run_id} ({run.label}), in progress elsewhere: {lock.describe_holder()}",
                  file=sys.stderr, flush=True)
            lock.wait_released()
        if store.has_record(run.run_id):
            if wandb_pending():
                return "done", "wandb pending"
            if job is not None and job.state in ACTIVE_STATES:  # requeued (node lost) after its orphan finished
                return "done", (f"SLURM job {job.job_id} is {job.state} again, requeued after the record was "
                                "written: it will find the record and do nothing")
            if job is not None and job.state not in ("COMPLETED", "UNKNOWN"):  # e.g. cancelled after its record
                return "done", f"SLURM job {job.job_id} ended {job.state} after the record was written"
            return "done", ""
        damage = store.damage(run.run_id)
        if damage is not None:
            return "failed", str(damage)
    except (CorruptRecordError, ResultsWriteError) as e:
        return "failed", str(e)
    error = store.error_path(run.run_id)
    if error.exists() and error.stat().st_mtime >= started_at - 1:
        try:
            return "failed", read_json(error).get("message", "")
        except (OSError, ValueError):
            return "failed", f"see {error}"
    if job is not None and job.state in ACTIVE_STATES:
        return "queued", _queued(job.job_id)
    if job is not None:
        reason = f": {job.reason}" if job.reason else ""
        return "missing", (f"no record: SLURM job {job.job_id} ended {job.state}{reason}; rerun the command to "
                           "finish it")
    return "missing", "no record: not run, interrupted, or its process was killed; rerun the command to finish it"


def _queued(job_id: str) -> str:
    return f"SLURM job {job_id} still queued or running: it finishes the run; the rerun then finds its record"


def _wandb_note(results: dict, status: str) -> str:
    pending = sum(1 for s, detail in results.values() if s == status and detail == "wandb pending")
    return f"{pending} W&B log{'s' if pending > 1 else ''} failed: will retry on rerun" if pending else ""


def summarize(runs: list[PlannedRun], started_at: float, wait: bool = True) -> tuple[str, bool]:
    """(the summary text, True when every run has a record); ``wait``: see ``outcome``."""
    text, status = summary_status(runs, started_at, wait)
    return text, status == DONE


def summary_status(runs: list[PlannedRun], started_at: float, wait: bool = True) -> tuple[str, int]:
    """(the summary text, its exit status: DONE, PARTIAL when runs are missing or queued, FAILED when any
    failed)."""
    results = {run.run_id: outcome(run, started_at, wait) for run in runs}
    counts = {k: sum(1 for status, _ in results.values() if status == k) for k in ("done", "skipped", "failed",
                                                                                  "missing", "queued")}
    done_note, skipped_note = _wandb_note(results, "done"), _wandb_note(results, "skipped")
    resumed = [run for run in runs if run.videos_kept]
    lines = [f"summary: {len(runs)} run(s): {counts['done']} done{f' ({done_note})' if done_note else ''}, "
             f"{counts['skipped']} skipped (already finished{f'; {skipped_note}' if skipped_note else ''}), "
             f"{counts['failed']} failed, {counts['missing']} missing"
             + (f", queued: {counts['queued']}" if counts["queued"] else "")
             + (f"; resumed {len(resumed)} run{'s' if len(resumed) > 1 else ''} with finished videos "
                f"({sum(r.videos_kept for r in resumed)} of {sum(r.videos for r in resumed)} videos kept)"
                if resumed else "")]
    for run in runs:
        status, detail = results[run.run_id]
        if status in ("failed", "missing", "queued") or (status == "done" and detail.startswith("SLURM")):
            lines.append(f"  {status}: run {run.run_id} ({run.label}): {detail}")
    status = FAILED if counts["failed"] else PARTIAL if counts["missing"] or counts["queued"] else DONE
    return "\n".join(lines), status


def job_status(code: int | str | None) -> int:
    """A job's exit as the command's: ours (bad input, failed) as they are; anything else (Hydra's 1 for an
    unexpected error, a message) is a failure, never "partial"."""
    if code in (0, None):
        return DONE
    return code if code in (BAD_INPUT, FAILED, INTERRUPTED) else FAILED


INTERRUPTED = ("interrupted: Ctrl-C stopped the command; finished runs and videos are kept, and the same "
               "command resumes the rest")


def run_with_summary(args: Sequence[str], launch: Callable[[], None]) -> None:
    """Plan the runs, ``launch`` (Hydra), then print the summary; exit non-zero when runs are missing, 130
    after Ctrl-C (one line, the summary, no traceback)."""
    from jensenkv.run.orphans import mark_sweep_process

    mark_sweep_process()  # parallel workers stop when this process dies
    # Ctrl-C ends joblib's workers mid-job: the resource tracker's note on their semaphores is noise
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"),
                                                          "ignore:resource_tracker:UserWarning")))
    try:
        runs = plan_runs(args)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_EXIT)
    started_at = time.time()
    code: int | str | None = 0
    interrupted = False
    try:
        launch()
    except SystemExit as e:  # a job's one-line error stops Hydra's sweep: still say where the sweep stands
        code = e.code
    except KeyboardInterrupt:
        interrupted = True
        print(INTERRUPTED, file=sys.stderr, flush=True)
    if runs is None:
        if interrupted:
            sys.exit(INTERRUPTED_EXIT)
        if job_status(code) != DONE:
            sys.exit(job_status(code))
        return
    text, status = summary_status(runs, started_at, wait=not interrupted)
    print(text, file=sys.stderr, flush=True)
    if interrupted:
        sys.exit(INTERRUPTED_EXIT)
    if job_status(code) != DONE:
        sys.exit(job_status(code))
    if status != DONE:
        sys.exit(status)
