"""The memory headline: how many latent frames of SkyReels-V2-1.3B's KV cache a memory budget holds, per quantizer
(`make memory-headline` -> results/memory_headline.{csv,md}, memory_headline_frames.csv (every frame measured) and
results/figures/memory_headline.png).

Geometry (jensenkv.bench.subjects.SKYREELS_V2_1_3B at 544x960): 30 layers of 12 heads x 128, 2,040 tokens per
latent frame, a cond and an uncond cache per layer (CFG). One fresh process per quantizer, with glibc's mmap
threshold fixed (``MALLOC_MMAP_THRESHOLD_``, so a freed buffer leaves RSS at once), commits one latent frame at a
time: random K/V of the real per-frame size (one draw per frame) into every layer's two caches, each quantizing
and storing its own copy with the suite's cache, then one attention call over the whole cache (Taylor-corrected
for quantized keys), so the shared attention workspace (one layer's widest window, dequantized) is in the
measurement. After each frame it records the process's peak
RSS over its baseline (after imports and a warm-up); it stops once that passes the largest budget. The frames a
budget holds are the most frames whose peak stayed within it (the peak only grows, so one process answers every
budget below its largest). Queries of the attention call: a slice of the in-flight chunk, which, like the weights,
is held before the baseline and is not the cache's memory.

Bytes per element of a preset (``theory``): what the cache stores per K/V element (its ``nbytes``) against BF16's 2;
INT2 g=32 with an fp16 step and a uint8 zero per group stores 2.75 of 16 bits, so 5.8x the frames at most.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from jensenkv.store.files import atomic_write

MMAP_THRESHOLD = "131072"  # the same fixed threshold as jensenkv.bench.memory
GIB = float(1 << 30)
BUDGETS_GIB = (4.0, 8.0)
# (label, configs/quant preset, overrides): what the headline compares
QUANTIZERS = (("bf16", "bf16", {}), ("int4 g32", "rtn", {"bits": 4, "group_size": 32}),
              ("int2 g32", "rtn", {"bits": 2, "group_size": 32}), ("int2 g128", "rtn", {"bits": 2, "group_size": 128}))
TARGET_INT2_G32 = 4.5  # issue 21: INT2 g=32 holds at least 4.5x the frames of BF16
VIDEO_FRAMES_PER_LATENT = 4  # Wan VAE: 4 video frames per latent frame (the first latent frame: 1)
FPS = 24


@dataclass(frozen=True)
class Geometry:
    """One model's cache: ``layers`` x ``branches`` caches of ``heads`` x ``dim``, ``frame_tokens`` per frame."""

    layers: int
    branches: int
    heads: int
    dim: int
    frame_tokens: int
    chunk_frames: int  # frames in flight per forward (the current chunk: its queries and K/V)
    queries: int  # query rows of the per-frame attention call (a slice of the current chunk)

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.branches} CFG branches, {self.heads} heads x {self.dim}, "
                f"{self.frame_tokens} tokens per latent frame")


def skyreels_geometry() -> Geometry:
    from jensenkv.bench.subjects import SKYREELS_V2_1_3B, SKYREELS_V2_FRAME, frame_tokens

    cfg = SKYREELS_V2_1_3B
    return Geometry(cfg["num_layers"], 2, cfg["num_attention_heads"], cfg["attention_head_dim"],
                    frame_tokens(cfg, SKYREELS_V2_FRAME), 5, 256)


def _rss_now() -> int:
    from jensenkv.bench.memory import rss_bytes

    return rss_bytes()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS mark (VmHWM) at the current RSS (Linux >= 4.0: clear_refs 5), so the peak
    after the baseline is the cache's, not the imports' or the warm-up's. False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmHWM") <= _status_kib("VmRSS") + 64  # the mark really restarted
    except OSError:
        return False


def peak_rss() -> int:
    """Peak RSS since the last reset (VmHWM), in bytes."""
    return _status_kib("VmHWM") * 1024


