"""Per-layer error-model diagnostics: why the correction helps or over-corrects, layer by layer.

Reads the ``em_*`` probe keys (``jensenkv.attention.diagnostics``, recorded with attention.diagnostics=true) of
the claims' uncorrected rows (``diagnose``: the rows, pooled replicates and context of ``report.options``) and
averages them per layer over denoising probes (``report.layers.probe_layer_means``, as table1_layers.csv).
The realized shift of the cached block's log partition sum splits as log_zs_shift = first_order + jensen;
subtracting b removes predicted_taylor = sum pi b of it (to first order), leaving residual = log_zs_shift -
predicted_taylor. The correction's model says first_order = 0 (and the mean error in steps is 0) and that the
Jensen term is predicted_jensen = sum pi (1 - pi) b, so subtracting b is expected to overshoot by sum pi^2 b
(``jensenkv.attention.diagnostics``): the Jensen term is compared with that prediction, not with b. A layer
where first_order dominates is a layer the correction cannot fix. ``reading`` writes that down per layer and
``render_diagnostics`` the report's section.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from jensenkv.eval.attention import denoising_rows
from jensenkv.report.intervals import cell_interval
from jensenkv.report.layers import cell_probes, probe_layer_means
from jensenkv.report.options import Options, load_options
from jensenkv.report.rows import PROBE_VIDEO_KEYS
from jensenkv.store.files import portable
from jensenkv.store.record import CorruptRecordError

DIAGNOSED = "em_log_zs_shift_mean"  # the run-level mean the runner stores when the probes carry diagnostics
COLUMNS = ("row", "layer", "mean_err", "mean_err_small", "slope", "corr", "var_ratio", "first_order", "jensen",
           "predicted_jensen", "log_zs_shift", "predicted_taylor", "residual", "residual_low", "residual_high",
           "n_eff", "n_eff_fraction", "delta_p_s", "videos", "prompts", "reading")


def has_diagnostics(frame: pd.DataFrame) -> bool:
    """Whether a run's probe table carries the error-model diagnostics."""
    return all(k in frame.columns for k in ("em_first_order", "em_jensen", "em_log_zs_shift",
                                            "em_predicted_taylor")) and frame["em_log_zs_shift"].notna().any()


