"""Table 1: fidelity, VBench, content and the attention-mass shift of each quantizer, "no correction -> X" for
every correction (treatment) X that was run, with 95% intervals and paired tests, from the results store.

    python -m jensenkv.report.table1 [--results $JENSENKV_RESULTS or results] [--out <results>] [--group-size 32]
                                     [--correction taylor] [--allow-incomplete]

Writes ``table1.csv`` (one row per cell = table row x treatment, long form: model, quantizer, label, bits,
group_size, rotation, rotation_seeds, zero_point, dither, smoothing, qvg_centroids, correction, strength,
treatment, effective_bits, psnr, ssim, lpips, vbench, content, delta_p_s, ..., ``<metric>_missing_reason`` for
every metric that could not be computed, ``num_videos``, ``num_clusters`` (prompts: the independent units),
``<metric>_ci95_low`` / ``_high`` (Student-t over prompts), and on treated cells ``delta_<metric>`` /
``p_<metric>`` (exact sign flip over prompts, raw) / ``delta_<metric>_mde`` (the smallest effect detected at
80% power)), ``table1.md`` and ``table1.tex`` (rows model x quantizer x treatment, cells "none -> X"),
``table1_videos.csv`` (one row per run, prompt, seed and replicate with every per-video metric: what every cell
is computed from), ``table1_layers.csv`` (per cell and layer: the probes' means, error-model
diagnostics em_* included; jensenkv.report.layers) and the figures under ``<out>/figures/``.

Rows and treatments come from the runs' identities (``jensenkv.report.rows``): every quantizer setting is a row
(its label spells out zero point, dither, smoothing, rotation, QVG centroids), every correction / strength a
"none -> X" line. Runs of one quantizer that differ only in seed fields (rotation seeds, dither seeds) are
replicates, pooled into one row; their videos are paired with the uncorrected ones by (prompt, seed, replicate),
as in the claims report. Runs are chosen by content, not by experiment name: BF16 plus every quantized run with
a full cache (no sinks / window) and values quantized like keys (RTN-family rows: group size ``--group-size``;
QVG keeps its own residual block), all from one context (same model and sampler settings, weights, prompts,
seeds and probes: ``jensenkv.report.selection``). Runs of other contexts are left out and listed. The command
prints which runs each row compares, and writes to ``--out`` only a complete table (every TABLE1_ROWS row with
its "none" and ``--correction`` cells, and every treated cell with its baseline); otherwise it writes to
``<out>/partial/`` and exits 1, leaving the committed tables as they are (``jensenkv.report.publish``: every
file is built first, then all are written or none).
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jensenkv.eval.attention import denoising_rows
from jensenkv.report.intervals import add_intervals
from jensenkv.report.layers import cell_probes, layer_means
from jensenkv.report.rows import (BASELINE, QUANTIZER_ORDER, REASON_SOURCE, RUN_SEPARATOR, VIDEO_METRICS,
                                  attach_details, bits_label, by_replicate, full_cache, present, quantizer_label,
                                  run_ids_of, video_metrics)
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.exit_codes import EPILOG, guarded, stop
from jensenkv.machine import PLATFORM_FILE, platform_text
from jensenkv.exit_codes import PARTIAL as PARTIAL_EXIT
from jensenkv.report.publish import PARTIAL, Part, add_store_args, publish, recover_store, report_error, text_file
from jensenkv.report.store_frame import load_results
from jensenkv.store.files import portable

CSV_COLUMNS = ("model", "quantizer", "label", "bits", "group_size", "rotation", "rotation_seeds", "zero_point",
               "dither", "smoothing", "qvg_centroids", "correction", "strength", "treatment", "effective_bits",
               "psnr", "ssim", "lpips", "vbench", "content", "delta_p_s", "delta_p_s_abs", "delta_p_s_median", "jsd",
               "num_prompts", "num_runs", "vbench_dimensions_used", "run_id")
# Run-level numbers a pooled cell averages over its runs (weighted by videos); renamed to their CSV names.
POOLED = {"effective_bits": "effective_bits", "psnr": "psnr", "ssim": "ssim", "lpips": "lpips", "vbench": "vbench",
          "content": "content", "delta_p_s_mean": "delta_p_s", "delta_p_s_abs_mean": "delta_p_s_abs",
          "delta_p_s_median": "delta_p_s_median",
          "jsd_mean": "jsd"}
GRID_TAG_ORDER = {"min_aligned": 1, "fixed_point": 2, "dither": 3, "channel_mean": 4}  # QuantConfig.label's tags
DIGITS = {"psnr": 2, "ssim": 3, "lpips": 3, "vbench": 2, "content": 2, "delta_p_s": 4}
LATEX_ARROWS = {"psnr": r"$\uparrow$", "ssim": r"$\uparrow$", "lpips": r"$\downarrow$", "vbench": r"$\uparrow$",
                "content": r"$\uparrow$", "delta_p_s": r"$\to 0$"}  # which way is better
HEADERS = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "content": "Content",
           "delta_p_s": "dP_S"}
NO_REFERENCE = ("vbench", "content")  # scored on the video alone: BF16 rows show their own value
ROW = ("model", "row_id")  # one table row: a quantizer setting of one model (replicates pooled)
CELL = (*ROW, "treatment")
# The rows the committed Table 1 must have (experiment=table1), as (quantizer label, bits); each needs its
# "none" and --correction cells. Rows beyond these (other options, other corrections) are shown when run.
TABLE1_ROWS = (("bf16", 16), ("rtn", 2), ("rtn+min_aligned", 2), ("rtn+dither", 2), ("rtn+channel_mean", 2),
               ("rtn", 4), ("quarot+rtn", 2), ("qvg", 2))
PAIRED_HEADER = "dPSNR [95% CI], p"


def select_runs(runs: pd.DataFrame, group_size: int = 32, corrections: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The runs Table 1 shows: one per (model, row, replicate, treatment)."""
    return choose_runs(runs, group_size, corrections).runs


