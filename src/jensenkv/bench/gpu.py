"""GPU benchmark -> results/bench_gpu.csv: the fused Triton kernel over a packed INT2 cache against SDPA flash
attention over the same keys held in BF16, at the two shapes the suite's real models run.

- wan-1.3b: 12 heads x 128, a 4,680-token chunk (3 latent frames of 1,560 tokens) attending to 3..21 cached
  latent frames plus itself.
- magi1-4.5b: 24 query and 8 KV heads x 128; one in-flight chunk of 12,150 tokens attends to 1 cached (clean,
  quantized) chunk plus the 3 chunks in flight, itself included, which stay BF16 and are never corrected.

Per shape it writes (benchmark, config, value, unit, iqr, repeats, gpu):
- ``gpu_time_ratio``: Triton INT2 g=32 (none / taylor / exact) over SDPA BF16, and taylor / none and exact / none
  inside the kernel (the fused correction's own overhead). Medians of paired, interleaved repetitions, timed
  on the wall clock after a device synchronize.
- ``gpu_peak_memory``: ``torch.cuda.max_memory_allocated`` while one variant's inputs are held and it runs,
  each variant measured alone from an emptied allocator (MiB), and INT2 over BF16.
- ``gpu_time``: SDPA BF16 milliseconds per call, the unit the ratios divide.

Runs where CUDA is present (``scripts/bench.py`` does it by itself on a GPU machine). ``device="cpu"``
with ``TRITON_INTERPRET=1`` runs the same code at toy sizes so a test can check its plumbing; such rows
time the interpreter and mean nothing, and memory rows are left out there (no CUDA allocator).
"""
from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from jensenkv.bench.presets import preset
from jensenkv.bench.timing import paired_ratio, time_interleaved
from jensenkv.store.files import atomic_write

COLUMNS = ("benchmark", "config", "value", "unit", "iqr", "repeats", "gpu")
INT2 = {"bits": 2, "group_size": 32}
MIB = float(1 << 20)
WAN_FRAME_TOKENS = 1560  # one 480p latent frame of Wan-1.3B: 60 x 104 latents, 2 x 2 patches


@dataclass(frozen=True)
class GpuShape:
    """One attention call: queries of one chunk, ``cached`` quantized tokens, ``in_flight`` BF16 tokens (the
    query chunk included, the kernel's k_cur) over ``heads_q`` query and ``heads_kv`` KV heads of ``dim``."""

    name: str
    heads_q: int
    heads_kv: int
    queries: int
    cached: int
    in_flight: int
    dim: int = 128

    def describe(self) -> str:
        gqa = f"{self.heads_q}q/{self.heads_kv}kv" if self.heads_q != self.heads_kv else f"{self.heads_q}"
        return f"{self.name} H{gqa} d{self.dim} Q{self.queries} cached {self.cached} + in flight {self.in_flight}"


def paper_shapes() -> list[GpuShape]:
    """The issue's shapes: Wan-1.3B at 3, 9, 15, 21 cached frames; MAGI-1-4.5B with 1 cached + 3 in flight."""
    wan = [GpuShape("wan-1.3b", 12, 12, 3 * WAN_FRAME_TOKENS, f * WAN_FRAME_TOKENS, 3 * WAN_FRAME_TOKENS)
           for f in (3, 9, 15, 21)]
    return wan + [GpuShape("magi1-4.5b", 24, 8, 12_150, 12_150, 3 * 12_150)]


def toy_shapes() -> list[GpuShape]:
    """Interpreter-sized stand-ins of the two shapes (plumbing only)."""
    return [GpuShape("wan-toy", 2, 2, 16, 48, 16, 32), GpuShape("magi-toy", 4, 2, 16, 32, 48, 32)]