def per_layer(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """{row label: probe table (``load_attention`` rows of one or more runs, with a run_id column)} -> one row
    per (row, layer): the means of the em_* keys (``layers.probe_layer_means``, without the prefix), the
    residual with its 95% interval over prompts (videos averaged within their prompt), delta_p_s and a one-line reading."""
    out = []
    for label, frame in frames.items():
        if not has_diagnostics(frame):
            raise ValueError(f"the probes of {label!r} have no error-model diagnostics (em_* keys): run with "
                             "attention.diagnostics=true")
        frame = frame.assign(em_residual=frame["em_log_zs_shift"] - frame["em_predicted_taylor"])
        if "run_id" not in frame.columns:
            frame["run_id"] = label
        rows = denoising_rows(frame)
        per_video = rows.groupby([*PROBE_VIDEO_KEYS, "layer"])["em_residual"].mean().reset_index()
        for layer, mean in probe_layer_means(frame, ("em_residual",)).iterrows():
            layer_videos = per_video.loc[per_video["layer"] == layer].set_index(list(PROBE_VIDEO_KEYS))
            ci = cell_interval(layer_videos["em_residual"], prompt="prompt_index")  # over prompts (rows.cluster_means)
            entry = {k.removeprefix("em_"): float(v) for k, v in mean.items()}
            entry.update({"row": label, "layer": int(layer), "residual_low": ci.low, "residual_high": ci.high,
                          "videos": ci.num_videos, "prompts": ci.n})
            entry["reading"] = reading(entry)
            out.append(entry)
    table = pd.DataFrame(out)
    for col in COLUMNS:
        if col not in table.columns:
            table[col] = math.nan
    return table[list(COLUMNS)]


def reading(r: Mapping[str, float]) -> str:
    """One line on a layer from its means (and the residual's interval, when given): which term moves log Z_S,
    how the Jensen term compares with the model's prediction sum pi (1 - pi) b, and what subtracting b does."""
    first, jensen, shift, b = r["first_order"], r["jensen"], r["log_zs_shift"], r["predicted_taylor"]
    predicted = r.get("predicted_jensen", math.nan)
    residual = shift - b
    low, high = r.get("residual_low", math.nan), r.get("residual_high", math.nan)
    if abs(first) > abs(jensen):
        head = f"first-order shift {first:+.3g} dominates the Jensen term {jensen:+.3g}"
    else:
        head = f"Jensen term {jensen:+.3g} dominates the first-order shift {first:+.3g}"
    if math.isfinite(predicted) and predicted > 0:
        head += f" ({jensen / predicted:.2g}x its prediction sum pi(1-pi) b = {predicted:.3g})"
    if low <= 0 <= high:  # the interval of what is left contains 0
        effect = (f"subtracting b ({b:.3g}) removes the log Z_S shift {shift:+.3g} (left: {residual:+.3g}, 0 within "
                  "its 95% CI)")
    elif abs(residual) < abs(shift):
        effect = f"subtracting b ({b:.3g}) shrinks the log Z_S shift {shift:+.3g} to {residual:+.3g}: helps"
        if residual * shift < 0:
            effect += " (overshoots" + (f"; the model predicts {first - (b - predicted):+.3g}: sum pi^2 b left over)"
                                        if math.isfinite(predicted) else ")")
    elif residual * shift < 0:
        effect = f"subtracting b ({b:.3g}) turns the log Z_S shift {shift:+.3g} into {residual:+.3g}: over-corrects"
    else:
        effect = (f"the log Z_S shift {shift:+.3g} is not inflated, so subtracting b ({b:.3g}) moves it to "
                  f"{residual:+.3g}: over-corrects")
    text = f"{head}; {effect}"
    mean_err = r.get("mean_err", math.nan)
    if math.isfinite(mean_err):  # the model: zero-mean error in every channel group
        small = r.get("mean_err_small", math.nan)
        text += f"; mean error {mean_err:+.2g} steps" + (f" ({small:+.2g} on small channels)"
                                                       if math.isfinite(small) else "")
    if math.isfinite(r.get("n_eff", math.nan)):
        frac = r.get("n_eff_fraction", math.nan)
        text += f"; n_eff {r['n_eff']:.3g}" + (f" ({frac:.1%} of cached keys)" if math.isfinite(frac) else "")
    return text


TERMS = (("first_order", "first-order shift", "tab:orange"), ("jensen", "Jensen term", "tab:purple"),
         ("predicted_jensen", "Jensen predicted: sum pi(1-pi) b", "plum"),
         ("log_zs_shift", "realized log Z_S shift", "black"), ("predicted_taylor", "b removes: sum pi b", "tab:blue"))


def plot_diagnostics(table: pd.DataFrame, per_line: int = 4, model: str | None = None,
                     title: str = "why the correction helps or over-corrects, per layer (uncorrected runs)") -> Figure:
    """Per layer: the first-order shift, the Jensen term and its prediction, the realized log Z_S shift, what b
    removes and the residual (shift - b, with its interval) on top; n_eff below. One panel pair per row of ``per_layer``,
    ``per_line`` side by side."""
    if table.empty:
        raise ValueError("table is empty: there are no per-layer diagnostics to draw")
    labels = list(dict.fromkeys(table["row"]))
    cols, lines = min(per_line, len(labels)), math.ceil(len(labels) / per_line)
    fig, axes = plt.subplots(2 * lines, cols, figsize=(max(5.0, 4.2 * cols), 5.2 * lines + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3] * lines})
    width = 0.8 / len(TERMS)
    for j, label in enumerate(labels):
        part = table[table["row"] == label].sort_values("layer")
        x = np.arange(len(part))
        top, bottom = axes[2 * (j // cols)][j % cols], axes[2 * (j // cols) + 1][j % cols]
        for i, (key, name, color) in enumerate(TERMS):  # a key older stores lack draws as no bar
            top.bar(x + (i - (len(TERMS) - 1) / 2) * width, part[key], width, color=color, label=name)
        err = np.vstack([part["residual"] - part["residual_low"], part["residual_high"] - part["residual"]])
        top.errorbar(x, part["residual"], yerr=np.nan_to_num(err), fmt="D", color="tab:red", capsize=3,
                     label="left after subtracting b (95% CI)")
        top.axhline(0, color="gray", linewidth=0.8)
        top.set_title(label, fontsize=9)
        top.set_xticks(x, [])
        top.grid(alpha=0.3, axis="y")
        bottom.bar(x, part["n_eff"], color="tab:green")
        bottom.set_xticks(x, [str(v) for v in part["layer"]])
        bottom.set_xlabel("layer")
        bottom.grid(alpha=0.3, axis="y")
        if j % cols == 0:
            top.set_ylabel("shift of log Z_S (cached keys)")
            bottom.set_ylabel("n_eff (keys)")
    for j in range(len(labels), lines * cols):
        axes[2 * (j // cols)][j % cols].axis("off")
        axes[2 * (j // cols) + 1][j % cols].axis("off")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.suptitle((f"{model}: " if model else "") + title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


SHOWN = {"layer": "layer", "mean_err": "mean e/D", "mean_err_small": "mean e/D (small ch.)",
         "slope": "slope e~k", "corr": "corr(k, e)", "var_ratio": "Var(e)/(D²/12)", "first_order": "first order",
         "jensen": "Jensen", "predicted_jensen": "Σπ(1-π)b", "log_zs_shift": "log Z_S shift",
         "predicted_taylor": "b removes (Σπb)", "residual": "shift - b [95% CI]", "n_eff": "n_eff",
         "delta_p_s": "dP_S"}
UNSIGNED = ("var_ratio", "n_eff")


def _signed(value: float, digits: int = 4) -> str:
    return f"{value:+.{digits}f}" if math.isfinite(value) else "missing"


def render_diagnostics(diag: Diagnostics) -> str:
    """The report's section on the per-layer diagnostics (markdown): one table and one reading line per layer."""
    lines = ["## Why: error-model diagnostics per layer (uncorrected runs)", "",
             ("Means over denoising probes of the em_* keys (jensenkv.attention.diagnostics). The cached block's "
              "log Z_S shift = first-order term + Jensen term. The correction's model says the error has mean 0 "
              "(mean e/D, in steps; 'small ch.': channels below one step, as in a group whose range an outlier "
              "sets), is uncorrelated with the key (slope of e on k, corr(k, e)), and that the Jensen term is "
              "Σπ(1-π)b: subtracting b (Σπb) is expected to overshoot by Σπ²b, so the Jensen term is read against "
              "Σπ(1-π)b, not against b. 'shift - b' is what is left after subtracting b (interval over videos); "
              "n_eff is how many cached keys a query attends to."), ""]
    if diag.missing:
        return "\n".join(lines + [f"- missing: {portable(m)}" for m in diag.missing]) + "\n"
    lines += [f"Runs over {diag.context}.", ""]
    for row, part in diag.table.groupby("row", sort=False):
        shown = part.copy()
        shown["residual"] = [f"{_signed(r.residual)} [{_signed(r.residual_low)}, {_signed(r.residual_high)}]"
                             for r in part.itertuples()]
        for col in SHOWN:
            if col not in ("layer", "residual"):
                shown[col] = [("missing" if not math.isfinite(v) else f"{v:.3g}") if col in UNSIGNED
                              else ("missing" if not math.isfinite(v) else f"{v:+.3g}") for v in part[col]]
        table = shown[list(SHOWN)].rename(columns=SHOWN).to_markdown(index=False, disable_numparse=True)
        lines += [f"### {row}", "", table, ""]
        lines += [f"- layer {r.layer}: {r.reading}" for r in part.itertuples()] + [""]
    return "\n".join(lines)


@dataclass
class Diagnostics:
    """Per-layer diagnostics of one model's uncorrected runs, the context they come from, or why there are none."""

    table: pd.DataFrame  # per_layer
    context: str = ""
    missing: list[str] = field(default_factory=list)

    @classmethod
    def none(cls, why: str) -> Diagnostics:
        """No diagnostics, and why (the report lists it as missing)."""
        return cls(pd.DataFrame(columns=list(COLUMNS)), missing=[why])


def diagnosed_runs(opts: Options, bits: int = 2) -> dict[str, pd.DataFrame]:
    """{row: its uncorrected runs that recorded the diagnostics} over the uncorrected INT``bits`` rows of the
    claims' options (their rows, pooled replicates and context): what ``diagnose`` reads."""
    diagnosed = {}
    for row in opts.rows:
        if row == "bf16" or opts.first(row, "bits") != bits or "none" not in opts.variants(row):
            continue
        runs = opts.members(row, "none")
        runs = runs[runs[DIAGNOSED].notna()] if DIAGNOSED in runs.columns else runs.iloc[0:0]
        if len(runs):
            diagnosed[row] = runs
    return diagnosed


def diagnose(opts: Options, bits: int = 2) -> Diagnostics:
    """``per_layer`` over the uncorrected INT``bits`` rows of the claims' options (their rows, their pooled
    replicates, their context), each from those of its runs that recorded the diagnostics."""
    rows = [r for r in opts.rows if r != "bf16" and opts.first(r, "bits") == bits and "none" in opts.variants(r)]
    diagnosed = diagnosed_runs(opts, bits)
    if not diagnosed:
        why = "" if not rows else (" recorded the error-model diagnostics (em_* probe keys): run with "
                                   "attention.diagnostics=true and 'attention' in eval.metrics")
        return Diagnostics.none(f"no uncorrected INT{bits} run of {opts.model}{why}")
    frames = {row: cell_probes(opts.results_dir, runs["run_id"]) for row, runs in diagnosed.items()}
    return Diagnostics(per_layer(frames), opts.selection.context_desc)


def uncorrected_diagnostics(results_dir: str | Path, model: str, bits: int = 2) -> Diagnostics:
    """``diagnose`` on the model's options in a results store (``jensenkv.report.options.load_options``)."""
    try:
        opts = load_options(results_dir, model).get(model)
    except CorruptRecordError:  # damaged runs: named, never read as "no runs"
        raise
    except ValueError:  # the store has no run of this model
        opts = None
    return diagnose(opts, bits) if opts is not None else Diagnostics.none(f"no runs of {model} under {results_dir}")
