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


def job_asks_for_gpu(launcher: Any) -> bool:
    """Whether a job of this launcher config asks SLURM for a GPU: gpus_per_node or gpus_per_task >= 1 (an
    int, or a "type:count" string), or a gres (own key or additional_parameters) naming gpu."""
    launcher = launcher or {}
    extra = launcher.get("additional_parameters") or {}
    for key in ("gpus_per_node", "gpus_per_task"):
        for value in (launcher.get(key), extra.get(key), extra.get(key.replace("_", "-"))):
            if value is not None and _gpu_count(value) >= 1:
                return True
    return any("gpu" in str(v).lower() for v in (launcher.get("gres"), extra.get("gres")) if v)


def _gpu_count(value: Any) -> int:
    """1 from 1, "1" or "a100:1"; 0 from what names no count (SLURM would refuse it: sbatch --test-only says)."""
    text = str(value).rsplit(":", 1)[-1]
    return int(text) if text.isdigit() else 0


def planned_node_of(launcher: Any) -> Any:
    """Device checks as on the node a job of ``launcher`` runs on (``jensenkv.devices.planned_node``): a job
    that asks for a GPU runs where one is visible, one that asks for none on the CPU. A launcher that is not
    SLURM's runs its jobs here: this host's own answer."""
    from contextlib import nullcontext

    return job_node(launcher) if is_slurm(launcher) else nullcontext()


def job_node(launcher: Any) -> Any:
    """``jensenkv.devices.planned_node`` for the node a SLURM job of ``launcher`` runs on."""
    from jensenkv.devices import planned_node

    has_gpu = job_asks_for_gpu(launcher)
    return planned_node(has_gpu, "on the SLURM job's node (it asks for " + (
        "a GPU)" if has_gpu else "no GPU: set hydra.launcher.gpus_per_node=1)"))


def pinned_device(overrides: Sequence[str], written: str, planned: str) -> list[str]:
    """The job's overrides with ``model.device`` set to the device planned for it when the config leaves it to
    "auto": a node whose GPUs a CPU job can see (no cgroup isolation) still runs the planned device, and the
    run id (which hashes the resolved device, not the override) is the planned one."""
    if written != "auto":
        return list(overrides)
    kept = [o for o in overrides if o.partition("=")[0].lstrip("+") != "model.device"]
    return [*kept, f"model.device={planned}"]


def resource_overrides(args: Sequence[str], base: Any, variants: list[list[str]] | None) -> list[str]:
    """``hydra.launcher.<key>=<value>`` for each resource the command line leaves to the family: the most any
    variant of the sweep needs. [] when the launcher is not SLURM's or a variant does not compose (the
    pre-check then names the bad value)."""
    from jensenkv.devices import planned_node
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
            # built for its video size only, as on a node with a GPU: the device is judged by the pre-check,
            # once the request it depends on is known (planned_node_of)
            with planned_node(True, "on the SLURM job's node"):
                spec = build_spec(config)
            video = video_bytes(spec) if spec.geometry is not None else 0
            stated = family(config.model.kind).resources(config.model, video)
            for key in open_keys:
                needs[key] = max(needs.get(key, 0), int(getattr(stated, RESOURCE_KEYS[key])))
    except (ValueError, FileNotFoundError):
        return []
    return [f"hydra.launcher.{k}={v}" for k, v in needs.items()]


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
