"""The machine a benchmark ran on, recorded next to its numbers (times mean nothing without it)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's "model name" from /proc/cpuinfo, or platform.processor() where that file is absent."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The SIMD flags that decide CPU matmul speed (avx2, avx512*, amx*), as listed in /proc/cpuinfo."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))
    except OSError:
        pass
    return []


def machine_info() -> dict[str, str]:
    """CPU model, usable cores, torch version and thread count, load average, GPU if any."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "cpu": cpu_model(),
        "cpu_flags": " ".join(cpu_flags()) or "n/a",
        "cores (usable / total)": f"{usable} / {os.cpu_count()}",
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "load average (1/5/15 min, at start)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }
    return info
