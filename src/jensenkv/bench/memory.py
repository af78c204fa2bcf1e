"""Memory measurements, each in a fresh process with glibc's mmap threshold fixed.

With the default malloc, freed tensors stay in the heap and RSS keeps growth that is no longer live;
``MALLOC_MMAP_THRESHOLD_=131072`` makes every large buffer its own mapping, returned on free, so RSS
growth measures what is really held. Besides RSS, "live" counts the tensor bytes reachable from the
caches plus the attention workspace. Run ``python -m jensenkv.bench.memory held|generation ...``; it
prints one JSON line. ``measure(...)`` starts such a process and parses that line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

MMAP_THRESHOLD = "131072"
LAYER_SHAPE = (1, 12, 4680, 128)  # Wan2.1-1.3B: one chunk of one layer (B, H, S, D)


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tensor_bytes(obj, seen: set | None = None) -> int:
    """Bytes of every tensor storage reachable from ``obj`` (attributes, lists, dicts), each storage once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        ptr = ("storage", obj.untyped_storage().data_ptr())
        if ptr in seen:
            return 0
        seen.add(ptr)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return tensor_bytes(vars(obj), seen)
    return 0


def held_memory(layers: int, commits: int, shape: tuple[int, int, int, int], queries: int) -> dict:
    """An INT2 g=32 cache per layer, ``commits`` chunks each, then one Taylor-corrected attention call per
    layer (``queries`` current-chunk queries against the whole window): RSS growth and live bytes."""
    from jensenkv.attention import cached_attention
    from jensenkv.bench.presets import preset
    from jensenkv.cache import ChunkedKVCache

    try:
        from jensenkv.attention.workspace import workspace_nbytes
    except ImportError:  # a suite without the shared workspace (before/after comparisons)
        def workspace_nbytes() -> int:
            return 0

    torch.manual_seed(0)
    cfg = preset("rtn", shape[-1], bits=2, group_size=32)
    b, h, s, d = shape
    q = torch.randn(b, h, queries, d)  # (B, H, Q, D)
    k_cur, v_cur = torch.randn(shape), torch.randn(shape)  # (B, H, S, D): the current chunk
    warm = ChunkedKVCache(cfg, d)  # warm-up: load kernels and allocator pools before the baseline
    warm.commit(torch.randn(1, 1, 64, d), torch.randn(1, 1, 64, d))
    cached_attention(q[:, :1, :8], k_cur[:, :1, :64], v_cur[:, :1, :64], warm.segments(), correction="taylor")
    del warm
    before = rss_bytes()
    caches = [ChunkedKVCache(cfg, d) for _ in range(layers)]
    for _ in range(commits):
        for cache in caches:
            k, v = torch.randn(shape), torch.randn(shape)
            cache.commit(k, v)
            del k, v
    with torch.inference_mode():
        for cache in caches:
            cached_attention(q, k_cur, v_cur, cache.segments(), correction="taylor")
    stored = sum(c.nbytes for c in caches)
    return {"rss_growth": rss_bytes() - before, "live": tensor_bytes(caches) + workspace_nbytes(),
            "workspace": workspace_nbytes(), "stored": stored, "bf16": sum(c.bf16_nbytes for c in caches)}


def generation_peak(cache_name: str, quick: bool) -> dict:
    """Peak RSS over one whole long-context generation with a BF16 or an INT2 (+ Taylor) cache."""
    from jensenkv.bench.presets import preset
    from jensenkv.bench.subjects import LONG_CONTEXT, PROMPT, long_context_adapter
    from jensenkv.generation.loop import generate_video

    head_dim = LONG_CONTEXT["attention_head_dim"]
    cache = preset("bf16", head_dim) if cache_name == "bf16" else preset("rtn", head_dim, bits=2, group_size=32)
    adapter, generation = long_context_adapter(cache, "none" if cache_name == "bf16" else "taylor", quick=quick)
    before = peak_rss_bytes()
    with torch.inference_mode():
        generate_video(adapter, PROMPT, 0, generation)
    caches = [c for p in adapter.processors for c in p.caches.values()]
    return {"peak": peak_rss_bytes(), "peak_before": before, "stored": sum(c.nbytes for c in caches),
            "bf16": sum(c.bf16_nbytes for c in caches)}


def batch_peak(batch: int, quick: bool) -> dict:
    """Peak RSS over one batch of the built-in model (INT2 g=32 + taylor, 1 thread) and each video's cache bytes."""
    from jensenkv.bench.presets import preset
    from jensenkv.bench.subjects import PROMPT, tiny_adapter
    from jensenkv.generation.loop import generate_videos

    adapter, generation = tiny_adapter(preset("rtn", 128, bits=2, group_size=32), "taylor", quick=quick)
    before = peak_rss_bytes()
    with torch.inference_mode():
        generate_videos(adapter, [PROMPT] * batch, list(range(batch)), generation)
    caches = adapter.caches("cond")
    return {"peak": peak_rss_bytes(), "peak_before": before,
            "cache_bytes_per_video": sum(c.nbytes for c in caches) / batch}


def measure(kind: str, *args: str, pythonpath: str | None = None, module: str = "jensenkv.bench.memory",
            in_process: bool = False) -> dict:
    """Run one measurement (``python -m <module> <kind> ...``, printing one JSON line) in a fresh process with
    the fixed mmap threshold; return its JSON result. ``in_process``: the same command line in this process
    (a smoke run: no interpreter start-up, but RSS then counts whatever this process did before)."""
    if in_process:
        return _measure_here(module, [kind, *args])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-m", module, kind, *args], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_here(module: str, argv: list[str]) -> dict:
    """``module``'s main(argv) in this process, its printed JSON line parsed; the thread count it sets restored."""
    import contextlib
    import importlib
    import io

    threads, out = torch.get_num_threads(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            importlib.import_module(module).main(argv)
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    held = sub.add_parser("held")
    held.add_argument("--layers", type=int, default=8)
    held.add_argument("--commits", type=int, default=6)
    held.add_argument("--shape", type=int, nargs=4, default=list(LAYER_SHAPE))
    held.add_argument("--queries", type=int, default=256)
    gen = sub.add_parser("generation")
    gen.add_argument("cache", choices=["bf16", "int2"])
    gen.add_argument("--quick", action="store_true")
    batch = sub.add_parser("batch")
    batch.add_argument("size", type=int)
    batch.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))
    if args.kind == "held":
        result = held_memory(args.layers, args.commits, tuple(args.shape), args.queries)
    elif args.kind == "batch":
        result = batch_peak(args.size, args.quick)
    else:
        result = generation_peak(args.cache, args.quick)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
