"""Table 1's rows, treatments, pooling and pairing, on synthetic run records (no generation): a new correction
or strength becomes a new line, rotation seeds pool into one row, treated videos pair with the uncorrected ones
by (prompt, seed, rotation seed)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from jensenkv.quant import QuantConfig
from jensenkv.store.record_check import identity_labels
from jensenkv.report.table1 import main
from jensenkv.report.table1_build import build_table1
from jensenkv.hashing import config_hash
from jensenkv.store.results import ResultsStore
from report_testkit import explain_missing

PROMPTS = ("a red square moving right on a dark background", "a blue circle moving up on a gradient background")
SEEDS = (0, 1)


def write_run(root, key: QuantConfig, correction: str = "none", strength: float = 1.0, psnr=None,
              calibration: str | None = None, second_order: bool = False, model: str = "tiny", **metrics) -> str:
    """A finished run's record as the runner writes it (labels, identity, per-video metrics, run means);
    ``psnr(prompt_index, seed, rotation_seed)`` gives each video's PSNR."""
    quantized = key.method != "none"
    identity = {"model": {"kind": "tiny", "name": model}, "weights": "w", "generation": {"steps": 10},
                "key": dataclasses.asdict(key), "value": dataclasses.asdict(key), "sink_chunks": 0,
                "window_chunks": None, "correction": correction, "strength": strength,
                "second_order": second_order, "probe_steps": [0, 3], "prompts": list(PROMPTS), "seeds": list(SEEDS), "metrics": ["psnr"]}
    if calibration is not None:
        identity["calibration"] = calibration
    videos = []
    for i, prompt in enumerate(PROMPTS):
        for seed in SEEDS:
            values = {"content": 1.0, **metrics}
            if quantized and psnr is not None:
                values["psnr"] = float(psnr(i, seed, key.rotation_seed))
            videos.append({"index": len(videos), "prompt": prompt, "seed": seed, "metrics": values, "missing": {}})
    means = {k: sum(v["metrics"][k] for v in videos) / len(videos) for k in videos[0]["metrics"]}
    run_id = config_hash(identity)
    labels = identity_labels(identity)  # a tiny run's identity: its labels are the ones it gives
    ResultsStore(root).write_record(explain_missing({
        "run_id": run_id, "created_at": "2026-12-01T00:00:00+00:00", "identity": identity, "labels": labels,
        "metrics": means, "missing": {}, "vbench_dimensions_used": [], "per_prompt": videos}))
    return run_id


RTN = QuantConfig()
QUAROT = [QuantConfig(rotation="hadamard", rotation_seed=s) for s in (0, 1, 2)]


def base_psnr(i: int, seed: int, rotation_seed: int) -> float:
    """Differs by rotation seed far more than by the correction: mispairing seeds would show."""
    return 20.0 + 10.0 * max(rotation_seed, 0) + i + 0.1 * seed


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "results"
    write_run(root, QuantConfig(method="none"))
    for key in (RTN, *QUAROT):
        write_run(root, key, "none", psnr=base_psnr)
        write_run(root, key, "taylor", psnr=lambda i, s, r: base_psnr(i, s, r) + 1.0)
    return root


def test_rotation_seeds_pool_into_one_row_per_treatment(store):
    table = build_table1(store, correction="taylor").table
    quarot = table[table["quantizer"] == "quarot+rtn"].set_index("treatment")
    assert list(quarot.index) == ["none", "taylor"]  # one row per treatment, not one per seed
    assert (quarot["num_runs"] == 3).all() and (quarot["num_videos"] == 3 * len(PROMPTS) * len(SEEDS)).all()
    assert (quarot["rotation_seeds"] == "0,1,2").all()
    assert quarot.loc["none", "label"] == "QuaRot (3 rotation seeds) + RTN, integer zero"
    videos = [base_psnr(i, s, r) for i in range(len(PROMPTS)) for s in SEEDS for r in (0, 1, 2)]
    assert quarot.loc["none", "psnr"] == pytest.approx(sum(videos) / len(videos))  # mean over every video
    assert len(quarot.loc["none", "run_id"].split(";")) == 3


def test_treated_videos_pair_by_prompt_seed_and_rotation_seed(store):
    table = build_table1(store, correction="taylor").table
    quarot = table[(table["quantizer"] == "quarot+rtn") & (table["treatment"] == "taylor")].iloc[0]
    # every pair differs by exactly +1; pairing across rotation seeds would mix differences of 10s
    assert quarot["delta_psnr"] == pytest.approx(1.0)
    assert quarot["delta_psnr_ci95_low"] == pytest.approx(1.0) and quarot["delta_psnr_ci95_high"] == pytest.approx(1.0)
    # 2 prompts are 2 independent clusters: the exact sign-flip test cannot go below 2/2^2 (the 72 videos behind
    # them do not make it more certain)
    assert quarot["p_psnr"] == pytest.approx(0.5) and quarot["num_clusters"] == len(PROMPTS)
    # (a difference of means would be +1 whatever the pairing: the zero-width interval above is what pairs)


