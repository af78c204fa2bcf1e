"""Figures: memory-quality trade-off, attention mass per layer and step, the Jensen bias itself, and per-layer
error-model diagnostics (``jensenkv.report.diagnostics``).

Every function takes data (DataFrames from ``jensenkv.report.store_frame.load_results`` / ``load_attention``) and
returns a matplotlib Figure; ``write_figures`` picks the runs from a results directory (their rows and
treatments from ``jensenkv.report.rows``, the diagnostics from the claims' rows) and saves PNGs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from jensenkv.eval.attention import mass_by_layer_step
from jensenkv.report.diagnostics import plot_diagnostics, uncorrected_diagnostics
from jensenkv.report.model_choice import choose_model
from jensenkv.exit_codes import EPILOG, guarded, stop
from jensenkv.exit_codes import PARTIAL as PARTIAL_EXIT
from jensenkv.report.publish import PARTIAL, Part, add_store_args, publish, recover_store, report_error
from jensenkv.report.rows import attach_details, full_cache
from jensenkv.report.selection import Selection, comparable, latest
from jensenkv.report.store_frame import load_attention, load_results
from jensenkv.store.results import ResultsStore

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
    for correction, group in data.groupby("correction"):
        color, marker, label = CORRECTION_STYLE.get(correction, ("tab:gray", "x", correction))
        for bits, series in group.groupby("bits"):
            series = series.sort_values("effective_bits")
            ax.plot(series["effective_bits"], series[metric], color=color, marker=marker,
                    label=label if bits == group["bits"].min() else None, linestyle="-" if bits <= 2 else "--")
    # one "INTb gG" label per setting; neighbours of one bit width (g128 / g64 lie close
    # together) alternate below / above their point so that no two labels overlap
    settings = data.groupby(["bits", "group_size"], sort=True).agg(x=("effective_bits", "mean"), low=(metric, "min"),
                                                                    high=(metric, "max"))
    for bits, part in settings.groupby(level="bits"):
        for i, ((_, group_size), point) in enumerate(part.sort_values("x").iterrows()):
            below = i % 2 == 0  # under the lowest series, or over the highest: clear of every marker
            ax.annotate(f"INT{int(bits)} g{int(group_size)}", (point["x"], point["low" if below else "high"]),
                        textcoords="offset points", xytext=(0, -14 if below else 8), ha="center", fontsize=7,
                        color="dimgray")
    ax.margins(x=0.08, y=0.15)  # room for the labels at the ends
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
    return comparable(runs[mask], results_dir=results_dir)


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


@dataclass
class Figures:
    """The figures of one model, built in memory (nothing written yet), and what keeps them from being the
    committed ones (``gaps``: the runs of experiment=tradeoff / table1 they describe that the store lacks)."""

    model: str | None
    figures: dict[str, Figure] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # figure -> why it was skipped; "left_out" -> runs
    gaps: list[str] = field(default_factory=list)

    def part(self, folder: str = "figures") -> Part:
        """The figures as one part of a report (``report.publish``): PNGs under ``folder``."""
        return Part("figures", {f"{folder}/{name}.png": _saver(fig) for name, fig in self.figures.items()},
                    list(self.gaps))

    def close(self) -> None:
        for fig in self.figures.values():
            plt.close(fig)


def _saver(fig: Figure):
    return lambda path: fig.savefig(path, dpi=130, format="png")


def tradeoff_grid() -> dict[str, list[str]]:
    """The swept values of experiment=tradeoff (configs/experiment/tradeoff.yaml): what tradeoff.png shows."""
    from omegaconf import OmegaConf

    from jensenkv.config.resolve import CONFIG_DIR

    params = OmegaConf.load(CONFIG_DIR / "experiment" / "tradeoff.yaml").hydra.sweeper.params
    return {str(k): [v.strip() for v in str(values).split(",")] for k, values in params.items()}


def tradeoff_gaps(runs: pd.DataFrame) -> list[str]:
    """The (bits, group size, correction) runs of experiment=tradeoff that ``runs`` (one model's RTN runs of
    one context) lack."""
    grid = tradeoff_grid()
    have = {(str(b), str(g), str(c)) for b, g, c in zip(runs["bits"], runs["group_size"], runs["correction"])} \
        if not runs.empty else set()
    return [f"rtn INT{b} g{g} {c} (experiment=tradeoff)" for b in grid["quant.bits"]
            for g in grid["quant.group_size"] for c in grid["correction"] if (b, g, c) not in have]


def build_figures(results_dir: str | Path = "results", model: str | None = None, bits: int = 2,
                  group_size: int = 32) -> Figures:
    """tradeoff, attention_mass, jensen_bias and diagnostics (per-layer error-model diagnostics,
    ``jensenkv.report.diagnostics``) of one model, in memory; each figure it cannot draw is noted with why."""
    results_dir = Path(results_dir)
    runs = load_results(results_dir)
    if runs.empty:
        out = Figures(model, {"jensen_bias": plot_jensen_bias()}, gaps=[f"every run (no runs under {results_dir})"])
        out.notes["tradeoff"] = out.notes["attention_mass"] = f"skipped: no runs under {results_dir}"
        return out
    model = choose_model(runs, model, key="--model")  # one model per figure (report.model_choice)
    out = Figures(model, {"jensen_bias": plot_jensen_bias()})
    selection = rtn_runs(runs, model, results_dir)
    rtn = selection.runs
    if selection.left_out:
        out.notes["left_out"] = "; ".join(selection.left_out)
    tradeoff = latest(rtn[rtn["correction"].isin(["none", "taylor"])], ("bits", "group_size", "correction")) \
        if not rtn.empty else rtn
    out.gaps += tradeoff_gaps(tradeoff)
    if tradeoff.empty or "psnr" not in tradeoff.columns:
        out.notes["tradeoff"] = "skipped: no RTN runs with PSNR (run experiment=tradeoff)"
    else:
        out.figures["tradeoff"] = plot_tradeoff(tradeoff, "psnr", f"{model}: memory-quality trade-off (RTN), "
                                                f"{videos_text(tradeoff, results_dir)}")
    frames = attention_frames(results_dir, rtn, bits, group_size)
    lacking = [c for c in ("none", "taylor") if f"INT{bits} RTN" + ("" if c == "none" else f" + {c}") not in frames]
    out.gaps += [f"rtn INT{bits} g{group_size} {c} with attention probes" for c in lacking]
    if frames:
        out.figures["attention_mass"] = plot_attention_mass(frames, title=f"{model}: attention mass on the cache "
                                                                          "per layer and step")
    else:
        out.notes["attention_mass"] = f"skipped: no INT{bits} g{group_size} RTN run with attention probes"
    diag = uncorrected_diagnostics(results_dir, model, bits)
    if diag.missing:
        out.notes["diagnostics"] = "skipped: " + "; ".join(diag.missing)
        out.gaps += diag.missing
    else:
        out.figures["diagnostics"] = plot_diagnostics(diag.table, model=model)
    return out


def videos_text(runs: pd.DataFrame, results_dir: str | Path) -> str:
    """"2 prompts x 1 seed": what each point averages over, read from the runs' identities."""
    store = ResultsStore(results_dir)
    shapes = set()
    for run_id in runs["run_id"]:
        identity = store.read_record(run_id).get("identity") or {}
        shapes.add((len(identity.get("prompts") or []), len(identity.get("seeds") or [])))
    return "; ".join(f"{p} prompt{'s' * (p != 1)} x {s} seed{'s' * (s != 1)}" for p, s in sorted(shapes))


