"""The partial-prefill experiment: one run per (quantizer preset, sink setting) over every window, in the suite's
results store (``<results_dir>/llm_prefill/``), with its run ids, leased locks, resume and W&B.

A run's identity holds the model's name and weights digest, each text source's package, version and digest, the
window spec, the key / value quantizers (resolved as ``CacheSettings.key_value`` resolves a video run's), the sink
tokens, the treatments and the attention settings; its id is ``config_hash(identity)``. Each (run, window) result
is written on its own as soon as it is measured (``runs/<id>/windows/<index>.json``), so a killed experiment
resumes where it stopped; a run's record (``record.json`` with ``windows.csv`` and ``layers.csv`` beside it,
each listed with its size and sha256) is written once all its windows are in, holding the run's lock.

Work is shared by windows, not runs: each of ``workers`` processes takes every ``workers``-th window and measures
all unfinished runs on it, so the full-precision pass over a window (its NLL and the prefix's K/V) is computed
once for every quantizer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from jensenkv.hashing import config_hash
from jensenkv.llm.config import LlmPrefillConfig
from jensenkv.quant import QuantConfig

log = logging.getLogger("jensenkv.llm")
STORE_FOLDER = "llm_prefill"
RECORD_SCHEMA = 1
WINDOWS_FILE, LAYERS_FILE = "windows.csv", "layers.csv"


@dataclass(frozen=True)
class RunPlan:
    preset: str
    sink_tokens: int
    key: QuantConfig
    value: QuantConfig
    identity: dict
    run_id: str

    def labels(self, model: str) -> dict:
        from jensenkv.report.rows import quantizer_label

        key = self.key
        row = {"quantizer": key.label, "zero_point": "symmetric" if key.symmetric else key.zero_convention,
               "dither": key.dither, "smoothing": key.smoothing, "rotation": key.rotation,
               "qvg_centroids": key.qvg_centroids if key.method == "qvg" else None}
        return {"model": model, "preset": self.preset, "quantizer": key.label, "label": quantizer_label(row),
                "bits": key.bits, "group_size": key.group_size, "granularity": key.granularity,
                "sink_tokens": self.sink_tokens}


def quant_preset(name: str) -> QuantConfig:
    """A ``configs/quant`` preset as the video runs compose it (one definition of every quantizer)."""
    from jensenkv.run.cli import group_options
    from jensenkv.spec import compose_config

    if name not in group_options("quant"):
        raise ValueError(f"quantizers: {name!r} is not allowed: use presets of configs/quant "
                         f"{tuple(group_options('quant'))}")
    return QuantConfig.from_dict(compose_config([f"quant={name}"]).quant)


def plan_runs(cfg: LlmPrefillConfig, weights_digest: str, sources: list[dict], head_dim: int) -> list[RunPlan]:
    """Every run of the experiment, from the config and what it reads (weights digest, text identities)."""
    from jensenkv.cache import CacheSettings

    runs = []
    for preset in cfg.quantizers:
        quant = quant_preset(preset)
        key, value = CacheSettings(values=cfg.values, full_precision_dtype="float32").key_value(quant, head_dim)
        for sink in ([0, 1] if preset in cfg.sink_quantizers else [0]):
            identity = {
                "experiment": STORE_FOLDER,
                "model": {"name": cfg.llm.name, "weights_digest": weights_digest, "dtype": cfg.llm.dtype},
                "text": {"sources": sources, "windows_per_source": cfg.text.windows_per_source,
                         "length": cfg.text.length, "prefix": cfg.text.prefix},
                "key": dataclasses.asdict(key), "value": dataclasses.asdict(value), "sink_tokens": sink,
                "treatments": list(cfg.treatments), "backend": cfg.attention.backend,
                "probe_layers": cfg.attention.probe_layers, "diagnostics": cfg.attention.diagnostics,
            }
            runs.append(RunPlan(preset, sink, key, value, identity, config_hash(identity)))
    return runs


# --- the store ----------------------------------------------------------------------------------------------
def store_of(cfg: LlmPrefillConfig):
    from jensenkv.tracking import ResultsStore

    return ResultsStore(Path(cfg.paths.results_dir) / STORE_FOLDER)


def window_path(store, run_id: str, index: int) -> Path:
    return store.run_dir(run_id) / "windows" / f"{index:04d}.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class DamagedLlmRunError(ValueError):
    """A finished LLM run whose record or side files do not hold what its run id says."""


def read_record(store, run_id: str) -> dict:
    """The run's record, checked: its id, its identity's hash, and each side file's size and sha256."""
    from jensenkv.tracking import read_json

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
        if not side.is_file() or side.stat().st_size != entry.get("bytes") or _sha256(side) != entry.get("sha256"):
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


