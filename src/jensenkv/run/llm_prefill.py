"""python -m jensenkv.run.llm_prefill [key=value ...]: the LLM partial-prefill experiment (configs/llm/,
``jensenkv.config.llm``), e.g. ``experiment=llm_prefill``. One run per (quantizer preset, sink setting) over every window, in the suite's
results store (``<results_dir>/llm_prefill/``), with its run ids, leased locks, resume and W&B.

A run's identity holds the model's name and weights digest, each text source's package, version and digest, the
window spec, the key / value quantizers (resolved as ``CacheSettings.key_value`` resolves a video run's), the sink
tokens, the treatments and the attention settings; its id is ``config_hash(identity)``. Each (run, window) result
is written on its own as soon as it is measured (``runs/<id>/windows/<index>.json``), so a killed experiment
resumes where it stopped; a run's record (``record.json`` with ``windows.csv`` and ``layers.csv`` beside it,
each listed with its size and sha256) is written once all its windows are in, holding the run's lock.

Exit codes: 0 every run finished; 1 some run is being run by another process; 2 bad input (one line naming the key,
the value and what is allowed, before any model loads); 130 interrupted (the measured windows are kept: a rerun
resumes).

Work is shared by windows, not runs: each of ``workers`` processes takes every ``workers``-th window and measures
all unfinished runs on it, so the full-precision pass over a window (its NLL and the prefix's K/V) is computed
once for every quantizer.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import signal
import sys
import time
from datetime import datetime, timezone

from jensenkv.exit_codes import EPILOG, guarded
from jensenkv.hashing import config_hash
from jensenkv.config.llm import LlmPrefillConfig, RunPlan, compose, plan_runs
from jensenkv.quant import QuantConfig
from jensenkv.store.llm import (
    LAYERS_FILE,
    RECORD_SCHEMA,
    WINDOWS_FILE,
    file_sha256,
    finished,
    read_record,
    store_at,
    window_path,
)

log = logging.getLogger("jensenkv.llm")


# --- the work of one process: a share of the windows, every unfinished run ----------------------------------
def _work(cfg: LlmPrefillConfig, runs: list[tuple], windows: list[tuple[int, list[int]]], results_dir: str) -> int:
    """Measure ``windows`` ((index, token ids)) for each run (``RunPlan.work``) lacking them; returns the number of
    (run, window) results written. Runs in a worker process (or in process with workers=1)."""
    import torch

    from jensenkv.llm.anchors import measure_anchor_window
    from jensenkv.llm.attention import register
    from jensenkv.llm.prefill import TREATMENTS, full_precision_pass, measure_window
    from jensenkv.llm.weights import load_causal_lm
    from jensenkv.store.files import atomic_write_json
    from jensenkv.store.results import ResultsStore

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
        for run_id, kind, job in todo:
            if kind == "anchor":
                result = measure_anchor_window(lm, tokens, cfg.text.prefix, job, float(fp[0].mean()))
            else:
                result = measure_window(lm, tokens, cfg.text.prefix, QuantConfig(**job["key"]), treatments,
                                        sink_tokens=job["sink"], backend=cfg.attention.backend,
                                        diagnostics=job["diagnostics"], values=cfg.values, fp=fp,
                                        probe_layers=cfg.attention.probe_layers)
            result["seconds"]["full_precision"] = fp_seconds
            atomic_write_json(window_path(store, run_id, index), {"window": index, **result})
            written += 1
    return written


# --- records ----------------------------------------------------------------------------------------------------
def assemble(store, plan: RunPlan, window_meta: list[dict], model_label: str, seconds: float) -> dict:
    """Write the run's windows.csv, layers.csv and record.json from its per-window results."""
    import pandas as pd

    from jensenkv.run.runner import _versions
    from jensenkv.store.files import atomic_write, atomic_write_json, read_json

    window_rows, layer_rows, byte_rows, timing = [], [], [], {}
    for meta in window_meta:
        result = read_json(window_path(store, plan.run_id, meta["window"]))
        byte_rows.append(result["bytes"])
        for name, value in result["seconds"].items():
            timing.setdefault(name, []).append(value)
        for label, measured in result["treatments"].items():
            layers = pd.DataFrame(measured["layers"])
            means = layers.drop(columns=["layer", "sample"], errors="ignore").mean(numeric_only=True)
            abs_shift = float(layers["delta_p_s"].abs().mean()) if len(layers) else float("nan")  # no probes: NaN
            window_rows.append({**meta, "treatment": label, "nll": measured["nll"], "nll_fp": result["nll_fp"],
                                "dnll": measured["nll"] - result["nll_fp"], "delta_p_s_abs": abs_shift,
                                **means.to_dict()})
            for row in measured["layers"]:
                layer_rows.append({"window": meta["window"], "document": meta["document"], "treatment": label,
                                   **{k: v for k, v in row.items() if k != "sample"}})
    files = {}
    for name, rows in ((WINDOWS_FILE, window_rows), (LAYERS_FILE, layer_rows)):
        text = io.StringIO()
        frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["window", "document", "treatment", "layer"])
        frame.to_csv(text, index=False, float_format="%.9g")  # an anchor has no probes: a header, no rows
        path = atomic_write(store.run_dir(plan.run_id) / name, lambda f, t=text.getvalue(): f.write(t), mode="w")
        files[name] = {"rows": len(rows), "bytes": path.stat().st_size, "sha256": file_sha256(path)}
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
    from jensenkv.config.logger import resolve_wandb_mode
    from jensenkv.run.wandb import WandbRun
    from jensenkv.store.files import atomic_write_json

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
    from jensenkv.llm.weights import converted_dir, load_causal_lm, locate

    from jensenkv.llm.anchors import check_backend
    from jensenkv.config.llm import quant_preset

    for preset in cfg.quantizers:  # every bad name in one line before anything is read
        quant_preset(preset)
    weights = locate(cfg.llm.name)
    sources = [load_source(name) for name in cfg.text.sources]
    for backend in cfg.hf_anchors:
        check_backend(backend)
    store = store_at(cfg.paths.results_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    if weights.gguf_file is not None and not (converted_dir(weights) / "config.json").is_file():
        load_causal_lm(cfg.llm.name, log=say)  # the one-time dequantization, announced, before any worker
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
            specs = [p.work() for p in todo]
            shards = [[(i, list(spans[i].ids)) for i in missing[k::cfg.workers]] for k in range(cfg.workers)]
            shards = [s for s in shards if s]
            start = time.perf_counter()
            from jensenkv.run.llm_prefill import _work as work  # by its module's name: spawned workers import it

            if len(shards) <= 1:
                work(cfg, specs, shards[0] if shards else [], str(store.root))
            else:
                context = multiprocessing.get_context("spawn")
                os.environ.setdefault("OMP_NUM_THREADS", "1")
                with ProcessPoolExecutor(len(shards), mp_context=context, initializer=_one_thread) as pool:
                    for future in [pool.submit(work, cfg, specs, shard, str(store.root))
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


# --- the command line ----------------------------------------------------------------------------------------
def _one_line(error: Exception) -> str:
    from jensenkv.config.resolve import field_error_line

    text = str(error).split("Config search path:")[0]
    cause = error.__cause__
    if isinstance(cause, ValueError) and "full_key" not in str(cause):
        return str(cause)
    if cause is not None and "full_key:" in str(cause):
        return field_error_line(cause)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def main(argv: list[str] | None = None) -> None:
    previous = signal.signal(signal.SIGINT, lambda *_: (print("interrupted: measured windows are kept; rerun to "
                                                              "resume", file=sys.stderr), sys.exit(130)))
    try:
        _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        signal.signal(signal.SIGINT, previous)


def _main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jensenkv.run.llm_prefill", description=__doc__.split("\n\n")[0],
                                     epilog="Fields and defaults: jensenkv/config/llm.py; experiments: configs/llm/. " + EPILOG)
    parser.add_argument("settings", nargs="*", help="Hydra overrides: experiment=llm_prefill, key=value ...")
    args = parser.parse_args(argv).settings
    guarded(lambda: _run(args))


def _run(args: list[str]) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jensenkv.llm.text import MissingTextError
    from jensenkv.llm.weights import MissingLlmWeightsError

    try:
        summary = run_experiment(compose(args))
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except (MissingLlmWeightsError, MissingTextError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(describe(summary))
    sys.exit(1 if summary["held_elsewhere"] else 0)


if __name__ == "__main__":
    main()
