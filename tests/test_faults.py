"""Faults while running: locks that must not hang, Ctrl-C, a bad calibration --out, leftovers of a kill,
workers orphaned by a killed sweep and a full disk during the W&B log. Fast tests first; the ones that start
a sweep subprocess are marked slow."""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jensenkv.run.summary import PlannedRun, run_with_summary, summarize
from jensenkv.store.lock import FileLock, LockError
from jensenkv.store.results import ResultsStore

from pipeline_testkit import ctrl_c_as_in_a_terminal, fast_overrides  # noqa: E402


def _spec(results: Path, weights: Path, *extra: str):
    from jensenkv.run import build_spec, compose_config

    return build_spec(compose_config(fast_overrides(results, weights, *extra)))


# --- 1. locks: the heartbeat rule, whatever the PID says; no wait on a lock that can never be taken --------
def test_a_live_pid_without_a_start_time_is_stale_once_its_heartbeat_is(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("JENSENKV_LOCK_STALE_S", "0.5")
    path = tmp_path / "x.lock"
    holder = {"host": socket.gethostname(), "pid": os.getpid()}  # alive, start time unknown
    path.write_text(json.dumps({**holder, "heartbeat": time.time()}))
    assert not FileLock(path).try_acquire()  # beating: respected
    assert "stops its heartbeat for 0.5s" in FileLock(path).describe_holder()  # the promise ...
    path.write_text(json.dumps({**holder, "heartbeat": time.time() - 3683}))
    with caplog.at_level("WARNING", logger="jensenkv.store"):
        lock = FileLock(path)
        assert lock.try_acquire()  # ... kept: taken over, although the PID is alive
    assert "no heartbeat for 3683s (> 0.5s)" in caplog.text
    lock.release()
    path.write_text(json.dumps({**holder, "heartbeat": time.time()}))  # a holder that stops beating now
    start = time.monotonic()
    FileLock(path).acquire(poll_s=0.05)
    assert time.monotonic() - start < 3


def test_a_lock_that_can_never_be_taken_fails_in_one_line_instead_of_waiting(tmp_path):
    folder_lock = tmp_path / "run" / ".lock"
    folder_lock.mkdir(parents=True)  # a folder where the lock file belongs
    lock = FileLock(folder_lock)
    for wait in (lock.try_acquire, lock.acquire, lock.wait_released, lock.is_held_elsewhere):
        with pytest.raises(LockError, match="cannot be read") as info:
            wait()
        assert str(folder_lock) in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "file").write_text("a file where a folder belongs")
    under_a_file = FileLock(tmp_path / "file" / ".lock")
    assert not under_a_file.is_held_elsewhere()  # nobody can hold it: nothing to wait for
    under_a_file.wait_released()
    with pytest.raises(LockError, match="cannot be created"):
        under_a_file.acquire()
    start = time.monotonic()  # a sweep over a results dir under a file: its summary used to wait forever
    text, _ = summarize([PlannedRun("0123abcd", tmp_path / "file", "rtn", False)], time.time())
    assert "1 missing" in text and time.monotonic() - start < 2


def test_a_run_whose_lock_can_never_be_taken_exits_2_and_the_summary_does_not_wait(tmp_path, tiny_weights,
                                                                                     monkeypatch, capsys):
    from jensenkv.run import compose_config, task

    monkeypatch.setattr("jensenkv.models.build_adapter", lambda *a, **k: pytest.fail("loaded the model"))
    overrides = fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr]")
    spec = _spec(tmp_path, tiny_weights, "eval.metrics=[psnr]")
    ResultsStore(tmp_path).run_lock(spec.run_id).path.mkdir(parents=True)
    with pytest.raises(SystemExit) as info:
        task(compose_config(overrides))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".lock cannot be read" in err
    text, complete = summarize([PlannedRun(spec.run_id, tmp_path, "rtn", False)], time.time())
    assert not complete and "1 failed" in text and ".lock cannot be read" in text
    from jensenkv.exit_codes import FAILED, PARTIAL
    from jensenkv.run.summary import job_status, summary_status

    assert summary_status([PlannedRun(spec.run_id, tmp_path, "rtn", False)], time.time())[1] == FAILED  # not 1
    assert summary_status([PlannedRun("0" * 16, tmp_path / "empty", "rtn", False)], time.time())[1] == PARTIAL
    assert job_status(1) == FAILED and job_status(2) == 2 and job_status(None) == 0  # Hydra's 1: an error