def choose_runs(runs: pd.DataFrame, group_size: int = 32, corrections: tuple[str, ...] | None = None,
                results_dir: str | Path | None = None) -> Selection:
    """Table 1's runs, all of one context per model, the latest per (row, replicate, treatment); and what was
    left out. ``corrections``: keep only these (None: every correction run)."""
    runs = attach_details(runs, results_dir)
    candidates = table1_candidates(runs, group_size, corrections)
    selection = comparable(candidates, results_dir=results_dir)
    if not selection.runs.empty:
        selection.runs = latest(selection.runs, ("model", "row_id", "replicate", "treatment"))
    return selection


def table1_candidates(runs: pd.DataFrame, group_size: int, corrections: tuple[str, ...] | None) -> pd.DataFrame:
    """BF16 runs and quantized runs of the table's kind (full cache, values like keys, RTN-family group size)."""
    if runs.empty:
        return runs
    runs = runs.copy()
    for col in ("sink_chunks", "window_chunks", "values", "granularity", "group_size", "method"):
        if col not in runs.columns:
            runs[col] = None
    bf16 = runs["quantizer"] == "bf16"
    own_block = runs["method"] == "qvg"  # QVG's residual block is its preset's (published: 64)
    quantized = (~bf16) & (runs["values"] == "same") & (own_block | (runs["group_size"] == group_size))
    if corrections is not None:
        quantized &= runs["correction"].isin(corrections)
    return runs[full_cache(runs) & (bf16 | quantized)]


def _order(row: pd.Series) -> tuple:
    """BF16, then per family (QUANTIZER_ORDER) by bits, the plain grid before its options (GRID_TAG_ORDER)."""
    quantizer = str(row["quantizer"])
    rotated = quantizer.startswith("quarot+")
    base, *tags = quantizer.removeprefix("quarot+").split("+")
    family = QUANTIZER_ORDER.get(("quarot+" if rotated else "") + base, 99)
    return (family, row["bits"] if pd.notna(row["bits"]) else 0, tuple(GRID_TAG_ORDER.get(t, 99) for t in tags),
            str(row["label"]))


def _pooled_median(results_dir: Path | None, run_ids: list[str]) -> float:
    """delta_p_s median over every denoising probe of the pooled runs (NaN when a run has no probes)."""
    if results_dir is None:
        return math.nan
    try:
        return float(denoising_rows(cell_probes(results_dir, run_ids))["delta_p_s"].median())
    except FileNotFoundError:
        return math.nan


