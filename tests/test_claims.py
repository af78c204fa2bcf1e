"""The claims report: the verdict rule, a report rendered from a synthetic results store whose answers are known,
missing data reported as missing, the per-layer diagnostics, their figure and notebook."""
from __future__ import annotations

import math
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jensenkv.report.claims import main, write_claims
from jensenkv.report.claims_markdown import render
from jensenkv.report.paper_claims import build_report
from jensenkv.report.diagnostics import per_layer, plot_diagnostics, reading, uncorrected_diagnostics
from jensenkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE, MISSING, decide, side_of, summarize
from jensenkv.hashing import config_hash
from jensenkv.report.store_frame import COMPARED
from jensenkv.store.files import atomic_write
from jensenkv.store.results import ResultsStore
from report_testkit import explain_missing

# 8 prompts: the independent units of every test (the exact sign-flip floor is 2/2^8, below 0.05 after Holm)
PROMPTS = ("a red square", "a blue circle", "a green square", "a white circle", "a red circle", "a blue square",
           "a green circle", "a white square")
SEEDS = (0, 1)
MODEL = "synthetic-video-model"  # not the built-in model: nothing may depend on "tiny"
INTERVAL = re.compile(r"[+-]?\d+\.\d+ \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]")


# --- the verdict rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("side, p, expected", [
    (HOLDS, 0.01, HOLDS), (FAILS, 0.01, FAILS), (HOLDS, 0.05, INCONCLUSIVE), (FAILS, 0.3, INCONCLUSIVE),
    (HOLDS, math.nan, MISSING),
])
def test_verdict_rule(side, p, expected):
    assert decide(side, p) == expected


def test_side_of_a_reference():
    assert side_of(4.5, "above", reference=4.38) == HOLDS and side_of(4.0, "above", reference=4.38) == FAILS
    assert side_of(-0.1, "below") == HOLDS and side_of(0.0, "below") == FAILS  # strict
    with pytest.raises(ValueError, match="claimed='higher' is not allowed"):
        side_of(0.1, "higher")
    with pytest.raises(ValueError, match="side='maybe' is not allowed"):
        decide("maybe", 0.01)


def test_summary_over_options():
    rtn, quarot, qvg = frozenset({"RTN", "g32"}), frozenset({"hadamard rotation", "RTN", "g32"}), frozenset({"QVG", "g32"})
    assert summarize([("rtn", rtn, HOLDS), ("quarot+rtn", quarot, HOLDS)]) == "holds: holds in 2 of 2 (rtn, quarot+rtn)"
    assert summarize([("rtn", rtn, FAILS), ("quarot+rtn", quarot, HOLDS), ("qvg", qvg, INCONCLUSIVE)]) == (
        "mixed: holds in 1 of 3 (quarot+rtn), does not hold in 1 (rtn), inconclusive in 1")  # one row: no pattern
    assert summarize([("rtn", rtn, FAILS), ("quarot+rtn", quarot, HOLDS), ("quarot-2", quarot, HOLDS)]) == (
        "mixed: holds in 2 of 3 (quarot+rtn, quarot-2), does not hold in 1 (rtn); "
        "only the rows with hadamard rotation hold")
    assert summarize([("rtn", rtn, FAILS), ("qvg", qvg, FAILS)], "reversed") == "reversed: reversed in 2 of 2 (rtn, qvg)"
    assert summarize([("rtn", rtn, FAILS), ("qvg", qvg, INCONCLUSIVE)], "reversed") == \
        "reversed in part: reversed in 1 of 2 (rtn), inconclusive in 1"
    assert summarize([("rtn", rtn, MISSING), ("qvg", qvg, HOLDS)]) == "holds: holds in 1 of 1 (qvg), missing for 1"
    assert summarize([("rtn", rtn, MISSING)]) == MISSING
    assert summarize([]) == MISSING


