"""The local results store: one JSON record per run, the files of its run, shared references.

Layout under the results directory (``paths.results_dir``, default ``results/``)::

    runs/<run_id>/record.json       the run's record (written last, atomically: its presence = run done)
    runs/<run_id>/prompts/<i>.json   per-prompt results (lets an interrupted run resume)
    runs/<run_id>/attention.csv      probe statistics per (prompt, layer, step, chunk, branch)
    runs/<run_id>/videos/*.mp4       the run's videos
    runs/<run_id>/wandb.json         written once the record is logged to W&B (absent: a rerun logs it)
    runs/<run_id>/error.json         the run's last failure (sweep summaries report it)
    runs/<run_id>/.lock, .tmp/       the lease of the process running it; files being written
    refs/<ref_id>.pt                 BF16 reference videos, shared by every run of the same model/prompt/seed
    wandb/                           offline W&B runs (``wandb sync results/wandb/wandb/offline-run-*``)

A record (``jensenkv.store.record.Record``) is checked against its run id and the content digests of itself and
of every file of its run whenever it is read (``jensenkv.store.record_check``): a damaged one counts as
unfinished, so the rerun regenerates it, and stops ``report.store_frame.load_results`` with one line naming it.

Every file is written atomically (``jensenkv.store.files``); what a killed writer leaves is removed by the next
process that takes the run's lock (``jensenkv.store.lock``), or by the next run of it once no live writer can own
it (``ResultsStore.remove_leftovers``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from jensenkv.store.files import (TMP_DIR, ResultsWriteError, atomic_write_json, describe_write_error, file_sha256,
                                  probe_writable, read_json, remove_tmp_files, sealed, tmp_files)
from jensenkv.store.lock import FileLock, lock_stale_after_s
from jensenkv.store.record import (ATTENTION_FILE, RECORD_SCHEMA, CorruptRecordError, DamagedRunError,
                                   DamagedStoreError, Record, SealedRecord)
from jensenkv.store.record_check import check_record, check_side_files, read_attention

RECORD_FILE = "record.json"
WANDB_MARKER = "wandb.json"    # written once the run's W&B run is complete; its absence = log again
ERROR_FILE = "error.json"      # the last failure of a run (what a sweep summary reports)

log = logging.getLogger(__name__)


def run_files(run_dir: Path) -> dict[str, dict]:
    """Every file of a finished run but its record, by path inside the run's folder: its bytes and sha256.
    Left out: hidden files (locks, temporary files) and the marks written after the record (W&B, errors)."""
    out = {}
    for path in sorted(run_dir.rglob("*")):
        name = path.relative_to(run_dir).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in name.split("/")) and \
                name not in (RECORD_FILE, WANDB_MARKER, ERROR_FILE):
            out[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return out


# attention.csv verdicts of ResultsStore.damage, by the stat of a run's record and attention.csv: any rewrite
# changes the key.
_DAMAGE_VERDICTS: dict[tuple, None] = {}  # the sound ones
_DAMAGE_VERDICTS_KEPT = 4096


def _damage_key(run_dir: Path) -> tuple | None:
    """(run dir, stat of record.json, stat of attention.csv or None); None when the run has no record."""
    def stat(path: Path) -> tuple | None:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):  # as Path.exists(): a file where a folder belongs
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    record = stat(run_dir / RECORD_FILE)
    return None if record is None else (str(run_dir), record, stat(run_dir / ATTENTION_FILE))


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
        """True when the run finished and is sound; a damaged run counts as unfinished (``damage`` says why)."""
        return self.record_path(run_id).exists() and self.damage(run_id) is None

    def damage(self, run_id: str) -> DamagedRunError | None:
        """Why a finished run is damaged: its record and every file of its run checked against its run id and
        their digests (attention.csv also read whole); None when it is sound or has no record. attention.csv's
        verdict is kept while it and the record keep their stat, so a plan, its runner and its summary read it
        once."""
        key = _damage_key(self.run_dir(run_id))
        if key is None:  # no record
            return None
        try:
            record = self.read_record(run_id)  # every file's digest (hashed once while its stat holds)
            if key not in _DAMAGE_VERDICTS:
                read_attention(run_id, self.run_dir(run_id), record)
                if len(_DAMAGE_VERDICTS) >= _DAMAGE_VERDICTS_KEPT:
                    _DAMAGE_VERDICTS.clear()
                _DAMAGE_VERDICTS[key] = None
        except DamagedRunError as e:
            return e
        return None

    def read_record(self, run_id: str) -> SealedRecord:
        """The run's record, checked against its run id, its own digest and every listed file's (labels: those
        its identity gives): DamagedRunError naming the file and the field when it does not hold what the run id
        says; FileNotFoundError when there is none."""
        path = self.record_path(run_id)
        try:
            record = read_json(path)
        except CorruptRecordError as e:
            raise DamagedRunError(run_id, path, f"not JSON ({e.__cause__})") from None
        record = check_record(run_id, record, path)
        check_side_files(run_id, self.run_dir(run_id), record)
        return record

    def write_record(self, record: Record) -> Path:
        """Write a run's record last: with every file of its run (``run_files``, merged into the entries the
        record lists, such as attention.csv's rows) and its own content digest."""
        listed = record.get("files") or {}
        files = {name: {**listed.get(name, {}), **entry} for name, entry in run_files(self.run_dir(record["run_id"])).items()}
        return atomic_write_json(self.record_path(record["run_id"]),
                                 sealed({**record, "schema": RECORD_SCHEMA, "files": files}))

    def prompt_result_path(self, run_id: str, index: int) -> Path:
        return self.run_dir(run_id) / "prompts" / f"{index:04d}.json"

    def ref_path(self, ref_id: str) -> Path:
        return self.refs_dir / f"{ref_id}.pt"

    @property
    def guard_path(self) -> Path:
        """One OS lock file for the whole store, serialising lease checks (a few ms each)."""
        return self.root / ".locks.guard"

    def run_lock(self, run_id: str) -> FileLock:
        return FileLock(self.run_dir(run_id) / ".lock", guard=self.guard_path)

    def ref_lock(self, ref_id: str) -> FileLock:
        return FileLock(self.refs_dir / f".{ref_id}.lock", guard=self.guard_path)

    def tmp_dir(self, run_id: str) -> Path:
        """Where a run's files are encoded before being moved into place (outside videos/)."""
        return self.run_dir(run_id) / TMP_DIR

    def clean_run_tmp(self, run_id: str) -> list[Path]:
        """Remove what killed writers of this run left behind; call it holding the run's lock."""
        removed = remove_tmp_files(self.run_dir(run_id), keep=lambda p: p.name.startswith(".lock."))
        with contextlib.suppress(OSError):
            self.tmp_dir(run_id).rmdir()  # only when empty
        if removed:
            log.info("removed %d temporary file(s) left by an interrupted run %s", len(removed), run_id)
        return removed

    def remove_leftovers(self, run_id: str) -> list[Path]:
        """Remove what killed writers left around a run that no live writer can own, without taking its lock:
        temporary files in its folder and in refs/ (lock heartbeats, references) untouched for longer than the
        lock's stale limit, and an error.json beside a finished record. Best effort: a read-only store keeps
        them."""
        limit = time.time() - lock_stale_after_s()
        leftovers = [*tmp_files(self.run_dir(run_id)), *tmp_files(self.refs_dir)]
        if self.record_path(run_id).exists():
            leftovers.append(self.error_path(run_id))
        removed = []
        for path in leftovers:
            try:
                if path.name == ERROR_FILE or path.stat().st_mtime < limit:
                    path.unlink()
                    removed.append(path)
            except OSError:  # gone meanwhile, or a read-only store
                continue
        if removed:
            log.info("removed %d file(s) left by interrupted writers around run %s", len(removed), run_id)
        return removed

    def clean_ref_tmp(self, ref_id: str) -> None:
        """Remove half-written copies of one reference; call it holding the reference's lock."""
        for path in self.refs_dir.glob(f".{ref_id}.pt.*.tmp"):
            path.unlink(missing_ok=True)

    def wandb_marker_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / WANDB_MARKER

    def error_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / ERROR_FILE

    def check_writable(self, run_id: str) -> None:
        """Fail in one line, before any work, when the run's folder cannot be written."""
        try:
            probe_writable(self.run_dir(run_id))
        except OSError as e:
            raise ResultsWriteError(describe_write_error(e, self.root)) from None

    def iter_records(self) -> Iterator[SealedRecord]:
        """Every finished run's record, in run-id order; DamagedStoreError, naming each damaged run, if any."""
        records, damaged = [], []
        for path in sorted(self.runs_dir.glob(f"*/{RECORD_FILE}")) if self.runs_dir.is_dir() else []:
            try:
                records.append(self.read_record(path.parent.name))
            except DamagedRunError as e:
                damaged.append(e)
        if damaged:
            raise DamagedStoreError(damaged)
        yield from records