def fill(quant: str, overrides: dict, geometry: Geometry, budget_gib: float, max_frames: int, emit) -> None:
    """Commit latent frames until the peak RSS growth passes ``budget_gib``; ``emit`` one dict per frame."""
    import torch

    from jensenkv.attention import cached_attention
    from jensenkv.bench.presets import preset
    from jensenkv.cache import ChunkedKVCache

    try:
        from jensenkv.attention.workspace import release_workspace, workspace_nbytes
    except ImportError:  # a suite without the shared workspace
        def workspace_nbytes() -> int:
            return 0

        def release_workspace() -> None:
            return None

    g = geometry
    cfg = preset(quant, g.dim, **overrides)
    correction = "none" if cfg.key.method == "none" else "taylor"
    gen = torch.Generator().manual_seed(0)
    chunk = g.chunk_frames * g.frame_tokens
    q = torch.randn(1, g.heads, g.queries, g.dim, generator=gen)  # (1, H, Q, D): queries of the current chunk
    k_cur, v_cur = (torch.randn(1, g.heads, chunk, g.dim, generator=gen) for _ in range(2))  # (1, H, S, D)
    warm = ChunkedKVCache(cfg, g.dim)  # load kernels and allocator pools before the baseline
    warm.commit(k_cur[:, :, :64], v_cur[:, :, :64])
    with torch.inference_mode():
        cached_attention(q[:, :, :8], k_cur[:, :, :64], v_cur[:, :, :64], warm.segments(), correction=correction)
    del warm
    release_workspace()
    baseline = _rss_now()
    # anonymous pages alone: the cache's bytes. Total RSS also counts library code pages, which the kernel may
    # reclaim or fault back in at any moment on a busy machine
    anon_baseline = _status_kib("RssAnon")
    if not reset_peak_rss():
        raise RuntimeError("cannot reset the peak RSS mark (/proc/self/clear_refs): the peak would include the "
                           "imports' and the warm-up's")
    caches = [ChunkedKVCache(cfg, g.dim) for _ in range(g.layers * g.branches)]
    budget = budget_gib * GIB
    for frame in range(1, max_frames + 1):
        with torch.inference_mode():
            # one draw per frame, committed into every cache: each quantizes and stores its own copy (a stored
            # form's size does not depend on the values), and the draws cost a third of the time less
            k = torch.randn(1, g.heads, g.frame_tokens, g.dim, generator=gen)  # (1, H, S, D)
            v = torch.randn(1, g.heads, g.frame_tokens, g.dim, generator=gen)
            for cache in caches:
                cache.commit(k, v)
            del k, v
            cached_attention(q, k_cur, v_cur, caches[-1].segments(), correction=correction)  # one layer's window
        peak = peak_rss() - baseline
        emit({"frames": frame, "peak_growth": peak, "rss_growth": _rss_now() - baseline,
              "anon_growth": (_status_kib("RssAnon") - anon_baseline) * 1024,
              "stored": sum(c.nbytes for c in caches), "bf16": sum(c.bf16_nbytes for c in caches),
              # what the layer buffers hold, capacity included (pages never written are not in RSS)
              "held": sum(getattr(c, "held_nbytes", c.nbytes) for c in caches),
              "workspace": workspace_nbytes()})
        if peak > budget:
            return


def measure(label: str, geometry: Geometry, budget_gib: float, max_frames: int = 400,
            timeout: float = 3600) -> list[dict]:
    """One quantizer's trajectory, measured in a fresh process with the fixed mmap threshold."""
    quant, overrides = next((q, o) for name, q, o in QUANTIZERS if name == label)
    import torch

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD,
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(torch.get_num_threads())}
    args = [sys.executable, "-m", "jensenkv.bench.memory_headline", "--child", "--quant", quant,
            "--overrides", json.dumps(overrides), "--geometry", json.dumps(asdict(geometry)),
            "--budget-gib", str(budget_gib), "--max-frames", str(max_frames)]
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True, timeout=timeout)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def frames_within(trajectory: list[dict], budget_bytes: float) -> int | None:
    """The most frames whose peak RSS growth stayed within the budget; None when the trajectory never passed
    it (the budget holds more than was measured: no answer)."""
    if not trajectory or trajectory[-1]["peak_growth"] <= budget_bytes:
        return None
    held = [t["frames"] for t in trajectory if t["peak_growth"] <= budget_bytes]
    return max(held) if held else 0


def video_seconds(latent_frames: int) -> float:
    """Seconds of 24 fps video the latent frames decode to (Wan VAE: 1 + 4 (n - 1) frames)."""
    return (1 + VIDEO_FRAMES_PER_LATENT * (latent_frames - 1)) / FPS if latent_frames > 0 else 0.0


def headline_rows(trajectories: dict[str, list[dict]], budgets_gib: tuple[float, ...]) -> list[dict]:
    """Per quantizer and budget: frames held, their ratio to BF16's, the bytes-only theory, seconds of video."""
    rows = []
    bf16 = trajectories.get("bf16")
    for label, trajectory in trajectories.items():
        last = trajectory[-1]
        stored_per_element = last["stored"] / last["bf16"]  # of BF16's bytes
        for budget in budgets_gib:
            frames = frames_within(trajectory, budget * GIB)
            base = frames_within(bf16, budget * GIB) if bf16 else None
            ratio = frames / base if frames is not None and base else float("nan")
            rows.append({"quant": label, "budget_gib": budget,
                         "frames_held": float("nan") if frames is None else frames,
                         "ratio_to_bf16": ratio, "theory_ratio": 1 / stored_per_element,
                         "video_seconds": float("nan") if frames is None else video_seconds(frames),
                         "stored_gib_per_frame": last["stored"] / last["frames"] / GIB,
                         "peak_gib_per_frame": last["peak_growth"] / last["frames"] / GIB,
                         "workspace_gib": last["workspace"] / GIB})
    return rows


