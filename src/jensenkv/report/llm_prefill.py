"""The LLM partial-prefill report: tables, figures, claims and the attention-statistics comparison, from the
store of ``python -m jensenkv.run.llm_prefill`` (``<results>/llm_prefill/``).

Files (under --out, default --results; an incomplete store's go to ``partial/``, as every report's):
- ``llm_prefill.{csv,md,tex}``: per (cache, treatment): the continuation's NLL, dNLL against the full-precision
  prefix and the paired change against no correction, with 95% intervals and sign-flip tests over documents
  (Holm over the paired tests), the smallest change the windows detect (80% power), dP_S, mean |dP_S|, JSD, the
  prefix cache's held bytes against BF16, and the time per window;
- ``llm_prefill_windows.csv``: every window's values; ``llm_prefill_layers.csv``: per layer, the mean over windows;
- ``llm_claims.md``: claims 1a, 1b and 2 restated for the LLM, by the claims report's own rules (``claims.md``
  includes it as a section);
- ``llm_attention_stats.{csv,md}``: what sets the size of the Jensen bias, SmolLM2 against the built-in video model
  (``table1_layers.csv``);
- ``figures/llm_dnll.png``, ``figures/llm_delta_p_s_layers.png``.

The unit of every interval and test is the document (``rows.cluster_means``: windows averaged within their
document): windows of one document share its content and style.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import ALPHA, holm, mean_interval, paired_difference, shift_test
from jensenkv.report.claim_numbers import ONE_SIDED_LEVEL
from jensenkv.exit_codes import EPILOG, FAILED, PARTIAL, guarded, stop
from jensenkv.report.publish import Part, add_store_args, publish, recover_store, report_error, text_file
from jensenkv.report.rows import cluster_means, setting_tags

BASELINE = "none"
UNIT, MEMBER = "document", "window"
METRICS = ("dnll", "delta_p_s", "delta_p_s_abs", "jsd", "out_rel_err")


def treatment_order(present) -> list[str]:
    """The treatments present, in the experiment's order (none, taylor, exact, taylor2, ...)."""
    from jensenkv.llm.prefill import TREATMENTS

    present = set(present)
    return [t for t in TREATMENTS if t in present] + sorted(present - set(TREATMENTS))


def row_name(labels: dict) -> str:
    sink = ", first token full precision" if labels.get("sink_tokens") else ""
    return f"{labels['label']} INT{labels['bits']} g{labels['group_size']}{sink}"


def load(results: Path) -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
    """(records, every window row, every layer row) of the LLM store; rows carry their run's labels."""
    from jensenkv.store.llm import LAYERS_FILE, WINDOWS_FILE, records, side_table, store_at

    store = store_at(results)
    found = records(store)
    if not found:
        return [], pd.DataFrame(), pd.DataFrame()
    windows, layers = (pd.concat([side_table(store, r, name).assign(row=row_name(r["labels"])) for r in found],
                                 ignore_index=True) for name in (WINDOWS_FILE, LAYERS_FILE))
    return found, windows, layers


def clusters(frame: pd.DataFrame, metric: str) -> pd.Series:
    """One value per document: the windows' values averaged within their document."""
    return cluster_means(frame.set_index([UNIT, MEMBER])[metric], prompt=UNIT, seed=MEMBER)


def paired(frame: pd.DataFrame, row: str, treatment: str, metric: str = "dnll"):
    """treatment - none per document (windows paired first), its interval, sign-flip p and mde."""
    treated = frame[(frame.row == row) & (frame.treatment == treatment)]
    a = clusters(treated, metric)
    b = clusters(frame[(frame.row == row) & (frame.treatment == BASELINE)], metric)
    return paired_difference(a, b.reindex(a.index), videos=treated[MEMBER].nunique())


