"""What this host offers a run, asked in one place: its usable CPU cores, whether a CUDA device is visible, and
the node a run is planned for.

On the host that runs, ``cuda_available()`` is torch's answer. A host that plans runs for another node (a SLURM
login node planning the jobs of a sweep) knows that node only by what the job asks for: under
``planned_node(has_gpu)`` every device check answers as on that node, so "auto" resolves, and "cuda" or a
GPU-only backend is judged, as the job will resolve and judge them (the device is part of the run id). The
bottom of the package: it imports nothing of jensenkv.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

HOST = "on this machine"


@dataclass(frozen=True)
class PlannedNode:
    has_gpu: bool
    where: str  # how an error names the node: "on the job's node (...)"


_PLANNED: ContextVar[PlannedNode | None] = ContextVar("jensenkv_planned_node", default=None)


def available_cores() -> int:
    """CPU cores this process may use: its affinity (SLURM's cpus_per_task, taskset) and cgroup quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def cuda_available() -> bool:
    """A CUDA device is visible where the run will run: the planned node's, else this host's (torch's answer)."""
    planned = _PLANNED.get()
    if planned is not None:
        return planned.has_gpu
    import torch

    return torch.cuda.is_available()


def where() -> str:
    """The place ``cuda_available()`` speaks of, for an error message: this machine or the planned node."""
    planned = _PLANNED.get()
    return HOST if planned is None else planned.where


@contextmanager
def planned_node(has_gpu: bool, where: str = "on the job's node") -> Iterator[None]:
    """Within: device checks answer as on a node that has (or has no) visible GPU, not as on this host."""
    token = _PLANNED.set(PlannedNode(bool(has_gpu), where))
    try:
        yield
    finally:
        _PLANNED.reset(token)
