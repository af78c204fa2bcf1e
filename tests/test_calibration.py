"""Calibrated per-(layer, head) strengths: the fit, the per-head moments it reads, the file a run refuses, and
calibrate -> run end to end on the tiny test weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from jensenkv.attention.diagnostics import HEAD_MOMENT_KEYS
from jensenkv.calibration.fit import calibrate_overrides, fit_strengths, main
from jensenkv.attention.config import layer_strengths
from jensenkv.calibration import CALIBRATION_FORMAT, calibration_identity
from jensenkv.config.tree import AttentionConfig
from jensenkv.run import compose_config, run_overrides
from jensenkv.config.resolve import build_spec
from pipeline_testkit import FAST, fast_overrides

S_TRUE = np.array([[-2.0, 0.5, 1.0], [3.0, -0.7, 0.25]])  # (L, H): signed


def synthetic_moments(rng: np.random.Generator, videos: int = 8, queries: int = 400, noise: float = 0.05,
                      video_noise: float = 0.02) -> np.ndarray:
    """(L, H, V, 6) sums of samples delta = S_TRUE * <b> + noise, with a per-video offset (correlated queries)."""
    layers, heads = S_TRUE.shape
    moments = np.zeros((layers, heads, videos, len(HEAD_MOMENT_KEYS)))
    for layer in range(layers):
        for h in range(heads):
            for v in range(videos):
                x = rng.uniform(0.05, 0.3, queries)  # <b> > 0: the Taylor bias is positive
                y = S_TRUE[layer, h] * x + video_noise * rng.standard_normal() + noise * rng.standard_normal(queries)
                moments[layer, h, v] = [queries, x.sum(), y.sum(), (x * x).sum(), (x * y).sum(), (y * y).sum()]
    return moments


def test_fit_recovers_known_signed_strengths() -> None:
    fit = fit_strengths(synthetic_moments(np.random.default_rng(0)))
    assert fit.strengths.shape == S_TRUE.shape and (fit.num_samples == 8 * 400).all()
    assert (np.abs(fit.strengths - S_TRUE) < 5 * fit.std_error).all()
    assert (np.abs(fit.strengths - S_TRUE) < 0.1).all()
    assert (np.sign(fit.strengths) == np.sign(S_TRUE)).all()
    assert np.allclose(fit.residual_rms, 0.05, rtol=0.3)  # the per-query noise (plus the small video offsets)


def test_fit_standard_error_matches_the_spread_of_refits() -> None:
    """The cluster-robust standard error predicts how much the fitted strength moves between data sets."""
    rng = np.random.default_rng(1)
    fits = [fit_strengths(synthetic_moments(rng, videos=10, queries=50)) for _ in range(60)]
    spread = np.std([f.strengths for f in fits], axis=0)
    predicted = np.mean([f.std_error for f in fits], axis=0)
    assert np.allclose(predicted, spread, rtol=0.4), (predicted, spread)


def test_fit_without_signal_keeps_strength_one_and_no_error() -> None:
    moments = np.zeros((1, 2, 1, len(HEAD_MOMENT_KEYS)))
    moments[0, 1, 0] = [10, 1.0, 2.0, 0.2, 0.4, 0.9]  # one video: a slope but no standard error
    fit = fit_strengths(moments)
    assert fit.strengths[0, 0] == 1.0 and np.isnan(fit.std_error[0, 0]) and fit.num_samples[0, 0] == 0
    assert fit.strengths[0, 1] == pytest.approx(2.0) and np.isnan(fit.std_error[0, 1])
    with pytest.raises(ValueError, match=r"moments.shape=\(2, 6\)"):
        fit_strengths(np.zeros((2, 6)))


def test_t_intervals_cover_with_few_clusters_where_1_96_does_not() -> None:
    """8 videos whose per-video offsets dominate the noise: the cluster-robust SE is right, but 1.96 SE covers
    the true strength only ~0.91 of the time; the t(7) interval (2.36 SE) covers ~0.95 (1,500 data sets: coverage
    SE 0.006)."""
    from jensenkv.calibration.fit import strength_interval, t_critical

    assert t_critical(8) == pytest.approx(2.3646, abs=1e-4) and np.isnan(t_critical(1))
    rng = np.random.default_rng(3)
    videos, queries, hits_t, hits_z, total = 8, 50, 0, 0, 0
    for _ in range(1500):
        x = rng.uniform(0.05, 0.3, (videos, queries))  # (V, Q): <b>
        y = 0.5 * x + 0.05 * rng.standard_normal((videos, 1)) + 0.01 * rng.standard_normal((videos, queries))
        m = np.stack([np.full(videos, queries), x.sum(1), y.sum(1), (x * x).sum(1), (x * y).sum(1), (y * y).sum(1)],
                     axis=-1)[None, None]  # (1, 1, V, 6)
        fit = fit_strengths(m)
        low, high = strength_interval(fit, np.array([[videos]]))
        hits_t += int(low[0, 0] <= 0.5 <= high[0, 0])
        hits_z += int(abs(fit.strengths[0, 0] - 0.5) <= 1.96 * fit.std_error[0, 0])
        total += 1
    assert 0.93 <= hits_t / total <= 0.97, hits_t / total
    assert hits_z / total < 0.935, hits_z / total  # the normal interval is too short with 8 clusters


def test_shrinking_strengths_by_their_standard_error() -> None:
    """s' = target + w (s - target), w = d^2 / (d^2 + SE^2): a precise entry keeps its fit, a noisy one moves to
    the target, one without SE is the target."""
    from jensenkv.calibration.fit import shrink_strengths

    s = np.array([[3.0, 3.0, 1.0, -2.0]])
    se = np.array([[0.01, 2.0, 0.5, np.nan]])
    out = shrink_strengths(s, se, 1.0)
    assert out[0, 0] == pytest.approx(1 + 2 * 4 / (4 + 1e-4))
    assert out[0, 1] == pytest.approx(1 + 2 * 4 / 8)  # SE = |d|: half way
    assert out[0, 2] == 1.0 and out[0, 3] == 1.0
    assert shrink_strengths(s, se, 0.0)[0, 1] == pytest.approx(3 * 9 / 13)
    with pytest.raises(SystemExit) as exit_:  # refused before any video is generated
        main(["--shrink", "nan", "correction=taylor", "model.device=cpu"])
    assert exit_.value.code == 2


def test_calibration_seeds_are_disjoint_from_every_evaluation_preset() -> None:
    calibration = set(compose_config(["eval=calibration"]).eval.seeds)
    for overrides in (["eval=default"], ["eval=natural"], ["experiment=table1"], ["experiment=tradeoff"]):
        assert not calibration & set(compose_config(overrides).eval.seeds), overrides


# --- the file a run reads --------------------------------------------------------------------------------
def write_file(path: Path, spec, strengths=None, prompts=("a magenta square moving left on a dark background",),
               seeds=(1000,), **changes) -> Path:
    """A calibration file fitted (by hand) for ``spec``'s model, quantizer and correction."""
    layers, heads = 4, 1  # the tiny model
    strengths = strengths if strengths is not None else [[0.5 - 0.25 * layer] for layer in range(layers)]
    content = {"format": CALIBRATION_FORMAT, "name": "test", "strengths": strengths,
               "num_samples": [[100] * heads] * layers, "std_error": [[0.1] * heads] * layers, "objective": "test",
               "identity": calibration_identity(spec), "calibration": {"prompts": list(prompts), "seeds": list(seeds)},
               **changes}
    path.write_text(json.dumps(content))
    return path


