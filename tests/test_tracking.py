"""Results store (ids, atomic writes, records -> DataFrame, damaged files) and W&B modes."""
from __future__ import annotations

import json
import os

import pytest

from jensenkv.tracking import (
    CorruptRecordError,
    FileLock,
    ResultsStore,
    WandbRun,
    atomic_write,
    atomic_write_json,
    config_hash,
    load_results,
    resolve_wandb_mode,
)


def _record(run_id: str, **metrics) -> dict:
    return {"run_id": run_id, "experiment_name": "t", "created_at": "2026-01-01T00:00:00+00:00",
            "labels": {"model": "tiny", "quantizer": "rtn", "bits": 2, "group_size": 32, "correction": "none"},
            "metrics": metrics, "missing": {"lpips": "LPIPS backbone weights alexnet-owt-7be5be79.pth not found"},
            "vbench_dimensions_used": ["temporal_flickering"], "per_prompt": [{"index": 0}, {"index": 1}]}


def test_config_hash_is_stable_and_order_free():
    a = {"quant": {"bits": 2, "group_size": 32}, "correction": "taylor"}
    b = {"correction": "taylor", "quant": {"group_size": 32, "bits": 2}}
    assert config_hash(a) == config_hash(b) and len(config_hash(a)) == 16
    assert config_hash(a) != config_hash({**a, "correction": "none"})


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "record.json"
    atomic_write_json(path, {"v": 1})

    def crash(f):
        f.write("{partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(path, crash, mode="w")
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["record.json"]  # no temp file left behind


def test_non_finite_metrics_are_stored_as_null(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"psnr": float("inf"), "ssim": float("nan"), "ok": 1.5})
    assert json.loads((tmp_path / "r.json").read_text()) == {"psnr": None, "ssim": None, "ok": 1.5}


def test_records_round_trip_into_a_dataframe(tmp_path):
    store = ResultsStore(tmp_path)
    assert load_results(tmp_path).empty
    store.write_record(_record("aaa", psnr=30.0, ssim=0.9))
    store.write_record(_record("bbb", psnr=25.0, ssim=0.8))
    assert store.has_record("aaa") and not store.has_record("ccc")
    assert store.read_record("aaa")["schema"] == 1
    df = load_results(tmp_path).sort_values("run_id")
    assert list(df["run_id"]) == ["aaa", "bbb"] and list(df["psnr"]) == [30.0, 25.0]
    assert set(df["quantizer"]) == {"rtn"} and list(df["num_prompts"]) == [2, 2]
    assert df["lpips_missing_reason"].str.contains("alexnet-owt-7be5be79.pth").all()
    assert set(df["vbench_dimensions_used"]) == {"temporal_flickering"}


def test_corrupted_record_names_the_file_and_deletes_nothing(tmp_path):
    store = ResultsStore(tmp_path)
    store.write_record(_record("good", psnr=30.0))
    bad = store.record_path("bad")
    bad.parent.mkdir(parents=True)
    bad.write_text('{"run_id": "bad", "metrics": {')  # truncated by hand
    with pytest.raises(CorruptRecordError, match=str(bad)) as info:
        load_results(tmp_path)
    assert "nothing was deleted" in str(info.value)
    with pytest.raises(CorruptRecordError):
        store.has_record("bad")  # a rerun refuses to silently overwrite it
    assert bad.read_text() == '{"run_id": "bad", "metrics": {' and store.record_path("good").exists()


def test_a_json_file_that_is_not_a_record_is_rejected(tmp_path):
    store = ResultsStore(tmp_path)
    path = store.record_path("x")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2]")
    with pytest.raises(CorruptRecordError, match="not a run record"):
        store.read_record("x")


def test_wandb_mode_environment_wins(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_wandb_mode("offline") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("online") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ValueError, match="logger.mode='bogus'"):
        resolve_wandb_mode("offline")


def test_disabled_wandb_run_accepts_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = WandbRun({"mode": "offline", "dir": str(tmp_path / "wandb")}, "abc", "tiny/rtn", "test",
                   {"quant": {"bits": 2}})
    assert run.mode == "disabled"
    run.log_metrics({"psnr": 30.0, "note": "text is skipped"})
    run.log_video("v", tmp_path / "missing.mp4")  # no-op when disabled
    run.finish()


def test_offline_wandb_run_is_written_under_the_results_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "")
    run = WandbRun({"mode": "offline", "dir": str(tmp_path / "wandb"), "project": "jensenkv"}, "abc", "tiny/rtn",
                   "test", {"quant": {"bits": 2}})
    run.log_metrics({"psnr": 30.0})
    run.finish()
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_file_lock_is_exclusive_and_released(tmp_path):
    first, second = FileLock(tmp_path / "x.lock"), FileLock(tmp_path / "x.lock")
    assert first.try_acquire() and not second.try_acquire()
    assert str(os.getpid()) in first.describe_holder()
    first.release()
    assert not (tmp_path / "x.lock").exists()
    with second:
        assert second.held and not FileLock(tmp_path / "x.lock").try_acquire()
    assert not second.held


def test_a_dead_holders_lock_is_taken_over_but_another_hosts_is_respected(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout)}))
    assert FileLock(path).try_acquire()  # stale: its process is gone
    path.write_text(json.dumps({"host": "some-other-node", "pid": 1}))
    assert not FileLock(path).try_acquire()  # cannot tell from here: respected
