"""Where runs leave their results: the local results store (one JSON record per run) and W&B.

Layout under the results directory (``paths.results_dir``, default ``results/``)::

    runs/<run_id>/record.json       the run's record (written last, atomically: its presence = run done)
    runs/<run_id>/prompts/<i>.json   per-prompt results (lets an interrupted run resume)
    runs/<run_id>/attention.csv      probe statistics per (prompt, layer, step, chunk, branch)
    runs/<run_id>/videos/*.mp4       the run's videos
    refs/<ref_id>.pt                 BF16 reference videos, shared by every run of the same model/prompt/seed
    wandb/                           offline W&B runs (``wandb sync results/wandb/wandb/offline-run-*``)

Every file is written to a temporary file in the same directory and moved into place with
``os.replace``, so a crash never leaves a half-written record behind.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

RECORD_SCHEMA = 1
INTEGER_COLUMNS = ("bits", "group_size", "sink_chunks", "window_chunks", "num_prompts")
RECORD_FILE = "record.json"


class CorruptRecordError(ValueError):
    """A record file exists but cannot be read; names the file. Nothing is deleted."""


# --- hashing -----------------------------------------------------------------------------------------
def config_hash(obj: Any, length: int = 16) -> str:
    """Stable hex id of a JSON-serialisable object (key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


# --- atomic writes -----------------------------------------------------------------------------------
def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, then ``os.replace`` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _json_safe(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as null (a metric that is not a number is missing)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(_json_safe(obj), indent=2, sort_keys=True, allow_nan=False)
    return atomic_write(path, lambda f: f.write(text), mode="w")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a damaged one raises CorruptRecordError naming it."""
    path = Path(path)
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptRecordError(
            f"results file {path} is corrupted ({type(e).__name__}: {e}); fix or remove it by hand "
            "(nothing was deleted) and rerun to regenerate it"
        ) from e


# --- locks: one process per run / per reference ------------------------------------------------------
class FileLock:
    """An exclusive lock file (O_EXCL create) holding {host, pid}, so parallel sweep jobs never do the same work.

    A lock left by a dead process on this host is stale and taken over; a lock held on another host (SLURM)
    is respected: if that job died, delete the lock file by hand (the message names it).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.held = False

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # vanished, or being written right now

    def _stale(self, holder: dict | None) -> bool:
        if holder is None or holder.get("host") != socket.gethostname():
            return False
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError):
            return False
        return False

    def try_acquire(self) -> bool:
        """Take the lock if free (or stale); False if another live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if self._stale(self._holder()):
                    self.path.unlink(missing_ok=True)
                    continue
                return False
            with os.fdopen(fd, "w") as f:
                json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)
            self.held = True
            return True
        return False

    def acquire(self, poll_s: float = 0.5) -> None:
        """Wait until the lock is ours."""
        while not self.try_acquire():
            time.sleep(poll_s)

    def describe_holder(self) -> str:
        holder = self._holder() or {}
        return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')} (lock file {self.path})"

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --- the local results store -------------------------------------------------------------------------
class ResultsStore:
    """The results directory: run records, per-prompt partial results and BF16 references."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def refs_dir(self) -> Path:
        return self.root / "refs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def record_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / RECORD_FILE

    def has_record(self, run_id: str) -> bool:
        """True when the run finished. A damaged record raises CorruptRecordError (never silently redone)."""
        path = self.record_path(run_id)
        if not path.exists():
            return False
        self.read_record(run_id)
        return True

    def read_record(self, run_id: str) -> dict:
        record = read_json(self.record_path(run_id))
        if not isinstance(record, dict) or "run_id" not in record:
            raise CorruptRecordError(f"results file {self.record_path(run_id)} is not a run record (no run_id); "
                                     "fix or remove it by hand (nothing was deleted)")
        return record

    def write_record(self, record: Mapping[str, Any]) -> Path:
        return atomic_write_json(self.record_path(record["run_id"]), {"schema": RECORD_SCHEMA, **record})

    def prompt_result_path(self, run_id: str, index: int) -> Path:
        return self.run_dir(run_id) / "prompts" / f"{index:04d}.json"

    def ref_path(self, ref_id: str) -> Path:
        return self.refs_dir / f"{ref_id}.pt"

    def run_lock(self, run_id: str) -> FileLock:
        return FileLock(self.run_dir(run_id) / ".lock")

    def ref_lock(self, ref_id: str) -> FileLock:
        return FileLock(self.refs_dir / f".{ref_id}.lock")

    def iter_records(self) -> Iterator[dict]:
        """Every finished run's record, in run-id order."""
        if not self.runs_dir.is_dir():
            return
        for path in sorted(self.runs_dir.glob(f"*/{RECORD_FILE}")):
            yield self.read_record(path.parent.name)


def record_row(record: Mapping[str, Any]) -> dict:
    """One flat DataFrame row: labels, metrics and ``<metric>_missing_reason`` columns."""
    row: dict[str, Any] = {"run_id": record["run_id"], "experiment_name": record.get("experiment_name")}
    row.update(record.get("labels", {}))
    row.update(record.get("metrics", {}))
    for metric, reason in record.get("missing", {}).items():
        row[f"{metric}_missing_reason"] = reason
    row["vbench_dimensions_used"] = ",".join(record.get("vbench_dimensions_used", []))
    row["num_prompts"] = len(record.get("per_prompt", []))
    row["created_at"] = record.get("created_at")
    return row


def load_results(root: str | os.PathLike = "results") -> pd.DataFrame:
    """All finished runs under ``root`` as a DataFrame, one row per run (empty frame if there are none).

    A damaged record raises CorruptRecordError naming the file; nothing is deleted.
    """
    frame = pd.DataFrame([record_row(r) for r in ResultsStore(root).iter_records()])
    for col in INTEGER_COLUMNS:  # nullable integers: a bf16 run has no group size, but 32 must not read 32.0
        if col in frame.columns:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    return frame


def load_attention(root: str | os.PathLike, run_id: str) -> pd.DataFrame:
    """The probe statistics of one run (one row per prompt, layer, step, chunk, branch)."""
    path = ResultsStore(root).run_dir(run_id) / "attention.csv"
    if not path.exists():
        raise FileNotFoundError(f"run {run_id} has no attention statistics ({path}); run it with "
                                "'attention' in eval.metrics")
    return pd.read_csv(path)


# --- W&B ---------------------------------------------------------------------------------------------
WANDB_MODES = ("offline", "online", "disabled")


def resolve_wandb_mode(configured: str) -> str:
    """WANDB_MODE in the environment wins over the config (tests and CI set it to "disabled")."""
    mode = os.environ.get("WANDB_MODE") or configured
    if mode == "dryrun":
        mode = "offline"
    if mode not in WANDB_MODES:
        raise ValueError(f"logger.mode={mode!r} is not allowed: use one of {WANDB_MODES}")
    return mode


class WandbRun:
    """One W&B run per suite run: config, summary metrics, a sample video and plots.

    Offline runs land in ``<dir>/wandb/offline-run-*``; upload them later with ``wandb sync``.
    """

    def __init__(self, logger_cfg: Mapping[str, Any], run_id: str, name: str, group: str,
                 config: Mapping[str, Any]):
        import wandb

        self.mode = resolve_wandb_mode(logger_cfg.get("mode", "offline"))
        self.log_video_enabled = bool(logger_cfg.get("log_video", True))
        self.log_plots_enabled = bool(logger_cfg.get("log_plots", True))
        self._wandb = wandb
        directory = Path(logger_cfg.get("dir") or "wandb")
        if self.mode != "disabled":
            directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=logger_cfg.get("project", "jensenkv"),
            entity=logger_cfg.get("entity"),
            dir=str(directory),
            mode=self.mode,
            name=name,  # W&B picks the run id: a run redone after a crash is a new W&B run; run_id is in config
            group=group,
            tags=list(logger_cfg.get("tags") or []),
            config={**dict(config), "run_id": run_id},
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", disable_git=True, save_code=False),
        )

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and v is not None}
        self.run.log(numeric)
        for key, value in numeric.items():
            self.run.summary[key] = value

    def log_video(self, key: str, path: str | os.PathLike, caption: str | None = None) -> None:
        if self.log_video_enabled and self.mode != "disabled":
            self.run.log({key: self._wandb.Video(str(path), caption=caption, format="mp4")})

    def log_figure(self, key: str, figure: Any) -> None:
        if self.log_plots_enabled and self.mode != "disabled":
            self.run.log({key: self._wandb.Image(figure)})

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