def ordered(records: list[dict]) -> list[dict]:
    """The tables' order: the suite's quantizers by width and name (each without, then with a sink), then the
    transformers anchors."""
    return sorted(records, key=lambda r: (r["labels"]["granularity"] == "transformers", r["labels"]["bits"],
                                          r["labels"]["label"], r["labels"]["sink_tokens"]))


def summary_table(records: list[dict], windows: pd.DataFrame) -> pd.DataFrame:
    """One row per (cache, treatment), in the store's run order and the experiment's treatment order."""
    rows, family = [], []
    for record in ordered(records):
        own = windows[windows.run_id == record["run_id"]]
        for treatment in record["identity"]["treatments"]:
            part = own[own.treatment == treatment]
            if len(part):
                row = _summary_row(record, part, windows, treatment, rows, family)
                rows.append(row)
    table = pd.DataFrame(rows)
    if family:
        table.loc[family, "change_p_holm"] = holm([rows[i]["change_p"] for i in family])
    return table


def _summary_row(record: dict, part: pd.DataFrame, windows: pd.DataFrame, treatment: str, rows: list,
                 family: list) -> dict:
    """One (cache, treatment) row; a paired test against none joins the Holm ``family``."""
    row = part.row.iloc[0]
    out = {"model": record["labels"]["model"], "cache": row, "bits": record["labels"]["bits"],
           "group_size": record["labels"]["group_size"], "sink_tokens": record["labels"]["sink_tokens"],
           "treatment": treatment, "windows": part[MEMBER].nunique(), "documents": part[UNIT].nunique(),
           "nll_fp": clusters(part, "nll_fp").mean(), "nll": clusters(part, "nll").mean()}
    for metric in METRICS:
        iv = mean_interval(clusters(part, metric) if metric in part else pd.Series(dtype=float))
        out.update({metric: iv.mean, f"{metric}_low": iv.low, f"{metric}_high": iv.high})
    if treatment != BASELINE and BASELINE in set(windows[windows.row == row].treatment):
        est = paired(windows, row, treatment)
        out.update(change=est.delta, change_low=est.low, change_high=est.high, change_p=est.test.p,
                   change_mde=est.mde)
        family.append(len(rows))
    memory = record["memory"]  # an anchor's (transformers' cache) bytes are not counted: NaN
    out.update(held_bytes=memory.get("held", math.nan), stored_bytes=memory.get("stored", math.nan),
               bf16_bytes=memory.get("bf16", math.nan), seconds_per_window=record["seconds"].get(treatment),
               run_id=record["run_id"])
    return out


def _interval(row, metric: str, digits: int = 3) -> str:
    mean, low, high = row[metric], row[f"{metric}_low"], row[f"{metric}_high"]
    if not math.isfinite(mean):
        return "missing"
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _number(value, digits: int) -> str:
    """A cell's number, or "missing" (an anchor row has no probes and no byte count)."""
    return f"{value:.{digits}f}" if value is not None and math.isfinite(value) else "missing"


