"""Figures: memory-quality trade-off, attention mass per layer and step, the Jensen bias itself, and per-layer
error-model diagnostics (``jensenkv.report.diagnostics``).

Every function takes data (DataFrames from ``jensenkv.tracking.load_results`` / ``load_attention``) and
returns a matplotlib Figure; ``write_figures`` picks the runs from a results directory (their rows and
treatments from ``jensenkv.report.rows``, the diagnostics from the claims' rows) and saves PNGs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from jensenkv.eval.attention import mass_by_layer_step
from jensenkv.report.diagnostics import plot_diagnostics, uncorrected_diagnostics
from jensenkv.report.model_choice import choose_model
from jensenkv.report.rows import attach_details, full_cache
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.tracking import load_attention, load_results

CORRECTION_STYLE = {"none": ("tab:red", "o", "no correction"), "taylor": ("tab:blue", "s", "Taylor correction"),
                    "exact": ("tab:green", "^", "exact correction")}


def plot_tradeoff(runs: pd.DataFrame, metric: str = "psnr", title: str | None = None) -> Figure:
    """Quality vs effective bits per cached element: one series per correction, one point per (bits, g).

    runs: rows of ``load_results`` (columns effective_bits, bits, group_size, correction, <metric>).
    """
    for col in ("effective_bits", "bits", "group_size", "correction", metric):
        if col not in runs.columns:
            raise ValueError(f"runs lack the column {col!r} needed for the trade-off plot")
    data = runs.dropna(subset=["effective_bits", metric])
    if data.empty:
        raise ValueError(f"no run has both effective_bits and {metric}")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    labelled: set[tuple[int, int]] = set()  # one "INTb gG" label per setting, not one per correction
    for correction, group in data.groupby("correction"):
        color, marker, label = CORRECTION_STYLE.get(correction, ("tab:gray", "x", correction))
        for bits, series in group.groupby("bits"):
            series = series.sort_values("effective_bits")
            ax.plot(series["effective_bits"], series[metric], color=color, marker=marker,
                    label=label if bits == group["bits"].min() else None, linestyle="-" if bits <= 2 else "--")
            for _, row in series.iterrows():
                setting = (int(row["bits"]), int(row["group_size"]))
                if setting not in labelled:
                    labelled.add(setting)
                    ax.annotate(f"INT{setting[0]} g{setting[1]}", (row["effective_bits"], row[metric]),
                                textcoords="offset points", xytext=(4, -10), fontsize=7, color="dimgray")
    ax.set_xlabel("effective bits per cached element (K and V, incl. metadata)")
    ax.set_ylabel(metric.upper() if metric in ("psnr", "ssim", "lpips") else metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"memory-quality trade-off ({metric})")
    fig.tight_layout()
    return fig


REFERENCE_LABEL = "same call, run's own cache in full precision"


def plot_attention_mass(frames: Mapping[str, pd.DataFrame], reference_label: str = REFERENCE_LABEL,
                        title: str = "attention mass on the cache per layer and step") -> Figure:
    """P_S (attention mass on the cache) per denoising step, one panel per layer.

    frames: {label: probe DataFrame of one run} (``load_attention``). The reference curve is p_s_ref of the
    first run's probes: the same attention call with that run's own cache in full precision (not the BF16 run,
    whose history differs), which is what dP_S is measured against.
    """
    if not frames:
        raise ValueError("frames={} is not allowed: give at least one run's probes")
    tables = {label: mass_by_layer_step(frame) for label, frame in frames.items()}
    layers = sorted(set().union(*(set(t["layer"]) for t in tables.values())))
    cols = min(4, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False, sharey=True)
    first = next(iter(tables.values()))
    for i, layer in enumerate(layers):
        ax = axes[i // cols][i % cols]
        ref = first[first["layer"] == layer]
        ax.plot(ref["step"], ref["p_s_ref"], color="black", linewidth=2, label=reference_label)
        for label, table in tables.items():
            part = table[table["layer"] == layer]
            ax.plot(part["step"], part["p_s"], marker="o", markersize=3, label=label)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("denoising step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for j in range(len(layers), rows * cols):
        axes[j // cols][j % cols].axis("off")
    for r in range(rows):
        axes[r][0].set_ylabel("P_S (mass on cached chunks)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def jensen_bias_curves(alphas: torch.Tensor, samples: int = 200_000, seed: int = 0) -> pd.DataFrame:
    """Bias b(alpha) = log E[exp(delta)], delta ~ U(-alpha, alpha): exact, Taylor and a Monte Carlo estimate.

    alpha = scale * |q_c| * D / 2 for one channel (q_c the query channel, D the quantization step).
    Exact and Taylor come from ``jensenkv.correction.jensen_bias`` with d = 1, q = 1, scale = 1, step = 2 alpha.
    """
    from jensenkv.correction import jensen_bias

    alphas = alphas.double()
    q = torch.ones(1, 1, dtype=torch.float64)  # (Q=1, d=1)
    step = (2 * alphas)[:, None]  # (K, d=1)
    exact = jensen_bias(q, step, method="exact", scale=1.0)[0]  # (K,)
    taylor = jensen_bias(q, step, method="taylor", scale=1.0)[0]  # (K,)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(samples, generator=gen, dtype=torch.float64) * 2 - 1  # U(-1, 1)
    monte_carlo = torch.log(torch.exp(alphas[:, None] * u[None]).mean(-1))  # (K,)
    return pd.DataFrame({"alpha": alphas.numpy(), "exact": exact.numpy(), "taylor": taylor.numpy(),
                         "monte_carlo": monte_carlo.numpy()})


def plot_jensen_bias(alpha_max: float = 3.0, alpha_demo: float = 1.5) -> Figure:
    """Left: E[exp(s + delta)] vs exp(s) for uniform score noise (the convex inflation of the cache's mass).
    Right: the bias log E[exp(delta)] vs the noise half-width alpha: exact, second-order Taylor, Monte Carlo."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    s = torch.linspace(-2, 2, 101, dtype=torch.float64)
    inflation = math.sinh(alpha_demo) / alpha_demo  # E[exp(delta)], delta ~ U(-alpha, alpha)
    left.plot(s, torch.exp(s), color="black", label="exp(s)  (BF16 key)")
    left.plot(s, torch.exp(s) * inflation, color="tab:red",
              label=f"E[exp(s + delta)], alpha={alpha_demo}  (x{inflation:.2f})")
    left.set_xlabel("score s")
    left.set_ylabel("unnormalised attention weight")
    left.set_title("zero-mean key noise inflates exp(score)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    curves = jensen_bias_curves(torch.linspace(0.0, alpha_max, 61))
    right.plot(curves["alpha"], curves["exact"], color="tab:green", label="exact: log(sinh a / a)")
    right.plot(curves["alpha"], curves["taylor"], color="tab:blue", linestyle="--", label="Taylor: a^2 / 6")
    right.plot(curves["alpha"][::5], curves["monte_carlo"][::5], "k.", label="Monte Carlo log E[exp(delta)]")
    right.set_xlabel("alpha = scale |q_c| D / 2  (grows with the quantization step D)")
    right.set_ylabel("bias b subtracted from cached scores")
    right.set_title("Jensen bias and its correction")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def rtn_runs(runs: pd.DataFrame, model: str | None = None, results_dir: str | Path | None = None) -> Selection:
    """The RTN runs the figures show (token groups, values like keys, full cache; treatments none / taylor /
    exact as ``jensenkv.report.rows`` names them: strength 1 and nothing else, read from the records' identities
    when ``results_dir`` is given), all of one context (``jensenkv.report.selection``); others are left out."""
    if runs.empty or any(col not in runs.columns for col in ("model", "quantizer", "granularity", "values")):
        return Selection(runs.iloc[0:0])
    runs = attach_details(runs, results_dir)
    for col in ("sink_chunks", "window_chunks"):
        if col not in runs.columns:
            runs[col] = None
    mask = (runs["quantizer"] == "rtn") & (runs["granularity"] == "token_group") & (runs["values"] == "same") & \
        full_cache(runs) & runs["treatment"].isin(list(CORRECTION_STYLE))
    if model is not None:
        mask &= runs["model"] == model
    return comparable(runs[mask])


def attention_frames(results_dir: str | Path, rtn: pd.DataFrame, bits: int = 2,
                     group_size: int = 32) -> dict[str, pd.DataFrame]:
    """{"INT2 RTN" / "INT2 RTN + taylor" ...: probe table} of the latest INT``bits`` g``group_size`` run per
    correction among ``rtn`` (one model's ``rtn_runs``), in the legend's order; runs without probes are skipped.
    Each table carries its run_id."""
    if rtn.empty:
        return {}
    at_bits = rtn[(rtn["bits"] == bits) & (rtn["group_size"] == group_size)]
    chosen = latest(at_bits, ("correction",)).set_index("correction")["run_id"] if not at_bits.empty else {}
    frames = {}
    for correction in [c for c in CORRECTION_STYLE if c in chosen]:
        try:
            frame = load_attention(results_dir, chosen[correction])
        except FileNotFoundError:
            continue
        label = f"INT{bits} RTN" + ("" if correction == "none" else f" + {correction}")
        frames[label] = frame.assign(run_id=chosen[correction])
    return frames


def write_figures(results_dir: str | Path = "results", out_dir: str | Path | None = None,
                  model: str | None = None, bits: int = 2, group_size: int = 32) -> dict[str, str]:
    """Save tradeoff.png, attention_mass.png, jensen_bias.png and diagnostics.png (per-layer error-model
    diagnostics, ``jensenkv.report.diagnostics``); returns {figure: path or reason skipped}."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}

    def save(name: str, fig: Figure) -> None:
        path = out / f"{name}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        written[name] = str(path)

    save("jensen_bias", plot_jensen_bias())
    runs = load_results(results_dir)
    if runs.empty:
        written["tradeoff"] = written["attention_mass"] = f"skipped: no runs under {results_dir}"
        return written
    model = choose_model(runs, model, key="--model")  # one model per figure, never the first row's
    selection = rtn_runs(runs, model, results_dir)
    rtn = selection.runs
    if selection.left_out:
        written["left_out"] = "; ".join(selection.left_out)
    tradeoff = latest(rtn[rtn["correction"].isin(["none", "taylor"])], ("bits", "group_size", "correction"))
    if tradeoff.empty or "psnr" not in tradeoff.columns:
        written["tradeoff"] = "skipped: no RTN runs with PSNR (run experiment=tradeoff)"
    else:
        save("tradeoff", plot_tradeoff(tradeoff, "psnr", f"{model}: memory-quality trade-off (RTN)"))
    frames = attention_frames(results_dir, rtn, bits, group_size)
    if frames:
        save("attention_mass", plot_attention_mass(frames))
    else:
        written["attention_mass"] = f"skipped: no INT{bits} g{group_size} RTN run with attention probes"
    diag = uncorrected_diagnostics(results_dir, model, bits)
    if diag.missing:
        written["diagnostics"] = "skipped: " + "; ".join(diag.missing)
    else:
        save("diagnostics", plot_diagnostics(diag.table))
    return written


def main(argv: list[str] | None = None) -> None:
    """``python -m jensenkv.report.figures [--results results] [--out results/figures]`` (``make figures``)."""
    import argparse

    parser = argparse.ArgumentParser(description="figures from the results store")
    parser.add_argument("--results", default="results", help="results directory with runs/ (default: results)")
    parser.add_argument("--out", default=None, help="where the PNGs go (default: <results>/figures)")
    args = parser.parse_args(argv)
    try:
        written = write_figures(args.results, args.out)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    for name, where in written.items():
        print(f"{name}: {where}")


if __name__ == "__main__":
    main()
