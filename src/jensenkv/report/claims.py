"""The paper's three claims checked on a results store: a pre-specified primary endpoint, then every claim as
counts over the store's quantizer options, with intervals, exact tests, Holm-adjusted p-values, margins, power
and the paper's own effect sizes.

    python -m jensenkv.report.claims [--results $JENSENKV_RESULTS or results] [--model M] [--out <results>]
                                     [--correction taylor] [--bits 2] [--reference-bits 4] [--allow-incomplete]

Per model in the store (or only ``--model``, matched against the records' model label), from one context
(``jensenkv.report.options``: rows = quantizer options, variants = corrections and other attention-time
options, rotation / dither seeds pooled):

0. The primary endpoint (``report.endpoints.PRIMARY``): the paper's setting, RTN INT2 g32 (integer zero),
   none -> the correction, PSNR; tested alone at 0.05.
1. INT2 cached keys steal attention mass: (a) uncorrected dP_S > 0; (b) the correction brings dP_S to about 0:
   equivalence (TOST) of the corrected mean per-probe |dP_S| with 0 within ``endpoints.ABOUT_ZERO``.
2. The correction improves fidelity to the BF16 video at INT2 (PSNR, SSIM, VBench up; LPIPS down), paired
   per video against the uncorrected run; each row matching a paper quantizer is also tested against the
   paper's own effect (``endpoints.PAPER_TABLE1``).
3. Corrected INT2 at fewer effective bits matches or beats uncorrected INT4 of the same quantizer:
   non-inferiority within ``endpoints.NON_INFERIORITY`` (paired per (prompt, seed)).

The unit of every interval and test is the prompt (``rows.cluster_means``): replicates are averaged within
(prompt, seed), seeds within the prompt; intervals are Student-t intervals and p-values exact sign-flip tests over
prompts (``jensenkv.eval.stats``); n is given as prompts / videos. The verdict rule is
``jensenkv.report.verdicts.RULE``. Then the power of every row, the per-layer error-model diagnostics of the
uncorrected INT2 runs (``jensenkv.report.diagnostics``) and every option of the store side by side. Absent data
are listed as missing, with the reason.

``<out>/claims.md`` is written only from a store that holds the experiment it describes (``claims_gaps``: Table
1's rows, the noise floor, the teacher-forced runs); otherwise the report goes to ``<out>/partial/claims.md``
with a line saying what is missing, and the command exits 1 (``jensenkv.report.publish``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from jensenkv.exit_codes import EPILOG, guarded, stop
from jensenkv.exit_codes import PARTIAL as PARTIAL_EXIT
from jensenkv.report.publish import PARTIAL, Part, add_store_args, publish, recover_store, report_error, text_file
from jensenkv.report.paper_claims import ModelReport, build_report
from jensenkv.report.claims_markdown import render


def claims_gaps(results_dir: str | Path, correction: str, model: str | None = None) -> list[str]:
    """What the store lacks of the experiment claims.md describes: Table 1's rows (``table1_build.missing_rows``),
    the noise floor and the teacher-forced runs (``report.checks``)."""
    from jensenkv.report.checks import NOISE_FLOOR_FILE, TEACHER_FORCED_DIR
    from jensenkv.report.table1_build import missing_rows

    results_dir = Path(results_dir)
    gaps = missing_rows(results_dir, correction=correction, model=model)
    if not (results_dir / NOISE_FLOOR_FILE).is_file():
        gaps.append(f"{NOISE_FLOOR_FILE} (python -m jensenkv.run.noise_floor)")
    if not (results_dir / TEACHER_FORCED_DIR / "runs").is_dir():
        gaps.append(f"the teacher-forced runs under {TEACHER_FORCED_DIR}/ (experiment=teacher_forced)")
    return gaps


def write_claims(results_dir: str | Path = "results", out: str | Path | None = None, model: str | None = None,
                 correction: str = "taylor", bits: int = 2, reference_bits: int = 4,
                 allow_incomplete: bool = False) -> tuple[Path, list[ModelReport], str]:
    """Build the report, then write ``<out>/claims.md`` (out: ``results_dir`` by default) when the store holds
    the experiment it describes (``claims_gaps``), else ``<out>/partial/claims.md`` (``report.publish``).
    Returns (the path written, the reports, the why line or "")."""
    reports = build_report(results_dir, model, correction, bits, reference_bits)
    text = render(reports, results_dir, correction, bits)
    part = Part("claims", {"claims.md": text_file(text)}, claims_gaps(results_dir, correction, model))
    published = publish(Path(out) if out is not None else Path(results_dir), [part], allow_incomplete)
    return published.paths["claims.md"], reports, published.incomplete.get("claims", "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG)
    add_store_args(parser, "claims.md goes to <out>/")
    parser.add_argument("--model", default=None, help="only this model (its label in the records)")
    parser.add_argument("--correction", default="taylor", help="the paper's correction (default: taylor)")
    parser.add_argument("--bits", type=int, default=2, help="the claims' bit width (default: 2)")
    parser.add_argument("--reference-bits", type=int, default=4, help="claim 3's reference (default: 4)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help=f"write the report of an incomplete store to <out>/ too (default: <out>/{PARTIAL}/)")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    recover_store(args)
    try:
        path, reports, why = write_claims(args.results, args.out, args.model, args.correction, args.bits,
                                          args.reference_bits, args.allow_incomplete)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    for rep in reports:
        for claim in rep.claims:
            print(f"{rep.model} claim {claim.key}: {claim.headline}")
    print(f"claims: {path}")
    if why and not args.allow_incomplete:
        stop(f"{why}: written to {path}, the committed claims.md is unchanged; run `make reproduce-table1` (or "
             "pass --allow-incomplete)", PARTIAL_EXIT)
    if why:
        stop(f"{why}: written to {path} (--allow-incomplete)", PARTIAL_EXIT)


if __name__ == "__main__":
    main()