def spec_of(tmp_path: Path, weights: Path, *extra: str):
    return build_spec(compose_config(fast_overrides(tmp_path / "results", weights, "correction=taylor", *extra)))


def test_a_run_reads_a_calibration_file_into_its_identity_and_labels(tmp_path: Path, tiny_weights: Path) -> None:
    plain = spec_of(tmp_path, tiny_weights)
    one = write_file(tmp_path / "one.json", plain)
    two = write_file(tmp_path / "two.json", plain, strengths=[[-1.0]] * 4)
    first = spec_of(tmp_path, tiny_weights, f"attention.calibration={one}")
    second = spec_of(tmp_path, tiny_weights, f"attention.calibration={two}")
    assert len({plain.run_id, first.run_id, second.run_id}) == 3  # two calibrations are two runs
    assert first.identity()["calibration"] != second.identity()["calibration"] and plain.identity()["calibration"] is None
    assert first.labels()["strength"] == "calibrated" and plain.labels()["strength"] == 1.0
    half = spec_of(tmp_path, tiny_weights, f"attention.calibration={one}", "attention.strength=-0.5")
    assert half.labels()["strength"] == "-0.5x calibrated"
    strengths = layer_strengths(half.attention, 4, 1)
    assert [float(s) for s in strengths] == pytest.approx([-0.25, -0.125, 0.0, 0.125])  # -0.5 x file[l]
    assert all(isinstance(s, torch.Tensor) and s.shape == (1,) for s in strengths)
    # no correction: nothing to scale, the file is dropped and the run is the uncorrected one
    none = spec_of(tmp_path, tiny_weights, f"attention.calibration={one}", "correction=none")
    assert none.attention.calibration is None
    assert none.run_id == spec_of(tmp_path, tiny_weights, "correction=none").run_id


