"""Table 1: fidelity and VBench of each quantizer, "no correction -> correction", from the results store.

    python -m jensenkv.report.table1 [--results results] [--out results] [--group-size 32] [--correction taylor]
                                     [--allow-incomplete]

Writes ``table1.csv`` (one row per run, long form: model, quantizer, bits, group_size, rotation, correction,
effective_bits, psnr, ssim, lpips, vbench, delta_p_s, ... and ``<metric>_missing_reason`` for every metric
that could not be computed), ``table1.md`` and ``table1.tex`` (the paper's layout: rows model x quantizer,
columns PSNR / SSIM / LPIPS / VBench as "none -> corrected"), and the figures under ``<out>/figures/``.
Runs are chosen by content, not by experiment name: BF16 rows plus every quantized run with the chosen
group size, full cache (no sinks / window) and values quantized like keys, all from one context (same
model and sampler settings, weights, prompts and seeds: ``jensenkv.report.selection``); the two runs of a
cell differ only in the correction. Runs of other contexts are left out and listed. The command prints
which runs each row compares, and writes to ``--out`` only a complete table (every Table 1 row with both
cells); otherwise it writes to ``<out>/partial/`` and exits 1, leaving the committed tables as they are.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pandas as pd

from dataclasses import dataclass, field

from jensenkv.report.intervals import add_intervals, video_metrics
from jensenkv.report.selection import Selection, comparable, pairs
from jensenkv.tracking import atomic_write, load_results, portable

METRICS = ("psnr", "ssim", "lpips", "vbench", "content", "delta_p_s")
CSV_COLUMNS = ("model", "quantizer", "bits", "group_size", "rotation", "correction", "strength", "effective_bits",
               "psnr", "ssim", "lpips", "vbench", "content", "delta_p_s", "delta_p_s_median", "jsd", "num_prompts",
               "vbench_dimensions_used", "run_id")
QUANTIZER_ORDER = {"bf16": 0, "rtn": 1, "kivi": 2, "quarot+rtn": 3, "quarot+kivi": 4, "qvg": 5, "quarot+qvg": 6}
QUANTIZER_NAMES = {"bf16": "BF16", "rtn": "RTN", "kivi": "KIVI", "quarot+rtn": "QuaRot+RTN",
                   "quarot+kivi": "QuaRot+KIVI", "qvg": "QVG", "quarot+qvg": "QuaRot+QVG"}
DIGITS = {"psnr": 2, "ssim": 3, "lpips": 3, "vbench": 2, "content": 2}
LATEX_ARROWS = {"psnr": r"$\uparrow$", "ssim": r"$\uparrow$", "lpips": r"$\downarrow$", "vbench": r"$\uparrow$",
                "content": r"$\uparrow$"}  # which way is better
HEADERS = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "content": "Content"}
NO_REFERENCE = ("vbench", "content")  # scored on the video alone: BF16 rows show their own value
REASON_SOURCE = {"delta_p_s": "attention"}  # the runner records why the attention metrics are missing
SETTING = ("model", "quantizer", "bits", "group_size", "rotation", "correction")
ROW = ("model", "quantizer", "bits", "group_size", "rotation")
# The rows of the committed Table 1 (experiment=table1 and experiment=tradeoff): (quantizer, bits).
TABLE1_ROWS = (("bf16", 16), ("rtn", 2), ("rtn", 4), ("quarot+rtn", 2), ("qvg", 2))


def select_runs(runs: pd.DataFrame, group_size: int = 32, corrections: tuple[str, ...] = ("none", "taylor")) -> pd.DataFrame:
    """The runs Table 1 shows: one per (model, quantizer, bits, group size, rotation, correction)."""
    return choose_runs(runs, group_size, corrections).runs


def choose_runs(runs: pd.DataFrame, group_size: int = 32,
                corrections: tuple[str, ...] = ("none", "taylor")) -> Selection:
    """Table 1's runs, all of one context, with both runs of a cell from one setting; and what was left out."""
    candidates = table1_candidates(runs, group_size, corrections)
    selection = comparable(candidates)
    selection.runs = pairs(selection.runs, ROW, tuple(corrections))
    return selection


def table1_candidates(runs: pd.DataFrame, group_size: int, corrections: tuple[str, ...]) -> pd.DataFrame:
    """BF16 runs and quantized runs of the table's kind (group size, full cache, values like keys)."""
    if runs.empty:
        return runs
    runs = runs.copy()
    for col in ("sink_chunks", "window_chunks", "values", "granularity", "group_size", "strength"):
        if col not in runs.columns:
            runs[col] = None
    full_cache = (runs["sink_chunks"].fillna(0) == 0) & runs["window_chunks"].isna()
    bf16 = runs["quantizer"] == "bf16"
    quantized = (~bf16) & (runs["values"] == "same") & (runs["correction"].isin(corrections)) & \
        (runs["strength"].fillna(1.0) == 1.0) & (runs["group_size"] == group_size)
    return runs[full_cache & (bf16 | quantized)]


