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
from pathlib import Path

from jensenkv.report.layers import layer_means
from jensenkv.exit_codes import EPILOG, guarded, stop
from jensenkv.machine import PLATFORM_FILE, platform_text
from jensenkv.exit_codes import PARTIAL as PARTIAL_EXIT
from jensenkv.report.publish import PARTIAL, Part, add_store_args, publish, recover_store, report_error, text_file
from jensenkv.report.table1_format import to_latex, to_markdown
from jensenkv.report.table1_build import Table1, build_table1


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
