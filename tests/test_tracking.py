"""Results store (ids, atomic writes, records -> DataFrame, damaged files) and W&B modes."""
from __future__ import annotations

import json
import os
import time

import pytest

from jensenkv.hashing import config_hash
from jensenkv.config.logger import resolve_wandb_mode
from jensenkv.report.store_frame import load_results
from jensenkv.run.wandb import WandbRun
from jensenkv.store.files import atomic_write, atomic_write_json
from jensenkv.store.lock import FileLock
from jensenkv.store.record import CorruptRecordError
from jensenkv.store.results import ResultsStore


def _record(name: str, **metrics) -> dict:
    """A sound record: its run id hashes its identity (``name`` tells runs apart), one video per prompt."""
    identity = {"name": name, "prompts": ["a", "b"], "seeds": [0], "metrics": sorted([*metrics, "lpips"])}
    missing = {"lpips": "LPIPS backbone weights alexnet-owt-7be5be79.pth not found"}
    return {"run_id": config_hash(identity), "experiment_name": "t", "created_at": "2026-01-01T00:00:00+00:00",
            "identity": identity, "labels": {"model": "tiny", "quantizer": "rtn", "method": "rtn", "bits": 2,
                                             "group_size": 32, "correction": "none"},
            "metrics": metrics, "missing": missing, "vbench_dimensions_used": ["temporal_flickering"],
            "per_prompt": [{"index": i, "prompt": p, "seed": 0, "metrics": metrics, "missing": missing}
                           for i, p in enumerate(identity["prompts"])]}


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
    a, b = _record("aaa", psnr=30.0, ssim=0.9), _record("bbb", psnr=25.0, ssim=0.8)
    store.write_record(a)
    store.write_record(b)
    assert store.has_record(a["run_id"]) and not store.has_record("ccc")
    assert store.read_record(a["run_id"])["schema"] == 2
    df = load_results(tmp_path).set_index("run_id").loc[[a["run_id"], b["run_id"]]]
    assert list(df["psnr"]) == [30.0, 25.0]
    assert set(df["quantizer"]) == {"rtn"} and list(df["num_prompts"]) == [2, 2]
    assert df["lpips_missing_reason"].str.contains("alexnet-owt-7be5be79.pth").all()
    assert set(df["vbench_dimensions_used"]) == {"temporal_flickering"}


def test_corrupted_record_names_the_file_and_deletes_nothing(tmp_path):
    store = ResultsStore(tmp_path)
    good = store.write_record(_record("good", psnr=30.0))
    bad = store.record_path("bad")
    bad.parent.mkdir(parents=True)
    bad.write_text('{"run_id": "bad", "metrics": {')  # truncated by hand
    with pytest.raises(CorruptRecordError, match=str(bad)) as info:
        load_results(tmp_path)
    assert "nothing was deleted" in str(info.value)
    assert not store.has_record("bad") and "not JSON" in str(store.damage("bad"))  # a rerun regenerates it
    assert bad.read_text() == '{"run_id": "bad", "metrics": {' and good.exists()


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
    with pytest.raises(ValueError, match=r"WANDB_MODE='bogus' \(in the environment"):
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


# --- leases ----------------------------------------------------------------------------------------------
def _holder(path, **fields) -> None:
    path.write_text(json.dumps(fields))


def test_an_empty_or_garbled_lock_is_taken_over_once_it_is_not_being_written(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("")
    assert not FileLock(path).try_acquire()  # fresh: its creator may be writing it right now
    old = time.time() - 60
    os.utime(path, (old, old))
    lock = FileLock(path)
    assert lock.try_acquire() and json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    path.write_text("{garbled")
    os.utime(path, (old, old))
    assert FileLock(path).try_acquire()


def test_another_hosts_lock_is_respected_while_it_heartbeats_and_taken_over_after(tmp_path, caplog):
    path = tmp_path / "x.lock"
    _holder(path, host="other-node", pid=1, heartbeat=time.time())
    assert not FileLock(path, stale_after_s=60).try_acquire()
    _holder(path, host="other-node", pid=1, heartbeat=time.time() - 61)  # preempted: no heartbeat for 61 s
    with caplog.at_level("WARNING", logger="jensenkv.store"):
        assert FileLock(path, stale_after_s=60).try_acquire()
    assert "other-node" in caplog.text and "no heartbeat" in caplog.text


def test_a_reused_pid_does_not_keep_a_lock_alive(tmp_path):
    import socket

    path = tmp_path / "x.lock"
    _holder(path, host=socket.gethostname(), pid=os.getpid(), pid_started=1.0, heartbeat=time.time())
    assert FileLock(path).try_acquire()  # this PID is alive, but it is not the process that took the lock


def test_a_lease_is_renewed_while_held_and_lost_to_nobody(tmp_path, monkeypatch):
    import jensenkv.store.lock as lock_module

    path = tmp_path / "x.lock"
    holder = FileLock(path, stale_after_s=0.6, heartbeat_s=0.05)
    assert holder.try_acquire()
    first = json.loads(path.read_text())["heartbeat"]
    monkeypatch.setattr(lock_module.socket, "gethostname", lambda: "another-node")  # seen from another host
    time.sleep(1.0)
    assert json.loads(path.read_text())["heartbeat"] > first
    assert not FileLock(path, stale_after_s=0.6).try_acquire()  # renewed: still live after > stale_after_s
    holder._stop.set()  # the holder freezes (preempted): no more heartbeats
    holder._thread.join()
    time.sleep(0.8)
    taker = FileLock(path, stale_after_s=0.6, heartbeat_s=0.05)
    assert taker.try_acquire()
    holder.release()  # the old holder wakes up: it must not remove the new holder's lock
    assert path.exists() and json.loads(path.read_text())["token"] == taker._token
    taker.release()
    assert not path.exists()


def test_waiting_for_a_lock_says_who_holds_it_and_ends_when_the_lease_runs_out(tmp_path, caplog):
    path = tmp_path / "x.lock"
    _holder(path, host="other-node", pid=7, heartbeat=time.time())
    lock = FileLock(path, stale_after_s=0.5)
    with caplog.at_level("WARNING", logger="jensenkv.store"):
        lock.acquire(poll_s=0.05)
    assert lock.held and "waiting for host other-node, pid 7" in caplog.text
    lock.release()


def test_only_one_of_many_processes_takes_over_a_stale_lock(tmp_path):
    import socket
    import subprocess
    import sys

    path = tmp_path / "x.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _holder(path, host=socket.gethostname(), pid=int(dead.stdout), heartbeat=time.time())
    script = ("import sys, time; from jensenkv.store.lock import FileLock; lock = FileLock(sys.argv[1]); "
              "time.sleep(max(0, float(sys.argv[2]) - time.time())); print(lock.try_acquire()); time.sleep(1)")
    start = str(time.time() + 8)  # after every import: all try at once
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), start], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    answers = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(answers) == ["False", "False", "False", "True"]


def test_atomic_writes_make_files_with_the_usual_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        path = atomic_write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_portable_drops_machine_paths():
    from pathlib import Path

    from jensenkv.store.files import portable

    home = str(Path.home())
    assert portable(f"put it in {home}/.cache/torch/hub") == "put it in ~/.cache/torch/hub"
    assert portable(f"{home}x/file") == f"{home}x/file"  # only whole path components
