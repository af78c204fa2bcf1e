"""One benchmark result = one row of results/bench.csv.

Columns:
- benchmark, config, shape: what was measured (shape is "overall" for an aggregate over shapes).
- value, unit: the headline number.
- median, iqr, repeats: the distribution it came from. For a time row these describe the
  seconds; for a ratio of two times they describe the per-repetition paired ratios, while
  ``value`` is the ratio of the two medians (numerator / denominator).
- numerator, denominator: the two measured quantities a ratio is made of (empty otherwise).
- theory: the analytic value the measurement should match (empty when there is none).
- note: free text (what the ratio compares, what a number counts).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import numpy as np

from jensenkv.bench.timing import Timing, paired_ratios

COLUMNS = (
    "benchmark",
    "config",
    "shape",
    "value",
    "unit",
    "median",
    "iqr",
    "repeats",
    "numerator",
    "denominator",
    "theory",
    "note",
)


@dataclass(frozen=True)
class BenchRow:
    benchmark: str
    config: str
    shape: str
    value: float
    unit: str
    median: float = math.nan
    iqr: float = math.nan
    repeats: int = 1
    numerator: float = math.nan
    denominator: float = math.nan
    theory: float = math.nan
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def time_row(benchmark: str, config: str, shape: str, timing: Timing, note: str = "") -> BenchRow:
    """A row holding the median seconds of one timed variant."""
    return BenchRow(
        benchmark=benchmark,
        config=config,
        shape=shape,
        value=timing.median,
        unit="s",
        median=timing.median,
        iqr=timing.iqr,
        repeats=timing.repeats,
        note=note,
    )


def time_ratio_row(
    benchmark: str, config: str, shape: str, numerator: Timing, denominator: Timing, note: str = ""
) -> BenchRow:
    """value = median(numerator) / median(denominator); median/iqr describe the paired per-repetition ratios."""
    ratios = paired_ratios(numerator, denominator)
    q75, q25 = np.percentile(ratios, [75, 25])
    return BenchRow(
        benchmark=benchmark,
        config=config,
        shape=shape,
        value=numerator.median / denominator.median,
        unit="ratio",
        median=statistics.median(ratios),
        iqr=float(q75 - q25),
        repeats=len(ratios),
        numerator=numerator.median,
        denominator=denominator.median,
        note=note,
    )


def overall_median_row(benchmark: str, config: str, per_shape: list[BenchRow], note: str = "") -> BenchRow:
    """The median over shapes of per-shape values (value == median == median of the rows' values)."""
    if not per_shape:
        raise ValueError(f"per_shape=[] is not allowed for {benchmark}/{config}: give at least one row")
    values = [r.value for r in per_shape]
    q75, q25 = np.percentile(values, [75, 25])
    return BenchRow(
        benchmark=benchmark,
        config=config,
        shape="overall",
        value=statistics.median(values),
        unit=per_shape[0].unit,
        median=statistics.median(values),
        iqr=float(q75 - q25),
        repeats=len(values),
        note=note or f"median over {len(values)} shapes",
    )