# --- 2. Ctrl-C: one line and the summary; the rerun says what it resumed -------------------------------------
def test_ctrl_c_prints_one_line_and_the_summary_with_what_was_resumed(tmp_path, tiny_weights, capsys):
    overrides = fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr]", "eval.num_prompts=2")
    spec = _spec(tmp_path, tiny_weights, "eval.metrics=[psnr]", "eval.num_prompts=2")
    kept = ResultsStore(tmp_path).prompt_result_path(spec.run_id, 0)  # an earlier command finished one video
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")

    def launch():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as info:
        run_with_summary(overrides, launch)
    assert info.value.code == 130
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("interrupted: Ctrl-C stopped the command") and len(err) == 3
    assert err[1] == ("summary: 1 run(s): 0 done, 0 skipped (already finished), 0 failed, 1 missing; "
                      "resumed 1 run with finished videos (1 of 2 videos kept)")


def test_ctrl_c_while_checking_is_one_line(monkeypatch, capsys):
    from jensenkv.run import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "precheck", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main(["quant.bits=2"])
    assert info.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted: before any job started (while checking the values)"]


# --- 3. calibration: --out is checked before any video --------------------------------------------------
@pytest.mark.parametrize("where", ["under a file", "/proc", "a folder"])
def test_calibrate_refuses_an_unwritable_out_before_any_video(tmp_path, monkeypatch, capsys, where):
    from jensenkv.calibration.fit import main

    (tmp_path / "file").write_text("x")
    out = {"under a file": tmp_path / "file" / "cal.json", "/proc": Path("/proc/x.json"),
           "a folder": tmp_path}[where]
    monkeypatch.setattr("jensenkv.models.build_adapter", lambda *a, **k: pytest.fail("generated a video"))
    with pytest.raises(SystemExit) as info:
        main(["--out", str(out), "correction=taylor", "model.device=cpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out='{out}' is not allowed") and err.count("\n") == 1
    assert not list(Path("/proc").glob(".probe.*"))


# --- 4. leftovers of a kill ---------------------------------------------------------------------------------
def test_a_kill_during_the_wandb_marker_write_leaves_nothing_after_the_next_run(tmp_path, tiny_weights,
                                                                              monkeypatch):
    """Killed while writing wandb.json: a young ``.wandb.json.*.tmp`` and no marker. The next run logs W&B
    holding the run's lock, so it owns the folder and removes the leftover, whatever its age."""
    from jensenkv.run import run_overrides
    from jensenkv.run.runner import Runner
    from jensenkv.store.files import atomic_write_json

    overrides = fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr]")
    record = run_overrides(overrides)
    store = ResultsStore(tmp_path)
    leftover = store.run_dir(record["run_id"]) / ".wandb.json.k1ll.tmp"
    leftover.write_text('{"wandb_id": "')  # the marker's half-written copy, just now
    monkeypatch.setattr(Runner, "wandb_pending", lambda self: not store.wandb_marker_path(self.run_id).exists())
    monkeypatch.setattr(Runner, "log_wandb",  # W&B itself is not what is tested: its marker is
                        lambda self, rec: atomic_write_json(store.wandb_marker_path(self.run_id), {"logged": True}))
    assert run_overrides(overrides) == record
    assert store.wandb_marker_path(record["run_id"]).exists() and not leftover.exists()


