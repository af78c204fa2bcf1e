"""The report's model checks beside the claims: the noise floor, teacher-forced fidelity and the cost of the
calibrated strengths. Each reads what its command wrote and returns a markdown section (or says what is missing).

- Noise floor (``python -m jensenkv.run.noise_floor`` -> ``<results>/noise_floor.csv``): how far PSNR moves under
  harmless changes (float32 cache, another thread count, batch composition, another rotation seed for QuaRot).
  ``floor`` is the largest mean per-video |dPSNR against BF16| a harmless change causes on a quantized setting;
  every PSNR effect of the claims is read against it (``effect_lines``).
- Teacher-forced fidelity (``experiment=teacher_forced`` -> ``<results>/teacher_forced/runs``): per row and
  correction, the PSNR of each chunk read with the BF16 history (quantized vs full-precision cache) and the
  relative error of the denoiser output, mean over videos and per chunk.
- Calibration cost: each calibrated variant against the uncorrected run and against the same correction at
  strength 1, paired per video (``Options.paired``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from jensenkv.eval.stats import Interval, PairedDifference
from jensenkv.report.intervals import cell_interval, paired
from jensenkv.report.options import Options
from jensenkv.report.rows import cluster_means
from jensenkv.report.store_frame import load_results
from jensenkv.store.results import ResultsStore

NOISE_FLOOR_FILE = "noise_floor.csv"
TEACHER_FORCED_DIR = "teacher_forced"


def _ci(values: pd.Series, digits: int = 2, signed: bool = True) -> str:
    """"+0.12 [-0.05, +0.30] (n=8 prompts, 24 videos)": per-video values indexed by (prompt, seed), their mean
    and interval over prompts by the report's one clustering rule (``intervals.cell_interval``); "missing"
    without a finite value."""
    values = values[np.isfinite(values.to_numpy(dtype=float))]
    return "missing" if values.empty else _fmt(cell_interval(values), digits, signed)


def _paired_ci(treated: pd.Series, base: pd.Series, digits: int = 2) -> str:
    """treated - base paired per (prompt, seed), then over prompts (``intervals.paired``), formatted as ``_ci``."""
    diff = paired(treated, base)
    return "-" if diff.n == 0 else _fmt(diff, digits, True)


def _fmt(iv: Interval | PairedDifference, digits: int, signed: bool) -> str:
    sign = "+" if signed else ""
    mean = iv.delta if isinstance(iv, PairedDifference) else iv.mean
    counts = f"(n={iv.n} prompt{'' if iv.n == 1 else 's'}, {iv.num_videos} videos)"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):  # one prompt: no interval
        return f"{mean:{sign}.{digits}f} {counts}"
    return f"{mean:{sign}.{digits}f} [{iv.low:{sign}.{digits}f}, {iv.high:{sign}.{digits}f}] {counts}"


def _mean_abs(part: pd.DataFrame) -> float:
    """Mean abs(dPSNR vs BF16) by the clustering rule (per prompt, then over prompts); NaN without a value."""
    values = _by_video(part, "d_psnr_vs_bf16").abs().dropna()
    return float(cluster_means(values).mean()) if len(values) else math.nan


def _by_video(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column of per-video rows as a series indexed by (prompt, seed): what the clustering rule reads."""
    return frame.set_index(["prompt", "seed"])[column].astype(float)


# --- noise floor ----------------------------------------------------------------------------------------
def load_noise_floor(results_dir: str | Path) -> pd.DataFrame | None:
    path = Path(results_dir) / NOISE_FLOOR_FILE
    return pd.read_csv(path) if path.is_file() else None


def floor(frame: pd.DataFrame, base: str | None = None) -> tuple[float, str]:
    """(largest mean per-video |dPSNR against BF16| over the harmless changes of ``base`` (None: of every
    quantized base), "base: change"); (nan, "") when none was measured."""
    part = frame[frame["d_psnr_vs_bf16"].notna()]
    if base is not None:
        part = part[part["base"] == base]
    if part.empty:
        return math.nan, ""
    means = part.groupby(["base", "perturbation"])[["prompt", "seed", "d_psnr_vs_bf16"]].apply(_mean_abs)
    which = means.idxmax()
    return float(means.max()), f"{which[0]}: {which[1]}"