# --- a synthetic results store ---------------------------------------------------------------------------
def _noise(key: str, scale: float) -> np.ndarray:
    """Fixed per-video noise (one value per prompt x seed), seeded by the cell's name."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.normal(0.0, scale, len(PROMPTS) * len(SEEDS))


def _write_run(root: Path, name: str, quantizer: str, bits: int, group: int | None, correction: str, *,
               psnr: np.ndarray | None = None, dps: np.ndarray | None = None, rotation_seed: int = 0,
               effective_bits: float | None = None, diagnostics: dict | None = None, model: str = MODEL,
               extra_labels: dict | None = None) -> None:
    """One finished run: a record with per-video rows and, when ``diagnostics`` is given ({layer: (first_order,
    jensen, b)}), an attention.csv with em_* keys. ``name`` only labels the call: as in a real store, the run id
    is the identity's hash (a compared label in ``extra_labels``, e.g. a calibration, is in the identity too)."""
    method = "none" if quantizer == "bf16" else ("qvg" if quantizer.startswith("qvg") else "rtn")
    labels = {"model": model, "quantizer": quantizer, "method": method, "bits": bits, "group_size": group,
              "granularity": None if quantizer == "bf16" else "token_group",
              "rotation": "hadamard" if quantizer.startswith("quarot") else "none", "values": "same",
              "correction": correction, "strength": 1.0, "sink_chunks": 0, "window_chunks": None,
              **(extra_labels or {})}
    identity = {"model": {"name": model, "kind": "synthetic"}, "weights": None, "generation": {"steps": 2},
                "key": {"method": method, "label": quantizer, "bits": bits, "group_size": group,
                        "rotation": labels["rotation"], "rotation_seed": rotation_seed},
                "value": {"method": method}, "sink_chunks": 0, "window_chunks": None, "correction": correction,
                "strength": 1.0, "prompts": list(PROMPTS), "seeds": list(SEEDS), "metrics": ["attention", "psnr"],
                **{k: v for k, v in (extra_labels or {}).items() if k in COMPARED and k != "strength"}}
    run_id = config_hash(identity)
    videos = []
    for i, (prompt, seed) in enumerate((p, s) for p in PROMPTS for s in SEEDS):
        metrics = {}
        if psnr is not None:
            metrics["psnr"] = float(psnr[i])
        if dps is not None:
            metrics["delta_p_s_mean"] = float(dps[i])
            metrics["delta_p_s_abs_mean"] = abs(float(dps[i])) + 0.001  # layers differ: the mean |dP_S| is larger
        videos.append({"prompt": prompt, "seed": seed, "index": i, "metrics": metrics})
    run_metrics = {"effective_bits": effective_bits} if effective_bits is not None else {}
    if psnr is not None:
        run_metrics["psnr"] = float(np.mean(psnr))
    if dps is not None:
        run_metrics["delta_p_s_mean"] = float(np.mean(dps))
    missing = {"lpips": "LPIPS backbone weights not found (synthetic store)"} if quantizer != "bf16" else {}
    if diagnostics:
        rows = []
        for i, (p, seed) in enumerate((p, s) for p in range(len(PROMPTS)) for s in SEEDS):
            for layer, (first, jensen, b) in diagnostics.items():
                for step in (0, 1, None):  # None: the commit pass, which the diagnostics leave out
                    wobble = 0.01 if (p + layer) % 2 else -0.01  # averages to 0 over the prompts, differs between them
                    rows.append({"prompt_index": p, "seed": seed, "layer": layer, "step": -1 if step is None else step,
                                 "chunk": 1, "branch": "cond", "p_s": 0.8, "p_s_ref": 0.79, "delta_p_s": 0.01,
                                 "em_slope": -0.2, "em_corr": -0.4, "em_mean_err": -0.05, "em_mean_err_small": -0.3,
                                 "em_var_ratio": 0.5, "em_predicted_jensen": 0.8 * b, "em_first_order": first + wobble,
                                 "em_jensen": jensen, "em_log_zs_shift": first + wobble + jensen,
                                 "em_predicted_taylor": b if step is not None else 99.0, "em_n_eff": 10.0 + layer,
                                 "em_n_eff_fraction": 0.05})
        frame = pd.DataFrame(rows)
        atomic_write(ResultsStore(root).run_dir(run_id) / "attention.csv", lambda f: frame.to_csv(f, index=False),
                     mode="w")
        run_metrics["em_log_zs_shift_mean"] = float(frame["em_log_zs_shift"].mean())
    ResultsStore(root).write_record(explain_missing({
        "run_id": run_id, "labels": labels, "identity": identity, "metrics": run_metrics, "missing": missing,
        "per_prompt": videos, "created_at": "2026-12-01T00:00:00"}))


DIAG = {0: (-0.30, 0.10, 0.12), 1: (0.0, 0.10, 0.10)}  # layer: (first order, Jensen, b)