def pool_cells(runs: pd.DataFrame, results_dir: Path | None = None) -> pd.DataFrame:
    """One row per cell (model, row, treatment): its runs (one per replicate, ``rows.by_replicate``) pooled.
    Numbers are the runs' values averaged with weights = videos per run (= the mean over all the cell's videos);
    a number missing from any run is missing for the cell, with that run's reason."""
    cells = []
    for _, group in runs.groupby(list(CELL), dropna=False, sort=False):
        group = by_replicate(group)
        first = group.iloc[0].to_dict()
        cell = {k: v for k, v in first.items() if not k.endswith("_missing_reason")}
        weights = group["num_prompts"].astype(float).fillna(1.0).to_numpy()
        for source, name in POOLED.items():
            values = group[source].astype(float) if source in group.columns else pd.Series([math.nan] * len(group))
            cell[name] = float((values.to_numpy() * weights).sum() / weights.sum()) if values.notna().all() \
                else math.nan
        if len(group) > 1 and pd.notna(cell["delta_p_s_median"]):
            cell["delta_p_s_median"] = _pooled_median(results_dir, list(group["run_id"]))
        for col in [c for c in group.columns if c.endswith("_missing_reason")]:
            reasons = group[col].dropna()
            cell[col] = reasons.iloc[0] if len(reasons) else None
        seeds = list(dict.fromkeys(int(s) for s in group["rotation_seed"].dropna()))  # distinct, in order
        cell["rotation_seeds"] = ",".join(str(s) for s in seeds) if seeds else None
        cell["num_runs"] = len(group)
        cell["num_prompts"] = int(group["num_prompts"].fillna(0).sum())
        cell["run_id"] = RUN_SEPARATOR.join(group["run_id"])
        cell["label"] = quantizer_label(cell, len(seeds))
        cells.append(cell)
    return pd.DataFrame(cells)


def long_table(runs: pd.DataFrame, results_dir: Path | None = None) -> pd.DataFrame:
    """The CSV form, one row per cell: required columns first, then each metric's missing reason (empty when
    present)."""
    runs = attach_details(runs)
    if "num_prompts" not in runs.columns:
        runs["num_prompts"] = None
    table = pool_cells(runs, results_dir) if not runs.empty else pd.DataFrame(columns=list(CSV_COLUMNS))
    for col in CSV_COLUMNS:
        if col not in table.columns:
            table[col] = None
    for metric in VIDEO_METRICS:
        reason_col = f"{metric}_missing_reason"
        given = f"{REASON_SOURCE.get(metric, metric)}_missing_reason"
        table[reason_col] = table[given] if given in table.columns else None
        no_value = table[metric].isna()
        table.loc[no_value & table[reason_col].isna(), reason_col] = f"{metric} was not computed for this run"
        table.loc[~no_value, reason_col] = None
        table[reason_col] = table[reason_col].map(lambda r: portable(r) if isinstance(r, str) else r)
    if not table.empty:
        keys = [(str(row["model"]), *_order(row), row["treatment"] != BASELINE, str(row["treatment"]))
                for _, row in table.iterrows()]
        table = table.iloc[sorted(range(len(table)), key=keys.__getitem__)]
    for col in ("bits", "group_size", "num_prompts", "num_runs", "qvg_centroids"):  # integers, empty where n/a
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("Int64")
    reasons = [f"{m}_missing_reason" for m in VIDEO_METRICS]
    extra = [c for c in ("row_id", "probe_steps") if c in table.columns]
    return table[list(CSV_COLUMNS) + reasons + extra].reset_index(drop=True)


def fmt_signed(value: float, digits: int, signed: bool = True) -> str:
    """``value`` to ``digits`` decimals ("+" shown when ``signed``), or to 2 significant digits when those
    decimals would print a nonzero value as 0: the sign of a bound stays visible ("+0.00034", not "+0.00")."""
    sign = "+" if signed else ""
    text = f"{value:{sign}.{digits}f}"
    if value != 0 and math.isfinite(value) and float(text) == 0:
        text = f"{value:{sign}.2g}"
    return text


def _fmt(value: object, metric: str) -> str:
    return fmt_signed(float(value), DIGITS[metric], False) if present(value) else "n/a"


