"""The results store as tables: one DataFrame row per finished run (``load_results``), a run's probe statistics
(``load_attention``), and the columns that say which runs may be compared (``comparison_columns``). pandas is
imported here, where a table is built, never by the store itself."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jensenkv.hashing import config_hash
from jensenkv.store.record import ATTENTION_FILE
from jensenkv.store.record_check import read_attention
from jensenkv.store.results import ResultsStore

if TYPE_CHECKING:  # pandas is imported when a table is built
    import pandas as pd

INTEGER_COLUMNS = ("bits", "group_size", "sink_chunks", "window_chunks", "num_prompts")


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
    row.update(comparison_columns(record.get("identity")))
    return row


# what a Table 1 cell compares (its treatment): everything else must be equal. "second_order": the b (1 - pi)
# term of attention.second_order; "calibration": the fitted strengths file of attention.calibration
COMPARED = ("correction", "strength", "second_order", "calibration")
QUANTIZER = ("key", "value")            # what distinguishes the rows of one table


def comparison_columns(identity: Mapping[str, Any] | None) -> dict:
    """Columns that say which runs may be compared: ``context`` (model and sampler settings, weights,
    prompts, seeds, cache layout, evaluators: equal for every run of one table or figure), ``setting``
    (the context plus the quantizer: equal for the two runs of one "none -> correction" cell), and a
    readable ``context_desc``."""
    if not identity:
        return {"context": "unknown", "setting": "unknown", "context_desc": "record without identity"}
    context = {k: v for k, v in identity.items() if k not in (*COMPARED, *QUANTIZER, "metrics")}
    context["full_precision_dtype"] = (identity.get("key") or {}).get("store_dtype")
    setting = {k: v for k, v in identity.items() if k not in (*COMPARED, "metrics")}
    model = identity.get("model") or {}
    generation = identity.get("generation") or {}
    sampler = {k: generation[k] for k in ("steps", "num_chunks", "frames_per_chunk", "shift", "guidance_scale",
                                          "sampler") if generation.get(k) is not None}
    prompts = identity.get("prompts") or []
    desc = (f"{len(prompts)} prompt(s) {config_hash(prompts, 6)}, seeds {identity.get('seeds')}, model "
            f"{model.get('name') or model.get('kind')} on {model.get('device')}"
            + (f" {sampler}" if sampler else "") + (f", weights {identity['weights']}" if identity.get("weights") else ""))
    return {"context": config_hash(context), "setting": config_hash(setting), "context_desc": desc}


def load_results(root: str | os.PathLike = "results") -> pd.DataFrame:
    """All finished runs under ``root`` as a DataFrame, one row per run (empty frame if there are none).

    Damaged runs raise DamagedStoreError, one line per run naming the file and the field: a table never
    silently drops or thins a run. Nothing is deleted.
    """
    import pandas as pd

    frame = pd.DataFrame([record_row(r) for r in ResultsStore(root).iter_records()])
    for col in INTEGER_COLUMNS:  # nullable integers: a bf16 run has no group size, but 32 must not read 32.0
        if col in frame.columns:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    return frame


def load_attention(root: str | os.PathLike, run_id: str) -> pd.DataFrame:
    """The probe statistics of one run (one row per prompt, layer, step, chunk, branch), checked against its
    record (DamagedRunError); FileNotFoundError when the run has none."""
    store = ResultsStore(root)
    frame = read_attention(run_id, store.run_dir(run_id), store.read_record(run_id))
    if frame is None:
        raise FileNotFoundError(f"run {run_id} has no attention statistics ({store.run_dir(run_id) / ATTENTION_FILE});"
                                " run it with 'attention' in eval.metrics")
    return frame
