"""The run record: what a finished run's ``record.json`` holds, as types, and the words a damaged one is named by.

A record is one JSON object (``RECORD_SCHEMA`` 2), written last and atomically by ``ResultsStore.write_record``:

    Record
      run_id, created_at, experiment_name, seconds, schema, digest
      identity: dict                what the run id hashes (``RunSpec.identity``)
      labels: Labels                what the tables select runs by, derived from the identity
      metrics: {metric: float|None} run-level values (null: not a number)
      missing: {metric: reason}     why a requested metric has no value
      vbench_dimensions_used, computed_from, versions
      per_prompt: [VideoResult]     one per (prompt, seed), in index order
      files: {name: FileEntry}      every file of the run with its bytes and sha256

What a record must hold to be trusted is checked in ``jensenkv.store.record_check``. The types document the
contract: a record is read back as the plain dict JSON gives, so nothing converts it.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from jensenkv.hashing import config_hash

RECORD_SCHEMA = 2  # 2: the record's and every run file's content digests (1: none, so nothing to verify by)
DIGEST = "digest"  # a JSON file's own content digest: sha256 of its canonical text without this field
ATTENTION_FILE = "attention.csv"


class Labels(TypedDict, total=False):
    """The results-table labels of a run (``record_check.identity_labels``): LABEL_FIELDS always, the rest when
    its identity gives them."""

    model: str
    quantizer: str
    method: str
    bits: int
    group_size: int | None
    granularity: str | None
    rotation: str
    values: str
    correction: str | None
    strength: Any
    second_order: Any
    calibration: Any
    sink_chunks: int | None
    window_chunks: int | None


class FileEntry(TypedDict, total=False):
    """One file of a run as its record lists it; a table (``attention.csv``) also its rows and text columns."""

    bytes: int
    sha256: str
    rows: int
    text_columns: list[str]


class TeacherForcedChunk(TypedDict):
    """One chunk of teacher-forced fidelity (``Runner.teacher_forced``)."""

    chunk: int
    psnr: float
    rel_err: float
    latent_rel_err: float


class _VideoResultBase(TypedDict):
    index: int
    prompt: str
    seed: int
    reference_id: str | None
    video: str | None              # the mp4's name under videos/ (None: no video saved)
    metrics: dict[str, float | None]
    missing: dict[str, str]
    timings: dict[str, Any]


class VideoResult(_VideoResultBase, total=False):
    """One video's result (``per_prompt[i]``, and ``prompts/<i>.json`` with its own digest and files)."""

    cache_bytes: int
    cache_bf16_bytes: int
    teacher_forced: list[TeacherForcedChunk]


class Record(TypedDict):
    """A finished run's record, as ``Runner.assemble`` makes it (``schema``, ``files`` and ``digest`` are
    completed by ``ResultsStore.write_record``)."""

    run_id: str
    created_at: str
    computed_from: dict[str, Any]
    experiment_name: str
    identity: dict[str, Any]
    labels: Labels
    metrics: dict[str, float | None]
    missing: dict[str, str]
    vbench_dimensions_used: list[str]
    per_prompt: list[VideoResult]
    files: dict[str, FileEntry]
    seconds: float
    versions: dict[str, str]


class SealedRecord(Record):
    """A record as written and read back: its schema and content digest."""

    schema: int
    digest: str


class CorruptRecordError(ValueError):
    """A results file exists but cannot be used; the message names it. Nothing is deleted."""


class DamagedRunError(CorruptRecordError):
    """A finished run whose record or side file does not hold what its run id says."""

    def __init__(self, run_id: str, path: str | Path, what: str):
        self.run_id, self.path, self.what = run_id, Path(path), what
        super().__init__(f"damaged run {run_id} ({path}): {what}")


class DamagedStoreError(CorruptRecordError):
    """Damaged runs of a results store, one line each: no table is built from the others alone."""

    def __init__(self, damaged: list[DamagedRunError]):
        self.damaged = list(damaged)
        super().__init__("\n".join([*map(str, self.damaged),
                                    f"{len(self.damaged)} damaged run(s), so no table is built without them: rerun "
                                    "the command that made them (a rerun regenerates a damaged run; nothing was "
                                    "deleted)"]))


def content_digest(obj: Mapping[str, Any]) -> str:
    """sha256 of a JSON object's canonical text (sorted keys, no spaces), its own ``digest`` left out: an edit of
    any value changes it, a reformatting does not."""
    return config_hash({k: v for k, v in obj.items() if k != DIGEST}, length=64)  # the run ids' canonical JSON