# --- the work of one process: a share of the windows, every unfinished run ----------------------------------
def _work(cfg_dict: dict, runs: list[tuple[str, dict, dict, int]], windows: list[tuple[int, list[int]]],
          results_dir: str) -> int:
    """Measure ``windows`` ((index, token ids)) for each run (run id, key, value, sink) lacking them; returns the
    number of (run, window) results written. Runs in a worker process (or in process with workers=1)."""
    import torch

    from jensenkv.llm.attention import register
    from jensenkv.llm.prefill import TREATMENTS, full_precision_pass, measure_window
    from jensenkv.llm.weights import load_causal_lm
    from jensenkv.tracking import ResultsStore, atomic_write_json

    cfg = LlmPrefillConfig(**{**cfg_dict})
    store = ResultsStore(results_dir)
    torch.manual_seed(0)
    register()
    lm, _, _ = load_causal_lm(cfg.llm.name, cfg.llm.dtype, cfg.llm.device, log=log.info)
    lm.set_attn_implementation("jensenkv")
    treatments = [TREATMENTS[name] for name in cfg.treatments]
    written = 0
    for index, ids in windows:
        todo = [r for r in runs if not window_path(store, r[0], index).exists()]
        if not todo:
            continue
        tokens = torch.tensor([ids], device=cfg.llm.device)  # (1, L)
        start = time.perf_counter()
        fp = full_precision_pass(lm, tokens, cfg.text.prefix)
        fp_seconds = time.perf_counter() - start
        for run_id, key, value, sink in todo:
            result = measure_window(lm, tokens, cfg.text.prefix, QuantConfig(**key), treatments, sink_tokens=sink,
                                    backend=cfg.attention.backend, diagnostics=cfg.attention.diagnostics,
                                    values=cfg.values, fp=fp, probe_layers=cfg.attention.probe_layers)
            result["seconds"]["full_precision"] = fp_seconds
            atomic_write_json(window_path(store, run_id, index), {"window": index, **result})
            written += 1
    return written