def test_a_new_correction_or_strength_becomes_a_new_line_without_code_changes(store, tmp_path):
    write_run(store, RTN, "taylor", second_order=True, psnr=lambda i, s, r: base_psnr(i, s, r) + 2.0)
    write_run(store, RTN, "taylor", strength=0.5, psnr=lambda i, s, r: base_psnr(i, s, r) + 0.5)
    write_run(store, RTN, "taylor", calibration="results/calibration/strengths_tiny.json",
              psnr=lambda i, s, r: base_psnr(i, s, r) + 0.25)
    t1 = build_table1(store, correction="taylor")
    rtn = t1.table[t1.table["quantizer"] == "rtn"].set_index("treatment")
    assert set(rtn.index) == {"none", "taylor", "taylor, second order", "taylor x0.5",
                              "taylor, calibration strengths_tiny"}
    assert rtn.loc["taylor, second order", "delta_psnr"] == pytest.approx(2.0)
    assert rtn.loc["taylor x0.5", "delta_psnr"] == pytest.approx(0.5)
    assert rtn.loc["taylor, calibration strengths_tiny", "delta_psnr"] == pytest.approx(0.25)
    lines = t1.paper[t1.paper["quantizer"] == "RTN, integer zero"].set_index("correction")
    assert set(lines.index) == {"none -> taylor", "none -> taylor, second order", "none -> taylor x0.5",
                                "none -> taylor, calibration strengths_tiny"}
    base = f"{rtn.loc['none', 'psnr']:.2f}"
    treated = rtn.loc["taylor, second order", "psnr"]
    assert lines.loc["none -> taylor, second order", "PSNR"] == f"{base} -> {treated:.2f}"
    with pytest.raises(SystemExit) as partial:  # written, and exit 1: the store lacks the other quantizers
        main(["--results", str(store), "--out", str(tmp_path / "out"), "--no-figures", "--allow-incomplete"])
    assert partial.value.code == 1
    md = (tmp_path / "out" / "table1.md").read_text()
    assert "none -> taylor, second order" in md and "QuaRot (3 rotation seeds) + RTN, integer zero" in md


def test_grid_options_are_spelled_out_as_rows(tmp_path):
    root = tmp_path / "results"
    write_run(root, QuantConfig(method="none"))
    keys = {"RTN, integer zero": RTN,
            "RTN, min-aligned zero": QuantConfig(zero_point="min_aligned"),
            "RTN, min-aligned zero, subtractive dither": QuantConfig(dither="subtractive"),
            "RTN, integer zero, channel-mean smoothing": QuantConfig(smoothing="channel_mean"),
            "QVG, 16 centroids, symmetric": QuantConfig(method="qvg", symmetric=True, group_size=64,
                                                       qvg_kmeans="published", qvg_centroids=16)}
    for key in keys.values():
        for c in ("none", "taylor"):
            write_run(root, key, c, psnr=base_psnr)
    table = build_table1(root).table
    assert set(table["label"]) == {"BF16", *keys}
    assert len(table) == 1 + 2 * len(keys)  # QVG's own block (64) is kept although the RTN rows use g=32


def test_a_treated_seed_without_its_uncorrected_twin_makes_the_table_incomplete(tmp_path):
    root = tmp_path / "results"
    write_run(root, QuantConfig(method="none"))
    for key in QUAROT:
        write_run(root, key, "taylor", psnr=base_psnr)
    for key in QUAROT[:2]:
        write_run(root, key, "none", psnr=base_psnr)
    t1 = build_table1(root)
    assert any("rotation seed 2: no uncorrected twin" in gap for gap in t1.missing_rows)
    quarot = t1.table[(t1.table["quantizer"] == "quarot+rtn") & (t1.table["treatment"] == "taylor")].iloc[0]
    assert quarot["num_videos"] == 3 * len(PROMPTS) * len(SEEDS)
    assert not math.isnan(quarot["delta_psnr"])  # the pairs that exist are still tested


def test_runs_of_another_context_never_join_a_row(store):
    other = dataclasses.replace(RTN)
    run_id = write_run(store, other, "taylor", psnr=base_psnr)
    record = ResultsStore(store).read_record(run_id)
    record["identity"]["seeds"] = [5]  # another seed: its videos too, or the record is damaged
    record["per_prompt"] = videos = [{**video, "seed": 5} for video in record["per_prompt"] if video["seed"] == SEEDS[0]]
    record["metrics"] = {k: sum(v["metrics"][k] for v in videos) / len(videos) for k in record["metrics"]}  # theirs
    record["run_id"] = run_id2 = config_hash(record["identity"])
    ResultsStore(store).write_record(record)
    t1 = build_table1(store)
    assert run_id2 not in ";".join(t1.table["run_id"]) and any(run_id2 in line for line in t1.selection.left_out)


def test_treatment_labels_name_the_correction_strength_and_calibration():
    from jensenkv.report.rows import treatment_label

    assert treatment_label({"correction": "none", "strength": 0.5}) == "none"  # nothing corrected: the baseline
    assert treatment_label({"correction": "taylor", "strength": 1.0, "calibration": None}) == "taylor"
    assert treatment_label({"correction": "exact", "strength": 0.25}) == "exact x0.25"
    assert treatment_label({"correction": "taylor", "strength": 1.0,
                            "calibration": {"path": "results/calibration/tiny_layers.json", "sha": "ab"}}) \
        == "taylor, calibration tiny_layers"
    assert treatment_label({"correction": "taylor", "strength": "fitted"}) == "taylor, strength fitted"
    assert treatment_label({"correction": "taylor", "strength": 1.0, "second_order": True}) == "taylor, second order"
    assert treatment_label({"correction": "taylor", "strength": 1.0, "second_order": False}) == "taylor"


def test_what_a_models_table_lacks_names_only_that_model(tmp_path):
    """``report.claims --model X`` on a store holding several models: its gaps are X's rows, not the others'."""
    from jensenkv.report.claims import claims_gaps
    from jensenkv.report.table1_build import missing_rows

    write_run(tmp_path, RTN, psnr=lambda i, s, r: 20.0)
    write_run(tmp_path, RTN, psnr=lambda i, s, r: 20.0, model="other")
    for gaps in (missing_rows(tmp_path, model="tiny"), claims_gaps(tmp_path, "taylor", model="tiny")):
        assert gaps and all("other" not in gap for gap in gaps)
    assert any(gap.startswith("other ") for gap in missing_rows(tmp_path))
