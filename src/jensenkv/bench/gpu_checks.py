"""The check groups of `make gpu-check` (jensenkv.bench.gpu_check runs each in a process of its own).

A group is a function of a ``CheckContext``; it emits one row per case as soon as the case is done, so a
later crash keeps the rows before it. Every case runs inside ``ctx.run``: an exception becomes a "failed"
row with the error, and a case that would start after the deadline becomes a "skipped" row.

- environment: versions of python, torch, triton, diffusers, hydra; the device.
- pytest: the tests marked ``gpu`` (``pytest -m gpu`` over the files that have such tests), one row per test.
- oracle: the ``triton`` and ``flex`` backends against the float64 oracle (``reference_attention``) at the
  real shapes, none / taylor / exact, on an INT2 g=32 cache of the suite; relative error of the output on
  evenly spaced query rows (rows of attention are independent, so the oracle runs on those rows alone).
- kernel: the ``triton`` backend against SDPA flash on BF16 K/V: time ratios (CUDA events, warm-up,
  interleaved repeats, median) and ``torch.cuda.max_memory_allocated`` per variant.
- generation: a real-size random-weight SkyReels-V2-1.3B (544x960) generating a few chunks with CFG, BF16
  cache against INT2 g=32 + Taylor: peak GPU memory and seconds per chunk.

Real shapes run in bfloat16 on CUDA; ``dry_run`` runs the same code on the CPU in float32 at toy shapes with
TRITON_INTERPRET=1 (plumbing only: its numbers mean nothing).
"""
from __future__ import annotations

from collections.abc import Callable


from jensenkv.bench.gpu_check_context import CheckContext
from jensenkv.bench.gpu_check_environment import environment, pytest_gpu
from jensenkv.bench.gpu_check_generation import generation
from jensenkv.bench.gpu_check_kernel import kernel
from jensenkv.bench.gpu_check_oracle import oracle

GROUPS: dict[str, Callable[[CheckContext], None]] = {
    "environment": environment,
    "pytest": pytest_gpu,
    "oracle": oracle,
    "kernel": kernel,
    "generation": generation,
}