def refusal(tmp_path: Path, weights: Path, path: Path, *extra: str) -> str:
    with pytest.raises(ValueError) as error:
        spec_of(tmp_path, weights, f"attention.calibration={path}", *extra)
    message = str(error.value)
    assert message.startswith(f"attention.calibration={str(path)!r} is not allowed: "), message
    return message


def test_runs_refuse_missing_and_corrupt_files(tmp_path: Path, tiny_weights: Path) -> None:
    plain = spec_of(tmp_path, tiny_weights)
    assert "does not exist" in refusal(tmp_path, tiny_weights, tmp_path / "absent.json")
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{"format": "jensenkv-calibration/1", "strengths": [[1.0')
    assert "corrupt" in refusal(tmp_path, tiny_weights, garbled)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"run_id": "x"}))
    assert "not a calibration file" in refusal(tmp_path, tiny_weights, other)
    ragged = write_file(tmp_path / "ragged.json", plain, strengths=[[1.0], [1.0, 2.0], [1.0], [1.0]])
    assert "layer 1 has 2 strengths" in refusal(tmp_path, tiny_weights, ragged)
    nan = tmp_path / "nan.json"
    nan.write_text(write_file(tmp_path / "x.json", plain).read_text().replace("0.5", "NaN", 1))
    assert "finite" in refusal(tmp_path, tiny_weights, nan)


def test_runs_refuse_files_that_do_not_fit(tmp_path: Path, tiny_weights: Path) -> None:
    plain = spec_of(tmp_path, tiny_weights)
    shape = write_file(tmp_path / "shape.json", plain, strengths=[[1.0, 1.0]] * 4)
    assert "4 layers x 2 heads, model 'tiny' has 4 layers x 1 heads" in refusal(tmp_path, tiny_weights, shape)
    shallow = write_file(tmp_path / "shallow.json", plain, strengths=[[1.0]] * 3)
    assert "3 layers x 1 heads" in refusal(tmp_path, tiny_weights, shallow)
    # the first eval=default prompt (FAST evaluates one prompt), in other case and spacing
    tuned = write_file(tmp_path / "tuned.json", plain, prompts=["A red square  moving right on a gradient background"])
    assert "overlap the run's evaluation prompts" in refusal(tmp_path, tiny_weights, tuned)
    # the run evaluates seed 0: a file fitted on seed 0 shares its noise draws
    same_noise = write_file(tmp_path / "seed0.json", plain, seeds=(0, 1000))
    assert "calibration seeds overlap the run's evaluation seeds [0]" in refusal(tmp_path, tiny_weights, same_noise)
    unsaid = json.loads(write_file(tmp_path / "unsaid.json", plain).read_text())
    del unsaid["calibration"]["seeds"]
    (tmp_path / "unsaid.json").write_text(json.dumps(unsaid))
    assert "does not list the integer seeds" in refusal(tmp_path, tiny_weights, tmp_path / "unsaid.json")
    for extra, what in (("quant.bits=4", "key.bits"), ("correction=exact", "correction"),
                        ("model.dtype=bfloat16", "model.dtype")):
        message = refusal(tmp_path, tiny_weights, write_file(tmp_path / "fitted.json", plain), extra)
        assert "another model, quantizer or correction" in message and what in message, message
    weights = json.loads(write_file(tmp_path / "w.json", plain).read_text())
    weights["identity"]["weights"] = "0123456789abcdef"
    (tmp_path / "w.json").write_text(json.dumps(weights))
    assert "weights (file: '0123456789abcdef'" in refusal(tmp_path, tiny_weights, tmp_path / "w.json")