def _as_config_dict(cfg: LlmPrefillConfig) -> dict:
    """The config as plain nested dataclasses' fields, rebuilt in a worker (spawned processes get pickles)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


# --- records ----------------------------------------------------------------------------------------------------
def assemble(store, plan: RunPlan, window_meta: list[dict], model_label: str, seconds: float) -> dict:
    """Write the run's windows.csv, layers.csv and record.json from its per-window results."""
    import pandas as pd

    from jensenkv.run.runner import _versions
    from jensenkv.tracking import atomic_write, atomic_write_json, read_json

    window_rows, layer_rows, byte_rows, timing = [], [], [], {}
    for meta in window_meta:
        result = read_json(window_path(store, plan.run_id, meta["window"]))
        byte_rows.append(result["bytes"])
        for name, value in result["seconds"].items():
            timing.setdefault(name, []).append(value)
        for label, measured in result["treatments"].items():
            layers = pd.DataFrame(measured["layers"])
            means = layers.drop(columns=["layer", "sample"], errors="ignore").mean(numeric_only=True)
            abs_shift = float(layers["delta_p_s"].abs().mean()) if len(layers) else float("nan")
            window_rows.append({**meta, "treatment": label, "nll": measured["nll"], "nll_fp": result["nll_fp"],
                                "dnll": measured["nll"] - result["nll_fp"], "delta_p_s_abs": abs_shift,
                                **means.to_dict()})
            for row in measured["layers"]:
                layer_rows.append({"window": meta["window"], "document": meta["document"], "treatment": label,
                                   **{k: v for k, v in row.items() if k != "sample"}})
    files = {}
    for name, rows in ((WINDOWS_FILE, window_rows), (LAYERS_FILE, layer_rows)):
        text = io.StringIO()
        pd.DataFrame(rows).to_csv(text, index=False, float_format="%.9g")
        path = atomic_write(store.run_dir(plan.run_id) / name, lambda f, t=text.getvalue(): f.write(t), mode="w")
        files[name] = {"rows": len(rows), "bytes": path.stat().st_size, "sha256": _sha256(path)}
    frame = pd.DataFrame(window_rows)
    metrics = {}
    for label, part in frame.groupby("treatment", sort=False):
        for column in ("nll", "dnll", "delta_p_s", "delta_p_s_abs", "jsd", "out_rel_err", "p_s", "p_s_ref"):
            if column in part:
                metrics[f"{label}.{column}"] = float(part[column].mean())
    metrics["nll_fp"] = float(frame.drop_duplicates("window")["nll_fp"].mean())
    memory = pd.DataFrame(byte_rows).mean().to_dict()
    record = {
        "schema": RECORD_SCHEMA, "run_id": plan.run_id, "identity": plan.identity,
        "labels": plan.labels(model_label), "metrics": metrics, "windows": len(window_meta),
        "memory": {k: float(v) for k, v in memory.items()},
        "seconds": {"wall": seconds, **{k: float(sum(v) / len(v)) for k, v in timing.items()}},
        "files": files, "versions": _versions(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_json(store.record_path(plan.run_id), record)
    return record


def log_wandb(store, cfg: LlmPrefillConfig, record: dict) -> None:
    """The record's metrics to W&B once (``wandb.json`` marks it); a failure keeps the record and is retried."""
    from jensenkv.tracking import WandbRun, atomic_write_json, resolve_wandb_mode

    mode = resolve_wandb_mode(cfg.logger.mode)
    marker = store.wandb_marker_path(record["run_id"])
    if mode == "disabled" or marker.exists():
        return
    labels = record["labels"]
    name = f"{labels['model']}/{labels['preset']}" + (f"+sink{labels['sink_tokens']}" if labels["sink_tokens"] else "")
    wandb_id = f"{record['run_id']}-{config_hash(record.get('created_at'), 6)}"
    try:
        wb = WandbRun(dataclasses.asdict(cfg.logger), record["run_id"], name, cfg.experiment_name,
                      {**record["identity"], **labels}, wandb_id=wandb_id)
        wb.log_metrics(record["metrics"])
        wb.finish()
        atomic_write_json(marker, {"wandb_id": wandb_id, "mode": wb.mode, "project": cfg.logger.project,
                                   "logged_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    except Exception as e:  # noqa: BLE001
        log.warning("W&B logging of run %s failed (%s: %s); the record is written, a rerun logs it",
                    record["run_id"], type(e).__name__, e)


# --- the whole experiment -------------------------------------------------------------------------------------
def run_experiment(cfg: LlmPrefillConfig, say=print) -> dict:
    """Plan, measure what is missing, record each run; returns {"done", "skipped", "held_elsewhere", "runs"}."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    from transformers import AutoConfig, AutoTokenizer

    from jensenkv.llm.text import load_source, windows
    from jensenkv.llm.weights import converted_dir, locate

    weights = locate(cfg.llm.name)
    sources = [load_source(name) for name in cfg.text.sources]
    store = store_of(cfg)
    store.root.mkdir(parents=True, exist_ok=True)
    if weights.gguf_file is not None and not (converted_dir(weights) / "config.json").is_file():
        _work(_as_config_dict(cfg), [], [], str(store.root))  # the one-time dequantization, announced
    folder = converted_dir(weights) if weights.gguf_file is not None else weights.directory
    model_config = AutoConfig.from_pretrained(str(folder)).get_text_config(decoder=True)
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    spans = [w for source in sources for w in windows(source, tokenizer, cfg.text.length,
                                                       cfg.text.windows_per_source)]
    meta = [{"window": i, "source": w.source, "document": w.document, "start": w.start} for i, w in enumerate(spans)]
    runs = plan_runs(cfg, weights.digest, [s.identity() for s in sources], head_dim)
    model_label = cfg.llm.name
    summary = {"done": [], "skipped": [], "held_elsewhere": [], "runs": runs}
    todo, locks = [], {}
    for plan in runs:
        if finished(store, plan.run_id):
            summary["skipped"].append(plan.run_id)
            log_wandb(store, cfg, read_record(store, plan.run_id))
            continue
        lock = store.run_lock(plan.run_id)
        if not lock.try_acquire():
            say(f"run {plan.run_id} ({plan.preset}, sink {plan.sink_tokens}) is being run by {lock.describe_holder()}")
            summary["held_elsewhere"].append(plan.run_id)
            continue
        locks[plan.run_id] = lock
        store.clean_run_tmp(plan.run_id)
        todo.append(plan)
    try:
        if todo:
            missing = [i for i in range(len(spans))
                       if any(not window_path(store, p.run_id, i).exists() for p in todo)]
            kept = len(todo) * len(spans) - sum(not window_path(store, p.run_id, i).exists()
                                                for p in todo for i in range(len(spans)))
            say(f"llm_prefill: {len(todo)} run(s) of {len(runs)} to do over {len(spans)} windows "
                f"({len(missing)} to measure, {kept} (run, window) results kept from an earlier start), "
                f"{min(cfg.workers, max(1, len(missing)))} process(es)")
            specs = [(p.run_id, dataclasses.asdict(p.key), dataclasses.asdict(p.value), p.sink_tokens) for p in todo]
            shards = [[(i, list(spans[i].ids)) for i in missing[k::cfg.workers]] for k in range(cfg.workers)]
            shards = [s for s in shards if s]
            start = time.perf_counter()
            if len(shards) <= 1:
                _work(_as_config_dict(cfg), specs, shards[0] if shards else [], str(store.root))
            else:
                context = multiprocessing.get_context("spawn")
                os.environ.setdefault("OMP_NUM_THREADS", "1")
                with ProcessPoolExecutor(len(shards), mp_context=context, initializer=_one_thread) as pool:
                    for future in [pool.submit(_work, _as_config_dict(cfg), specs, shard, str(store.root))
                                   for shard in shards]:
                        future.result()
            seconds = time.perf_counter() - start
            for plan in todo:
                record = assemble(store, plan, meta, model_label, seconds)
                log_wandb(store, cfg, record)
                summary["done"].append(plan.run_id)
    finally:
        for lock in locks.values():
            lock.release()
    return summary


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def describe(summary: dict) -> str:
    runs = len(summary["runs"])
    return (f"summary: {runs} run(s): {len(summary['done'])} done, {len(summary['skipped'])} already finished, "
            f"{len(summary['held_elsewhere'])} running elsewhere")


def window_table(store, record: dict) -> "pd.DataFrame":  # noqa: F821 - pandas imported lazily
    """A finished run's windows.csv as a DataFrame, with its labels as columns."""
    import pandas as pd

    frame = pd.read_csv(store.run_dir(record["run_id"]) / WINDOWS_FILE)
    for key, value in record["labels"].items():
        frame[key] = value
    frame["run_id"] = record["run_id"]
    return frame


def layer_table(store, record: dict) -> "pd.DataFrame":  # noqa: F821
    import pandas as pd

    frame = pd.read_csv(store.run_dir(record["run_id"]) / LAYERS_FILE)
    for key, value in record["labels"].items():
        frame[key] = value
    return frame


def records(store) -> list[dict]:
    """Every finished run's record; DamagedLlmRunError naming the first damaged one."""
    if not store.runs_dir.is_dir():
        return []
    return [read_record(store, path.parent.name) for path in sorted(store.runs_dir.glob("*/record.json"))]


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)