def test_leftovers_no_live_writer_can_own_are_removed_by_the_next_run(tmp_path, tiny_weights, monkeypatch):
    from jensenkv.run import run_overrides

    overrides = fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr]")
    record = run_overrides(overrides)
    store = ResultsStore(tmp_path)
    run_dir = store.run_dir(record["run_id"])
    old = [run_dir / ".wandb.json.k1ll.tmp", store.refs_dir / "..0123abcd.lock.k1ll.tmp",
           run_dir / ".lock.k1ll.tmp", run_dir / ".tmp" / ".0000_s0.999999.tmp.mp4"]
    fresh = [run_dir / ".wandb.json.l1ve.tmp", store.refs_dir / ".0123abcd.pt.l1ve.tmp"]  # a writer may own them
    for path in [*old, *fresh]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("left by kill -9")
    for path in old:
        os.utime(path, (time.time() - 10, time.time() - 10))
    store.error_path(record["run_id"]).write_text('{"message": "No space left on device"}')  # beside a record
    monkeypatch.setenv("JENSENKV_LOCK_STALE_S", "5")
    assert run_overrides(overrides) == record  # a finished run: only its leftovers are touched
    assert [p for p in old if p.exists()] == [] and all(p.exists() for p in fresh)
    assert not store.error_path(record["run_id"]).exists()


# --- 5. orphans: workers stop with their sweep --------------------------------------------------------------
def test_a_worker_notices_that_its_sweep_is_gone(monkeypatch):
    from jensenkv.run import orphans

    gone, alive = [], [True]
    watcher = orphans.watch(lambda: alive[0], lambda: gone.append(time.monotonic()), poll_s=0.02)
    time.sleep(0.1)
    assert not gone  # the sweep lives
    alive[0] = False
    watcher.join(timeout=2)
    assert len(gone) == 1 and not watcher.is_alive()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert orphans.is_alive(os.getppid()) and not orphans.is_alive(int(dead.stdout))
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.05)
        assert not orphans.is_alive(later.pid)  # younger than this process: a reused PID, not the sweep
    finally:
        later.kill()
        later.wait()
    monkeypatch.setenv(orphans.SWEEP_PID_ENV, str(os.getpid()))
    assert not orphans.is_sweep_worker()  # the sweep's own process never watches itself
    monkeypatch.setenv(orphans.SWEEP_PID_ENV, str(os.getpid() + 1))
    assert orphans.is_sweep_worker()


# --- 6. a full disk during the W&B log, after the record -----------------------------------------------------
class _FullDiskWandb:
    """A W&B run whose finish hits a full disk (what a real offline run does when its folder is full)."""

    mode, log_plots_enabled = "offline", False

    def __init__(self, *args, **kwargs):
        pass

    @staticmethod
    def offline_runs(*args):
        return []

    def log_metrics(self, metrics):
        logging.getLogger("jensenkv.fake.wandb").warning("logging %d metrics", len(metrics))

    def log_video(self, *args, **kwargs):
        pass

    def finish(self, exit_code: int = 0):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_wandb_is_one_done_run_with_a_retried_log(tmp_path, tiny_weights, monkeypatch,
                                                                        capfd):
    from jensenkv.run import compose_config, task

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(logging, "raiseExceptions", True)  # restored after the test
    monkeypatch.setattr("jensenkv.run.wandb.WandbRun", _FullDiskWandb)

    class FullDisk:  # a log file on the full disk
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    handler = logging.StreamHandler(FullDisk())
    logging.getLogger("jensenkv").addHandler(handler)
    try:
        overrides = [*fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr]"), "logger=wandb_offline"]
        record = task(compose_config(overrides))  # no exception: the record is written
    finally:
        logging.getLogger("jensenkv").removeHandler(handler)
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    store = ResultsStore(tmp_path)
    assert store.has_record(record["run_id"]) and not store.wandb_marker_path(record["run_id"]).exists()
    run = PlannedRun(record["run_id"], tmp_path, "rtn INT2 g32 none", False, wandb=True)
    text, complete = summarize([run], time.time())
    assert complete  # every result is in the store: exit 0
    assert text == ("summary: 1 run(s): 1 done (1 W&B log failed: will retry on rerun), 0 skipped (already "
                    "finished), 0 failed, 0 missing")


# --- subprocesses: a real Ctrl-C and a real kill -9 ---------------------------------------------------------
def _env(tmp_path: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path / "home"),
           "WANDB_MODE": "disabled"}
    for key in ("JENSENKV_DEBUG", "JENSENKV_SWEEP_PID"):
        env.pop(key, None)
    return env


