"""The benchmark suite: the quick run's rows and report, presets composed from configs/, the timing helper.

No assertion depends on how fast anything ran.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from jensenkv.bench.presets import preset
from jensenkv.bench.plan import BENCHMARKS, quick_plan
from jensenkv.bench.suite import run_suite
from jensenkv.bench.suite_report import COLUMNS
from jensenkv.bench.timing import paired_ratio, time_interleaved

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[pd.DataFrame, str]:
    """`scripts/bench.py --quick` into a temporary folder, on one thread, as `make bench` calls it."""
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--threads", "1",
                    "--out-dir", str(out)], check=True, env=env, cwd=ROOT, timeout=900)
    return pd.read_csv(out / "bench.csv"), (out / "bench.md").read_text()


def test_quick_run_writes_every_benchmark(quick_run):
    frame, md = quick_run
    assert tuple(frame.columns) == COLUMNS
    assert set(frame.benchmark) == set(BENCHMARKS)
    assert frame.value.notna().all()
    for name in BENCHMARKS:
        assert f"## {name}" in md
    assert "## Targets" in md and "not measured" not in md


def test_quick_run_a_builtin_run_imports_no_diffusers(quick_run):
    """run_imports replays a real built-in run's imports: torch and the rest are timed, and diffusers is not among
    them (the built-in model is models.wan.dit)."""
    frame, _ = quick_run
    rows = frame[frame.benchmark == "run_imports"].set_index("config")
    assert rows.loc["diffusers imported by a built-in run (1 = yes)", "value"] == 0
    assert (rows[rows.unit == "s (CPU)"].value > 0).all() and len(rows) == 3


def test_quick_run_without_a_gpu_says_bench_gpu_was_not_written(quick_run):
    _, md = quick_run
    assert "no CUDA GPU visible, so results/bench_gpu.csv" in md


def test_gpu_bench_triton_plumbing_on_the_interpreter(monkeypatch, tmp_path):
    """bench.gpu's code path at toy shapes on the CPU (TRITON_INTERPRET=1): every variant runs, every ratio
    row is written with the device named; no value is checked against a speed."""
    from jensenkv.bench.gpu import COLUMNS as GPU_COLUMNS, gpu_rows, toy_shapes, write_gpu_csv

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = gpu_rows(toy_shapes(), device="cpu", repeats=1, block=(16, 16), log=lambda _: None)
    frame = pd.read_csv(write_gpu_csv(rows, tmp_path))
    assert tuple(frame.columns) == GPU_COLUMNS
    ratios = frame[frame.benchmark == "gpu_time_ratio"]
    assert len(ratios) == 5 * len(toy_shapes())
    assert {c.split(": ")[1] for c in ratios.config} == {
        "triton none / sdpa bf16", "triton taylor / sdpa bf16", "triton exact / sdpa bf16",
        "triton taylor / triton none", "triton exact / triton none"}
    assert (frame.value > 0).all() and frame.value.notna().all()
    assert frame.gpu.str.contains("TRITON_INTERPRET").all()
    assert "gpu_peak_memory" not in set(frame.benchmark)  # no CUDA allocator to read on the CPU
    assert any("magi-toy H4q/2kv" in c for c in frame.config)  # GQA shape named as such


def test_gpu_comparison_alone_leaves_bench_csv_untouched(tmp_path):
    (tmp_path / "bench.csv").write_text("kept\n")
    frame = run_suite(quick_plan(), tmp_path, only=("gpu_kernel",))
    assert frame.empty and (tmp_path / "bench.csv").read_text() == "kept\n"
    assert not (tmp_path / "bench.md").exists()


def test_gpu_bench_refuses_cuda_without_a_gpu():
    import torch

    from jensenkv.bench.gpu import gpu_rows, toy_shapes

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(RuntimeError, match="device='cuda' needs a CUDA GPU"):
        gpu_rows(toy_shapes(), device="cuda")


def test_quick_run_memory_rows_are_consistent(quick_run):
    frame, _ = quick_run
    held = frame[frame.benchmark == "held_memory_ratio"].set_index("config").value
    live = held[[c for c in held.index if "live tensor bytes" in c]].iloc[0]
    target = held[[c for c in held.index if c.endswith("target")]].iloc[0]
    assert live >= 1.0  # the stored form itself is live
    assert target > 1.25  # 1.25 plus a workspace that is not empty after an attention call
    ratio = frame[(frame.benchmark == "cache_bytes_ratio") & frame.config.str.startswith("rtn bits=2 group_size=32")]
    assert ratio.value.iloc[0] == pytest.approx((2 + 24 / 32) / 16)  # codes + fp16 step + 8-bit zero per 32


def test_a_measurement_in_a_fresh_process_is_the_one_in_process():
    """The full plan's path (a child per memory row, as `make bench` runs it), which the quick run skips: the
    child's JSON line is parsed and holds what the same command line gives in this process."""
    from jensenkv.bench.memory import measure

    args = ("--layers", "1", "--commits", "1", "--shape", "1", "1", "64", "128", "--queries", "8")
    child, here = measure("held", *args), measure("held", *args, in_process=True)
    assert set(child) == set(here) and child["stored"] == here["stored"] > 0
    assert child["live"] >= child["stored"] and here["live"] >= here["stored"]  # plus the shared workspace


