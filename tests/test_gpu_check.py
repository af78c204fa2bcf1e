"""`make gpu-check` (jensenkv.bench.gpu_check): its dry run on this CPU (TRITON_INTERPRET=1, toy sizes) writes
every group's rows and both files; a crashing group, a spent budget and a failing case are rows, not aborts.

No assertion depends on a time or a speed: the dry run's numbers mean nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from jensenkv.bench.gpu_check import COLUMNS, GROUP_ORDER, STATUSES, run_all, write_report
from jensenkv.bench.gpu import GpuShape
from jensenkv.bench.gpu_check_context import CheckContext
from jensenkv.bench.gpu_check_environment import gpu_test_files
from jensenkv.bench.gpu_check_inputs import attention_inputs, dense_gqa, oracle_output
from jensenkv.bench.gpu_check_shapes import oracle_shapes, toy_shape

ROOT = Path(__file__).resolve().parents[1]


def _group_rows(group: str, monkeypatch) -> pd.DataFrame:
    """One group's dry run in this process (CPU, TRITON_INTERPRET=1, float32, toy shapes)."""
    from jensenkv.bench.gpu_checks import GROUPS

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows: list[dict] = []
    GROUPS[group](CheckContext("cpu", torch.float32, True, time.time() + 600, rows.append))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    assert set(frame.status) <= set(STATUSES)
    failed = frame[frame.status == "failed"]
    assert failed.empty, failed[["case", "detail"]].to_string()
    return frame


def test_oracle_group_compares_every_backend_and_correction(monkeypatch):
    frame = _group_rows("oracle", monkeypatch)
    oracle = frame[frame.unit == "relative error"]
    assert len(oracle) == len(oracle_shapes()) * 3 * 2  # shapes x (none, taylor, exact) x (triton, flex)
    assert (oracle.value <= 1e-4).all() and (oracle.status == "passed").all()  # float32 operands
    magi = oracle[oracle.case.str.contains("magi1-4.5b (toy) H3q/1kv", regex=False)]  # the GQA shape kept as GQA
    assert len(magi) == 6 and magi[magi.case.str.endswith("flex")].detail.str.contains("no GQA").all()


def test_kernel_group_writes_every_ratio_and_judges_no_target_on_the_interpreter(monkeypatch):
    frame = _group_rows("kernel", monkeypatch)
    ratios = frame[frame.unit == "time ratio"]
    assert len(ratios) == 5 * len(oracle_shapes())
    assert {c.split(": ")[-1] for c in ratios.case} == {
        "triton none / sdpa bf16", "triton taylor / sdpa bf16", "triton exact / sdpa bf16",
        "triton taylor / triton none", "triton exact / triton none"}
    assert (ratios.value > 0).all()
    assert not frame.status.isin(["met", "missed"]).any()  # interpreter times mean nothing
    assert (frame[frame.case.str.endswith("peak memory")].status == "skipped").all()  # no CUDA allocator


def test_generation_group_measures_both_caches(monkeypatch):
    frame = _group_rows("generation", monkeypatch).set_index("case")
    held = frame.loc[["bf16: cache held", "int2 g32 + taylor: cache held"], "value"]
    assert held.iloc[1] < held.iloc[0] / 4  # INT2 g=32 stores 2.75 of 16 bits per element, BF16 16
    assert frame.loc["int2 g32 + taylor / bf16: seconds per chunk", "value"] > 0


def test_script_writes_both_files(tmp_path):
    """The command line end to end (its environment group only; test_gpu_check_full_dry_run runs them all)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--groups", "environment",
                    "--out-dir", str(tmp_path)], check=True, env=env, cwd=ROOT, timeout=300)
    frame = pd.read_csv(tmp_path / "gpu_check.csv")
    assert tuple(frame.columns) == COLUMNS
    assert set(frame.case) >= {"torch", "triton", "diffusers", "hydra-core", "python", "device"}
    md = (tmp_path / "gpu_check.md").read_text()
    assert "**Dry run**" in md and "## environment" in md


@pytest.mark.slow
def test_gpu_check_full_dry_run(tmp_path):
    """`make gpu-check-dry-run`: every group, each in its own process, nothing failed (about 1-2 min here)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out-dir", str(tmp_path)],
                   check=True, env=env, cwd=ROOT, timeout=900)
    frame = pd.read_csv(tmp_path / "gpu_check.csv")
    assert set(frame.check) == set(GROUP_ORDER)
    failed = frame[frame.status == "failed"]
    assert failed.empty, failed[["check", "case", "detail"]].to_string()
    tests = frame[(frame.check == "pytest") & (frame.unit == "s")]
    assert not tests.empty and (tests.status == ("passed" if torch.cuda.is_available() else "skipped")).all()


def test_gpu_test_files_are_the_ones_with_gpu_marked_tests():
    files = {p.name for p in gpu_test_files(ROOT / "tests")}
    assert {"test_attention_paths.py", "test_fidelity.py"} <= files
    assert "test_bench.py" not in files  # only files with a gpu-marked test


def test_a_crashing_group_is_a_failed_row_and_the_next_group_still_runs(tmp_path):
    frame = run_all(("no-such-group", "environment"), tmp_path, dry_run=True, budget=120, log=lambda _: None)
    crashed = frame[frame.check == "no-such-group"]
    assert len(crashed) == 1 and crashed.status.iloc[0] == "failed"
    assert "exit code 2" in crashed.detail.iloc[0] and "no-such-group" in crashed.detail.iloc[0]
    assert (frame[frame.check == "environment"].status == "measured").any()


