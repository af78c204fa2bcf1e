"""How far a rerun's number may move from the committed one: the tolerance rule of ``report.compare``.

Across machines the runs are not bit-identical (README "Reproducing on another machine"): the CPU's kernels
round differently, and a flipped INT2 code moves a video's whole trajectory. The noise floor
(``python -m jensenkv.run.noise_floor`` -> ``noise_floor.csv``) measures exactly that kind of change on this
code: a float-level perturbation (float32 cache, thread count, batch composition) and how far each video's PSNR
against BF16 moves. The rule:

- ``f`` (dB): the float floor, the largest mean per-video |dPSNR vs BF16| over the quantized settings' float-level
  perturbations (the "another ... seed" ones are a new draw of the quantizer, not float noise: left out).
- ``phi = f / s``: f as a fraction of ``s``, the spread (SD) of the per-video PSNR within Table 1's quantized cells
  (``table1_videos.csv``). Float noise moves a video's value by about phi of its spread, in any metric.
- A column's float floor: ``phi x`` its own spread (per-video SD from ``table1_videos.csv`` for Table 1's metrics,
  else the SD over the file's rows).
- A cell (a mean over videos, or a bound of its interval): ``K`` x its column's floor; a paired difference (two
  videos move), its bounds and its MDE: ``2 K`` x. Never more than ``CAP`` x the half-width of the cell's own 95%
  interval: a move within tolerance is always small beside the uncertainty the table states.
- Per-video rows (``table1_videos.csv``, ``noise_floor.csv``) are judged as a population: one video may jump (a
  flipped code), so the mean |change| over the rows of a column must stay within K x its floor.
- Text and integer columns must be equal; p-values are judged by the verdicts they decide (``claims.md``).

``K = 6``: a rerun on another CPU (results/ of commits deda0f3 -> 20190b8, same code) moved Table 1's cells by at
most 3.2 x their floor (K = 1; dP_S's MDE; PSNR cells 1.5 x, the per-video files 0.9 x): 6 leaves about twice that,
and still fails a PSNR cell moved by 0.14 dB (0.05 dB for a paired difference, by its interval). Without a noise
floor on either side, nothing may move.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from jensenkv.report.checks import floor

K = 6.0  # cells may move by K x their float floor (2 K for paired differences)
CAP = 0.5  # ... and never by more than half their own 95% interval's half-width


@dataclass
class Scale:
    """The floor ``f`` (dB), the PSNR spread ``s`` it is read against, and per-video spreads of Table 1's metrics."""

    f: float = math.nan
    where: str = ""
    s: float = math.nan
    video_sd: dict[str, float] = field(default_factory=dict)

    @property
    def phi(self) -> float:
        """f as a fraction of the PSNR spread; 0 without a floor (then nothing may move)."""
        if not (math.isfinite(self.f) and math.isfinite(self.s) and self.s > 0):
            return 0.0
        return self.f / self.s

    def describe(self) -> str:
        if not self.phi:
            return "no noise floor (noise_floor.csv) on either side: every number must be identical"
        return (f"float floor f = {self.f:.3g} dB ({self.where}), PSNR spread s = {self.s:.3g} dB, phi = f/s = "
                f"{self.phi:.3g}; a cell may move by {K:g} x phi x its metric's spread ({2 * K:g} x for a paired "
                f"difference), at most {CAP:g} x its own 95% half-width")


def float_floor(noise: pd.DataFrame | None) -> tuple[float, str]:
    """(f, "base: change") over the float-level perturbations of ``noise_floor.csv``; (nan, "") without one."""
    if noise is None or noise.empty:
        return math.nan, ""
    return floor(noise[~noise["perturbation"].str.contains("seed")])


def scale(noise: list[pd.DataFrame | None], videos: pd.DataFrame | None) -> Scale:
    """The rule's constants: the larger floor of the two sides, spreads from ``videos`` (table1_videos.csv)."""
    floors = [float_floor(n) for n in noise]
    f, where = max(((v, w) for v, w in floors if math.isfinite(v)), default=(math.nan, ""))
    out = Scale(f, where)
    if videos is not None and "psnr" in videos.columns:
        quantized = videos[videos["label"] != "BF16"] if "label" in videos.columns else videos
        cells = [c for c in ("model", "label", "bits", "treatment") if c in quantized.columns]
        out.video_sd = {c: within_sd(quantized, c, cells) for c in quantized.columns
                        if pd.api.types.is_float_dtype(quantized[c]) and c != "rotation_seed"}
        out.s = out.video_sd["psnr"]
    return out


def within_sd(videos: pd.DataFrame, column: str, cells: list[str]) -> float:
    """The spread of a per-video value within a cell (Table 1's row x treatment): the root mean square of the
    cells' SDs, so differences between quantizers do not count as spread."""
    values = pd.to_numeric(videos[column], errors="coerce").replace([np.inf, -np.inf], np.nan)
    sds = values.groupby([videos[c].astype(str) for c in cells]).std().dropna() if cells else values.std()
    sds = pd.Series(sds).dropna()
    return float(np.sqrt((sds ** 2).mean())) if len(sds) else math.nan


def metric_of(column: str, metrics: set[str]) -> tuple[str | None, bool]:
    """(the metric a Table 1 column reports, whether it is a paired difference): "delta_psnr_ci95_low" ->
    ("psnr", True), "ssim_ci95_high" -> ("ssim", False); (None, False) for other columns."""
    paired = column.startswith("delta_") and column.removeprefix("delta_").split("_ci95_")[0].removesuffix("_mde") \
        in metrics
    base = column.removeprefix("delta_") if paired else column
    base = base.split("_ci95_")[0].removesuffix("_mde")
    return (base, paired) if base in metrics else (None, False)


def cell_tolerances(committed: pd.DataFrame, sc: Scale, spreads: dict[str, float]) -> pd.DataFrame:
    """A frame like ``committed`` (table1.csv) holding each numeric cell's tolerance (NaN: not judged here)."""
    metrics = {c.removesuffix("_ci95_low") for c in committed.columns
               if c.endswith("_ci95_low") and not c.startswith("delta_")}
    tol = pd.DataFrame(np.nan, index=committed.index, columns=committed.columns)
    for column in committed.columns:
        metric, paired = metric_of(column, metrics)
        if metric is None:
            continue
        spread = sc.video_sd.get(metric, spreads.get(metric, math.nan))
        raw = (2 if paired else 1) * K * sc.phi * (spread if math.isfinite(spread) else 0.0)
        prefix = f"delta_{metric}" if paired else metric
        half = (committed[f"{prefix}_ci95_high"] - committed[f"{prefix}_ci95_low"]).abs() / 2
        tol[column] = np.fmin(raw, CAP * half) if raw else 0.0  # fmin: no interval (one prompt) -> the floor alone
    return tol
