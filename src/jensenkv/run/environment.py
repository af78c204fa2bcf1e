"""A run's process environment: torch threads (the cores shared out between parallel local jobs) and library
caches and logs under the results directory."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jensenkv.devices import available_cores
from jensenkv.models.registry import family

if TYPE_CHECKING:
    from jensenkv.config.resolve import RunSpec

MAX_DEFAULT_THREADS = 4  # the built-in model's ops are small: more threads mostly add contention


def parallel_jobs() -> int:
    """How many jobs of this sweep run at once on this machine (joblib launcher's n_jobs; 1 otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return 1
        launcher = HydraConfig.get().launcher
        if "joblib" not in str(launcher.get("_target_", "")).lower():
            return 1
        n_jobs = int(launcher.get("n_jobs") or 1)
    except Exception:  # noqa: BLE001 - no Hydra context (notebooks, tests): one job
        return 1
    return available_cores() if n_jobs < 0 else max(1, n_jobs)


def default_threads(model: Any = None) -> int | None:
    """torch threads when ``threads`` is null: None (leave torch alone) if OMP_NUM_THREADS is set; the family's
    own count where it has one (the built-in model: 1, its ops are too small to split); else the cores shared
    out between parallel local jobs, at most MAX_DEFAULT_THREADS (torch's default gives every job every core
    and oversubscribes)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if model is not None and family(model.kind).threads is not None:
        return family(model.kind).threads
    return max(1, min(MAX_DEFAULT_THREADS, available_cores() // parallel_jobs()))


@contextlib.contextmanager
def run_environment(spec: RunSpec) -> Iterator[None]:
    """Library caches and logs of a run under the results directory (W&B's cache and config, matplotlib's
    config), unless the user set them; restored afterwards."""
    wandb_dir = Path(spec.logger.dir or Path(spec.results_dir) / "wandb")
    wanted = {"WANDB_DIR": wandb_dir, "WANDB_CACHE_DIR": wandb_dir / ".cache",
              "WANDB_CONFIG_DIR": wandb_dir / ".config", "WANDB_DATA_DIR": wandb_dir / ".data",
              "MPLCONFIGDIR": Path(spec.results_dir) / ".cache" / "matplotlib"}
    saved = {k: os.environ.get(k) for k in wanted}
    for key, value in wanted.items():
        if saved[key] is None:
            os.environ[key] = str(Path(value).absolute())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