def _sweep(tmp_path: Path, weights: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jensenkv.run", "-m",
            *fast_overrides(tmp_path / "results", weights, "eval.metrics=[psnr]", *extra),
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]


def _wait_for(results: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(results.glob(pattern)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(results.glob(pattern)), f"{pattern} never appeared"


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_is_one_line_and_the_summary_and_the_rerun_resumes(tmp_path, tiny_weights):
    args = _sweep(tmp_path, tiny_weights, "correction=none,taylor", "eval.num_prompts=4", "generation.batch_size=1")
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=ctrl_c_as_in_a_terminal)
    _wait_for(tmp_path / "results", "runs/*/prompts/0000.json", proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]  # less progress bars
    assert "Traceback" not in err and len(lines) <= 4, err[-3000:]
    assert "interrupted: Ctrl-C" in err and "summary: 2 run(s):" in err
    rerun = subprocess.run(args, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "; resumed 1 run with finished videos (" in rerun.stderr, rerun.stderr[-3000:]


@pytest.mark.slow
def test_killing_a_parallel_sweep_stops_its_workers(tmp_path, tiny_weights):
    import psutil

    args = _sweep(tmp_path, tiny_weights, "correction=none,taylor", "eval.num_prompts=8", "generation.batch_size=1",
                  "hydra/launcher=local_parallel")
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(args, env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(list((tmp_path / "results").glob("runs/*/.lock"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # both workers have started their jobs
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers
        proc.kill()  # kill -9 the sweep's main process only
        proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=5)
        def running(worker: psutil.Process) -> bool:
            with contextlib.suppress(psutil.NoSuchProcess):
                return worker.status() != psutil.STATUS_ZOMBIE
            return False

        assert [p for p in alive if running(p)] == []
        assert "stopping: the sweep's main process is gone" in log.read_text()  # the watch, not a timeout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed check left running


def test_a_run_taken_over_by_another_process_writes_nothing_more(tmp_path, tiny_weights, monkeypatch, caplog):
    """A holder whose lease went stale (suspended, a slow disk) and was taken over stops before its next video
    and never writes the record: the process that took the run over finishes it."""
    from jensenkv.run import run_overrides
    from jensenkv.run.runner import Runner

    monkeypatch.setenv("JENSENKV_LOCK_STALE_S", "0.4")  # a beat every 0.1 s
    results = tmp_path / "results"
    original, original_lock = Runner.prompt_results, ResultsStore.run_lock
    held: list[FileLock] = []

    def recorded_lock(self, run_id):
        held.append(original_lock(self, run_id))
        return held[-1]

    def first_video_then_taken_over(self, batch):
        original(self, batch)
        lock = self.store.run_lock(self.run_id)
        with lock._guard():  # as a process taking the lock over writes it: never between a heartbeat's read and write
            lock.path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "heartbeat": time.time() + 60,
                                             "token": "other"}))
        deadline = time.monotonic() + 60  # the holder's heartbeat reads the foreign token: however loaded the machine
        while not any(h.lost for h in held) and time.monotonic() < deadline:
            time.sleep(0.05)

    monkeypatch.setattr(ResultsStore, "run_lock", recorded_lock)
    monkeypatch.setattr(Runner, "prompt_results", first_video_then_taken_over)
    caplog.set_level(logging.INFO, logger="jensenkv")
    record = run_overrides(fast_overrides(results, tiny_weights, "eval.seeds=[0,1]", "generation.batch_size=1"))
    store = ResultsStore(results)
    (run_id,) = [p.name for p in store.runs_dir.iterdir()]
    assert record is None and not store.record_path(run_id).exists()
    assert store.prompt_result_path(run_id, 0).exists() and not store.prompt_result_path(run_id, 1).exists()
    assert "lost the lock" in caplog.text and f"run {run_id} was taken over by another process" in caplog.text
    assert json.loads(store.run_lock(run_id).path.read_text())["token"] == "other"  # its lock is left alone
