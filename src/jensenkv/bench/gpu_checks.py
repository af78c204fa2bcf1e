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

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from jensenkv.bench.gpu import GpuShape, _sdpa_flash

CORRECTIONS = ("none", "taylor", "exact")
ORACLE_BACKENDS = ("triton", "flex")
INT2 = {"bits": 2, "group_size": 32}
BF16_TOLERANCE = 3e-2  # relative output error of a bf16 path against the float64 oracle (tests' flex bound)
FP32_TOLERANCE = 1e-4  # the dry run's float32 operands
ORACLE_ROWS = 256  # query rows per head the oracle recomputes
# Targets of issue 21 (GPU benchmarks): the fused Taylor bias against the kernel's own no-bias time, and the
# kernel against SDPA flash on BF16 K/V at the SkyReels shape.
TAYLOR_OVER_NONE = 1.05
KERNEL_OVER_FLASH = 1.3
MIB = float(1 << 20)
GIB = float(1 << 30)

SKYREELS_FRAME_TOKENS = 2040  # 544x960: 68x120 latents, 2x2 patches -> 34x60 tokens per latent frame
SKYREELS_CHUNK_FRAMES = 5  # SkyReels-V2-DF's causal block
WORLDPLAY_CHUNK = 6240  # HY-WorldPlay: a 4-latent-frame chunk of 1,560 tokens per frame
MAGI_CHUNK = 12_150  # MAGI-1-4.5B: one chunk's tokens (jensenkv.bench.gpu)


def skyreels_shape(cached_frames: int) -> GpuShape:
    """SkyReels-V2-1.3B: a 5-frame chunk (10,200 queries) over ``cached_frames`` cached latent frames."""
    chunk = SKYREELS_CHUNK_FRAMES * SKYREELS_FRAME_TOKENS
    return GpuShape(f"skyreels-v2-1.3b {cached_frames} cached frames", 12, 12, chunk,
                    cached_frames * SKYREELS_FRAME_TOKENS, chunk)


def oracle_shapes() -> list[GpuShape]:
    """The issue's real shapes: SkyReels at 21 cached frames, MAGI-1-4.5B (24q/8kv, 1 cached + 3 in flight),
    WorldPlay (16 x 128, 6,240-token chunks over 20 memory frames)."""
    return [skyreels_shape(21),
            GpuShape("magi1-4.5b", 24, 8, MAGI_CHUNK, MAGI_CHUNK, 3 * MAGI_CHUNK),
            GpuShape("worldplay", 16, 16, WORLDPLAY_CHUNK, 5 * WORLDPLAY_CHUNK, WORLDPLAY_CHUNK)]


def kernel_shapes() -> list[GpuShape]:
    """Kernel against SDPA flash: SkyReels at 5, 13 and 21 cached frames, then the other two models."""
    return [skyreels_shape(f) for f in (5, 13, 21)] + oracle_shapes()[1:]