def markdown(table: pd.DataFrame, records: list[dict]) -> str:
    first = records[0]["identity"]
    text = first["text"]
    sources = ", ".join(f"{s['name']} ({s['package']} {s['version']}, sha256 {s['digest']})" for s in text["sources"])
    lines = [
        f"# LLM partial-prefill diagnostic: {first['model']['name']} (weights {first['model']['weights_digest']})",
        "",
        f"{int(table.windows.max())} windows of {text['length']} tokens from {int(table.documents.max())} documents "
        f"of {sources}; the first {text['prefix']} tokens' K/V quantized once, the last "
        f"{text['length'] - text['prefix']} teacher-forced. dNLL: nats per token against the full-precision prefix "
        f"(mean NLL {table.nll_fp.iloc[0]:.3f}); 95% t-intervals and two-sided sign-flip tests over documents "
        f"(windows averaged within each); p (Holm) over every paired test of the table. mde: the smallest change the "
        f"documents detect at 80% power. Held bytes: the prefix cache's buffers, all layers, against the same K/V "
        f"in BF16.",
        "",
        "| cache | treatment | dNLL [95% CI] | change vs none [95% CI] | p (Holm) | mde | dP_S [95% CI] | "
        "mean abs(dP_S) | JSD | held / BF16 | s / window |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, row in table.iterrows():
        change = ("-" if row.treatment == BASELINE or not math.isfinite(row.get("change", math.nan))
                  else f"{row.change:+.3f} [{row.change_low:+.3f}, {row.change_high:+.3f}]")
        p = "-" if change == "-" else f"{row.change_p_holm:.2g}"
        mde = "-" if change == "-" else f"{row.change_mde:.3f}"
        ratio = row.held_bytes / row.bf16_bytes if row.bf16_bytes else math.nan
        lines.append(f"| {row.cache} | {row.treatment} | {_interval(row, 'dnll')} | {change} | {p} | {mde} | "
                     f"{_interval(row, 'delta_p_s', 4)} | {_number(row.delta_p_s_abs, 4)} | {_number(row.jsd, 4)} | "
                     f"{_number(ratio, 3)} | {_number(row.seconds_per_window, 2)} |")
    return "\n".join(lines) + "\n"


def latex(table: pd.DataFrame) -> str:
    lines = [r"\begin{tabular}{llrrr}", r"\toprule",
             r"cache & treatment & $\Delta$NLL & change vs none & $\Delta P_S$ \\", r"\midrule"]
    for _, row in table.iterrows():
        change = "--" if row.treatment == BASELINE else f"{row.change:+.3f}"
        shift = f"{row.delta_p_s:+.4f}" if math.isfinite(row.delta_p_s) else "--"
        cache = row.cache.replace("_", r"\_")
        lines.append(f"{cache} & {row.treatment} & {row.dnll:+.3f} & {change} & {shift} \\\\")
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"


# --- claims --------------------------------------------------------------------------------------------------
def claims_markdown(records: list[dict], windows: pd.DataFrame, corrections: list[str]) -> str:
    """Claims 1a, 1b and 2 for the LLM, with the claims report's Claim / Entry / verdict machinery."""
    from jensenkv.report.claim_entries import Claim, margin_entry, superiority
    from jensenkv.report.claim_numbers import est_interval, fmt_interval, fmt_paired
    from jensenkv.report.claims_markdown import render_claim
    from jensenkv.report.verdicts import FAILS
    from jensenkv.report.endpoints import ABOUT_ZERO

    tags = {row_name(r["labels"]): setting_tags(r["identity"]) for r in records}
    int2 = [row_name(r["labels"]) for r in ordered(records) if "INT2" in tags[row_name(r["labels"])]]
    a = Claim("LLM-1a", "INT2 cached keys steal attention mass in a real pretrained LM",
              "uncorrected dP_S = P_S(quantized prefix) - P_S(same call, full-precision prefix), per window the mean "
              "over layers, per document the mean over its windows: claimed above 0, two-sided sign-flip test over "
              "documents", ["dP_S uncorrected [95% CI]"], units="documents / windows")
    claims = [a]
    for row in int2:
        base = windows[(windows.row == row) & (windows.treatment == BASELINE)]
        est = shift_test(clusters(base, "delta_p_s"), videos=base[MEMBER].nunique())
        a.entries.append(superiority(row, tags[row], {a.columns[0]: fmt_interval(est_interval(est), "delta_p_s")},
                                     est, "above", "no uncorrected windows", "delta_p_s"))
    for correction in corrections:
        b = Claim(f"LLM-1b ({correction})", f"the {correction} correction brings dP_S to about 0",
                  f"mean abs(dP_S) over the layers of each window with {correction}: equivalent to 0 within the "
                  f"margin {ABOUT_ZERO.value:g} ({ABOUT_ZERO.reason}); two one-sided sign-flip tests over documents "
                  f"(TOST at {ALPHA}), so the matching interval is the {ONE_SIDED_LEVEL:.0%} one",
                  [f"mean abs(dP_S) {correction} [{ONE_SIDED_LEVEL:.0%} CI]", "mean abs(dP_S) uncorrected"],
                  fails=FAILS, margin=ABOUT_ZERO, units="documents / windows")
        c = Claim(f"LLM-2 ({correction})", f"the {correction} correction lowers the continuation's NLL",
                  f"NLL with {correction} - NLL uncorrected, per window over the same quantized prefix, per document "
                  "the mean over its windows: claimed below 0, two-sided sign-flip test over documents",
                  ["dNLL uncorrected [95% CI]", f"change with {correction} [95% CI], p"], units="documents / windows")
        for row in int2:
            own = windows[windows.row == row]
            if correction not in set(own.treatment):
                continue
            treated = own[own.treatment == correction]
            abs_clusters = clusters(treated, "delta_p_s_abs")
            fixed = shift_test(abs_clusters, level=ONE_SIDED_LEVEL, videos=treated[MEMBER].nunique())
            before = mean_interval(clusters(own[own.treatment == BASELINE], "delta_p_s_abs"))
            b.entries.append(margin_entry(row, tags[row], {
                b.columns[0]: fmt_interval(est_interval(fixed), "delta_p_s", False),
                b.columns[1]: f"{before.mean:.4f}"}, fixed, abs_clusters, ABOUT_ZERO.value, "equivalence", "below",
                "no corrected windows", "delta_p_s_abs"))
            est = paired(windows, row, correction)
            base = mean_interval(clusters(own[own.treatment == BASELINE], "dnll"))
            c.entries.append(superiority(row, tags[row], {
                c.columns[0]: fmt_interval(base, "dnll"), c.columns[1]: fmt_paired(est, "dnll")}, est, "below",
                "no corrected windows", "dnll"))
        claims += [b, c]
    parts = ["## LLM partial-prefill (a real pretrained network)", "",
             f"{records[0]['identity']['model']['name']}, the store's INT2 rows; verdicts by the rule of this report "
             "(Holm within a claim, alpha 0.05). Tables: results/llm_prefill.md.", ""]
    return "\n".join(parts) + "\n".join(render_claim(claim.finish()) for claim in claims)


# --- the built-in model against the real network ---------------------------------------------------------------
COMPARED_STATS = {"delta_p_s": "dP_S uncorrected (mean over layers)",
                  "em_predicted_taylor": "Taylor bias b, softmax-weighted: sum_j pi_j b_j (nats)",
                  "taylor_b_mean": "Taylor bias b, plain mean over queries and keys (nats)",
                  "taylor_b_head_max": "Taylor bias b, the largest head's mean (nats)",
                  "em_jensen": "Jensen term of log Z_S (nats)",
                  "em_first_order": "first-order shift of log Z_S (nats)",
                  "em_log_zs_shift": "log Z_S shift, total (nats)",
                  "em_var_ratio": "Var(e) / (D^2 / 12)",
                  "em_n_eff": "n_eff = 1 / sum pi^2 (cached keys a query attends to)",
                  "score_sd": "SD of cached scores along a row"}


def attention_stats(layers: pd.DataFrame, builtin_layers: Path) -> pd.DataFrame:
    """Per statistic: the LLM's integer-RTN INT2 g32 uncorrected value (mean over windows, then layers) against the
    built-in model's (Table 1's RTN row, uncorrected, mean over its layers); a statistic one side never records is
    shown missing."""
    rtn = layers[(layers.treatment == BASELINE) & (layers.sink_tokens == 0) & (layers.quantizer == "rtn")
                 & (layers.bits == 2) & (layers.group_size == 32)]
    llm = rtn.groupby("layer").mean(numeric_only=True).mean() if len(rtn) else pd.Series(dtype=float)
    builtin = pd.Series(dtype=float)
    if builtin_layers.is_file():
        table1 = pd.read_csv(builtin_layers)
        rows = table1[(table1.quantizer == "rtn") & (table1.treatment == BASELINE) & (table1.bits == 2)]
        builtin = rows.groupby("layer").mean(numeric_only=True).mean()
    out = []
    for key, name in COMPARED_STATS.items():
        a, b = llm.get(key, math.nan), builtin.get(key, math.nan)
        out.append({"statistic": name, "key": key, "smollm2": a, "builtin": b,
                    "ratio": a / b if math.isfinite(a) and math.isfinite(b) and b else math.nan})
    return pd.DataFrame(out)


def stats_markdown(stats: pd.DataFrame, model: str, layers: int) -> str:
    lines = [f"# What sets the Jensen bias: {model} against the built-in video model", "",
             f"RTN INT2 g32, integer zero, uncorrected. {model}: mean over {layers} layers of the per-layer means "
             "over windows (results/llm_prefill_layers.csv). Built-in: Table 1's RTN row, mean over its layers "
             "(results/table1_layers.csv). Missing: that model's probes do not record it.", "",
             f"| statistic | {model} | built-in | ratio |", "|---|---|---|---|"]
    fmt = lambda v: f"{v:.3f}" if math.isfinite(v) else "missing"  # noqa: E731
    for _, r in stats.iterrows():
        lines.append(f"| {r.statistic} | {fmt(r.smollm2)} | {fmt(r.builtin)} | {fmt(r.ratio)} |")
    return "\n".join(lines) + "\n"


# --- figures -----------------------------------------------------------------------------------------------------
def figure_dnll(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caches = list(dict.fromkeys(table.cache))
    treatments = list(dict.fromkeys(table.treatment))
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(caches) + 1.5))
    height = 0.8 / len(treatments)
    for j, treatment in enumerate(treatments):
        part = table[table.treatment == treatment].set_index("cache").reindex(caches)
        y = [i + j * height for i in range(len(caches))]
        ax.barh(y, part.dnll, height, xerr=[part.dnll - part.dnll_low, part.dnll_high - part.dnll],
                label=treatment, capsize=2)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(caches))], caches, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("dNLL vs full-precision prefix (nats / token), 95% CI over documents")
    ax.set_title(f"{table.model.iloc[0]}: partial prefill, quantized prefix, per correction")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure_layers(layers: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    int2 = layers[(layers.bits == 2) & (layers.sink_tokens == 0)]
    caches = list(dict.fromkeys(int2.row))
    treatments = treatment_order(int2.treatment)
    colors = {t: f"C{i}" for i, t in enumerate(treatments)}  # one colour per treatment in every panel
    columns = min(4, len(caches))
    rows = -(-len(caches) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), sharey=True, squeeze=False)
    for ax, cache in zip(axes.flat, caches):
        own = int2[int2.row == cache]
        for treatment in treatments:
            per_layer = own[own.treatment == treatment].groupby("layer")["delta_p_s"].mean()
            ax.plot(per_layer.index, per_layer.values, label=treatment, lw=1.2, color=colors[treatment])
        ax.axhline(0, color="black", lw=0.6)
        ax.set_title(cache, fontsize=7)
        ax.set_xlabel("layer", fontsize=8)
    for ax in axes.flat[len(caches):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("dP_S, mean over windows", fontsize=8)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{layers.model.iloc[0]}: attention mass the quantized prefix takes, per layer (INT2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the report -------------------------------------------------------------------------------------------------
def expected_runs() -> tuple[list[str], str]:
    """The run ids of ``experiment=llm_prefill`` here (weights digest and text identities read), and a note when
    they cannot be planned (the report then names that as its gap)."""
    from jensenkv.llm.text import load_source
    from jensenkv.config.llm import compose, plan_runs
    from jensenkv.llm.weights import converted_dir, locate

    cfg = compose(["experiment=llm_prefill"])
    try:
        weights = locate(cfg.llm.name)
        sources = [load_source(name).identity() for name in cfg.text.sources]
    except (FileNotFoundError, ValueError) as e:
        return [], str(e)
    from transformers import AutoConfig

    folder = converted_dir(weights) if weights.gguf_file is not None else weights.directory
    if not (folder / "config.json").is_file():
        return [], f"{cfg.llm.name} has not been loaded yet: run `make reproduce-llm`"
    config = AutoConfig.from_pretrained(str(folder))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return [p.run_id for p in plan_runs(cfg, weights.digest, sources, head_dim)], ""


def build(results: Path) -> list[Part]:
    records, windows, layers = load(results)
    expected, why = expected_runs()
    have = {r["run_id"] for r in records}
    gaps = [why] if why else []
    lacking = [run for run in expected if run not in have]
    if lacking:
        gaps.append(f"{len(lacking)} of the {len(expected)} runs of experiment=llm_prefill (python -m "
                    f"jensenkv.run.llm_prefill experiment=llm_prefill)")
    if not records:
        return [Part("llm_prefill", {"llm_prefill.md": text_file("# LLM partial-prefill: no runs in the store\n")},
                     gaps or ["no runs in the store"])]
    if expected:  # the committed files describe exactly the experiment's runs
        keep = set(expected)
        records = [r for r in records if r["run_id"] in keep] or records
        windows = windows[windows.run_id.isin({r["run_id"] for r in records})]
        layers = layers[layers.row.isin(set(windows.row))]
    table = summary_table(records, windows)
    per_layer = layers.groupby(["model", "row", "quantizer", "bits", "group_size", "sink_tokens", "treatment",
                                "layer"], sort=False).mean(numeric_only=True).reset_index()
    per_layer = per_layer.drop(columns=["window"], errors="ignore")
    corrections = [t for t in treatment_order(windows.treatment) if t != BASELINE]
    stats = attention_stats(layers, Path(results) / "table1_layers.csv")
    model = records[0]["identity"]["model"]["name"]
    files = {
        "llm_prefill.csv": lambda p: table.to_csv(p, index=False, float_format="%.6g"),
        "llm_prefill.md": text_file(markdown(table, records)),
        "llm_prefill.tex": text_file(latex(table)),
        "llm_prefill_windows.csv": lambda p: windows.drop(columns=["row"]).to_csv(p, index=False,
                                                                                  float_format="%.6g"),
        "llm_prefill_layers.csv": lambda p: per_layer.to_csv(p, index=False, float_format="%.6g"),
        "llm_claims.md": text_file(claims_markdown(records, windows, corrections)),
        "llm_attention_stats.csv": lambda p: stats.to_csv(p, index=False, float_format="%.6g"),
        "llm_attention_stats.md": text_file(stats_markdown(stats, model, int(layers.layer.nunique()))),
        "figures/llm_dnll.png": lambda p: figure_dnll(table, p),
        "figures/llm_delta_p_s_layers.png": lambda p: figure_layers(layers, p),
    }
    return [Part("llm_prefill", files, gaps)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jensenkv.report.llm_prefill", description=__doc__.split("\n")[0],
                                     epilog=EPILOG)
    add_store_args(parser, "where the LLM tables and figures go")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="write an incomplete store's files in place of the committed ones")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    from jensenkv.store.llm import DamagedLlmRunError

    recover_store(args)
    try:
        parts = build(Path(args.results))
    except DamagedLlmRunError as e:
        stop(f"error: {e}; rerun `python -m jensenkv.run.llm_prefill experiment=llm_prefill` to redo it", FAILED)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    published = publish(args.out or args.results, parts, args.allow_incomplete)
    for rel, path in published.paths.items():
        print(f"wrote {path}")
    for why in published.incomplete.values():
        stop(f"incomplete: {why}", PARTIAL)


if __name__ == "__main__":
    main()
