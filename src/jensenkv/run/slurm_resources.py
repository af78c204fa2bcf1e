"""hydra/launcher=slurm asks each job for what the model's family states (``ModelFamily.resources``): a CPU
model for no GPU and a few GB, a real model for one GPU and the host memory it loads with. The launcher config
leaves gpus_per_node, cpus_per_task and mem_gb null; the command line fills in those the user did not set
(one job script serves the whole sweep, so the most any run of it needs). Also the time-limit rule: the
signal that checkpoints and requeues a job must come after the job installed its handler.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jensenkv.checks import fail

# hydra.launcher key -> NodeResources field
RESOURCE_KEYS = {"gpus_per_node": "gpus", "cpus_per_task": "cpus", "mem_gb": "mem_gb"}
# SLURM sends --signal's signal up to this early ("due to the resolution of event handling", sbatch(1))
SLURM_EARLY_SIGNAL_S = 60
# a job's start before submitit's SIGUSR2 handler is installed (python, torch and the pickled task load),
# with room for a first video: a signal before it kills the job instead of requeueing it
HANDLER_READY_S = 60


def is_slurm(launcher: Any) -> bool:
    return "slurm" in str((launcher or {}).get("_target_", "")).lower()


def resource_overrides(args: Sequence[str], base: Any, variants: list[list[str]] | None) -> list[str]:
    """``hydra.launcher.<key>=<value>`` for each resource the command line leaves to the family: the most any
    variant of the sweep needs. [] when the launcher is not SLURM's or a variant does not compose (the
    pre-check then names the bad value)."""
    from jensenkv.models.family import video_bytes
    from jensenkv.models.registry import family
    from jensenkv.config.resolve import build_spec, compose_config

    if base is None or not is_slurm(base.hydra.get("launcher")):
        return []
    launcher = base.hydra.launcher
    open_keys = [k for k in RESOURCE_KEYS if launcher.get(k) is None
                 and not any(a.lstrip("+").startswith(f"hydra.launcher.{k}=") for a in args)]
    if not open_keys:
        return []
    needs: dict[str, int] = {}
    try:
        for overrides in variants or [[]]:
            config = compose_config(overrides)
            spec = build_spec(config)
            video = video_bytes(spec) if spec.geometry is not None else 0
            config.model.device = written_device(overrides, base)  # as the job will resolve it, on its node
            stated = family(config.model.kind).resources(config.model, video)
            for key in open_keys:
                needs[key] = max(needs.get(key, 0), int(getattr(stated, RESOURCE_KEYS[key])))
    except (ValueError, FileNotFoundError):
        return []
    return [f"hydra.launcher.{k}={v}" for k, v in needs.items()]


def written_device(overrides: Sequence[str], base: Any) -> str:
    """model.device as the command line or the model's preset writes it ("auto" unless set): composing
    resolves "auto" on this host, which is not the node the job runs on."""
    from omegaconf import OmegaConf

    from jensenkv.config.resolve import CONFIG_DIR

    for override in reversed(list(overrides)):
        key, _, value = override.partition("=")
        if key.lstrip("+") == "model.device":
            return value
    preset = CONFIG_DIR / "model" / f"{base.hydra.runtime.choices.get('model')}.yaml"
    written = OmegaConf.load(preset).get("model", {}).get("device") if preset.is_file() else None
    return str(written or "auto")


def check_time_limit(launcher: Any) -> None:
    """ValueError (one line) when SLURM's warning signal could come before the job can catch it: at
    timeout_min*60 - signal_delay_s, up to SLURM_EARLY_SIGNAL_S early, and not before HANDLER_READY_S."""
    timeout_min, delay = launcher.get("timeout_min"), launcher.get("signal_delay_s")
    if timeout_min is None or delay is None:
        return
    if delay <= 0:
        fail("hydra.launcher.signal_delay_s", delay, "a positive number of seconds: the warning before the time "
             "limit that checkpoints and requeues the job")
    room = timeout_min * 60 - delay - SLURM_EARLY_SIGNAL_S
    if room < HANDLER_READY_S:
        shortest = math.ceil((delay + SLURM_EARLY_SIGNAL_S + HANDLER_READY_S) / 60)
        fail("hydra.launcher.signal_delay_s", delay,
             f"with hydra.launcher.timeout_min={timeout_min} the requeue signal may come {max(room, 0)} s after "
             f"the job starts (SLURM sends it up to {SLURM_EARLY_SIGNAL_S} s early), before the job can catch "
             f"it (it needs {HANDLER_READY_S} s); set hydra.launcher.timeout_min>={shortest}"
             + (f" or signal_delay_s<={lowest}" if (lowest := timeout_min * 60 - SLURM_EARLY_SIGNAL_S
                                                      - HANDLER_READY_S) > 0 else ""))