def toy_shape(shape: GpuShape) -> GpuShape:
    """The interpreter-sized stand-in of a shape: the same GQA group and chunk counts, 16-token chunks, d 64."""
    group = shape.heads_q // shape.heads_kv
    heads_kv = 1 if group > 1 else 2
    chunks = math.ceil(shape.cached / shape.queries)
    return GpuShape(f"{shape.name} (toy)", heads_kv * group, heads_kv, 16, 16 * chunks,
                    16 * (shape.in_flight // shape.queries), 64)


@dataclass
class CheckContext:
    """Where the group runs and how it reports: ``emit`` gets each row (a dict of gpu_check.COLUMNS)."""

    device: str
    dtype: torch.dtype
    dry_run: bool
    deadline: float  # time.time() after which no new case starts
    emit: Callable[[dict], None]

    def add(self, check: str, case: str, status: str, value: float = float("nan"), unit: str = "",
            target: str = "", detail: str = "", seconds: float = float("nan")) -> None:
        self.emit({"check": check, "case": case, "status": status, "value": float(value), "unit": unit,
                   "target": target, "detail": detail, "seconds": seconds})

    def run(self, check: str, case: str, body: Callable[[], None]) -> bool:
        """Run one case; its failure is a row with the error, and no case starts past the deadline."""
        if time.time() >= self.deadline:
            self.add(check, case, "skipped", detail="time budget spent before this case")
            return False
        started = time.perf_counter()
        try:
            body()
            return True
        except Exception as err:  # noqa: BLE001 - every failure is reported as a row, the next case still runs
            first = (str(err).strip().splitlines() or [""])[0][:300]
            self.add(check, case, "failed", detail=f"{type(err).__name__}: {first}",
                     seconds=time.perf_counter() - started)
            if self.device == "cuda":
                torch.cuda.empty_cache()
            return False

    def shapes(self, real: list[GpuShape]) -> list[GpuShape]:
        return [toy_shape(s) for s in real] if self.dry_run else real

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


# ---------------------------------------------------------------- inputs


def attention_inputs(shape: GpuShape, ctx: CheckContext, quantized: bool, seed: int = 0):
    """(q, k_cur, v_cur, segments): q (1, Hq, Q, D); k_cur / v_cur (1, Hkv, in_flight, D); the cached tokens as
    the segments of the suite's INT2 g=32 cache, committed one chunk at a time (``quantized``), or as one
    BF16 block in front of k_cur / v_cur (the SDPA baseline, no segments)."""
    from jensenkv.bench.presets import preset
    from jensenkv.cache import ChunkedKVCache

    gen = torch.Generator(device=ctx.device).manual_seed(seed)

    def randn(heads: int, tokens: int) -> torch.Tensor:  # (1, heads, tokens, D)
        return torch.randn(1, heads, tokens, shape.dim, generator=gen, device=ctx.device, dtype=ctx.dtype)

    q = randn(shape.heads_q, shape.queries)
    k_cur, v_cur = randn(shape.heads_kv, shape.in_flight), randn(shape.heads_kv, shape.in_flight)
    if not quantized:
        k = torch.cat([randn(shape.heads_kv, shape.cached), k_cur], dim=2)  # (1, Hkv, cached + in_flight, D)
        v = torch.cat([randn(shape.heads_kv, shape.cached), v_cur], dim=2)
        return q, k, v, []
    cache = ChunkedKVCache(preset("rtn", shape.dim, **INT2), shape.dim)
    if hasattr(cache, "reserve"):  # layer buffers sized up front: the peak memory holds no growth slack
        cache.reserve(shape.cached)
    with torch.inference_mode():
        for start in range(0, shape.cached, shape.queries):  # one chunk at a time, as a run commits them
            n = min(shape.queries, shape.cached - start)
            cache.commit(randn(shape.heads_kv, n), randn(shape.heads_kv, n))
    return q, k_cur, v_cur, cache.segments()


def dense_gqa(q, k_cur, v_cur, segments):
    """K/V with each KV head repeated for its query heads, as dense segments: what a backend without GQA is
    handed (MAGI-1's caches expand their GQA heads this way for such backends)."""
    group = q.shape[1] // k_cur.shape[1]

    def rep(t: torch.Tensor) -> torch.Tensor:  # (B, Hkv, S, D) -> (B, Hq, S, D)
        return t.repeat_interleave(group, dim=1)

    dense = [s.expanded(group) for s in segments]
    return q, rep(k_cur), rep(v_cur), dense


def backend_call(name: str, q, k_cur, v_cur, segments, correction: str) -> torch.Tensor:
    """One call through the suite's backend table (``jensenkv.attention.get_backend``), its common contract;
    a backend without GQA gets ``dense_gqa`` inputs when the shape has fewer KV than query heads."""
    from jensenkv.attention.backends import get_backend, reads_kv_heads

    if q.shape[1] != k_cur.shape[1] and not reads_kv_heads(name):
        q, k_cur, v_cur, segments = dense_gqa(q, k_cur, v_cur, segments)
    with torch.inference_mode():
        return get_backend(name)(q, k_cur, v_cur, segments, correction=correction)


def oracle_output(q, k_cur, v_cur, segments, correction: str, rows: torch.Tensor) -> torch.Tensor:
    """The float64 oracle on the query rows ``rows`` (B, Hq, len(rows), Dv); GQA by stacking each KV head's
    query heads along the query axis (each attention row reads only its own KV head)."""
    from jensenkv.attention import reference_attention

    b, heads_q, _, d = q.shape
    group = heads_q // k_cur.shape[1]
    sub = q[:, :, rows].float()  # (B, Hq, n, D): bf16 values, exact in float32
    n = sub.shape[2]
    stacked = sub.reshape(b, heads_q // group, group * n, d)  # (B, Hkv, group * n, D)
    with torch.inference_mode():
        out = reference_attention(stacked, k_cur.float(), v_cur.float(), segments, correction=correction)
    return out.reshape(b, heads_q, n, out.shape[-1])  # (B, Hq, n, Dv)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


# ---------------------------------------------------------------- groups


def environment(ctx: CheckContext) -> None:
    import platform

    def versions() -> None:
        import importlib.metadata as md

        for name in ("torch", "triton", "diffusers", "hydra-core", "omegaconf", "pandas", "numpy"):
            try:
                version = md.version(name)
            except md.PackageNotFoundError:
                version = "not installed"
            ctx.add("environment", name, "measured", detail=version)
        ctx.add("environment", "python", "measured", detail=platform.python_version())

    def device() -> None:
        if ctx.device == "cuda":
            props = torch.cuda.get_device_properties(0)
            ctx.add("environment", "device", "measured", props.total_memory / GIB, "GiB",
                    detail=f"{props.name}, sm_{props.major}{props.minor}, CUDA {torch.version.cuda}, "
                           f"{props.multi_processor_count} SMs")
        else:
            ctx.add("environment", "device", "measured", detail=f"{platform.machine()} CPU, dry run "
                    "(TRITON_INTERPRET=1, float32, toy sizes: the numbers mean nothing)")

    ctx.run("environment", "versions", versions)
    ctx.run("environment", "device", device)


def oracle(ctx: CheckContext) -> None:
    from jensenkv.attention.backends import reads_kv_heads

    tolerance = BF16_TOLERANCE if ctx.dtype == torch.bfloat16 else FP32_TOLERANCE
    for shape in ctx.shapes(oracle_shapes()):
        held: dict = {}

        def build(shape: GpuShape = shape) -> None:
            held["inputs"] = attention_inputs(shape, ctx, quantized=True)
            n = min(ORACLE_ROWS, shape.queries)
            held["rows"] = torch.linspace(0, shape.queries - 1, n, device=ctx.device).round().long()

        if not ctx.run("oracle", f"{shape.describe()}: inputs", build):
            continue
        q, k_cur, v_cur, segments = held["inputs"]
        for correction in CORRECTIONS:
            expected: dict = {}
            if not ctx.run("oracle", f"{shape.describe()}, {correction}: float64 oracle",
                           lambda c=correction: expected.setdefault(
                               "out", oracle_output(q, k_cur, v_cur, segments, c, held["rows"]))):
                continue
            for backend in ORACLE_BACKENDS:
                case = f"{shape.describe()}, {correction}: {backend}"

                def check(backend: str = backend, correction: str = correction, case: str = case) -> None:
                    started = time.perf_counter()
                    out = backend_call(backend, q, k_cur, v_cur, segments, correction)
                    ctx.sync()
                    err = relative_error(out[:, :, held["rows"]], expected["out"])
                    dense = " (K/V repeated per query head: no GQA)" \
                        if not reads_kv_heads(backend) and shape.heads_q != shape.heads_kv else ""
                    ctx.add("oracle", case, "passed" if err <= tolerance else "failed", err, "relative error",
                            f"<= {tolerance:g}", f"{str(ctx.dtype).removeprefix('torch.')} operands, "
                            f"{len(held['rows'])} query rows per head{dense}", time.perf_counter() - started)

                ctx.run("oracle", case, check)
        del held, q, k_cur, v_cur, segments
        if ctx.device == "cuda":
            torch.cuda.empty_cache()


def _times(calls: dict[str, Callable[[], object]], ctx: CheckContext, warmup: int, repeats: int) -> dict[str, list]:
    """Seconds per call of each variant: CUDA events on a GPU (wall clock on the CPU), every repetition running
    each variant once in a rotating order, after ``warmup`` untimed rounds."""
    names = list(calls)
    with torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                calls[name]()
        ctx.sync()
        events: dict[str, list] = {name: [] for name in names}
        for rep in range(repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                if ctx.device == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    calls[name]()
                    end.record()
                    events[name].append((start, end))
                else:
                    started = time.perf_counter()
                    calls[name]()
                    events[name].append(time.perf_counter() - started)
        ctx.sync()
    if ctx.device == "cuda":
        return {name: [s.elapsed_time(e) / 1e3 for s, e in pairs] for name, pairs in events.items()}
    return events


def _peak_mib(build: Callable[[], Callable[[], object]], ctx: CheckContext) -> float:
    """max_memory_allocated while one variant's inputs are held and it runs once, over what was allocated
    before they were made (the random chunks made on the way to the stored form do not count)."""
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    call = build()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del call
    return peak / MIB


def kernel(ctx: CheckContext) -> None:
    warmup, repeats = (1, 2) if ctx.dry_run else (3, 15)
    # the dry run's toy SkyReels shapes would differ only in their cached chunks: one of each model is enough
    for shape in ctx.shapes(oracle_shapes() if ctx.dry_run else kernel_shapes()):
        what = shape.describe()

        def sdpa() -> Callable[[], object]:
            q, k, v, _ = attention_inputs(shape, ctx, quantized=False)
            return lambda: _sdpa_flash(q, k, v)

        def triton(correction: str) -> Callable[[], Callable[[], object]]:
            def build() -> Callable[[], object]:
                q, k_cur, v_cur, segments = attention_inputs(shape, ctx, quantized=True)
                return lambda: backend_call("triton", q, k_cur, v_cur, segments, correction)
            return build

        builders = {"sdpa bf16": sdpa, **{f"triton {c}": triton(c) for c in CORRECTIONS}}

        def memory() -> None:
            peaks = {}
            for name, build in builders.items():
                peaks[name] = _peak_mib(build, ctx)
                ctx.add("kernel", f"{what}: {name}", "measured", peaks[name], "MiB peak allocated",
                        detail="torch.cuda.max_memory_allocated: inputs held + one call")
            ctx.add("kernel", f"{what}: triton taylor / sdpa bf16", "measured",
                    peaks["triton taylor"] / peaks["sdpa bf16"], "peak memory ratio")

        if ctx.device == "cuda":
            ctx.run("kernel", f"{what}: peak memory", memory)
        else:
            ctx.add("kernel", f"{what}: peak memory", "skipped", detail="no CUDA allocator on the CPU")

        def timing() -> None:
            started = time.perf_counter()
            calls = {name: build() for name, build in builders.items()}
            seconds = _times(calls, ctx, warmup, repeats)
            median = {name: statistics.median(s) for name, s in seconds.items()}
            elapsed = time.perf_counter() - started
            ctx.add("kernel", f"{what}: sdpa bf16", "measured", 1e3 * median["sdpa bf16"], "ms",
                    detail=f"median of {repeats}", seconds=elapsed)
            skyreels = shape.name.startswith("skyreels")
            for num, den, bound in (("triton none", "sdpa bf16", KERNEL_OVER_FLASH if skyreels else None),
                                    ("triton taylor", "sdpa bf16", None), ("triton exact", "sdpa bf16", None),
                                    ("triton taylor", "triton none", TAYLOR_OVER_NONE),
                                    ("triton exact", "triton none", None)):
                ratio = median[num] / median[den]
                status = "measured" if bound is None or ctx.dry_run else ("met" if ratio <= bound else "missed")
                ctx.add("kernel", f"{what}: {num} / {den}", status, ratio, "time ratio",
                        "" if bound is None else f"<= {bound:g}", f"medians of {repeats} interleaved calls")

        ctx.run("kernel", f"{what}: time", timing)
        if ctx.device == "cuda":
            torch.cuda.empty_cache()


def generation(ctx: CheckContext) -> None:
    """BF16 cache (backend "cached") against INT2 g=32 + Taylor (backend "triton") on one random-weight
    real-size SkyReels-V2-1.3B, one adapter reconfigured between the two."""
    from jensenkv.bench.presets import preset
    from jensenkv.bench.subjects import (
        PROMPT, SKYREELS_V2_1_3B, SKYREELS_V2_FRAME, TOY_SKYREELS, TOY_SKYREELS_FRAME, random_skyreels_adapter,
    )
    from jensenkv.generation.config import GenerationConfig
    from jensenkv.generation.loop import generate_video
    from jensenkv.attention.config import AttentionConfig

    config, frame = (TOY_SKYREELS, TOY_SKYREELS_FRAME) if ctx.dry_run else (SKYREELS_V2_1_3B, SKYREELS_V2_FRAME)
    # diffusers 0.42.1 cannot add the fps embedding (inject_sample_info) to per-frame timesteps of a batch of more
    # than one (CFG's two branches in one forward): its (B, F, 6, d) + (B*F, 6, d) sum fails. The embedding
    # costs nothing next to the blocks, so the memory and time are measured without it.
    config = {**config, "inject_sample_info": False}
    generation_cfg = GenerationConfig(num_chunks=2 if ctx.dry_run else 3, steps=1 if ctx.dry_run else 2,
                                      frames_per_chunk=2 if ctx.dry_run else SKYREELS_CHUNK_FRAMES, shift=8.0,
                                      guidance_scale=6.0)  # CFG: cond and uncond caches
    head_dim = config["attention_head_dim"]
    settings = {"bf16": (preset("bf16", head_dim), AttentionConfig(backend="cached")),
                "int2 g32 + taylor": (preset("rtn", head_dim, **INT2),
                                      AttentionConfig(backend="triton", correction="taylor"))}
    held: dict = {}

    def build() -> None:
        started = time.perf_counter()
        cache, attention = settings["bf16"]
        held["adapter"] = random_skyreels_adapter(config, frame, generation_cfg, cache, attention, ctx.device,
                                                  ctx.dtype)
        weights = sum(p.numel() * p.element_size() for p in held["adapter"].transformer.parameters())
        ctx.add("generation", "random-weight transformer", "measured", weights / GIB, "GiB weights",
                detail=f"{config['num_layers']} layers, {config['num_attention_heads']} x {head_dim} (no fps "
                       f"embedding: diffusers' sum fails for a CFG batch), latent frame "
                       f"{frame}, {generation_cfg.num_chunks} chunks x {generation_cfg.frames_per_chunk} frames, "
                       f"{generation_cfg.steps} steps, CFG", seconds=time.perf_counter() - started)

    if not ctx.run("generation", "build", build):
        return
    adapter = held["adapter"]
    measured: dict = {}
    for name, (cache, attention) in settings.items():
        def generate(name: str = name, cache=cache, attention=attention) -> None:
            adapter.configure(cache=cache, attention=attention)
            if ctx.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            with torch.inference_mode():
                result = generate_video(adapter, PROMPT, 0, generation_cfg)
            ctx.sync()
            elapsed = time.perf_counter() - started
            per_chunk = result.timings["per_chunk_s"]
            later = statistics.median(per_chunk[1:]) if len(per_chunk) > 1 else per_chunk[0]
            stored = sum(c.nbytes for branch in ("cond", "uncond") for c in adapter.caches(branch))
            measured[name] = {"s": later}
            ctx.add("generation", f"{name}: seconds per chunk", "measured", later, "s",
                    detail=f"median over chunks 2..{len(per_chunk)}; first chunk {per_chunk[0]:.2f} s "
                           "(compiles and autotunes)", seconds=elapsed)
            ctx.add("generation", f"{name}: cache held", "measured", stored / GIB, "GiB",
                    detail="stored bytes of both CFG branches' caches, all layers, after the last commit")
            if ctx.device == "cuda":
                measured[name]["peak"] = torch.cuda.max_memory_allocated() / GIB
                ctx.add("generation", f"{name}: peak GPU memory", "measured", measured[name]["peak"], "GiB",
                        detail="torch.cuda.max_memory_allocated over the generation, weights included")
            if not torch.isfinite(result.latents).all():
                ctx.add("generation", f"{name}: latents", "measured", detail="non-finite latents (random weights)")

        ctx.run("generation", name, generate)
    if len(measured) == 2:
        bf16, int2 = measured["bf16"], measured["int2 g32 + taylor"]
        ctx.add("generation", "int2 g32 + taylor / bf16: seconds per chunk", "measured", int2["s"] / bf16["s"],
                "time ratio")
        if "peak" in bf16:
            ctx.add("generation", "int2 g32 + taylor / bf16: peak GPU memory", "measured",
                    int2["peak"] / bf16["peak"], "memory ratio")


def gpu_test_files(tests_dir: Path) -> list[Path]:
    """The test files that hold a ``gpu``-marked test (collecting only these keeps the other files' imports,
    e.g. of packages the GPU machine lacks, out of the run)."""
    return sorted(p for p in tests_dir.rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def pytest_gpu(ctx: CheckContext) -> None:
    """``pytest -m gpu``, one child process per test file (its timeout: what is left of the group's time, so a
    slow file costs its own rows only); one row per test from its JUnit XML, plus one row per file."""
    import os
    import subprocess
    import sys
    import tempfile
    import xml.etree.ElementTree as ET

    tests = Path(__file__).resolve().parents[3] / "tests"
    files = gpu_test_files(tests) if tests.is_dir() else []
    if not files:
        ctx.add("pytest", "pytest -m gpu", "skipped", detail=f"no test file with a gpu-marked test under {tests}")
        return

    def run(path: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "junit.xml"
            started = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                       f"--junitxml={report}", str(path)], cwd=tests.parent, text=True,
                                      capture_output=True, timeout=max(1.0, ctx.deadline - time.time()),
                                      env={**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"})
            except subprocess.TimeoutExpired:
                ctx.add("pytest", str(path.relative_to(tests.parent)), "failed",
                        detail=f"killed after {time.perf_counter() - started:.0f} s (the group's time budget)",
                        seconds=time.perf_counter() - started)
                return
            elapsed = time.perf_counter() - started
            for case in (ET.parse(report).getroot().iter("testcase") if report.is_file() else []):
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
                status = "passed" if outcome is None else ("skipped" if outcome.tag == "skipped" else "failed")
                message = "" if outcome is None else (outcome.get("message") or outcome.tag)
                ctx.add("pytest", name, status, float(case.get("time", "nan")), "s",
                        detail=(message.splitlines() or [""])[0][:300])
            tail = (done.stdout.strip().splitlines() or [""])[-1]
            ctx.add("pytest", str(path.relative_to(tests.parent)), "passed" if done.returncode in (0, 5) else "failed",
                    done.returncode, "exit code", detail=tail[:300], seconds=elapsed)

    for path in files:
        ctx.run("pytest", str(path.relative_to(tests.parent)), lambda path=path: run(path))


GROUPS: dict[str, Callable[[CheckContext], None]] = {
    "environment": environment,
    "pytest": pytest_gpu,
    "oracle": oracle,
    "kernel": kernel,
    "generation": generation,
}