def paper_table(table: pd.DataFrame) -> pd.DataFrame:
    """Rows model x quantizer x treatment, cells "none -> X" (BF16: "-" for the reference-based columns; a row
    with no treated cell: one line "none")."""
    if "treatment" not in table.columns:  # label columns only (a caller's own frame)
        table = attach_details(table)
    if "label" not in table.columns:
        table = table.assign(label=[quantizer_label(r) for _, r in table.iterrows()])
    rows = []
    for _, group in table.groupby(list(ROW) if "row_id" in table.columns else ["model"], dropna=False, sort=False):
        by_treatment = {r["treatment"]: r for _, r in group.iterrows()}
        base = by_treatment.get(BASELINE)
        first = group.iloc[0]
        treated = [t for t in by_treatment if t != BASELINE] or [None]
        for treatment in treated:
            fixed = by_treatment.get(treatment) if treatment is not None else None
            row = {"model": first["model"], "quantizer": first["label"], "bits": bits_label(first),
                   "correction": "-" if first["quantizer"] == "bf16" else
                   (f"none -> {treatment}" if treatment is not None else "none")}
            for metric, header in HEADERS.items():
                if first["quantizer"] == "bf16":
                    row[header] = _fmt(base.get(metric), metric) if metric in NO_REFERENCE and base is not None \
                        else "-"
                    continue
                a = _fmt(base.get(metric), metric) if base is not None else "n/a"
                b = _fmt(fixed.get(metric), metric) if fixed is not None else "n/a"
                row[header] = f"{a} -> {b}" if treatment is not None else a
            row[PAIRED_HEADER] = _paired(fixed) if first["quantizer"] != "bf16" else "-"
            rows.append(row)
    return pd.DataFrame(rows, columns=["model", "quantizer", "bits", "correction", *HEADERS.values(), PAIRED_HEADER])


def _paired(fixed: pd.Series | None) -> str:
    """The treated cell's paired PSNR difference to its baseline, with interval and p-value."""
    if fixed is None or pd.isna(fixed.get("delta_psnr", math.nan)):
        return "n/a"
    low, high = fixed.get("delta_psnr_ci95_low"), fixed.get("delta_psnr_ci95_high")
    d = DIGITS["psnr"]
    interval = f" [{fmt_signed(low, d)}, {fmt_signed(high, d)}]" if pd.notna(low) and pd.notna(high) else ""
    return (f"{fmt_signed(fixed['delta_psnr'], d)}{interval}, p={fixed['p_psnr']:.2g} "
            f"(n={int(fixed['num_clusters'])} prompts / {int(fixed['num_videos'])} videos)")


def missing_notes(table: pd.DataFrame) -> list[str]:
    """One line per distinct reason a metric is missing, and how the cells were measured (the footnotes)."""
    notes = []
    for metric in HEADERS:
        col = f"{metric}_missing_reason"
        reasons = table.loc[table["quantizer"] != "bf16", col].dropna().unique() if metric not in NO_REFERENCE \
            else table[col].dropna().unique()
        notes += [f"{metric}: {portable(r)}" for r in reasons]
    dims = table["vbench_dimensions_used"].dropna().unique()
    if len(dims):
        notes.append("VBench = mean x100 over the dimensions that ran: " + " | ".join(d or "none" for d in dims))
    return notes


def measurement_notes(table: pd.DataFrame) -> list[str]:
    """What each cell averages over: videos, pooled replicates (rotation seeds), the probed denoising steps."""
    notes = []
    if "num_videos" in table.columns and len(table):
        counts = sorted({(int(c), int(n)) for c, n in zip(table["num_clusters"], table["num_videos"])})
        notes.append("each cell: mean over its videos (prompts x seeds, x replicates where pooled: "
                     + ", ".join(f"{c} prompts / {n} videos" for c, n in counts) + "); its 95% interval in "
                     "table1.csv and every test are over prompts, the independent units (replicates averaged within "
                     "(prompt, seed), seeds within the prompt: Student-t interval, exact sign-flip p); "
                     + PAIRED_HEADER + ": treated - none, paired video by video (prompt, seed, replicate), then "
                     "averaged per prompt; raw p (the claims report adjusts for multiplicity); per-video values in "
                     "table1_videos.csv")
    pooled = table[table["num_runs"].fillna(1) > 1] if "num_runs" in table.columns else table.iloc[0:0]
    for label, seeds in dict(zip(pooled["label"], pooled["rotation_seeds"])).items():
        what = f"rotation seeds {seeds}" if isinstance(seeds, str) else "runs differing only in seed fields"
        notes.append(f"{label}: {what} pooled into one row")
    steps = table["probe_steps"].dropna().unique() if "probe_steps" in table.columns else []
    for probed in steps:
        where, _, diagnosed = str(probed).partition("; diagnostics ")
        where = "every denoising step" if where == "all" else f"denoising steps {where} only"
        notes.append(f"dP_S (attention mass on the cache: P_S with the quantized cache - P_S of the same call with "
                     f"the run's own cache in full precision): mean over probes on {where} (every layer, chunk, "
                     f"branch and video)" + (f"; the error-model diagnostics on steps {diagnosed}" if diagnosed else ""))
    return notes


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
TITLE = "Table 1: each correction X against no correction (none -> X)"


