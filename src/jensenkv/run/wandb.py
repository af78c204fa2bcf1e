"""W&B for a run: one W&B run per finished record (config, summary metrics, a sample video, the attention plot),
marked done in the run's ``wandb.json``. A log cut short by a kill or a full disk is redone by the next rerun;
a W&B failure never loses the record. The logger's settings are ``jensenkv.config.logger.LoggerConfig``."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jensenkv.hashing import config_hash
from jensenkv.config.logger import resolve_wandb_mode
from jensenkv.store.files import atomic_write_json
from jensenkv.store.results import ResultsStore

log = logging.getLogger("jensenkv.run")


class WandbRun:
    """One W&B run per suite run: config, summary metrics, a sample video and plots.

    Offline runs land in ``<dir>/wandb/offline-run-*``; upload them later with ``wandb sync``.
    """

    @staticmethod
    def offline_runs(logger_cfg: Mapping[str, Any], wandb_id: str) -> list[Path]:
        """The offline run folders written for ``wandb_id`` (an interrupted one is removed before redoing it)."""
        return sorted((Path(logger_cfg.get("dir") or "wandb") / "wandb").glob(f"offline-run-*-{wandb_id}"))

    def __init__(self, logger_cfg: Mapping[str, Any], run_id: str, name: str, group: str,
                 config: Mapping[str, Any], wandb_id: str | None = None):
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
            name=name,
            id=wandb_id,  # one W&B id per record: a log interrupted by a kill is redone under the same id
            resume="allow" if wandb_id and self.mode == "online" else None,
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


def pending(store: ResultsStore, run_id: str, logger: Any) -> bool:
    """True when W&B is on (``logger``: the LoggerConfig) and the run's record has not been logged to it yet."""
    return resolve_wandb_mode(logger.mode) != "disabled" and not store.wandb_marker_path(run_id).exists()


def log_when_free(store: ResultsStore, run_id: str, still_pending: Callable[[], bool], log_record: Callable[[], None]
                  ) -> None:
    """Log a finished run's record to W&B holding the run's lock (a parallel rerun logs it once)."""
    lock = store.run_lock(run_id)
    try:
        acquired = lock.try_acquire()
    except OSError as e:  # e.g. finished results on a read-only disk: the record stands
        log.warning("run %s is not logged to W&B yet and its folder cannot be written (%s); rerun where it can",
                    run_id, e)
        return
    if not acquired:
        log.info("run %s: its W&B log is being written elsewhere (%s)", run_id, lock.describe_holder())
        return
    try:
        store.clean_run_tmp(run_id)  # the lock's holder owns the folder: e.g. a killed marker write's
        if still_pending():
            log_record()
    finally:
        lock.release()


def log_record(store: ResultsStore, logger: Any, record: Mapping[str, Any]) -> None:
    """Config, metrics, one sample video and the attention plot, then the marker ``wandb.json``.

    The W&B id is derived from the record, so a log cut short by a kill is redone under the same id (the
    partial offline folder is replaced). A W&B failure never loses the record: it is retried next time.
    """
    import shutil

    run_id = record["run_id"]
    run_dir = store.run_dir(run_id)
    labels = record["labels"]
    name = f"{labels['model']}/{labels['quantizer']}"
    if labels["method"] != "none":
        name += f"-int{labels['bits']}-g{labels['group_size']}-{labels['correction']}"
    wandb_id = f"{run_id}-{config_hash(record.get('created_at'), 6)}"
    settings = dataclasses.asdict(logger)
    for partial in WandbRun.offline_runs(settings, wandb_id):  # no marker: an interrupted log
        shutil.rmtree(partial, ignore_errors=True)
    try:
        wb = WandbRun(settings, run_id, name, record["experiment_name"],
                      {**record["identity"], **labels, "run_id": run_id}, wandb_id=wandb_id)
    except Exception as e:  # noqa: BLE001
        log.warning("W&B logging skipped (%s: %s); the local record is written, a rerun logs it",
                    type(e).__name__, e)
        return
    try:
        wb.log_metrics(record["metrics"])
        first = record["per_prompt"][0] if record["per_prompt"] else None
        if first and first.get("video"):
            wb.log_video("sample_video", run_dir / "videos" / first["video"], caption=first["prompt"])
        csv = run_dir / "attention.csv"
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
        atomic_write_json(store.wandb_marker_path(run_id),
                          {"wandb_id": wandb_id, "mode": wb.mode, "project": logger.project,
                           "logged_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    except Exception as e:  # noqa: BLE001
        log.warning("W&B logging failed (%s: %s); the local record is written, a rerun logs it",
                    type(e).__name__, e)
