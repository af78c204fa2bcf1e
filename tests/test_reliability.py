"""Runs under faults: stale temporary files, unreadable weights, unwritable results, NaN videos, W&B logs cut
short by a kill, runs held elsewhere, killed sweeps and two identical sweeps at once on one results dir.

Every run uses the real generator with random-init tiny weights (CPU, 2 chunks x 2 steps)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from jensenkv.config.tree import ModelConfig
from jensenkv.run import Runner, build_spec, compose_config, run_overrides
from jensenkv.report.store_frame import load_results
from jensenkv.store.files import ResultsWriteError
from jensenkv.store.results import ResultsStore

from pipeline_testkit import fast_overrides, write_random_tiny_weights  # noqa: E402

SMALL = ("eval.metrics=[psnr,ssim,vbench]",)  # a VBench folder is scored: temporary videos must stay out of it


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_random_tiny_weights(tmp_path_factory.mktemp("tiny") / "weights")


def _spec(results: Path, weights: Path, *extra: str):
    return build_spec(compose_config(fast_overrides(results, weights, *extra)))


def _leftovers(results: Path) -> list[Path]:
    return [p for p in results.rglob("*") if p.name.endswith((".tmp", ".tmp.mp4")) or ".tmp" in p.parts]


# --- temporary files -----------------------------------------------------------------------------------
def test_temporary_videos_live_outside_videos_and_stale_ones_are_cleaned(tmp_path, weights, monkeypatch):
    from jensenkv.eval import video_files

    spec = _spec(tmp_path, weights, *SMALL)
    run_dir = ResultsStore(tmp_path).run_dir(spec.run_id)
    (run_dir / "videos").mkdir(parents=True)
    (run_dir / "videos" / ".0000_s0.4242.tmp.mp4").write_bytes(b"half an mp4 left by kill -9")
    (run_dir / "prompts").mkdir()
    (run_dir / "prompts" / ".0000.json.x1y2.tmp").write_text('{"ind')
    encoded: list[Path] = []
    real = video_files.encode_h264

    def spy(frames, path, *args, **kwargs):
        encoded.append(Path(path))
        return real(frames, path, *args, **kwargs)

    monkeypatch.setattr(video_files, "encode_h264", spy)
    record = Runner(spec).run()
    assert "vbench" in record["metrics"]  # VBench scored videos/ without tripping on a stale file
    assert encoded and all(p.parent != run_dir / "videos" for p in encoded)  # encoded where no evaluator looks
    assert [p.name for p in (run_dir / "videos").iterdir()] == ["0000_s0.mp4"]
    assert _leftovers(tmp_path) == []


def test_result_files_are_readable_by_others(tmp_path, weights):
    record = run_overrides(fast_overrides(tmp_path, weights, "eval.metrics=[psnr]"))
    mask = os.umask(0)
    os.umask(mask)
    path = ResultsStore(tmp_path).record_path(record["run_id"])
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


# --- one line instead of a traceback -------------------------------------------------------------------
def _broken_weights(tmp_path: Path, weights: Path, damage: str) -> Path:
    folder = tmp_path / "broken"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((weights / name).read_bytes())
    target = folder / ("config.json" if damage == "config" else "model.safetensors")
    data = target.read_bytes()
    target.write_bytes({"truncated": data[: len(data) // 2], "garbled": b"\x00garbage" * 64, "empty": b"",
                        "config": b'{"transformer": {'}[damage])
    return target


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty", "config"])
def test_damaged_weights_fail_in_one_line_naming_the_file(tmp_path, weights, damage):
    target = _broken_weights(tmp_path, weights, damage)
    with pytest.raises(ValueError) as info:
        run_overrides(fast_overrides(tmp_path / "results", target.parent, "eval.metrics=[psnr]"))
    message = str(info.value)
    assert str(target) in message and "\n" not in message
    assert not list((tmp_path / "results").glob("runs/*/record.json"))


def test_a_results_path_that_is_a_file_fails_before_any_work(tmp_path, weights, monkeypatch):
    results = tmp_path / "results"
    results.write_text("not a folder")
    monkeypatch.setattr("jensenkv.models.build_adapter", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ResultsWriteError, match=r"must be a directory, but a file is in the way"):
        run_overrides(fast_overrides(results, weights))


def test_a_read_only_results_dir_fails_before_any_work(tmp_path, weights, monkeypatch):
    import tempfile

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # root ignores chmod: simulate the file system
    monkeypatch.setattr("jensenkv.models.build_adapter", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ResultsWriteError, match="read-only") as info:
        run_overrides(fast_overrides(tmp_path, weights))
    assert "\n" not in str(info.value) and "paths.results_dir" in str(info.value)


def test_a_full_disk_fails_in_one_line_and_the_rerun_finishes(tmp_path, weights, monkeypatch):
    import jensenkv.store.files as files

    real = files.atomic_write

    def full(path, *args, **kwargs):
        if Path(path).parent.name == "prompts":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files, "atomic_write", full)
    overrides = fast_overrides(tmp_path, weights, "eval.metrics=[psnr]")
    with pytest.raises(ResultsWriteError, match="no space left") as info:
        run_overrides(overrides)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(files, "atomic_write", real)
    assert run_overrides(overrides)["metrics"]["psnr"] > 0
    assert _leftovers(tmp_path) == []


def test_nan_weights_fail_the_run_instead_of_a_perfect_record(tmp_path, weights):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan"
    folder.mkdir()
    (folder / "config.json").write_bytes((weights / "config.json").read_bytes())
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
             for k, v in load_file(str(weights / "model.safetensors")).items()}
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="non-finite values"):
        run_overrides(fast_overrides(tmp_path / "results", folder, "eval.metrics=[psnr,ssim]"))
    assert not list((tmp_path / "results").glob("runs/*/record.json"))


# --- threads ---------------------------------------------------------------------------------------------
def test_null_threads_share_the_cores_between_parallel_jobs(monkeypatch):
    from jensenkv.run import environment as runner

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner, "available_cores", lambda: 16)
    monkeypatch.setattr(runner, "parallel_jobs", lambda: 1)
    assert runner.default_threads() == runner.MAX_DEFAULT_THREADS
    monkeypatch.setattr(runner, "parallel_jobs", lambda: 8)
    assert runner.default_threads() == 2
    monkeypatch.setattr(runner, "parallel_jobs", lambda: 32)
    assert runner.default_threads() == 1
    assert runner.default_threads(ModelConfig()) == 1  # too small to split across threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runner.default_threads(ModelConfig()) is None  # the user's choice: torch already follows it


def test_a_run_with_null_threads_uses_the_default(tmp_path, weights, monkeypatch):
    from jensenkv.run import environment as runner

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_overrides(fast_overrides(tmp_path, weights, "eval.metrics=[psnr]", "threads=null"))
        assert torch.get_num_threads() == runner.default_threads(ModelConfig()) == 1
    finally:
        torch.set_num_threads(before)


# --- W&B -----------------------------------------------------------------------------------------------
def _offline_runs(results: Path) -> list[Path]:
    return sorted((results / "wandb" / "wandb").glob("offline-run-*"))


def test_a_kill_between_record_and_wandb_is_logged_by_the_rerun(tmp_path, weights, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "")
    overrides = [*fast_overrides(tmp_path, weights, "eval.metrics=[psnr]"), "logger=wandb_offline"]
    real = Runner.log_wandb

    def killed(self, record):
        raise KeyboardInterrupt  # SIGKILL right after the record: W&B never ran

    monkeypatch.setattr(Runner, "log_wandb", killed)
    with pytest.raises(KeyboardInterrupt):
        run_overrides(overrides)
    spec = build_spec(compose_config(overrides))
    store = ResultsStore(tmp_path)
    assert store.has_record(spec.run_id) and _offline_runs(tmp_path) == []
    monkeypatch.setattr(Runner, "log_wandb", real)
    record = run_overrides(overrides)  # finished run: only its W&B log is redone
    runs = _offline_runs(tmp_path)
    assert len(runs) == 1 and runs[0].name.endswith(json.loads(store.wandb_marker_path(spec.run_id).read_text())
                                                    ["wandb_id"])
    assert record == store.read_record(spec.run_id)
    run_overrides(overrides)
    assert _offline_runs(tmp_path) == runs  # logged once


# --- sweeps from the command line ----------------------------------------------------------------------
def _env(tmp_path: Path, **extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path / "home"),
           "WANDB_API_KEY": "", **extra}
    for key in ("JENSENKV_DEBUG", "WANDB_MODE", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "MPLCONFIGDIR"):
        env.pop(key, None)
    env.update(extra)
    return env


def _sweep_args(tmp_path: Path, results: Path, weights: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jensenkv.run", "-m", *fast_overrides(results, weights, "eval.metrics=[psnr]", *extra),
            "logger=wandb_offline", f"hydra.sweep.dir={tmp_path / name}"]


def _check_store(results: Path, expected_runs: int) -> None:
    """One complete, readable record per run, one W&B run each, nothing half-written left."""
    records = sorted(results.glob("runs/*/record.json"))
    assert len(records) == expected_runs
    frame = load_results(results)
    assert frame["run_id"].is_unique and frame["psnr"].notna().all()
    store = ResultsStore(results)
    for run_id in frame["run_id"]:
        record = store.read_record(run_id)
        assert [p["index"] for p in record["per_prompt"]] == list(range(len(record["identity"]["prompts"])))
        wandb_id = json.loads(store.wandb_marker_path(run_id).read_text())["wandb_id"]
        assert len([p for p in _offline_runs(results) if p.name.endswith(wandb_id)]) == 1
    assert len(_offline_runs(results)) == expected_runs
    assert _leftovers(results) == [] and not list(results.glob("runs/*/.lock")) and not list(results.glob("refs/.*"))


def test_a_sweep_with_a_run_held_elsewhere_waits_then_reports_it_missing(tmp_path, weights):
    import threading

    results = tmp_path / "results"
    held = _spec(results, weights, "eval.metrics=[psnr]", "logger=wandb_offline", "correction=taylor")
    lock = ResultsStore(results).run_lock(held.run_id).path
    lock.parent.mkdir(parents=True)

    def beat() -> None:  # a job on another node holding the run, alive until the sweep waits for it
        tmp = lock.with_name(".beat")
        tmp.write_text(json.dumps({"host": "node-that-died", "pid": 1, "heartbeat": time.time()}))
        os.replace(tmp, lock)

    beat()
    proc = subprocess.Popen(_sweep_args(tmp_path, results, weights, "sweep", "correction=none,taylor"),
                            env=_env(tmp_path, JENSENKV_LOCK_STALE_S="3"), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("waiting for run"):
                waiting.set()

    reader = threading.Thread(target=read)
    reader.start()
    while not waiting.is_set() and proc.poll() is None:
        beat()
        time.sleep(0.3)
    proc.wait(timeout=300)  # the node died: no more heartbeats, the lease runs out after 3 s
    reader.join()
    err = "".join(lines)
    assert proc.returncode == 1, err[-3000:]
    assert "summary: 2 run(s): 1 done, 0 skipped (already finished), 0 failed, 1 missing" in err
    assert f"missing: run {held.run_id} (rtn INT2 g32 taylor)" in err
    assert "node-that-died" in err and "Traceback" not in err  # said who holds it while waiting


@pytest.fixture(scope="module")
def identical_sweeps(tmp_path_factory, weights) -> tuple[Path, Path, list[tuple[int, str]]]:
    """Two identical sweeps started at once on one results dir, with an empty HOME: (folder, results,
    [(exit code, stderr)] per sweep). Each such process spends ~25 s starting, so two tests share them."""
    tmp_path = tmp_path_factory.mktemp("identical_sweeps")
    results = tmp_path / "results"
    (tmp_path / "home").mkdir()
    extra = ("correction=none,taylor,exact", "eval.num_prompts=2")
    procs = [subprocess.Popen(_sweep_args(tmp_path, results, weights, f"sweep{i}", *extra), env=_env(tmp_path),
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    return tmp_path, results, [(proc.returncode, err) for proc, (_, err) in zip(procs, outputs)]


def test_two_identical_sweeps_at_once_leave_one_record_and_one_wandb_run_per_run(identical_sweeps):
    _, results, outputs = identical_sweeps
    for code, err in outputs:
        assert code == 0, err[-3000:]
        assert "0 failed, 0 missing" in err
    _check_store(results, 3)


def test_a_sweep_writes_nothing_outside_the_project_and_its_results(identical_sweeps, weights):
    """On the shared sweeps (run after the test above has checked their store): then a rerun skips every run."""
    tmp_path, results, outputs = identical_sweeps
    assert all(code == 0 for code, _ in outputs), [err[-3000:] for _, err in outputs]
    assert list((tmp_path / "home").rglob("*")) == []  # W&B logs and caches, matplotlib: under results/
    again = subprocess.run(_sweep_args(tmp_path, results, weights, "again", "correction=none,taylor,exact",
                                       "eval.num_prompts=2"),
                           env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "3 skipped (already finished)" in again.stderr, again.stderr[-3000:]
    assert list((tmp_path / "home").rglob("*")) == []


@pytest.mark.parametrize("when", ["prompts/0000.json", pytest.param("record.json", marks=pytest.mark.slow)])
def test_a_sweep_killed_mid_way_is_finished_by_the_rerun(tmp_path, weights, when):
    results = tmp_path / "results"
    args = _sweep_args(tmp_path, results, weights, "sweep", "correction=none,taylor", "eval.num_prompts=2")
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not list(results.glob(f"runs/*/{when}")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(list(results.glob("runs/*/record.json"))) < 2  # killed before the sweep was done
    rerun = subprocess.run(args, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "0 failed, 0 missing" in rerun.stderr, rerun.stderr[-3000:]
    _check_store(results, 2)