def _latex_escape(text: str) -> str:
    """Escape LaTeX specials in one pass, then typeset the "->" arrows."""
    escaped = re.sub(r"[\\&%_#${}~^]", lambda m: LATEX_SPECIALS[m.group()], text)
    return escaped.replace("->", r"$\rightarrow$")


def to_latex(paper: pd.DataFrame, notes: list[str]) -> str:
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{llll" + "c" * (len(HEADERS) + 1) + "}", r"\toprule",
             " & ".join(["Model", "Quantizer", "Bits", "Correction"]
                        + [f"{_latex_escape(HEADERS[m])} {LATEX_ARROWS[m]}" for m in HEADERS]
                        + [_latex_escape(PAIRED_HEADER)])
             + r" \\",
             r"\midrule"]
    for _, row in paper.iterrows():
        lines.append(" & ".join(_latex_escape(str(row[c])) for c in paper.columns) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}",
              r"\caption{Fidelity to the BF16 video, VBench, prompt-content recovery and attention-mass shift, "
              r"no correction $\rightarrow$ each correction."
              + "".join(" " + _latex_escape(n) + "." for n in notes) + "}",
              r"\label{tab:table1}", r"\end{table}", ""]
    return "\n".join(lines)


def to_markdown(paper: pd.DataFrame, notes: list[str]) -> str:
    text = f"# {TITLE}\n\n" + paper.to_markdown(index=False) + "\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


@dataclass
class Table1:
    """Table 1 built from a results store: the long table, the paper layout, notes and provenance."""

    table: pd.DataFrame
    paper: pd.DataFrame
    notes: list[str]
    selection: Selection
    correction: str
    missing_rows: list[str] = field(default_factory=list)
    videos: pd.DataFrame = field(default_factory=pd.DataFrame)  # per_video_table: what every cell is computed from

    @property
    def complete(self) -> bool:
        return not self.missing_rows

    def describe(self) -> str:
        """What each row compares and from which runs; what was left out; what is missing."""
        lines = [f"Table 1 compares runs over {self.selection.context_desc}:"]
        for _, rows in (self.table.groupby(list(ROW), dropna=False, sort=False) if len(self.table) else ()):
            first = rows.iloc[0]
            name = f"{first['model']} {first['label']}"
            by_treatment = dict(zip(rows["treatment"], rows["run_id"]))
            if first["quantizer"] == "bf16":
                lines.append(f"  {name}: run {by_treatment.get(BASELINE)}")
                continue
            base = f"none (run {by_treatment.get(BASELINE, 'missing')})"
            treated = [f"{t} (run {r})" for t, r in by_treatment.items() if t != BASELINE] or ["nothing"]
            lines.append(f"  {name} {bits_label(first)}: {base} -> " + "; ".join(treated))
        if self.selection.left_out:
            lines.append(f"left out ({self.selection.num_left_out} runs of another context, never mixed in; what "
                         "differs from the runs above):")
            lines += [f"  {line}" for line in self.selection.left_out]
        if self.missing_rows:
            lines.append("incomplete, missing: " + "; ".join(self.missing_rows))
        return "\n".join(lines)