def long_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The CSV form: required columns first, then each metric's missing reason (empty when present)."""
    table = runs.copy()
    rename = {"delta_p_s_mean": "delta_p_s", "jsd_mean": "jsd"}
    table = table.rename(columns=rename)
    for col in CSV_COLUMNS:
        if col not in table.columns:
            table[col] = None
    for metric in METRICS:
        reason_col = f"{metric}_missing_reason"
        given = f"{REASON_SOURCE.get(metric, metric)}_missing_reason"
        table[reason_col] = runs[given] if given in runs.columns else None
        no_value = table[metric].isna()
        table.loc[no_value & table[reason_col].isna(), reason_col] = f"{metric} was not computed for this run"
        table.loc[~no_value, reason_col] = None
        table[reason_col] = table[reason_col].map(lambda r: portable(r) if isinstance(r, str) else r)
    table["_order"] = table["quantizer"].map(QUANTIZER_ORDER).fillna(99)
    table = table.sort_values(["model", "_order", "bits", "rotation", "correction"]).drop(columns="_order")
    for col in ("bits", "group_size", "num_prompts"):  # integers, empty where not applicable (bf16 group size)
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("Int64")
    reasons = [f"{m}_missing_reason" for m in METRICS]
    return table[list(CSV_COLUMNS) + reasons].reset_index(drop=True)


def _fmt(value: object, metric: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.{DIGITS[metric]}f}"


def paper_table(table: pd.DataFrame, correction: str = "taylor") -> pd.DataFrame:
    """Rows model x quantizer (x bits), cells "no correction -> correction" (BF16: "-" for the fidelity columns)."""
    rows = []
    keys = ["model", "quantizer", "bits", "group_size", "rotation"]
    for (model, quantizer, bits, group, _), group_rows in table.groupby(keys, dropna=False, sort=False):
        by_corr = {r["correction"]: r for _, r in group_rows.iterrows()}
        row = {"model": model, "quantizer": QUANTIZER_NAMES.get(quantizer, quantizer),
               "bits": "BF16" if quantizer == "bf16" else f"INT{int(bits)} g{int(group)}"}
        base = by_corr.get("none")
        fixed = by_corr.get(correction)
        for metric, header in HEADERS.items():
            if quantizer == "bf16":
                row[header] = _fmt(base.get(metric), metric) if metric in NO_REFERENCE and base is not None else "-"
                continue
            a = _fmt(base.get(metric), metric) if base is not None else "n/a"
            b = _fmt(fixed.get(metric), metric) if fixed is not None else "n/a"
            row[header] = f"{a} -> {b}"
        row[PAIRED_HEADER] = _paired(fixed) if quantizer != "bf16" else "-"
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", "quantizer", "bits", *HEADERS.values(), PAIRED_HEADER])


PAIRED_HEADER = "dPSNR [95% CI], p"


def _paired(fixed: pd.Series | None) -> str:
    """The corrected run's paired PSNR difference to its uncorrected twin, with interval and p-value."""
    if fixed is None or pd.isna(fixed.get("delta_psnr", math.nan)):
        return "n/a"
    low, high = fixed.get("delta_psnr_ci95_low"), fixed.get("delta_psnr_ci95_high")
    interval = f" [{low:+.2f}, {high:+.2f}]" if pd.notna(low) and pd.notna(high) else ""
    return f"{fixed['delta_psnr']:+.2f}{interval}, p={fixed['p_psnr']:.2g} (n={int(fixed['num_videos'])})"


def missing_notes(table: pd.DataFrame) -> list[str]:
    """One line per distinct reason a metric is missing (the tables' footnotes)."""
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


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    """Escape LaTeX specials in one pass, then typeset the "->" arrows."""
    escaped = re.sub(r"[\\&%_#${}~^]", lambda m: LATEX_SPECIALS[m.group()], text)
    return escaped.replace("->", r"$\rightarrow$")


def to_latex(paper: pd.DataFrame, notes: list[str], correction: str) -> str:
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{lll" + "c" * (len(HEADERS) + 1) + "}", r"\toprule",
             " & ".join(["Model", "Quantizer", "Bits"] + [f"{HEADERS[m]} {LATEX_ARROWS[m]}" for m in HEADERS]
                        + [_latex_escape(PAIRED_HEADER)])
             + r" \\",
             r"\midrule"]
    for _, row in paper.iterrows():
        lines.append(" & ".join(_latex_escape(str(row[c])) for c in paper.columns) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}",
              r"\caption{Fidelity to the BF16 video, VBench and prompt-content recovery, no correction $\rightarrow$ "
              + _latex_escape(correction) + " correction."
              + "".join(" " + _latex_escape(n) + "." for n in notes) + "}",
              r"\label{tab:table1}", r"\end{table}", ""]
    return "\n".join(lines)