def build_store(root: Path, *, int4: bool = True, diagnostics: bool = True, model: str = MODEL) -> Path:
    """Known answers: RTN INT2 g32 steals mass and the correction fixes it and PSNR (claims 1 and 2 hold);
    QuaRot (two rotation seeds) loses mass and the correction makes it worse (does not hold); QVG's
    differences are noise (inconclusive); corrected INT2 g128 beats INT4 g64, INT2 g32 does not (claim 3)."""
    n = len(PROMPTS) * len(SEEDS)
    base = 25 + _noise("base", 1.0)

    def w(cell: str, quantizer: str, bits: int, group: int | None, correction: str, **kw) -> None:
        _write_run(root, f"{model}-{cell}", quantizer, bits, group, correction, model=model, **kw)

    diag = DIAG if diagnostics else None
    w("bf16", "bf16", 16, None, "none")
    w("rtn-none", "rtn", 2, 32, "none", psnr=base, dps=0.02 + _noise("d1", 0.002), effective_bits=2.75,
      diagnostics=diag)
    w("rtn-taylor", "rtn", 2, 32, "taylor", psnr=base + 1.0 + _noise("p1", 0.1), dps=0.001 + _noise("d2", 0.002),
      effective_bits=2.75)
    for seed in (0, 1):
        q = 27 + _noise(f"q{seed}", 1.0)
        w(f"quarot{seed}-none", "quarot+rtn", 2, 32, "none", psnr=q, dps=-0.01 + _noise(f"qd{seed}", 0.002),
          rotation_seed=seed, effective_bits=2.75, diagnostics=diag)
        w(f"quarot{seed}-taylor", "quarot+rtn", 2, 32, "taylor", psnr=q - 1.0 + _noise(f"qp{seed}", 0.1),
          dps=-0.03 + _noise(f"qt{seed}", 0.002), rotation_seed=seed, effective_bits=2.75)
    alternating = np.array([0.5, -0.5] * (n // 2))
    w("qvg-none", "qvg", 2, 64, "none", psnr=base, dps=np.full(n, 0.004) + _noise("v", 0.001), effective_bits=4.8)
    w("qvg-taylor", "qvg", 2, 64, "taylor", psnr=base + alternating, dps=0.004 + alternating / 100,
      effective_bits=4.8)
    w("g128-taylor", "rtn", 2, 128, "taylor", psnr=base + 6 + _noise("g", 0.2), dps=_noise("gd", 0.001),
      effective_bits=2.19)
    if int4:
        w("int4-none", "rtn", 4, 64, "none", psnr=base + 5 + _noise("i4", 0.2), dps=_noise("i4d", 0.001),
          effective_bits=4.38)
    return root


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("claims") / "results")


@pytest.fixture(scope="module")
def report(store):
    (rep,) = build_report(store)
    return rep


def _claim(rep, key):
    return next(c for c in rep.claims if c.key == key)


def _verdicts(claim) -> dict[str, str]:
    return {e.option: e.verdict for e in claim.entries}


def test_claim_1_per_quantizer(report):
    a, b = _claim(report, "1a"), _claim(report, "1b")
    assert _verdicts(a) == {"rtn INT2 g32": HOLDS, "quarot+rtn INT2 g32": FAILS, "qvg INT2 g64": HOLDS}
    assert a.summary == ("mixed: holds in 2 of 3 (rtn INT2 g32, qvg INT2 g64), reversed in 1 (quarot+rtn INT2 g32); "
                         "only the rows with no rotation hold")
    # 1b is equivalence within the margin on the corrected mean |dP_S|: rtn (0.002) and qvg (~0.006) are within
    # 0.015, quarot (0.031) is not
    assert _verdicts(b) == {"rtn INT2 g32": HOLDS, "quarot+rtn INT2 g32": FAILS, "qvg INT2 g64": HOLDS}
    assert b.summary.startswith("mixed: holds in 2 of 3 (rtn INT2 g32, qvg INT2 g64), does not hold in 1 (quarot")
    # g128 has only a corrected run: no uncorrected dP_S to test, so it is not a claim-1 option
    assert all("g128" not in e.option for e in a.entries)


def test_claim_2_paired_per_video(report):
    psnr = _claim(report, "2 (PSNR)")
    assert _verdicts(psnr) == {"rtn INT2 g32": HOLDS, "quarot+rtn INT2 g32": FAILS, "qvg INT2 g64": INCONCLUSIVE}
    rtn = next(e for e in psnr.entries if e.option == "rtn INT2 g32")
    delta = float(rtn.numbers["dPSNR [95% CI]"].split()[0])
    assert delta == pytest.approx(1.0 + _noise("p1", 0.1).mean(), abs=0.01)  # the paired mean, per video
    assert (rtn.power.n, rtn.power.num_videos) == (len(PROMPTS), len(PROMPTS) * len(SEEDS))
    assert rtn.primary and rtn.p_adjusted == rtn.p == 2 / 2 ** len(PROMPTS)  # exact floor, tested alone


def test_rotation_seeds_are_pooled_and_paired_within_a_seed(report):
    quarot = next(e for e in _claim(report, "2 (PSNR)").entries if e.option == "quarot+rtn INT2 g32")
    assert quarot.power.num_videos == 2 * len(PROMPTS) * len(SEEDS)  # 2 rotation seeds x prompts x seeds ...
    assert quarot.power.n == len(PROMPTS)  # ... nested in their prompts
    expected = np.mean([(-1.0 + _noise(f"qp{s}", 0.1)).mean() for s in (0, 1)])  # pairs never cross seeds
    assert float(quarot.numbers["dPSNR [95% CI]"].split()[0]) == pytest.approx(expected, abs=0.01)
    assert "2 seeds pooled" in " ".join(report.options["variant"])


def test_claim_3_against_int4(report):
    psnr = _claim(report, "3 (PSNR)")
    assert _verdicts(psnr) == {"rtn INT2 g32 + taylor vs rtn INT4 g64": FAILS,
                               "rtn INT2 g128 + taylor vs rtn INT4 g64": HOLDS}
    assert psnr.summary == ("mixed: holds in 1 of 2 (rtn INT2 g128 + taylor vs rtn INT4 g64), does not hold in 1 "
                            "(rtn INT2 g32 + taylor vs rtn INT4 g64)")  # one row: no shared setting is claimed
    g128 = next(e for e in psnr.entries if "g128" in e.option)
    assert g128.numbers["effective bits"] == "2.19 vs 4.38 (-50%)"
    assert any(m.startswith("quarot+rtn: no uncorrected INT4 run") for m in psnr.missing)
    assert any(m.startswith("qvg: no uncorrected INT4 run") for m in psnr.missing)


def test_every_verdict_has_an_interval_and_missing_metrics_say_why(report, store):
    for claim in report.claims:
        for entry in claim.entries:
            if entry.verdict == MISSING:
                assert entry.reason, (claim.key, entry.option)
            else:
                assert any(INTERVAL.search(text) for text in entry.numbers.values()), (claim.key, entry.option)
    lpips = _claim(report, "2 (LPIPS)")
    assert lpips.summary == MISSING
    assert {e.reason for e in lpips.entries} == {"LPIPS backbone weights not found (synthetic store)"}
    text = render([report], store, "taylor")
    for claim in report.claims:
        assert f"### Claim {claim.key}:" in text
    assert "LPIPS backbone weights not found (synthetic store)" in text
    assert "**mixed: holds in 1 of 2 (rtn INT2 g128 + taylor vs rtn INT4 g64)" in text and "Verdict rule." in text


def test_options_side_by_side(report):
    table = report.options
    assert list(dict.fromkeys(table["option"])) == ["rtn INT2 g32", "rtn INT2 g128", "rtn INT4 g64",
                                                    "quarot+rtn INT2 g32", "qvg INT2 g64"]
    rtn = table[table["option"] == "rtn INT2 g32"].set_index("variant")
    assert rtn.loc["none", "dPSNR vs none, p"] == "-"
    assert INTERVAL.match(rtn.loc["taylor", "dPSNR vs none, p"]) and "p=" in rtn.loc["taylor", "dPSNR vs none, p"]


def test_new_options_appear_without_code_changes(tmp_path):
    root = build_store(tmp_path / "results")
    base = 25 + _noise("base", 1.0)
    _write_run(root, "calibrated", "rtn", 2, 32, "taylor", psnr=base + 2, dps=_noise("c", 0.001),
               extra_labels={"calibration": "calibrated"})
    _write_run(root, "second-order", "rtn", 2, 32, "taylor2", psnr=base + 0.5, dps=_noise("t2", 0.001))
    _write_run(root, "dither-none", "rtn+dither", 2, 32, "none", psnr=base - 1, dps=_noise("dn", 0.001))
    (rep,) = build_report(root)
    rtn = rep.options[rep.options["option"] == "rtn INT2 g32"]
    assert {"none", "taylor", "taylor2", "taylor calibration=calibrated"} == set(rtn["variant"])
    calibrated = rtn.set_index("variant").loc["taylor calibration=calibrated", "dPSNR vs none, p"]
    assert float(calibrated.split()[0]) == pytest.approx(2.0)
    assert "rtn+dither INT2 g32" in set(rep.options["option"])


def test_claim_3_averages_rotation_seeds_per_video(tmp_path):
    """INT2 over two rotation seeds against INT4 run at one: one pair per (prompt, seed), none dropped."""
    root = build_store(tmp_path / "results")
    base = 30 + _noise("rot", 1.0)
    for seed in (0, 1):
        _write_run(root, f"rot-int2-{seed}", "quarot+rtn", 2, 128, "taylor", psnr=base - 1 - seed,
                   rotation_seed=seed, effective_bits=2.19)
    _write_run(root, "rot-int4", "quarot+rtn", 4, 128, "none", psnr=base, rotation_seed=0, effective_bits=4.38)
    (rep,) = build_report(root)
    entry = next(e for e in _claim(rep, "3 (PSNR)").entries if e.option.startswith("quarot+rtn INT2 g128"))
    assert (entry.power.n, entry.power.num_videos) == (len(PROMPTS), len(PROMPTS) * len(SEEDS))
    assert float(entry.numbers["dPSNR [95% CI]"].split()[0]) == pytest.approx(-1.5)  # mean of -1 and -2


# --- missing data ----------------------------------------------------------------------------------------
def test_missing_diagnostics_and_int4_are_reported(tmp_path):
    root = build_store(tmp_path / "results", int4=False, diagnostics=False)
    path, (rep,), why = write_claims(root)
    assert path.parent.name == "partial" and "claims is incomplete, missing:" in why
    text = path.read_text()
    assert "no uncorrected INT2 run of synthetic-video-model recorded the error-model diagnostics" in text
    assert "attention.diagnostics=true" in text
    assert "rtn: no uncorrected INT4 run to compare with" in text
    assert _claim(rep, "3 (PSNR)").summary == MISSING


def test_empty_store_and_unknown_model_fail_clearly(tmp_path, store):
    with pytest.raises(SystemExit, match="no finished runs under"):
        main(["--results", str(tmp_path / "nothing")])
    with pytest.raises(SystemExit, match="--model='other' is not allowed: the store has runs of"):
        main(["--results", str(store), "--model", "other"])


def test_each_model_has_its_own_section_and_model_filters(tmp_path):
    root = build_store(tmp_path / "results")
    build_store(root, model="second-model")
    assert [r.model for r in build_report(root)] == ["second-model", MODEL]
    with pytest.raises(SystemExit, match="claims is incomplete"):  # a synthetic store: no noise floor, ...
        main(["--results-dir", str(root), "--model", "second-model", "--out", str(tmp_path)])  # the old spelling
    text = (tmp_path / "partial" / "claims.md").read_text()
    assert "## second-model" in text and f"## {MODEL}" not in text


# --- per-layer diagnostics -------------------------------------------------------------------------------
def test_per_layer_diagnostics_means_and_readings(store):
    diag = uncorrected_diagnostics(store, MODEL)
    assert not diag.missing
    table = diag.table.set_index(["row", "layer"])
    assert set(table.index.get_level_values("row")) == {"rtn INT2 g32", "quarot+rtn INT2 g32"}
    layer0 = table.loc[("rtn INT2 g32", 0)]
    # commit-pass probes (step -1, b = 99) are left out
    assert layer0["predicted_taylor"] == pytest.approx(0.12)
    assert layer0["first_order"] == pytest.approx(-0.30)
    assert layer0["residual"] == pytest.approx(-0.30 + 0.10 - 0.12)
    assert layer0["residual_low"] < layer0["residual"] < layer0["residual_high"]
    assert table.loc[("quarot+rtn INT2 g32", 0), "videos"] == 2 * len(PROMPTS) * len(SEEDS)  # two rotation seeds pooled
    assert table.loc[("quarot+rtn INT2 g32", 0), "prompts"] == len(PROMPTS)  # ... nested in their prompts
    assert "first-order shift -0.3 dominates the Jensen term +0.1" in layer0["reading"]
    assert "over-corrects" in layer0["reading"]
    assert "0 within its 95% CI" in table.loc[("rtn INT2 g32", 1), "reading"]


@pytest.mark.parametrize("first, jensen, b, words", [
    (0.0, 0.20, 0.10, "helps"),                 # under-corrects but shrinks the shift
    (0.0, 0.20, 0.30, "helps (overshoots)"),    # past 0 but closer to it
    (0.0, 0.10, 0.50, "over-corrects"),         # past 0 and further from it
    (-0.3, 0.10, 0.10, "is not inflated"),      # already negative: b can only make it worse
])
def test_reading_rule(first, jensen, b, words):
    text = reading({"first_order": first, "jensen": jensen, "log_zs_shift": first + jensen, "predicted_taylor": b})
    assert words in text


def test_the_jensen_term_is_read_against_sum_pi_one_minus_pi_b_and_the_overshoot_it_predicts():
    """b = 0.30 against a Jensen term of 0.24: with sum pi(1-pi) b = 0.24 that is the model's own prediction
    (1x), and the overshoot left (-0.06 = -sum pi^2 b) is what it predicts too."""
    text = reading({"first_order": 0.0, "jensen": 0.24, "log_zs_shift": 0.24, "predicted_taylor": 0.30,
                    "predicted_jensen": 0.24, "mean_err": -0.01, "mean_err_small": -0.4})
    assert "(1x its prediction sum pi(1-pi) b = 0.24)" in text
    assert "overshoots; the model predicts -0.06" in text
    assert "mean error -0.01 steps (-0.4 on small channels)" in text


def test_the_report_shows_the_jensen_prediction_and_the_mean_error(store):
    from jensenkv.report.diagnostics import render_diagnostics

    text = render_diagnostics(uncorrected_diagnostics(store, MODEL))
    assert "Σπ(1-π)b" in text and "mean e/D (small ch.)" in text and "corr(k, e)" in text
    assert "theta" not in text
    layer0 = uncorrected_diagnostics(store, MODEL).table.set_index(["row", "layer"]).loc[("rtn INT2 g32", 0)]
    assert layer0["predicted_jensen"] == pytest.approx(0.8 * 0.12) and layer0["mean_err_small"] == pytest.approx(-0.3)


def test_per_layer_refuses_probes_without_diagnostics():
    frame = pd.DataFrame({"layer": [0], "step": [0], "delta_p_s": [0.1]})
    with pytest.raises(ValueError, match="attention.diagnostics=true"):
        per_layer({"rtn": frame})


def test_diagnostics_figure_is_written(store, tmp_path):
    from jensenkv.report.figures import write_figures

    written = write_figures(store, tmp_path, model=MODEL)
    path = Path(written["diagnostics"])
    assert path.name == "diagnostics.png" and path.stat().st_size > 10_000
    fig = plot_diagnostics(uncorrected_diagnostics(store, MODEL).table)
    assert len([ax for ax in fig.axes if ax.has_data()]) == 4  # 2 options x (terms, n_eff)
    with pytest.raises(ValueError, match="table is empty"):
        plot_diagnostics(pd.DataFrame())


def test_figure_is_skipped_with_a_reason_without_diagnostics(tmp_path):
    from jensenkv.report.figures import write_figures

    root = build_store(tmp_path / "results", diagnostics=False)
    written = write_figures(root, tmp_path / "figures", model=MODEL)
    assert written["diagnostics"].startswith("skipped: ") and "attention.diagnostics=true" in written["diagnostics"]
    assert not (tmp_path / "figures" / "diagnostics.png").exists()


# --- the notebook ----------------------------------------------------------------------------------------
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "diagnostics.ipynb"


def _execute(results: Path, monkeypatch) -> list[dict]:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JENSENKV_RESULTS", str(results))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # raises on any cell error
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def test_notebook_draws_the_per_layer_story(store, monkeypatch):
    outputs = _execute(store, monkeypatch)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 2  # the figure and one layer's steps
    text = "".join(o.get("text", "") for o in outputs)
    assert f"finished runs under {store.resolve()}" in text
    assert "layer 0: first-order shift -0.3 dominates" in text


def test_notebook_on_a_fresh_clone_says_there_are_no_runs_yet(tmp_path, monkeypatch):
    text = "".join(o.get("text", "") for o in _execute(tmp_path / "results", monkeypatch))
    assert "no finished runs yet" in text and "python -m jensenkv.run -m experiment=" in text
