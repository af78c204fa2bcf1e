"""The LLM partial-prefill store (``<results_dir>/llm_prefill/``): where a run's files live and how a finished run
is read back, checked against its run id. The experiment (``jensenkv.run.llm_prefill``) writes it; the report
(``jensenkv.report.llm_prefill``) reads it.

A run folder holds ``record.json`` (identity, labels, run-level metrics, memory, timings, and each side file's size
and sha256), ``windows.csv`` (one row per window and treatment) and ``layers.csv`` (one row per window, treatment
and probed layer), plus ``windows/<index>.json``, each (run, window) result as it was measured (what a killed
experiment resumes from).
"""
from __future__ import annotations

import logging
from pathlib import Path

from jensenkv.hashing import config_hash
from jensenkv.store.files import file_sha256  # noqa: F401 - the one file hash (llm_prefill writes with it)

log = logging.getLogger("jensenkv.llm")
STORE_FOLDER = "llm_prefill"
RECORD_SCHEMA = 1
WINDOWS_FILE, LAYERS_FILE = "windows.csv", "layers.csv"


def store_at(results_dir: str | Path):
    from jensenkv.store.results import ResultsStore

    return ResultsStore(Path(results_dir) / STORE_FOLDER)


def window_path(store, run_id: str, index: int) -> Path:
    return store.run_dir(run_id) / "windows" / f"{index:04d}.json"


class DamagedLlmRunError(ValueError):
    """A finished LLM run whose record or side files do not hold what its run id says."""


def read_record(store, run_id: str) -> dict:
    """The run's record, checked: its id, its identity's hash, and each side file's size and sha256."""
    from jensenkv.store.files import read_json

    path = store.record_path(run_id)
    try:
        record = read_json(path)
    except Exception as e:  # noqa: BLE001 - not JSON, unreadable: the record is damaged
        raise DamagedLlmRunError(f"damaged run {run_id} ({path}): not a readable JSON record ({e})") from None
    if not isinstance(record, dict) or record.get("run_id") != run_id:
        raise DamagedLlmRunError(f"damaged run {run_id} ({path}): its run_id is not its folder's")
    if not isinstance(record.get("identity"), dict) or config_hash(record["identity"]) != run_id:
        raise DamagedLlmRunError(f"damaged run {run_id} ({path}): its identity no longer hashes to its run id")
    for name, entry in (record.get("files") or {}).items():
        side = store.run_dir(run_id) / name
        if not side.is_file() or side.stat().st_size != entry.get("bytes") or file_sha256(side) != entry.get("sha256"):
            raise DamagedLlmRunError(f"damaged run {run_id} ({side}): missing or changed since the run wrote it")
    if set(record.get("files") or {}) != {WINDOWS_FILE, LAYERS_FILE}:
        raise DamagedLlmRunError(f"damaged run {run_id} ({path}): it lists {sorted(record.get('files') or {})}, "
                                 f"not {WINDOWS_FILE} and {LAYERS_FILE}")
    return record


def finished(store, run_id: str) -> bool:
    """A sound record exists; a damaged one is named in one line and its run is done again."""
    if not store.record_path(run_id).exists():
        return False
    try:
        read_record(store, run_id)
        return True
    except DamagedLlmRunError as e:
        log.warning("%s: it is run again", e)
        return False


def side_table(store, record: dict, name: str) -> "pd.DataFrame":  # noqa: F821 - pandas imported lazily
    """A finished run's side file (WINDOWS_FILE or LAYERS_FILE) as a DataFrame, its labels and run id as columns."""
    import pandas as pd

    frame = pd.read_csv(store.run_dir(record["run_id"]) / name)
    for key, value in record["labels"].items():
        frame[key] = value
    frame["run_id"] = record["run_id"]
    return frame


def records(store) -> list[dict]:
    """Every finished run's record; DamagedLlmRunError naming the first damaged one."""
    if not store.runs_dir.is_dir():
        return []
    return [read_record(store, path.parent.name) for path in sorted(store.runs_dir.glob("*/record.json"))]