def to_markdown(paper: pd.DataFrame, notes: list[str], correction: str) -> str:
    text = f"# Table 1: no correction -> {correction} correction\n\n" + paper.to_markdown(index=False) + "\n"
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

    @property
    def complete(self) -> bool:
        return not self.missing_rows

    def describe(self) -> str:
        """What each row compares and from which runs; what was left out; what is missing."""
        lines = [f"Table 1 compares runs over {self.selection.context_desc}:"]
        for keys, rows in self.table.groupby(list(ROW), dropna=False, sort=False):
            model, quantizer, bits, group, _ = keys
            by_corr = dict(zip(rows["correction"], rows["run_id"]))
            name = f"{model} {QUANTIZER_NAMES.get(quantizer, quantizer)}"
            if quantizer == "bf16":
                lines.append(f"  {name}: run {by_corr.get('none')}")
                continue
            lines.append(f"  {name} INT{int(bits)} g{int(group)}: none (run {by_corr.get('none', 'missing')}) -> "
                         f"{self.correction} (run {by_corr.get(self.correction, 'missing')})")
        if self.selection.left_out:
            lines.append(f"left out ({len(self.selection.left_out)} runs of another context, never mixed in):")
            lines += [f"  {line}" for line in self.selection.left_out]
        if self.missing_rows:
            lines.append("incomplete, missing: " + "; ".join(self.missing_rows))
        return "\n".join(lines)


def table1_gaps(table: pd.DataFrame, correction: str) -> list[str]:
    """Table 1 rows (TABLE1_ROWS, per model) without a run or without one of their two cells."""
    if table.empty:
        return ["every row (no runs)"]
    gaps = []
    for model in sorted(table["model"].dropna().unique()):
        part = table[table["model"] == model]
        for quantizer, bits in TABLE1_ROWS:
            rows = part[(part["quantizer"] == quantizer) & (part["bits"] == bits)]
            label = f"{model} {QUANTIZER_NAMES.get(quantizer, quantizer)}" + ("" if quantizer == "bf16" else f" INT{bits}")
            wanted = ("none",) if quantizer == "bf16" else ("none", correction)
            lacking = [c for c in wanted if c not in set(rows["correction"])]
            if len(lacking) == len(wanted):
                gaps.append(f"{label} (no run)")
            elif lacking:
                gaps.append(f"{label} ({', '.join(lacking)} run)")
    return gaps


def build_table1(results_dir: str | Path = "results", group_size: int = 32, correction: str = "taylor") -> Table1:
    results_dir = Path(results_dir)
    runs = load_results(results_dir)
    if runs.empty:
        raise FileNotFoundError(f"no finished runs under {results_dir / 'runs'}: run "
                                "`python -m jensenkv.run -m experiment=table1` first")
    selection = choose_runs(runs, group_size, ("none", correction))
    table = long_table(selection.runs)
    table = add_intervals(table, video_metrics(results_dir, table["run_id"]), correction)
    return Table1(table, paper_table(table, correction), missing_notes(table), selection, correction,
                  table1_gaps(table, correction))


def write_table1(results_dir: str | Path = "results", out_dir: str | Path | None = None, group_size: int = 32,
                 correction: str = "taylor", figures: bool = True, allow_incomplete: bool = False,
                 built: Table1 | None = None) -> dict[str, str]:
    """Write table1.{csv,md,tex} (and figures); returns {artifact: path or reason skipped}.

    An incomplete table goes to ``<out>/partial/`` unless ``allow_incomplete``: the tables in ``out`` are
    only ever replaced by a complete one.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    t1 = built or build_table1(results_dir, group_size, correction)
    if not t1.complete and not allow_incomplete:
        out = out / "partial"
    table, paper, notes = t1.table, t1.paper, t1.notes
    written = {
        "csv": str(atomic_write(out / "table1.csv", lambda f: table.to_csv(f, index=False), mode="w")),
        "md": str(atomic_write(out / "table1.md", lambda f: f.write(to_markdown(paper, notes, correction)), mode="w")),
        "tex": str(atomic_write(out / "table1.tex", lambda f: f.write(to_latex(paper, notes, correction)), mode="w")),
    }
    if figures:
        from jensenkv.report.figures import write_figures

        written.update(write_figures(results_dir, out / "figures", group_size=group_size))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="results directory with runs/ (default: results)")
    parser.add_argument("--out", default=None, help="where table1.* and figures/ go (default: --results)")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--correction", default="taylor", choices=("taylor", "exact"))
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="write an incomplete table to --out too (default: to <out>/partial/)")
    args = parser.parse_args(argv)
    try:
        t1 = build_table1(args.results, args.group_size, args.correction)
        print(t1.describe())
        written = write_table1(args.results, args.out, args.group_size, args.correction, not args.no_figures,
                               args.allow_incomplete, built=t1)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    for name, where in written.items():
        print(f"{name}: {where}")
    if not t1.complete and not args.allow_incomplete:
        raise SystemExit(f"Table 1 is incomplete (missing: {'; '.join(t1.missing_rows)}): written under "
                         f"{Path(written['csv']).parent}, the tables in {args.out or args.results} are unchanged; "
                         "run `make reproduce-table1` (or pass --allow-incomplete)")


if __name__ == "__main__":
    main()