@pytest.mark.parametrize("value", ["nan", "inf", "true"])
def test_strength_is_any_finite_number(value: str) -> None:
    assert AttentionConfig(strength=-2.5).strength == -2.5
    with pytest.raises(ValueError, match="attention.strength=.* is not allowed: must be a finite number"):
        AttentionConfig(strength=True if value == "true" else float(value))


def test_calibrate_refuses_what_it_cannot_fit(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["correction=none", "model.device=cpu"])
    assert exit_.value.code == 2
    assert "attention.correction='none' is not allowed: calibration fits the strength of a correction" \
        in capsys.readouterr().err


def test_calibrate_then_run_end_to_end(tmp_path: Path, tiny_weights: Path, monkeypatch) -> None:
    """calibrate on eval=calibration (2 prompts), then a run on eval=default reads the file: every layer's
    attention call gets strength x file[l] as a (H,) tensor."""
    from jensenkv.attention import ATTENTION_BACKENDS

    fast = [o for o in FAST if not o.startswith("eval.")]
    out = calibrate_overrides([*fast, f"model.weights_dir={tiny_weights}", f"paths.results_dir={tmp_path}",
                               "correction=taylor", "eval.num_prompts=2"])
    assert out == tmp_path / "calibration" / "tiny-rtn-int2-g32-taylor.json"
    content = json.loads(out.read_text())
    assert content["calibration"]["prompts"] == compose_config(["eval=calibration"]).eval.prompts[:2]
    assert content["calibration"]["seeds"] == [1000] and content["shrinkage"] is None
    assert content["interval"]["t_critical"][0][0] == pytest.approx(12.706, abs=1e-3)  # 2 videos: t(1)
    assert content["interval"]["low"][0][0] < content["strengths"][0][0] < content["interval"]["high"][0][0]
    assert content["fit"]["strengths"] == content["strengths"]
    assert len(content["strengths"]) == 4 and all(len(row) == 1 for row in content["strengths"])
    assert all(n > 0 for row in content["num_samples"] for n in row)
    assert all(se is not None and se >= 0 for row in content["std_error"] for se in row)  # two videos: clusters
    assert content["git_commit"] and content["created_at"] and content["jensenkv_version"]
    assert content["identity"]["correction"] == "taylor" and content["quantizer"] == "rtn"
    # a rerun of the same fit leaves the file as it is, its provenance included; a file holding another fit is
    # rewritten
    same = [*fast, f"model.weights_dir={tiny_weights}", f"paths.results_dir={tmp_path}", "correction=taylor",
            "eval.num_prompts=2"]
    earlier = out.read_text().replace(content["created_at"], "2026-01-01T00:00:00+00:00")
    out.write_text(earlier)
    assert calibrate_overrides(same) == out and out.read_text() == earlier
    out.write_text(json.dumps({**content, "strengths": [[0.5]] * 4}))
    assert calibrate_overrides(same) == out and json.loads(out.read_text())["strengths"] == content["strengths"]

    seen = []

    def spy(q, k_cur, v_cur, segments, correction="none", strength=1.0, **kwargs):
        seen.append((correction, strength))
        return ATTENTION_BACKENDS["cached"](q, k_cur, v_cur, segments, correction=correction, strength=strength)

    monkeypatch.setitem(ATTENTION_BACKENDS, "strength_spy", spy)
    record = run_overrides(fast_overrides(tmp_path / "runs", tiny_weights, "correction=taylor", "attention.strength=2",
                                          f"attention.calibration={out}", "attention.backend=strength_spy",
                                          "eval.metrics=[psnr,attention]"))
    assert record["labels"]["strength"] == "2x calibrated" and record["identity"]["calibration"]
    assert "delta_p_s_mean" in record["metrics"] and "psnr" in record["metrics"]
    expected = sorted(2 * row[0] for row in content["strengths"])
    corrected = [s for c, s in seen if c == "taylor"]  # the BF16 reference runs uncorrected, strength 1
    assert corrected and all(isinstance(s, torch.Tensor) and s.shape == (1,) for s in corrected)  # every layer
    assert sorted({float(s) for s in corrected}) == pytest.approx(expected, rel=1e-6)