def write_figures(results_dir: str | Path = "results", out_dir: str | Path | None = None,
                  model: str | None = None, bits: int = 2, group_size: int = 32,
                  allow_incomplete: bool = False) -> dict[str, str]:
    """Build the figures, then write them to ``<out>/figures/`` (out: ``results_dir`` by default) when the
    store holds the experiments they describe, else to ``<out>/partial/figures/`` (``report.publish``);
    returns {figure: path or why skipped}, plus "partial" (the why line) when incomplete."""
    out = Path(out_dir) if out_dir is not None else Path(results_dir)
    built = build_figures(results_dir, model, bits, group_size)
    try:
        published = publish(out, [built.part()], allow_incomplete)
    finally:
        built.close()
    written = {Path(rel).stem: str(path) for rel, path in published.paths.items() if rel.endswith(".png")}
    written.update(built.notes)
    written.update({"partial": why for why in published.incomplete.values()})
    return written


def main(argv: list[str] | None = None) -> None:
    """``python -m jensenkv.report.figures [--results results] [--out results] [--model M]`` (``make figures``)."""
    import argparse

    parser = argparse.ArgumentParser(description="figures from the results store", epilog=EPILOG)
    add_store_args(parser, "the PNGs go to <out>/figures/")
    parser.add_argument("--model", default=None, help="the model to draw (default: the store's only model)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="write figures of an incomplete store to <out>/figures/ too")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args) -> None:
    recover_store(args)
    try:
        written = write_figures(args.results, args.out, args.model, allow_incomplete=args.allow_incomplete)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    for name, where in written.items():
        if name != "partial":
            print(f"{name}: {where}")
    out = Path(args.out or args.results)
    if "partial" in written and not args.allow_incomplete:
        stop(f"{written['partial']}: written under {out / PARTIAL}, the committed figures are unchanged; run "
             "`make reproduce-table1` (or pass --allow-incomplete)", PARTIAL_EXIT)
    if "partial" in written:
        stop(f"{written['partial']}: written to {out / 'figures'} (--allow-incomplete)", PARTIAL_EXIT)


if __name__ == "__main__":
    main()