def noise_floor_section(results_dir: str | Path) -> str:
    lines = ["## Noise floor: harmless changes, no quantization", "",
             ("Each video regenerated under a change that should not matter (`python -m jensenkv.run.noise_floor`). "
              "'PSNR vs unperturbed': the changed video against the video as the run makes it (8-bit frames; "
              "identical: infinite). 'dPSNR vs BF16': for the quantized settings, how much their PSNR against the "
              "BF16 video moves from the change alone: the floor a PSNR effect must clear."), ""]
    frame = load_noise_floor(results_dir)
    if frame is None:
        return "\n".join(lines + [f"- missing: no {NOISE_FLOOR_FILE} in the store: run `python -m "
                                  "jensenkv.run.noise_floor experiment=table1 eval.num_prompts=8 eval.seeds=[0]`"]) + "\n"
    rows = []
    for (base, change), part in frame.groupby(["base", "perturbation"], sort=False):
        moved_psnr = _by_video(part, "psnr_vs_unperturbed")
        moved = _ci(moved_psnr, signed=False) if np.isfinite(moved_psnr).any() else "- (every video identical)"
        rows.append({"base": base, "change": change, "videos": str(len(part)),
                     "identical": f"{int(part['identical'].sum())} of {len(part)}",
                     "PSNR vs unperturbed (moved videos)": moved,
                     "dPSNR vs BF16 [95% CI]": "-" if base == "bf16" else _ci(_by_video(part, "d_psnr_vs_bf16")),
                     "mean abs(dPSNR vs BF16)": "-" if base == "bf16"
                     else f"{_mean_abs(part):.2f}"})
    lines += [pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True), ""]
    level, which = floor(frame)
    if math.isfinite(level):
        lines += [f"Noise floor for PSNR effects: {level:.2f} dB per video (mean abs(dPSNR vs BF16) under '{which}').",
                  ""]
    return "\n".join(lines)


def effect_lines(opts: Options, results_dir: str | Path, correction: str, bits: int) -> list[str]:
    """One line per claim-2 PSNR row: the paired PSNR effect of ``correction`` against the noise floor of that
    row's uncorrected setting where it was measured (base "<row> none"), else the largest measured floor."""
    frame = load_noise_floor(results_dir)
    if frame is None or not math.isfinite(floor(frame)[0]):
        return ["- effect vs noise floor: missing (no noise floor measured on a quantized setting)"]
    out = []
    for row in opts.rows:
        if row == "bf16" or opts.first(row, "bits") != bits or not {"none", correction} <= set(opts.variants(row)):
            continue
        diff = opts.paired(row, correction, "psnr")
        if diff.n == 0 or not math.isfinite(diff.delta):
            continue
        level, which = floor(frame, f"{row} none")
        effect = f"- claim 2 (PSNR), {row}: d{correction} {diff.delta:+.2f} dB [{diff.low:+.2f}, {diff.high:+.2f}]"
        if not math.isfinite(level):
            out.append(f"{effect}; noise floor not measured for this setting (its own randomness, if any, is not "
                       "covered by the others')")
        elif level == 0:
            out.append(f"{effect}; every harmless change leaves this setting's videos bit-identical (floor 0): the "
                       "effect is not from them (its interval is the test)")
        else:
            where = "above" if abs(diff.delta) > level else "within"
            out.append(f"{effect} against its per-video noise floor {level:.2f} dB ({which}): {where} the floor")
    return out


