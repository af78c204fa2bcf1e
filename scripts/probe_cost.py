"""Cost of the attention probes: wall time of a video with probes on every layer over the same video without.

    python scripts/probe_cost.py                       # the built-in model, INT2 RTN cache, 3 repeats
    python scripts/probe_cost.py --num-chunks 6 --repeats 5 --device cuda

Prints one line per setting and the ratio probed / unprobed (median over repeats, after one warm-up; the
two settings alternate so that load from other processes hits both alike). On the CPU the clock is this
process's CPU time (run with OMP_NUM_THREADS=1), which other processes on a shared machine barely move.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time_video(adapter, probes: bool, correction: str, seed: int) -> float:
    from jensenkv.cache import CacheConfig
    from jensenkv.generation.loop import generate_video
    from jensenkv.attention.config import AttentionConfig
    from jensenkv.quant import QuantConfig

    int2 = QuantConfig(method="rtn", bits=2, granularity="token_group", group_size=32)
    adapter.configure(cache=CacheConfig(key=int2, value=int2, keep_reference=probes),
                      attention=AttentionConfig(correction=correction, probes=probes))
    cuda = adapter.device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    if cuda:
        torch.cuda.synchronize(adapter.device)
    start = clock()
    generate_video(adapter, "a red square moving right on a gradient background", seed)
    if cuda:
        torch.cuda.synchronize(adapter.device)
    return clock() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-chunks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--correction", default="taylor", choices=("none", "taylor", "exact"))
    args = parser.parse_args(argv)
    from jensenkv.models import build_adapter

    adapter = build_adapter({"kind": "tiny", "device": args.device, "num_chunks": args.num_chunks})
    samples: dict[bool, list[float]] = {False: [], True: []}
    for probes in (False, True):
        _time_video(adapter, probes, args.correction, seed=0)  # warm-up
    for seed in range(args.repeats):
        for probes in (False, True):
            samples[probes].append(_time_video(adapter, probes, args.correction, seed=seed))
    times = {probes: statistics.median(values) for probes, values in samples.items()}
    for probes, value in times.items():
        print(f"probes={probes}: {value:.3f} s per video (median of {args.repeats})")
    print(f"ratio probed / unprobed: {times[True] / times[False]:.3f}")


if __name__ == "__main__":
    main()