def table1_gaps(table: pd.DataFrame, correction: str, runs: pd.DataFrame | None = None) -> list[str]:
    """What keeps the table from being complete: TABLE1_ROWS rows (per model) without a run or without their
    "none" / ``correction`` cell; treated runs (per replicate) without their uncorrected twin in ``runs``."""
    if table.empty:
        return ["every row (no runs)"]
    gaps = []
    for model in sorted(table["model"].dropna().unique()):
        part = table[table["model"] == model]
        for quantizer, bits in TABLE1_ROWS:
            rows = part[(part["quantizer"] == quantizer) & (part["bits"] == bits)]
            label = f"{model} {quantizer}" + ("" if quantizer == "bf16" else f" INT{bits}")
            wanted = (BASELINE,) if quantizer == "bf16" else (BASELINE, correction)
            lacking = [c for c in wanted if c not in set(rows["treatment"])]
            if len(lacking) == len(wanted):
                gaps.append(f"{label} (no run)")
            elif lacking:
                gaps.append(f"{label} ({', '.join(lacking)} run)")
    if runs is not None and not runs.empty:
        twin = ["model", "row_id", "replicate"]
        baselines = set(map(tuple, runs.loc[runs["treatment"] == BASELINE, twin].itertuples(index=False)))
        for _, run in runs[(runs["treatment"] != BASELINE) & (runs["quantizer"] != "bf16")].iterrows():
            if tuple(run[twin]) not in baselines:
                seed = f" rotation seed {int(run['rotation_seed'])}" if pd.notna(run["rotation_seed"]) else ""
                gaps.append(f"{run['model']} {run['quantizer']} INT{run['bits']}{seed}: no uncorrected twin of "
                            f"{run['treatment']} run {run['run_id']}")
    return gaps


def missing_rows(results_dir: str | Path, group_size: int = 32, correction: str = "taylor",
                 model: str | None = None) -> list[str]:
    """What keeps the store's Table 1 (of ``model``; None: every model) from being complete (``table1_gaps``),
    without building the table."""
    runs = load_results(results_dir)
    if model is not None and not runs.empty:
        runs = runs[runs["model"] == model]
    if runs.empty:
        return ["every row (no runs)"]
    selection = choose_runs(runs, group_size, None, results_dir)
    return table1_gaps(long_table(selection.runs, Path(results_dir)), correction, selection.runs)


def build_table1(results_dir: str | Path = "results", group_size: int = 32, correction: str = "taylor") -> Table1:
    results_dir = Path(results_dir)
    runs = load_results(results_dir)
    if runs.empty:
        raise FileNotFoundError(f"no finished runs under {results_dir / 'runs'}: run "
                                "`python -m jensenkv.run -m experiment=table1` first")
    selection = choose_runs(runs, group_size, None, results_dir)
    table = long_table(selection.runs, results_dir)
    videos = video_metrics(results_dir, table["run_id"])
    table = add_intervals(table, videos, ROW, BASELINE)
    notes = measurement_notes(table) + missing_notes(table)
    return Table1(table, paper_table(table), notes, selection, correction,
                  table1_gaps(table, correction, selection.runs), per_video_table(table, videos, selection.runs))


VIDEO_COLUMNS = ("model", "label", "bits", "treatment", "run_id", "prompt", "seed", "replicate", "rotation_seed",
                 *VIDEO_METRICS)