def write_outputs(rows: list[dict], trajectories: dict[str, list[dict]], geometry: Geometry, out_dir: Path,
                  figure_dir: Path, seconds: float, note: str = "") -> None:
    """memory_headline.csv (one row per quantizer and budget), .md (the table and how it was measured) and the
    figure: peak RSS growth against cached latent frames, with the budgets drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    figure_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "memory_headline.csv", lambda f: f.write(frame.to_csv(index=False)), mode="w")
    steps = pd.DataFrame([{"quant": label, **t} for label, trajectory in trajectories.items() for t in trajectory])
    atomic_write(out_dir / "memory_headline_frames.csv", lambda f: f.write(steps.to_csv(index=False)), mode="w")
    budgets = sorted(frame.budget_gib.unique())
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, trajectory in trajectories.items():
        ax.plot([t["frames"] for t in trajectory], [t["peak_growth"] / GIB for t in trajectory], marker=".",
                label=label)
    for budget in budgets:
        ax.axhline(budget, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("cached latent frames (2,040 tokens each)" if geometry.frame_tokens == 2040 else
                  f"cached latent frames ({geometry.frame_tokens} tokens each)")
    ax.set_ylabel("peak RSS growth (GiB)")
    ax.set_title("KV cache a memory budget holds: SkyReels-V2-1.3B, CFG" if geometry.frame_tokens == 2040 else
                 "KV cache a memory budget holds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figure_dir / "memory_headline.png", dpi=120)
    plt.close(fig)
    int2 = frame[(frame.quant == "int2 g32")]
    lines = ["# Memory headline: the longest video a memory budget holds", "",
             f"Cache geometry: {geometry.describe()} (SkyReels-V2-1.3B's at 544x960). Per quantizer, a fresh process "
             "(MALLOC_MMAP_THRESHOLD_=131072) commits one latent frame at a time into every layer's cond and uncond "
             "cache and runs one attention call over the whole cache (the shared workspace included); frames held = "
             "the most frames whose peak RSS growth over the process's baseline stayed within the budget. "
             "`theory_ratio`: BF16 bytes over stored bytes (no workspace); `*_per_frame`: at the last frame measured; "
             "`workspace_gib`: the attention workspace then (one layer's window and the in-flight chunk, float32). "
             f"Video seconds at {FPS} fps, {VIDEO_FRAMES_PER_LATENT} video frames per latent frame.",
             f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} on this CPU in {seconds / 60:.1f} min. {note}", "",
             frame.to_markdown(index=False, floatfmt=".3g"), ""]
    if not int2.empty:
        met = [f"{b:g} GiB: {r:.2f}x" for b, r in zip(int2.budget_gib, int2.ratio_to_bf16)]
        ok = all(r >= TARGET_INT2_G32 for r in int2.ratio_to_bf16)
        lines += [f"Target INT2 g=32 >= {TARGET_INT2_G32}x BF16's frames: {', '.join(met)} "
                  f"({'met' if ok else 'missed'}).", ""]
    lines += ["Figure: `results/figures/memory_headline.png`.", ""]
    atomic_write(out_dir / "memory_headline.md", lambda f: f.write("\n".join(lines)), mode="w")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[3] / "results")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS_GIB), help="GiB")
    parser.add_argument("--quant", nargs="+", default=[q[0] for q in QUANTIZERS],
                        help=f"labels of {[q[0] for q in QUANTIZERS]}")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one quantizer, in this process
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--geometry", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--budget-gib", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-frames", type=int, default=400, help="stop a quantizer here even within budget")
    parser.add_argument("--note", default="", help="a line for the report, e.g. the commit measured")
    args = parser.parse_args(argv)
    if args.child:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))
        geometry = Geometry(**json.loads(args.geometry))
        fill(args.quant[0], json.loads(args.overrides), geometry, args.budget_gib, args.max_frames,
             lambda row: print(json.dumps(row), flush=True))
        return
    labels = [q[0] for q in QUANTIZERS]
    bad = [q for q in args.quant if q not in labels]
    if bad:
        parser.error(f"--quant={bad} is not allowed: use labels from {labels}")
    if any(b <= 0 for b in args.budgets):
        parser.error(f"--budgets={args.budgets} is not allowed: every budget must be > 0 GiB")
    geometry = skyreels_geometry()
    started = time.perf_counter()
    trajectories = {}
    for label in args.quant:
        trajectories[label] = measure(label, geometry, max(args.budgets), args.max_frames)
        last = trajectories[label][-1]
        print(f"[memory-headline {time.strftime('%H:%M:%S')}] {label}: {last['frames']} frames, peak growth "
              f"{last['peak_growth'] / GIB:.2f} GiB, stored {last['stored'] / GIB:.2f} GiB", flush=True)
    rows = headline_rows(trajectories, tuple(args.budgets))
    write_outputs(rows, trajectories, geometry, args.out_dir, args.out_dir / "figures", time.perf_counter() - started,
                  args.note)
    print(pd.DataFrame(rows).to_string(index=False), flush=True)


if __name__ == "__main__":
    main()
