"""Interleaved timing: every repetition runs each compared variant once, in a rotating order.

On a shared CPU the load drifts over seconds; timing variant A ten times and then variant B ten times
turns that drift into a bias of their ratio. Ratios are therefore taken per repetition (paired) and
summarised by their median and interquartile range. Each call is timed twice: wall clock, and the CPU
time of this process (all its threads), which other tenants' load perturbs far less.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np


def time_interleaved(
    variants: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, cpu): seconds per call of every variant, ``repeats`` each, after ``warmup`` untimed rounds.

    The order rotates by one position each repetition, so no variant always runs first (cold caches)
    or always right after the most expensive one.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} is not allowed: it must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} is not allowed: it must be >= 0")
    if not variants:
        raise ValueError("variants={} is not allowed: give at least one callable")
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return wall, cpu


def paired_ratio(numerator: list[float], denominator: list[float]) -> tuple[float, float]:
    """(median, IQR) of the per-repetition ratios numerator[i] / denominator[i]."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(
            f"numerator has {len(numerator)} samples and denominator {len(denominator)}: paired ratios need "
            "the same non-zero number, from one time_interleaved call"
        )
    ratios = np.asarray(numerator) / np.asarray(denominator)
    q25, q50, q75 = np.percentile(ratios, [25, 50, 75])
    return float(q50), float(q75 - q25)