def test_a_spent_budget_skips_the_group_with_a_row(tmp_path):
    frame = run_all(("environment", "oracle"), tmp_path, dry_run=True, budget=1.0, log=lambda _: None)
    assert list(frame.status) == ["skipped", "skipped"]
    assert frame.detail.str.contains("time budget").all()


def test_a_failing_case_is_a_row_with_its_error_and_a_late_case_is_skipped():
    rows: list[dict] = []
    ctx = CheckContext("cpu", torch.float32, True, time.time() + 60, rows.append)

    def boom() -> None:
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line")

    assert ctx.run("oracle", "a case", boom) is False
    assert rows[-1]["status"] == "failed" and rows[-1]["detail"] == "RuntimeError: CUDA error: an illegal memory access"
    assert ctx.run("oracle", "fine", lambda: ctx.add("oracle", "fine", "passed", 0.0)) is True
    late = CheckContext("cpu", torch.float32, True, time.time() - 1, rows.append)
    assert late.run("oracle", "late", lambda: pytest.fail("ran after the deadline")) is False
    assert rows[-1]["status"] == "skipped"


def test_toy_shapes_keep_the_gqa_group_and_the_chunk_counts():
    for shape in oracle_shapes():
        toy = toy_shape(shape)
        assert toy.heads_q // toy.heads_kv == shape.heads_q // shape.heads_kv
        assert toy.cached // toy.queries == -(-shape.cached // shape.queries)
        assert toy.in_flight // toy.queries == shape.in_flight // shape.queries
    skyreels = oracle_shapes()[0]
    assert (skyreels.heads_q, skyreels.dim, skyreels.queries, skyreels.cached) == (12, 128, 5 * 2040, 21 * 2040)


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_gqa_oracle_by_stacked_queries_equals_the_dense_repeated_heads(correction):
    """Two ways to give the non-GQA oracle a GQA shape agree: query heads stacked on their KV head (what the
    check compares with), and KV heads repeated per query head (what a backend without GQA is handed)."""
    from jensenkv.attention import reference_attention

    ctx = CheckContext("cpu", torch.float32, True, time.time() + 60, lambda row: None)
    shape = GpuShape("gqa", 6, 2, 8, 24, 16, 64)
    q, k_cur, v_cur, segments = attention_inputs(shape, ctx, quantized=True)
    rows = torch.tensor([0, 3, 7])
    stacked = oracle_output(q, k_cur, v_cur, segments, correction, rows)
    dense = reference_attention(*dense_gqa(q, k_cur, v_cur, segments), correction=correction)[:, :, rows]
    torch.testing.assert_close(stacked, dense, rtol=1e-6, atol=1e-6)
    wrong = oracle_output(q, k_cur.flip(1), v_cur.flip(1), segments, correction, rows)  # KV heads swapped
    assert (wrong - dense).abs().max() > 1e-2  # control: the head mapping matters


def test_report_lists_failures_and_targets(tmp_path):
    rows = [{"check": "environment", "case": "device", "status": "measured", "detail": "NVIDIA H200"},
            {"check": "kernel", "case": "skyreels: triton taylor / triton none", "status": "missed", "value": 1.2,
             "unit": "time ratio", "target": "<= 1.05"},
            {"check": "oracle", "case": "magi: flex", "status": "failed", "detail": "ValueError: no GQA"}]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    write_report(frame, tmp_path, dry_run=False, seconds=12.0, budget=450.0)
    md = (tmp_path / "gpu_check.md").read_text()
    assert "Device: NVIDIA H200" in md and "**Dry run**" not in md
    assert "## Targets" in md and "<= 1.05" in md and "missed" in md
    assert "## Failures" in md and "ValueError: no GQA" in md
    assert tuple(pd.read_csv(tmp_path / "gpu_check.csv").columns) == COLUMNS


def test_cli_refuses_unknown_groups_and_a_zero_budget():
    from jensenkv.bench.gpu_check import main

    with pytest.raises(SystemExit):
        main(["--groups", "nope"])
    with pytest.raises(SystemExit):
        main(["--budget", "0"])


def test_each_group_gets_its_share_and_what_earlier_groups_left(tmp_path, monkeypatch):
    """A group's timeout ends where its share ends (a hung group cannot eat the next ones' time); time a group
    leaves unused passes to the next."""
    import jensenkv.bench.gpu_check as gpu_check

    timeouts: dict[str, float] = {}

    def fake(name, rows_path, dry_run, timeout):
        timeouts[name] = timeout
        return [gpu_check._row(name, "x", "measured")]

    monkeypatch.setattr(gpu_check, "run_group", fake)
    monkeypatch.setattr(gpu_check, "SHARES", {"environment": 0.5, "oracle": 0.25, "kernel": 0.25})
    frame = run_all(("environment", "oracle", "kernel"), tmp_path, True, budget=100.0, log=lambda _: None)
    assert list(frame.check) == ["environment", "oracle", "kernel"]
    # each fake group returned at once: its unused time passed on, so the last one may use all that is left
    assert timeouts["environment"] == pytest.approx(50, abs=1) and timeouts["oracle"] == pytest.approx(75, abs=1)
    assert timeouts["kernel"] == pytest.approx(100, abs=1)