def _inputs(shape: GpuShape, device: str, quantized: bool, seed: int = 0):
    """(q, k_cur, v_cur, segments): q (1, Hq, Q, D) bf16; k_cur / v_cur (1, Hkv, in_flight, D) bf16; the
    cached tokens as an INT2 g=32 cache's segments (quantized) or one BF16 block prepended to k_cur."""
    from jensenkv.cache import ChunkedKVCache

    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.bfloat16)

    q = randn(1, shape.heads_q, shape.queries, shape.dim)
    k_cur, v_cur = (randn(1, shape.heads_kv, shape.in_flight, shape.dim) for _ in range(2))
    if not quantized:
        k_cached, v_cached = (randn(1, shape.heads_kv, shape.cached, shape.dim) for _ in range(2))
        k = torch.cat([k_cached, k_cur], dim=2)  # (1, Hkv, cached + in_flight, D)
        v = torch.cat([v_cached, v_cur], dim=2)
        return q, k, v, []
    cache = ChunkedKVCache(preset("rtn", shape.dim, **INT2), shape.dim)
    with torch.inference_mode():
        for start in range(0, shape.cached, shape.queries):  # one chunk at a time, as a run commits them
            n = min(shape.queries, shape.cached - start)
            cache.commit(randn(1, shape.heads_kv, n, shape.dim), randn(1, shape.heads_kv, n, shape.dim))
    return q, k_cur, v_cur, cache.segments()


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA over BF16 K/V, flash backend where the device has it (GQA through enable_gqa)."""
    gqa = q.shape[1] != k.shape[1]
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)


def _variants(shape: GpuShape, device: str, block: tuple[int, int]) -> dict[str, Callable[[], Callable[[], object]]]:
    """name -> a builder that makes the variant's inputs and returns its call (so memory is per variant)."""
    from jensenkv.attention.triton_kernel import triton_cached_attention

    def sdpa() -> Callable[[], object]:
        q, k, v, _ = _inputs(shape, device, quantized=False)
        return lambda: _sdpa_flash(q, k, v)

    def triton(correction: str) -> Callable[[], Callable[[], object]]:
        def build() -> Callable[[], object]:
            q, k_cur, v_cur, segments = _inputs(shape, device, quantized=True)
            return lambda: triton_cached_attention(q, k_cur, v_cur, segments, correction=correction,
                                                   block_m=block[0], block_n=block[1])
        return build

    return {"sdpa bf16": sdpa, "triton none": triton("none"), "triton taylor": triton("taylor"),
            "triton exact": triton("exact")}


def _synchronized(call: Callable[[], object], device: str) -> Callable[[], None]:
    def run() -> None:
        with torch.inference_mode():
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    return run


def _peak_mib(build: Callable[[], Callable[[], object]]) -> float:
    """Peak allocated bytes (MiB) while one variant's inputs are held and it runs once, over what was allocated
    before they were made. The peak counter is reset after building, so the temporaries of making the inputs
    (random chunks before they are quantized) do not count; the inputs held do."""
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    call = build()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # the peak restarts at what is allocated now: the held inputs
    with torch.inference_mode():
        call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del call
    return peak / MIB


def gpu_rows(shapes: list[GpuShape], device: str = "cuda", repeats: int = 10,
             block: tuple[int, int] = (64, 64), log: Callable[[str], None] = print) -> list[dict]:
    """Time ratios and peak memory of every variant per shape (module docstring)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' needs a CUDA GPU: none is visible (torch.cuda.is_available() is False)")
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else f"{device} (TRITON_INTERPRET, plumbing only)"
    rows: list[dict] = []

    def add(benchmark: str, config: str, value: float, unit: str, iqr: float = float("nan"), n: int = 1) -> None:
        rows.append({"benchmark": benchmark, "config": config, "value": float(value), "unit": unit, "iqr": iqr,
                     "repeats": n, "gpu": gpu})

    for shape in shapes:
        builders = _variants(shape, device, block)
        what = f"{shape.describe()}, INT2 g=32, Triton block {block[0]}x{block[1]}"
        if device == "cuda":
            peaks = {name: _peak_mib(build) for name, build in builders.items()}
            for name, mib in peaks.items():
                add("gpu_peak_memory", f"{what}: {name}", mib, "MiB")
            add("gpu_peak_memory", f"{what}: triton taylor / sdpa bf16", peaks["triton taylor"] / peaks["sdpa bf16"],
                "ratio")
        calls = {name: _synchronized(build(), device) for name, build in builders.items()}
        wall, _ = time_interleaved(calls, repeats, warmup=2)
        add("gpu_time", f"{what}: sdpa bf16", 1e3 * statistics.median(wall["sdpa bf16"]), "ms", n=repeats)
        for num, den in (("triton none", "sdpa bf16"), ("triton taylor", "sdpa bf16"), ("triton exact", "sdpa bf16"),
                         ("triton taylor", "triton none"), ("triton exact", "triton none")):
            median, iqr = paired_ratio(wall[num], wall[den])
            add("gpu_time_ratio", f"{what}: {num} / {den}", median, "ratio (wall)", iqr, repeats)
        log(f"gpu {shape.describe()}: taylor/sdpa {rows[-4]['value']:.3f}, taylor/none {rows[-2]['value']:.3f}")
        del calls
    return rows


def write_gpu_csv(rows: list[dict], out_dir: Path) -> Path:
    path = out_dir / "bench_gpu.csv"
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    atomic_write(path, lambda f: f.write(frame.to_csv(index=False)), mode="w")
    return path
