"""The report's model checks (jensenkv.report.checks): noise floor, effects against it, teacher-forced fidelity and
the calibrated strengths' cost, on a synthetic store with known answers."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from jensenkv.report.checks import (calibration_cost_lines, checks_section, effect_lines, floor, noise_floor_section,
                                    teacher_forced_section)
from jensenkv.report.options import load_options
from jensenkv.hashing import config_hash
from jensenkv.store.results import ResultsStore
from test_claims import MODEL, PROMPTS, SEEDS, _noise, _write_run, build_store
from report_testkit import video_means


def _tf_identity(correction: str, videos: list[dict]) -> dict:
    """The run id and identity of a synthetic teacher-forced run of ``videos`` (the id hashes the identity)."""
    identity = {"name": "teacher-forced", "correction": correction, "metrics": ["teacher_forced"],
                "prompts": list(dict.fromkeys(v["prompt"] for v in videos)),
                "seeds": list(dict.fromkeys(v["seed"] for v in videos))}
    return {"run_id": config_hash(identity), "identity": identity}


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
        ResultsStore(root).write_record({**_tf_identity(correction, videos), "labels": labels,
                                         "metrics": video_means(videos),
                                         "missing": {}, "per_prompt": videos, "created_at": "2026-12-01T00:00:00"})
    text = teacher_forced_section(store)
    mean_index = (len(PROMPTS) - 1) / 2
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| rtn INT2 g32")}
    assert f"| {32 + mean_index:.2f} [" in rows["taylor"] and f"1: {31 + mean_index:.1f}, 2: {33 + mean_index:.1f}" \
        in rows["taylor"]
    assert f"| {30 + mean_index:.2f} [" in rows["none"]
    assert "0.0100 [0.0100, 0.0100] (n=8 prompts, 8 videos)" in rows["none"]
    assert "| +2.00 [+2.00, +2.00] (n=8 prompts, 8 videos) " in rows["taylor"]  # paired per video, then over prompts


def test_the_claims_report_carries_the_checks(store):
    from jensenkv.report.claims import write_claims

    path, _, _ = write_claims(store, store)
    text = path.read_text()
    for heading in ("## Noise floor", "### Effects against the noise floor", "## Teacher-forced fidelity",
                    "## What the calibrated strengths cost"):
        assert heading in text
    assert checks_section(load_options(store)[MODEL], store, "taylor", 2) in text
    # dP_S's reference is the same call with the run's own cache in full precision, not the BF16 run
    assert "P_S(same call, the run's own cache in full precision)" in text and "P_S(BF16)" not in text


# --- the one clustering rule: intervals over prompts, seeds nested in them --------------------------------
_INTERVAL = re.compile(r"([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\] \(n=(\d+) prompts, (\d+) videos\)")


def _clustered_floor(root: Path, rng: np.random.Generator, prompts: int, seeds: int, mean: float) -> pd.DataFrame:
    """A noise floor whose dPSNR vs BF16 varies mostly between prompts (s.d. 1) and little within (s.d. 0.2)."""
    effects = rng.normal(mean, 1.0, prompts)
    rows = [{"base": "rtn INT2 g32 none", "perturbation": "float32 cache", "prompt": f"p{i}", "seed": seed,
             "psnr_vs_unperturbed": 40.0, "identical": False, "psnr_vs_bf16": 25.0,
             "d_psnr_vs_bf16": effects[i] + rng.normal(0.0, 0.2)} for i in range(prompts) for seed in range(seeds)]
    frame = pd.DataFrame(rows)
    frame.to_csv(root / "noise_floor.csv", index=False)
    return frame


def _floor_interval(root: Path) -> tuple[float, float, float, int, int]:
    line = next(line for line in noise_floor_section(root).splitlines() if line.startswith("| rtn INT2 g32 none"))
    mean, low, high, n, videos = _INTERVAL.findall(line)[-1]  # the last interval of the row: dPSNR vs BF16
    return float(mean), float(low), float(high), int(n), int(videos)


def test_noise_floor_interval_runs_over_prompts_with_seeds_nested(tmp_path):
    """Known answer: the Student-t interval over the 4 prompt means (seeds averaged first), n = 4 prompts, 24 videos."""
    frame = _clustered_floor(tmp_path, np.random.default_rng(3), prompts=4, seeds=6, mean=0.0)
    means = frame.groupby("prompt")["d_psnr_vs_bf16"].mean().to_numpy()  # (4,)
    half = stats.t.ppf(0.975, 3) * means.std(ddof=1) / 2.0
    mean, low, high, n, videos = _floor_interval(tmp_path)
    assert (n, videos) == (4, 24)
    assert (mean, low, high) == pytest.approx((means.mean(), means.mean() - half, means.mean() + half), abs=0.006)


def test_noise_floor_interval_covers_at_the_nominal_level_on_clustered_videos(tmp_path):
    """200 stores of 6 prompts x 4 seeds, true mean 0.3: the interval over prompts covers ~0.95 of the time; an
    interval over the 24 videos as if independent (the control, what the section printed before) covers far less."""
    rng, truth = np.random.default_rng(11), 0.3
    covered = naive = 0
    for _ in range(200):
        frame = _clustered_floor(tmp_path, rng, prompts=6, seeds=4, mean=truth)
        _, low, high, _, _ = _floor_interval(tmp_path)
        covered += low <= truth <= high
        x = frame["d_psnr_vs_bf16"].to_numpy()
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        naive += abs(x.mean() - truth) <= half
    assert 0.91 <= covered / 200 <= 0.99
    assert naive / 200 < 0.8


def test_teacher_forced_difference_runs_over_prompts(store, tmp_path):
    """Two seeds per prompt: the paired tf PSNR difference is the t interval over the prompts' mean differences."""
    root = tmp_path / "teacher_forced"
    prompts, rng = ["a", "b", "c", "d", "e"], np.random.default_rng(4)
    shifts = {p: 1.0 + rng.normal(0, 0.5) for p in prompts}  # the correction's gain differs between prompts
    for correction in ("none", "taylor"):
        videos = [{"prompt": p, "seed": seed, "missing": {},
                   "metrics": {"tf_psnr": 30.0 + (shifts[p] + 0.01 * seed if correction == "taylor" else 0.0),
                               "tf_rel_err": 0.01}} for p in prompts for seed in (0, 1)]
        labels = {"model": MODEL, "quantizer": "rtn", "method": "rtn", "bits": 2, "group_size": 32,
                  "correction": correction, "strength": 1.0}
        ResultsStore(root).write_record({**_tf_identity(correction, videos), "labels": labels,
                                         "metrics": video_means(videos), "missing": {},
                                         "per_prompt": videos, "created_at": "2026-12-01T00:00:00"})
    line = next(line for line in teacher_forced_section(tmp_path).splitlines() if "| taylor" in line)
    mean, low, high, n, videos = (float(v) for v in _INTERVAL.findall(line)[0])
    d = np.array([shifts[p] + 0.005 for p in prompts])  # (5,) per-prompt mean difference over its two seeds
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert (n, videos) == (5, 10)
    assert (mean, low, high) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half), abs=0.006)
