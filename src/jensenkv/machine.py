"""Where results were made: the CPU, its vector ISA, BLAS / OpenMP and their thread counts, the torch build.

Float results here are bit-identical between reruns on one machine, not across machines: the kernels torch
picks (ATen's CPU capability, oneDNN's ISA, MKL's code path) and the thread counts change the rounding, and one
flipped INT2 code carries through the autoregressive trajectory. ``describe()`` records what decides that, and
``report.table1`` writes it beside the committed tables as ``platform.json``; ``report.compare`` shows both
sides' when a file differs. No timestamps or host names: a rerun on the same platform writes the same file.

No jensenkv import here: every layer may use it.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

PLATFORM_FILE = "platform.json"
# the environment that picks a kernel or a thread count (README "Reproducing on another machine")
ENV = ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
       "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE")
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8")
BUILD_KEYS = ("TORCH_VERSION", "BLAS_INFO", "LAPACK_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP")  # no paths: a committed file


def cpu_info(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The first CPU's model name, its vector-ISA flags, and a digest of its whole flag list (two machines with one
    digest offer torch the same instructions)."""
    text = Path(path).read_text() if Path(path).is_file() else ""
    fields = dict(re.findall(r"^([^\t:\n]+?)\s*:\s*(.*)$", text.split("\n\n")[0], re.M))
    flags = fields.get("flags", "").split()
    return {"model": fields.get("model name", platform.processor() or platform.machine()),
            "logical_cpus": os.cpu_count(),
            "isa_flags": [f for f in ISA_FLAGS if f in flags],
            "flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16] if flags else None}


def torch_info() -> dict[str, Any]:
    """The torch build (its BLAS, oneDNN, OpenMP), the CPU kernels it dispatches to, and its thread counts."""
    import torch

    shown = torch.__config__.show()
    build = dict(re.findall(r"(\w+)=([^,\n]*)", shown))
    libraries = [line.strip(" -") for line in shown.splitlines()
                 if re.search(r"Math Kernel|MKL-DNN|oneDNN|OpenMP|OpenBLAS", line) and "Build settings" not in line]
    return {"version": torch.__version__,
            "build": {k: build[k].strip() for k in BUILD_KEYS if k in build},
            "libraries": libraries,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl": torch.backends.mkl.is_available(), "mkldnn": torch.backends.mkldnn.is_available(),
            "openmp": torch.backends.openmp.is_available(),
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}


def describe() -> dict[str, Any]:
    """Everything above, with python / numpy versions and the kernel- and thread-picking variables that are set."""
    import numpy

    return {"cpu": cpu_info(), "torch": torch_info(),
            "python": platform.python_version(), "numpy": numpy.__version__, "os": platform.system(),
            "env": {k: os.environ[k] for k in ENV if k in os.environ}}


def platform_text() -> str:
    """``describe()`` as the JSON of ``platform.json``."""
    return json.dumps(describe(), indent=1, sort_keys=True) + "\n"


def read_platform(results_dir: str | Path) -> dict[str, Any] | None:
    path = Path(results_dir) / PLATFORM_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def summary(info: dict[str, Any] | None) -> str:
    """One line: CPU model, ISA, flags digest, torch version, BLAS, kernels and threads."""
    if not info:
        return f"not recorded (no {PLATFORM_FILE})"
    cpu, t = info.get("cpu", {}), info.get("torch", {})
    env = "; " + " ".join(f"{k}={v}" for k, v in info["env"].items()) if info.get("env") else ""
    return (f"{cpu.get('model')} ({cpu.get('logical_cpus')} CPUs, {' '.join(cpu.get('isa_flags', [])) or 'no AVX'}, "
            f"flags {cpu.get('flags_sha256')}); torch {t.get('version')} BLAS {t.get('build', {}).get('BLAS_INFO')}, "
            f"kernels {t.get('cpu_capability')}, {t.get('threads')} threads{env}")
