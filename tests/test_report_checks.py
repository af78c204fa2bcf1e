"""The report's model checks (jensenkv.report.checks): noise floor, effects against it, teacher-forced fidelity and
the calibrated strengths' cost, on a synthetic store with known answers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jensenkv.report.checks import (calibration_cost_lines, checks_section, effect_lines, floor, noise_floor_section,
                                    teacher_forced_section)
from jensenkv.report.options import load_options
from jensenkv.tracking import ResultsStore
from test_claims import MODEL, PROMPTS, SEEDS, _noise, _write_run, build_store


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = build_store(tmp_path_factory.mktemp("checks") / "results")
    # a calibrated taylor run of rtn INT2 g32: 0.4 dB below taylor at strength 1 on every video
    base = 25 + _noise("base", 1.0)
    _write_run(root, f"{MODEL}-rtn-taylor-cal", "rtn", 2, 32, "taylor", psnr=base + 1.0 + _noise("p1", 0.1) - 0.4,
               dps=0.001 + _noise("d2", 0.002), effective_bits=2.75,
               extra_labels={"calibration": "0123456789abcdef", "strength": "calibrated"})
    videos = len(PROMPTS) * len(SEEDS)
    rows = [{"base": base_, "perturbation": change, "prompt": f"p{i}", "seed": 0,
             "psnr_vs_unperturbed": np.inf if change == "in a batch" else 40.0 + i,
             "identical": change == "in a batch", "psnr_vs_bf16": np.nan if base_ == "bf16" else 25.0,
             "d_psnr_vs_bf16": np.nan if base_ == "bf16" else (0.0 if change == "in a batch" else d * (-1) ** i)}
            for base_ in ("bf16", "rtn INT2 g32 none") for change, d in (("float32 cache", 0.5), ("2 threads", 0.2),
                                                                         ("in a batch", 0.0)) for i in range(videos)]
    rows += [{"base": "quarot+rtn INT2 g32 none", "perturbation": "2 threads", "prompt": f"p{i}", "seed": 0,
              "psnr_vs_unperturbed": np.inf, "identical": True, "psnr_vs_bf16": 27.0, "d_psnr_vs_bf16": 0.0}
             for i in range(videos)]  # harmless changes leave QuaRot bit-identical: a floor of 0
    pd.DataFrame(rows).to_csv(root / "noise_floor.csv", index=False)
    return root


def test_the_floor_is_the_largest_mean_abs_change_of_psnr_on_the_quantized_base(store):
    level, which = floor(pd.read_csv(store / "noise_floor.csv"))
    assert level == pytest.approx(0.5) and which == "rtn INT2 g32 none: float32 cache"  # +-0.5: mean abs 0.5
    text = noise_floor_section(store)
    assert "Noise floor for PSNR effects: 0.50 dB per video (mean abs(dPSNR vs BF16) under 'rtn INT2 g32 none: " \
           "float32 cache')" in text
    batch = next(line for line in text.splitlines() if line.startswith("| bf16") and "in a batch" in line)
    assert [c.strip() for c in batch.split("|")[3:5]] == ["16", "16 of 16"]  # batching never moves a video


def test_each_psnr_effect_is_read_against_the_floor(store):
    opts = load_options(store)[MODEL]
    lines = effect_lines(opts, store, "taylor", 2)
    rtn = next(line for line in lines if "rtn INT2 g32:" in line and "quarot" not in line)
    assert "against its per-video noise floor 0.50 dB (rtn INT2 g32 none: float32 cache)" in rtn
    expected = opts.paired("rtn INT2 g32", "taylor", "psnr").delta  # +1 dB plus the cell's noise
    assert f"dtaylor {expected:+.2f} dB" in rtn and "above the floor" in rtn and abs(expected - 1) < 0.1
    qvg = next(line for line in lines if "qvg" in line)
    assert "noise floor not measured for this setting" in qvg  # no qvg base in the noise floor
    quarot = next(line for line in lines if "quarot" in line)
    assert "bit-identical (floor 0)" in quarot


def test_the_calibrated_strengths_cost_is_stated_against_none_and_strength_one(store):
    (line,) = calibration_cost_lines(load_options(store)[MODEL])
    assert line.startswith("- rtn INT2 g32, taylor")
    against_none, against_taylor = line.split("; ")
    expected = load_options(store)[MODEL].paired("rtn INT2 g32", "taylor", "psnr").delta - 0.4
    assert f"{expected:+.2f} [" in against_none and against_none.endswith("against none")
    assert "-0.40 [-0.40, -0.40]" in against_taylor and against_taylor.endswith("against taylor")


def test_teacher_forced_runs_are_tabulated_per_row_with_chunks(store, tmp_path):
    assert "- missing: no teacher-forced runs" in teacher_forced_section(tmp_path)
    root = store / "teacher_forced"
    for correction, psnr in (("none", 30.0), ("taylor", 32.0)):
        videos = [{"prompt": p, "seed": 0, "index": i, "missing": {},
                   "metrics": {"tf_psnr": psnr + i, "tf_rel_err": 0.01, "tf_latent_rel_err": 0.02},
                   "teacher_forced": [{"chunk": 1, "psnr": psnr + i - 1, "rel_err": 0.01, "latent_rel_err": 0.02},
                                      {"chunk": 2, "psnr": psnr + i + 1, "rel_err": 0.01, "latent_rel_err": 0.02}]}
                  for i, p in enumerate(PROMPTS)]
        labels = {"model": MODEL, "quantizer": "rtn", "method": "rtn", "bits": 2, "group_size": 32,
                  "correction": correction, "strength": 1.0}
        ResultsStore(root).write_record({"run_id": f"tf-{correction}", "labels": labels, "identity": {},
                                         "metrics": {"tf_psnr": psnr + 1.5, "tf_rel_err": 0.01},
                                         "missing": {}, "per_prompt": videos, "created_at": "2026-12-01T00:00:00"})
    text = teacher_forced_section(store)
    mean_index = (len(PROMPTS) - 1) / 2
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| rtn INT2 g32")}
    assert f"| {32 + mean_index:.2f} [" in rows["taylor"] and f"1: {31 + mean_index:.1f}, 2: {33 + mean_index:.1f}" \
        in rows["taylor"]
    assert f"| {30 + mean_index:.2f} [" in rows["none"] and "0.0100 [0.0100, 0.0100] (n=8)" in rows["none"]
    assert "| +2.00 [+2.00, +2.00] (n=8) " in rows["taylor"]  # paired per prompt and seed against none


def test_the_claims_report_carries_the_checks(store):
    from jensenkv.report.claims import write_claims

    path, _ = write_claims(store, store / "claims.md")
    text = path.read_text()
    for heading in ("## Noise floor", "### Effects against the noise floor", "## Teacher-forced fidelity",
                    "## What the calibrated strengths cost"):
        assert heading in text
    assert checks_section(load_options(store)[MODEL], store, "taylor", 2) in text
    # dP_S's reference is the same call with the run's own cache in full precision, not the BF16 run
    assert "P_S(same call, the run's own cache in full precision)" in text and "P_S(BF16)" not in text
