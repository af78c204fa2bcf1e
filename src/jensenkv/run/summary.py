"""What a command's runs came to: done / skipped (already finished) / failed / missing, and its exit status.

Hydra reports neither runs skipped because another process holds them nor runs a stopped sweep never
reached, so the command plans its runs first (every job of the sweep, with its run id) and checks the
results store after Hydra returns. A run still held by a live process elsewhere (another sweep, a SLURM
job) is waited for, with a message. Any run without a record at the end makes the exit status non-zero.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("jensenkv.run")
MISSING_EXIT = 1  # runs missing or failed at the end of the command


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    results_dir: Path
    label: str
    finished_before: bool


def _job_overrides(args: Sequence[str]) -> list[list[str]] | None:
    """The override list of every job the command launches (the product of swept values, as Hydra's basic
    sweeper builds it); None when the arguments are not plain overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from jensenkv.run.spec import compose_config

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return None
    plain = [a for a in args if not a.startswith("-")]
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(plain)
    base = compose_config([o.input_line for o in parsed if not o.is_sweep_override()], hydra_config=True)
    multirun = "-m" in args or "--multirun" in args or "MULTIRUN" in str(base.hydra.get("mode"))
    if not multirun:
        return [plain]
    params = base.hydra.sweeper.get("params") or {}
    declared = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    by_key = {o.key_or_group: o for o in [*declared, *parsed]}  # command line last: it wins, as in Hydra
    return BasicSweeper.split_arguments(list(by_key.values()), None)[0]


def _label(spec) -> str:
    labels = spec.labels()
    if labels["quantizer"] == "bf16":
        return "bf16"
    return f"{labels['quantizer']} INT{labels['bits']} g{labels['group_size']} {labels['correction']}"


def plan_runs(args: Sequence[str]) -> list[PlannedRun] | None:
    """The distinct runs of the command, and whether each was finished before it started; None if unknown."""
    from jensenkv.run.spec import build_spec, compose_config
    from jensenkv.tracking import ResultsStore

    try:
        jobs = _job_overrides(args)
        if jobs is None:
            return None
        planned: dict[str, PlannedRun] = {}
        for overrides in jobs:
            spec = build_spec(compose_config(overrides))
            if spec.run_id not in planned:
                store = ResultsStore(spec.results_dir)
                planned[spec.run_id] = PlannedRun(spec.run_id, Path(spec.results_dir), _label(spec),
                                                  store.has_record(spec.run_id))
    except Exception as e:  # noqa: BLE001 - range sweeps and the like: Hydra runs them, without a summary
        print(f"note: no run summary for this command ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    return list(planned.values())


def outcome(run: PlannedRun, started_at: float) -> tuple[str, str]:
    """("done" | "skipped" | "failed" | "missing", detail) of one planned run after the command ran."""
    from jensenkv.tracking import CorruptRecordError, ResultsStore, read_json

    store = ResultsStore(run.results_dir)
    try:
        if run.finished_before:
            return "skipped", "already finished"
        lock = store.run_lock(run.run_id)
        if not store.has_record(run.run_id) and lock.is_held_elsewhere():
            log.warning("run %s (%s) is in progress elsewhere: waiting for it", run.run_id, run.label)
            print(f"waiting for run {run.run_id} ({run.label}), in progress elsewhere: {lock.describe_holder()}",
                  file=sys.stderr, flush=True)
            lock.wait_released()
        if store.has_record(run.run_id):
            return "done", ""
        damage = store.damage(run.run_id)
        if damage is not None:
            return "failed", str(damage)
    except CorruptRecordError as e:
        return "failed", str(e)
    error = store.error_path(run.run_id)
    if error.exists() and error.stat().st_mtime >= started_at - 1:
        try:
            return "failed", read_json(error).get("message", "")
        except (OSError, ValueError):
            return "failed", f"see {error}"
    return "missing", "no record: not run, interrupted, or its process was killed; rerun the command to finish it"


def summarize(runs: list[PlannedRun], started_at: float) -> tuple[str, bool]:
    """(the summary text, True when every run has a record)."""
    results = {run.run_id: outcome(run, started_at) for run in runs}
    counts = {k: sum(1 for status, _ in results.values() if status == k) for k in ("done", "skipped", "failed",
                                                                                  "missing")}
    lines = [f"summary: {len(runs)} run(s): {counts['done']} done, {counts['skipped']} skipped (already finished), "
             f"{counts['failed']} failed, {counts['missing']} missing"]
    for run in runs:
        status, detail = results[run.run_id]
        if status in ("failed", "missing"):
            lines.append(f"  {status}: run {run.run_id} ({run.label}): {detail}")
    return "\n".join(lines), counts["failed"] + counts["missing"] == 0


def run_with_summary(args: Sequence[str], launch: Callable[[], None]) -> None:
    """Plan the runs, ``launch`` (Hydra), then print the summary; exit non-zero when runs are missing."""
    runs = plan_runs(args)
    if runs is None:
        launch()
        return
    started_at = time.time()
    code: int | str | None = 0
    try:
        launch()
    except SystemExit as e:  # a job's one-line error stops Hydra's sweep: still say where the sweep stands
        code = e.code
    text, complete = summarize(runs, started_at)
    print(text, file=sys.stderr, flush=True)
    if code not in (0, None):
        sys.exit(code)
    if not complete:
        sys.exit(MISSING_EXIT)