def test_models_hold_their_layers_strengths(tmp_path: Path) -> None:
    """MAGI-1's layer caches resolve strength x file[l] per layer once; a file of another depth or width is refused
    where the model's shape is known."""
    from jensenkv.cache import CacheConfig
    from jensenkv.models.magi.attention import MagiLayerCaches
    from jensenkv.quant import QuantConfig

    path = tmp_path / "two_layers.json"
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, "strengths": [[0.5, -1.0], [2.0, 0.0]],
                                "num_samples": [[1, 1], [1, 1]], "std_error": [[None, None], [None, None]],
                                "objective": "test", "identity": {}, "calibration": {"prompts": []}}))
    attention = AttentionConfig(correction="taylor", strength=-2.0, calibration=str(path))
    quant = QuantConfig(bits=2, group_size=32)
    caches = MagiLayerCaches(2, 64, 1, CacheConfig(key=quant, value=quant), attention)
    assert caches.strengths[0].tolist() == [-1.0, 2.0]
    assert caches.strengths[1].tolist() == [-4.0, -0.0]
    with pytest.raises(ValueError, match=r"2 layers x 2 heads, the model has 3 layers"):
        MagiLayerCaches(3, 64, 1, CacheConfig(key=quant, value=quant), attention)
    with pytest.raises(ValueError, match=r"2 layers x 2 heads, the model has 2 layers x 4 heads"):
        layer_strengths(attention, 2, heads=4)
    assert layer_strengths(AttentionConfig(strength=0.3), 3) == [0.3, 0.3, 0.3]  # no file: the float, every layer


def test_the_digest_names_the_fit_not_when_it_was_written(tmp_path: Path, tiny_weights: Path) -> None:
    """A rerun of the same fit (another created_at / git_commit) names the same runs; other strengths do not."""
    from jensenkv.calibration import load_calibration

    spec = spec_of(tmp_path, tiny_weights)
    first = write_file(tmp_path / "a.json", spec, created_at="2026-01-01T00:00:00+00:00", git_commit="abc")
    rerun = write_file(tmp_path / "b.json", spec, created_at="2026-12-01T00:00:00+00:00", git_commit="def")
    other = write_file(tmp_path / "c.json", spec, strengths=[[0.3]] * 4, created_at="2026-01-01T00:00:00+00:00")
    assert first.read_bytes() != rerun.read_bytes()
    assert load_calibration(str(first)).digest == load_calibration(str(rerun)).digest
    assert load_calibration(str(first)).digest != load_calibration(str(other)).digest


def test_the_wan_adapter_sets_each_layers_strength_once_whatever_the_configure_order(tmp_path: Path,
                                                                                      tiny_wan_adapter) -> None:
    """One layer_strengths call at configure time: a calibrated adapter keeps its per-head strengths when only the
    cache changes, and a plain attention node brings back the global float, in construction and configure alike."""
    from jensenkv.cache import CacheConfig
    from jensenkv.quant import QuantConfig

    path = tmp_path / "wan.json"
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, "strengths": [[0.5, -1.0], [2.0, 0.0]],
                                "num_samples": [[1, 1], [1, 1]], "std_error": [[None, None], [None, None]],
                                "objective": "test", "identity": {}, "calibration": {"prompts": []}}))
    calibrated = AttentionConfig(correction="taylor", strength=2.0, calibration=str(path))

    def strengths(adapter) -> list:
        return [p.strength.tolist() if isinstance(p.strength, torch.Tensor) else p.strength for p in adapter.processors]

    built = tiny_wan_adapter(attention=calibrated)
    assert strengths(built) == [[1.0, -2.0], [4.0, 0.0]]
    quant = QuantConfig(bits=2, group_size=4)
    built.configure(cache=CacheConfig(key=quant, value=quant))  # only the cache: the calibration stays
    assert strengths(built) == [[1.0, -2.0], [4.0, 0.0]]
    built.configure(attention=AttentionConfig(correction="taylor", strength=0.5))
    assert strengths(built) == [0.5, 0.5]
    plain = tiny_wan_adapter(attention=AttentionConfig(correction="taylor", strength=0.5))
    plain.configure(attention=calibrated)
    assert strengths(plain) == strengths(tiny_wan_adapter(attention=calibrated))
