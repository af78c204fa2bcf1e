"""Wall-clock timing with interleaved repetitions, so that variants compared by a ratio see the same machine load.

On a shared CPU the load drifts over seconds; timing variant A ten times and then variant B ten times
turns that drift into a bias of the ratio. Here every repetition runs each variant once, in an order
that rotates from one repetition to the next, and the ratio is taken between the medians.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """The measured seconds of one variant, one entry per repetition (warm-up runs excluded)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        """Interquartile range (75th minus 25th percentile, linear interpolation)."""
        q75, q25 = np.percentile(self.samples, [75, 25])
        return float(q75 - q25)

    @property
    def repeats(self) -> int:
        return len(self.samples)


def time_once(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_interleaved(
    variants: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, Timing]:
    """Time every variant ``repeats`` times, one call of each per repetition, after ``warmup`` untimed rounds.

    The order of the variants rotates by one position each repetition, so no variant always runs
    first (cold caches) or always right after the most expensive one.
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
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(time_once(variants[name]))
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def paired_ratios(numerator: Timing, denominator: Timing) -> list[float]:
    """Per-repetition ratios of two interleaved timings (repetition i of one against repetition i of the other)."""
    if numerator.repeats != denominator.repeats:
        raise ValueError(
            f"repeats differ: numerator has {numerator.repeats}, denominator {denominator.repeats}; "
            "paired ratios need timings from one time_interleaved call"
        )
    return [a / b for a, b in zip(numerator.samples, denominator.samples)]
