"""The benchmark suite: the quick run's CSV schema, ratios built from two measured numbers, byte theory.

No assertion here depends on how fast anything ran.
"""
from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from jensenkv.bench.quant_configs import key_value_configs, theory_bits_per_element
from jensenkv.bench.rows import COLUMNS, overall_median_row, time_ratio_row
from jensenkv.bench.suite import BYTES_CONFIGS, full_plan, run_suite
from jensenkv.bench.timing import Timing, paired_ratios, time_interleaved
from jensenkv.quant import QuantConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[pd.DataFrame, str]:
    """`scripts/bench.py --quick` into a temporary folder, on one thread, as `make bench` would call it."""
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--threads", "1",
                    "--out-dir", str(out)], check=True, env=env, cwd=ROOT, timeout=600)
    return pd.read_csv(out / "bench.csv", keep_default_na=False, na_values=[""]), (out / "bench.md").read_text()


def _rows(frame: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    rows = frame[frame.benchmark == benchmark]
    assert len(rows), f"no {benchmark} rows"
    return rows


def _one(frame: pd.DataFrame, benchmark: str, config: str, shape: str) -> pd.Series:
    match = frame[(frame.benchmark == benchmark) & (frame.config == config) & (frame["shape"] == shape)]
    assert len(match) == 1, (benchmark, config, shape, len(match))
    return match.iloc[0]


def test_quick_run_schema(quick_run):
    frame, _ = quick_run
    assert tuple(frame.columns) == COLUMNS
    assert frame["value"].notna().all() and (frame["value"] > 0).all()
    assert (frame["repeats"] >= 1).all()
    expected = {"cache_bytes_per_token", "cache_bytes_ratio", "commit_time", "quantize_throughput",
                "attention_time", "correction_overhead_ratio", "e2e_time", "e2e_time_ratio", "commit_quantize_share"}
    assert expected <= set(frame.benchmark)
    assert {"taylor", "exact"} <= set(_rows(frame, "correction_overhead_ratio").config)
    assert set(_rows(frame, "cache_bytes_ratio").config) == set(BYTES_CONFIGS)
    assert set(_rows(frame, "e2e_time_ratio").config) == {"rtn-int2-g32", "rtn-int2-g32+taylor", "rtn-int2-g32+exact"}


def test_correction_ratios_are_quotients_of_the_timed_medians(quick_run):
    frame, _ = quick_run
    ratios = _rows(frame, "correction_overhead_ratio")
    for _, r in ratios[ratios["shape"] != "overall"].iterrows():
        none = "none-outliers" if r.config == "exact-fallback" else "none"
        num = _one(frame, "attention_time", f"rtn-int2-g32+{r.config}", r["shape"])
        den = _one(frame, "attention_time", f"rtn-int2-g32+{none}", r["shape"])
        assert r.numerator == num.value and r.denominator == den.value
        assert math.isclose(r.value, num.value / den.value, rel_tol=1e-12)
        assert r.repeats == num.repeats == den.repeats
    for config in ("taylor", "exact"):
        overall = _one(frame, "correction_overhead_ratio", config, "overall")
        per_shape = ratios[(ratios.config == config) & (ratios["shape"] != "overall")]
        assert math.isclose(overall.value, statistics.median(per_shape.value), rel_tol=1e-12)
        assert overall.repeats == len(per_shape)


def test_e2e_ratios_are_quotients_of_the_timed_medians(quick_run):
    frame, _ = quick_run
    for _, r in _rows(frame, "e2e_time_ratio").iterrows():
        num = _one(frame, "e2e_time", r.config, r["shape"])
        den = _one(frame, "e2e_time", "bf16", r["shape"])
        assert r.numerator == num.value and r.denominator == den.value
        assert math.isclose(r.value, num.value / den.value, rel_tol=1e-12)
    for _, r in _rows(frame, "commit_quantize_share").iterrows():
        assert math.isclose(r.value, r.numerator / r.denominator, rel_tol=1e-12)
        assert 0 < r.value < 1


def test_throughput_matches_commit_time(quick_run):
    frame, _ = quick_run
    for _, r in _rows(frame, "quantize_throughput").iterrows():
        commit = _one(frame, "commit_time", r.config, r["shape"])
        assert r.denominator == commit.value
        assert math.isclose(r.value, r.numerator / commit.value, rel_tol=1e-12)
        if r.unit == "tokens/s":
            b, h, s, d = (int(x) for x in r["shape"].split("x"))
            assert r.numerator == s


def test_cache_bytes_match_theory_and_bf16(quick_run):
    frame, _ = quick_run
    for _, r in _rows(frame, "cache_bytes_ratio").iterrows():
        assert math.isclose(r.value, r.numerator / r.denominator, rel_tol=1e-12)
        assert abs(r.value / r.theory - 1) <= 0.01, (r.config, r["shape"], r.value, r.theory)
        # BF16 bytes per token: 2 bytes x H x D per tensor (shape label "K 1xHxSxD" / "K+V ...")
        scope, dims = r["shape"].split()
        b, h, s, d = (int(x) for x in dims.split("x"))
        assert r.denominator == 2 * b * h * d * (2 if scope == "K+V" else 1)
    for scope in ("K", "K+V"):
        shape = next(s for s in frame["shape"] if s.startswith(f"{scope} "))
        assert _one(frame, "cache_bytes_ratio", "bf16", shape).value == 1.0
        assert _one(frame, "cache_bytes_ratio", "rtn-int2-g32", shape).value <= 2.75 / 16


def test_markdown_reports_machine_targets_and_gpu_note(quick_run):
    _, md = quick_run
    import torch

    assert torch.__version__ in md
    assert "torch threads | 1" in md
    assert "## Targets" in md and "<= 1.03" in md and "<= 1.10" in md
    assert "GPU part" in md and "later issue" in md
    for section in ("cache_bytes_ratio", "correction_overhead_ratio", "e2e_time_ratio", "quantize_throughput"):
        assert f"## {section}" in md


def test_gpu_flag_without_cuda_is_reported_as_skipped(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU benchmark would run")
    rows = run_suite(full_plan(), tmp_path, only=("gpu",), gpu=True)
    assert rows == []
    md = (tmp_path / "bench.md").read_text()
    assert "GPU benchmark was skipped: no CUDA device" in md
    assert pd.read_csv(tmp_path / "bench.csv").columns.tolist() == list(COLUMNS)


def test_run_suite_rejects_unknown_benchmark(tmp_path):
    with pytest.raises(ValueError, match="only contains 'nope'"):
        run_suite(full_plan(), tmp_path, only=("nope",))


def test_time_interleaved_rotates_the_order():
    calls: list[str] = []
    variants = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    timings = time_interleaved(variants, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert all(t.repeats == 3 for t in timings.values())


@pytest.mark.parametrize("kwargs, match", [({"repeats": 0}, "repeats=0"), ({"repeats": 1, "warmup": -1}, "warmup=-1")])
def test_time_interleaved_rejects_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        time_interleaved({"a": lambda: None}, **kwargs)


def test_ratio_row_is_ratio_of_medians_with_paired_spread():
    a, b = Timing((2.0, 4.0, 3.0)), Timing((1.0, 2.0, 1.0))
    row = time_ratio_row("x", "c", "s", a, b)
    assert row.value == 3.0 / 1.0
    assert (row.numerator, row.denominator) == (3.0, 1.0)
    assert row.median == statistics.median([2.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="repeats differ"):
        paired_ratios(Timing((1.0,)), Timing((1.0, 2.0)))
    with pytest.raises(ValueError, match="per_shape"):
        overall_median_row("x", "c", [])


def test_theory_bits_per_element():
    def bits(name: str, part: int = 0, tokens: int = 4680) -> float:
        return theory_bits_per_element(key_value_configs(name)[part], 128, tokens)

    assert bits("bf16") == 16
    assert bits("rtn-int2-g32") == 2.75  # the paper's 2 + 24/32
    assert bits("rtn-int2-g128") == 2 + 24 / 128
    assert bits("rtn-int4-g64") == 4.375
    assert bits("kivi-int2-g32") == 2 + 32 / 32  # float16 step + float16 zero per 32 tokens of a channel
    assert bits("kivi-int2-g32", part=1) == 3.0  # values: per-token groups of 32 channels, float16 zero
    # QVG: RTN residual + 256 float16 centroids of 128 channels + one uint8 id per token, per (B, H)
    assert bits("qvg-int2", tokens=4096) == 2.75 + (256 * 128 * 16 + 4096 * 8) / (4096 * 128)
    symmetric = QuantConfig(method="rtn", bits=2, group_size=32, symmetric=True)
    assert theory_bits_per_element(symmetric, 128, 4680) == 2 + 16 / 32


@pytest.mark.parametrize("name", ["rtn-int2", "int2-g32", "kivi-int2", "bf32", "rtn-int5-g32"])
def test_bad_config_names_are_rejected(name):
    with pytest.raises(ValueError):
        key_value_configs(name)


def test_end_to_end_baseline_stores_bfloat16():
    """The e2e ratios divide by a BF16 cache, not by the float32 one the model computes in."""
    from jensenkv.bench.tiny_e2e import BASELINE, _cache

    cache = _cache(BASELINE)
    for part in (cache.key, cache.value):
        assert part.method == "none" and part.store_dtype == "bfloat16"