def test_presets_compose_configs():
    rtn = preset("rtn", 128, bits=2, group_size=32)
    assert rtn.key.bits == 2 and rtn.key.zero_dtype == "uint8" and rtn.value == rtn.key  # configs/quant/rtn.yaml
    kivi = preset("kivi", 128, bits=2, group_size=32)
    assert kivi.key.granularity == "channel" and kivi.value.granularity == "token_group"
    assert preset("bf16", 128).key.method == "none" and preset("bf16", 128).key.store_dtype == "bfloat16"
    assert preset("quarot", 128).key.rotation == "hadamard"
    with pytest.raises(ValueError, match=r"quant='int2' is not allowed"):
        preset("int2", 128)


def test_run_suite_rejects_unknown_benchmark(tmp_path):
    with pytest.raises(ValueError, match="only contains 'nope'"):
        run_suite(quick_plan(), tmp_path, only=("nope",))


def test_time_interleaved_rotates_the_order():
    calls: list[str] = []
    variants = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    wall, cpu = time_interleaved(variants, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert all(len(s) == 3 for s in wall.values()) and all(len(s) == 3 for s in cpu.values())
    assert all(w >= 0 and c >= 0 for name in "abc" for w, c in zip(wall[name], cpu[name]))


@pytest.mark.parametrize("kwargs, match", [({"repeats": 0}, "repeats=0"), ({"repeats": 1, "warmup": -1}, "warmup=-1")])
def test_time_interleaved_rejects_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        time_interleaved({"a": lambda: None}, **kwargs)


def test_paired_ratio_is_median_and_iqr_of_per_repetition_ratios():
    median, iqr = paired_ratio([2.0, 4.0, 3.0, 8.0], [1.0, 2.0, 1.0, 2.0])  # ratios 2, 2, 3, 4
    assert median == 2.5 and iqr == pytest.approx(3.25 - 2.0)
    with pytest.raises(ValueError, match="paired ratios"):
        paired_ratio([1.0], [1.0, 2.0])


def test_only_one_benchmark_replaces_its_rows_and_keeps_every_other_row(tmp_path, monkeypatch):
    """`scripts/bench.py --only NAME` on a copy of results/bench.csv: NAME's rows are this run's, every other row is
    kept as it was, and each row names the commit and the date it was measured."""
    import time

    from jensenkv.bench import suite
    from jensenkv.bench.plan import row

    shutil.copy(ROOT / "results" / "bench.csv", tmp_path / "bench.csv")
    (tmp_path / "bench.md").write_text("# old\n\n## Notes\n\n- worldplay_cache_memory: kept\n- e2e_time_ratio: old\n")
    before = pd.read_csv(tmp_path / "bench.csv", dtype={"commit": str, "measured": str})

    def stand_in(plan):
        plan.notes.append("e2e_time_ratio: new")
        return [row("e2e_time_ratio", "stand-in", 1.0, "ratio")]

    monkeypatch.setitem(suite.RUNNERS, "e2e_time_ratio", stand_in)
    suite.run_suite(quick_plan(), tmp_path, only=("e2e_time_ratio",))
    after = pd.read_csv(tmp_path / "bench.csv", dtype={"commit": str, "measured": str})
    measured = ["benchmark", "config", "value", "unit", "iqr", "repeats"]
    kept, old = after[after.benchmark != "e2e_time_ratio"], before[before.benchmark != "e2e_time_ratio"]
    assert len(old) > 0
    pd.testing.assert_frame_equal(kept[measured].reset_index(drop=True), old[measured].reset_index(drop=True))
    assert list(after[after.benchmark == "e2e_time_ratio"].config) == ["stand-in"]
    assert tuple(after.columns) == COLUMNS and after[["commit", "measured"]].notna().all().all()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    new = after[after.benchmark == "e2e_time_ratio"].iloc[0]
    assert new.commit.removesuffix("+dirty") == head.strip()
    assert new.measured == time.strftime("%Y-%m-%d", time.gmtime())
    md = (tmp_path / "bench.md").read_text()
    assert all(f"## {name}" in md for name in set(before.benchmark))
    # the notes of the benchmarks not run again stay; the rerun one's are this run's
    assert md.endswith("## Notes\n\n- worldplay_cache_memory: kept\n- e2e_time_ratio: new\n")