# --- teacher-forced fidelity ----------------------------------------------------------------------------
def teacher_forced_table(results_dir: str | Path) -> pd.DataFrame:
    """One row per (row, correction) of the teacher-forced store: tf PSNR and relative error over videos, a
    correction's paired tf PSNR difference against the uncorrected run of its row (same prompt and seed), and the
    mean PSNR per chunk."""
    root = Path(results_dir) / TEACHER_FORCED_DIR
    runs = load_results(root) if (root / "runs").is_dir() else pd.DataFrame()
    if runs.empty or "tf_rel_err" not in runs.columns:
        return pd.DataFrame()
    store, out, per_video = ResultsStore(root), [], {}
    for _, run in runs[runs["tf_rel_err"].notna()].sort_values(["quantizer", "bits", "correction"]).iterrows():
        videos = store.read_record(run["run_id"])["per_prompt"]
        name = f"{run['quantizer']} INT{int(run['bits'])} g{int(run['group_size'])}"
        psnr, rel_err = (_video_series(videos, key) for key in ("tf_psnr", "tf_rel_err"))  # (prompt, seed) index
        per_video[(name, run["correction"])] = psnr
        base = per_video.get((name, "none"))  # "none" sorts before the corrections
        difference = _paired_ci(psnr, base) if base is not None and run["correction"] != "none" else "-"
        chunks = pd.DataFrame([{**c, "prompt": v["prompt"], "seed": int(v["seed"])}
                               for v in videos for c in v.get("teacher_forced", [])])
        per_chunk = pd.Series(dtype=float) if chunks.empty else chunks.groupby("chunk").apply(  # over prompts
            lambda part: float(cluster_means(_by_video(part, "psnr").dropna()).mean()), include_groups=False)
        out.append({"row": name, "correction": run["correction"],
                    "tf PSNR [95% CI]": _ci(psnr, signed=False),
                    "d tf PSNR vs none [95% CI]": difference,
                    "denoiser rel. error": _ci(rel_err, 4, False),
                    "PSNR per chunk": ", ".join(f"{int(c)}: {p:.1f}" for c, p in per_chunk.items())})
    return pd.DataFrame(out)


def _video_series(videos: list[dict], metric: str) -> pd.Series:
    """A run's per-video ``metric`` indexed by (prompt, seed) (NaN where the video lacks it)."""
    index = pd.MultiIndex.from_tuples([(v["prompt"], int(v["seed"])) for v in videos], names=["prompt", "seed"])
    return pd.Series([v["metrics"].get(metric, math.nan) for v in videos], index=index, dtype=float)


def teacher_forced_section(results_dir: str | Path) -> str:
    lines = ["## Teacher-forced fidelity: the cache's direct effect, without trajectory divergence", "",
             ("Every chunk read with the BF16 run's own history, denoised from the same noise once with the run's "
              "cache and once in full precision (`experiment=teacher_forced`, jensenkv.teacher_forced). PSNR "
              "between the two clean chunks (chunks >= 1, mean over chunks then videos); relative error of the "
              "denoiser output at each chunk's first step, where both calls see the same input."), ""]
    table = teacher_forced_table(results_dir)
    if table.empty:
        return "\n".join(lines + ["- missing: no teacher-forced runs under "
                                  f"{TEACHER_FORCED_DIR}/: run `python -m jensenkv.run -m experiment=teacher_forced`"]) + "\n"
    return "\n".join(lines + [table.to_markdown(index=False, disable_numparse=True), ""])


# --- calibration cost -----------------------------------------------------------------------------------
def calibration_cost_lines(opts: Options, metric: str = "psnr") -> list[str]:
    """Per calibrated variant: its paired effect on ``metric`` against no correction and against its correction
    at strength 1 (the variant named by the correction alone)."""
    if "calibration" not in opts.runs.columns:
        return []
    out = []
    for row in opts.rows:
        for variant in opts.variants(row):
            members = opts.members(row, variant)
            if not members["calibration"].notna().any():
                continue
            correction = str(members["correction"].iloc[0])
            parts = []
            for base in ("none", correction):
                if base in opts.variants(row):
                    d = opts.paired(row, variant, metric, base=base)
                    if d.n:
                        p = f", p={d.p_value:.2g}" if math.isfinite(d.p_value) else ""
                        parts.append(f"{d.delta:+.2f} [{d.low:+.2f}, {d.high:+.2f}]{p} against {base}")
            if parts:
                out.append(f"- {row}, {variant}: calibrated strengths change {metric.upper()} by " + "; ".join(parts))
    return out


def checks_section(opts: Options, results_dir: str | Path, correction: str, bits: int) -> str:
    """The three checks as one markdown block (what ``report.claims`` appends per model)."""
    cost = calibration_cost_lines(opts)
    lines = [noise_floor_section(results_dir), "### Effects against the noise floor", "",
             *effect_lines(opts, results_dir, correction, bits), "", teacher_forced_section(results_dir),
             "## What the calibrated strengths cost", "",
             ("Strengths fitted per (layer, head) on calibration prompts and seeds disjoint from these "
              "(`python -m jensenkv.calibration`), paired per video:"), "",
             *(cost or ["- no calibrated run in the store"]), ""]
    return "\n".join(lines)