def per_video_table(table: pd.DataFrame, videos: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """table1_videos.csv: one row per (run, prompt, seed, replicate) of every cell of ``table`` with every
    per-video metric, in the table's order: anyone can recompute a cell (its mean, its prompt means, its
    paired difference) from it. ``replicate`` is the digest of the run's seed fields (rotation, dither, ...)."""
    per_run = pd.DataFrame([{"run_id": run_id, "cell": cell, "model": row["model"], "label": row["label"],
                             "bits": bits_label(row), "treatment": row["treatment"]}
                            for cell, (_, row) in enumerate(table.iterrows()) for run_id in run_ids_of(row["run_id"])])
    if videos.empty or per_run.empty:
        return pd.DataFrame(columns=list(VIDEO_COLUMNS))
    seeds = runs.drop_duplicates("run_id").set_index("run_id")["rotation_seed"] if "rotation_seed" in runs else {}
    out = videos.merge(per_run, on="run_id", how="inner")
    out["rotation_seed"] = pd.to_numeric(out["run_id"].map(seeds), errors="coerce").astype("Int64")
    for col in VIDEO_COLUMNS:
        if col not in out.columns:
            out[col] = math.nan
    out = out.sort_values(["cell", "prompt", "seed", "rotation_seed", "replicate"], kind="stable")
    return out[list(VIDEO_COLUMNS)].reset_index(drop=True)


def table1_part(t1: Table1, results_dir: str | Path) -> Part:
    """table1.{csv,md,tex}, table1_videos.csv, table1_layers.csv and platform.json (this machine: the runs of
    ``make reproduce-table1`` and its reports run on one), built in memory (``report.publish``)."""
    table, paper, notes = t1.table.drop(columns=["row_id", "probe_steps"], errors="ignore"), t1.paper, t1.notes
    layers = layer_means(t1.table, results_dir)  # per-layer probe means (em_* diagnostics) of every cell
    files = {"table1.csv": table.to_csv(index=False), "table1.md": to_markdown(paper, notes),
             "table1.tex": to_latex(paper, notes), "table1_videos.csv": t1.videos.to_csv(index=False),
             "table1_layers.csv": layers.to_csv(index=False),
             PLATFORM_FILE: platform_text()}  # where these numbers were made (report.compare shows it)
    return Part("table1", {name: text_file(text) for name, text in files.items()}, list(t1.missing_rows))


ARTIFACTS = {"table1.csv": "csv", "table1.md": "md", "table1.tex": "tex", "table1_videos.csv": "videos",
             "table1_layers.csv": "layers", PLATFORM_FILE: "platform"}


def write_table1(results_dir: str | Path = "results", out_dir: str | Path | None = None, group_size: int = 32,
                 correction: str = "taylor", figures: bool = True, allow_incomplete: bool = False,
                 built: Table1 | None = None) -> dict[str, str]:
    """Write table1.{csv,md,tex}, table1_videos.csv, table1_layers.csv (and figures); returns {artifact: path or
    reason skipped}, plus "partial" with the why line(s) when something went to ``<out>/partial/``.

    Everything is built first, then written at once (``report.publish``): an incomplete table goes to
    ``<out>/partial/`` unless ``allow_incomplete``, and so do figures of a store that lacks what they show; the
    committed files in ``out`` are only ever replaced by complete ones.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    t1 = built or build_table1(results_dir, group_size, correction)
    parts, notes = [table1_part(t1, results_dir)], {}
    shown = None
    if figures:
        from jensenkv.report.figures import build_figures

        models = sorted(t1.table["model"].dropna().unique())
        if len(models) == 1:
            shown = build_figures(results_dir, models[0], group_size=group_size)
            parts.append(shown.part())
            notes.update(shown.notes)
        else:
            notes["figures"] = (f"skipped: the table has {len(models)} models; draw one with `python -m "
                                "jensenkv.report.figures --model M`")
    try:
        published = publish(out, parts, allow_incomplete)
    finally:
        if shown is not None:
            shown.close()
    written = {ARTIFACTS.get(rel, Path(rel).stem): str(path) for rel, path in published.paths.items()
               if not rel.endswith(".why.txt")}
    written.update(notes)
    if published.incomplete:
        written["partial"] = " | ".join(published.incomplete.values())
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG)
    add_store_args(parser, "where table1.* and figures/ go")
    parser.add_argument("--group-size", type=int, default=32, help="group size of the RTN-family rows")
    parser.add_argument("--correction", default="taylor",
                        help="the correction every required row must have (others run are shown too)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help=f"write an incomplete table to --out too (default: to <out>/{PARTIAL}/)")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    recover_store(args)
    try:
        t1 = build_table1(args.results, args.group_size, args.correction)
        print(t1.describe())
        written = write_table1(args.results, args.out, args.group_size, args.correction, not args.no_figures,
                               args.allow_incomplete, built=t1)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    for name, where in written.items():
        if name != "partial":
            print(f"{name}: {where}")
    out = Path(args.out or args.results)
    if not t1.complete and not args.allow_incomplete:
        stop(f"Table 1 is incomplete (missing: {'; '.join(t1.missing_rows)}): written under {out / PARTIAL}, "
             f"the tables in {out} are unchanged; run `make reproduce-table1` (or pass --allow-incomplete)", PARTIAL_EXIT)
    if "partial" in written:
        stop(f"{written['partial']}: written to {out} (--allow-incomplete)", PARTIAL_EXIT)


if __name__ == "__main__":
    main()
