"""Table 1 as the paper lays it out: the cells as "none -> X" text with their digits, the footnotes (how the
cells were measured, why a metric is missing), and the markdown and LaTeX renderings of that layout.
"""
from __future__ import annotations

import math
import re

import pandas as pd

from jensenkv.report.rows import BASELINE, attach_details, bits_label, present, quantizer_label
from jensenkv.report.table1_cells import ROW
from jensenkv.store.files import portable


DIGITS = {"psnr": 2, "ssim": 3, "lpips": 3, "vbench": 2, "content": 2, "delta_p_s": 4}
LATEX_ARROWS = {"psnr": r"$\uparrow$", "ssim": r"$\uparrow$", "lpips": r"$\downarrow$", "vbench": r"$\uparrow$",
                "content": r"$\uparrow$", "delta_p_s": r"$\to 0$"}  # which way is better
HEADERS = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS", "vbench": "VBench", "content": "Content",
           "delta_p_s": "dP_S"}
NO_REFERENCE = ("vbench", "content")  # scored on the video alone: BF16 rows show their own value


PAIRED_HEADER = "dPSNR [95% CI], p"


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
