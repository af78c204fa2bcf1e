"""A sweep through hydra/launcher=slurm on a real cluster, with every scheduler fault of issue 33: after each,
every run has exactly one complete record and one W&B log, and the summary's words and exit code equal what
sacct and the store say (``slurm_testkit.check_truthful``). No launcher override: the built-in model's family
states its resources (no GPU, 1 CPU, 2 GB)."""
from __future__ import annotations

import subprocess
import time

import pytest
from slurm_testkit import (CLUSTER_SCRIPT, check_truthful, run_sweep, sacct_since, wait_for_empty_queue,
                           wait_for_running)

pytestmark = pytest.mark.usefixtures("cluster")
TWO_RUNS = ["quant=rtn,rtn_int4", "correction=none"]
SLURMD_PID = "/var/lib/jensenkv-slurm/run/slurmd.pid"
SLURMD_TIMEOUT_S = 20  # scripts/slurm_cluster.sh's SlurmdTimeout


def _log(sweep, what: str) -> None:
    sweep.fault_log.append(f"{time.strftime('%H:%M:%S')} {what}")


def test_a_sweep_then_its_rerun_submits_no_job(tmp_path):
    first = run_sweep(tmp_path, [*TWO_RUNS, "eval.num_prompts=1"])
    row = check_truthful(first, runs=2, videos=1)
    assert row["exit"] == 0 and first.summary_counts()["done"] == 2
    rerun = run_sweep(tmp_path, [*TWO_RUNS, "eval.num_prompts=1"])
    check_truthful(rerun, runs=2, videos=1)
    assert rerun.summary_counts()["skipped"] == 2
    assert not sacct_since(rerun.start).keys() - sacct_since(first.start).keys(), "the rerun submitted a job"


def test_scancel_mid_run_is_reported_as_sacct_says_and_the_rerun_finishes(tmp_path):
    def cancel(sweep):
        job = wait_for_running(min_s=8)
        subprocess.run(["scancel", job], check=True)
        _log(sweep, f"scancel {job}")

    args = [*TWO_RUNS, "eval.num_prompts=4"]
    cancelled = run_sweep(tmp_path, args, cancel)
    row = check_truthful(cancelled, runs=2, videos=4)
    counts = cancelled.summary_counts()
    assert counts["missing"] == 1 and "ended CANCELLED" in row["summary"] or \
        counts["done"] == 2 and "CANCELLED after the record was written" in row["summary"], row
    rerun = run_sweep(tmp_path, args)
    assert check_truthful(rerun, runs=2, videos=4)["exit"] == 0


def test_a_time_limit_requeues_and_the_job_resumes(tmp_path):
    # 192 videos: longer than the 2 minutes before the signal even on a fast machine, so the limit is met
    args = ["quant=rtn", "eval.num_prompts=16", f"eval.seeds=[{','.join(map(str, range(12)))}]",
            "hydra.launcher.timeout_min=3", "hydra.launcher.signal_delay_s=60"]
    sweep = run_sweep(tmp_path, args)
    row = check_truthful(sweep, runs=1, videos=192)
    assert row["exit"] == 0
    attempts = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-S", sweep.start],
                              capture_output=True, text=True).stdout.split()
    print(f"sacct -D: {attempts}")
    assert any("REQUEUED" in a for a in attempts), attempts  # the time limit was met and the job requeued
    assert attempts[-1].endswith("|COMPLETED"), attempts  # and its last attempt finished the run


def test_a_signal_before_the_job_can_catch_it_is_refused_before_any_job(tmp_path):
    sweep = run_sweep(tmp_path, ["quant=rtn", "eval.num_prompts=1", "hydra.launcher.timeout_min=1"])
    assert sweep.returncode == 2 and sweep.stderr.startswith("error: hydra.launcher.signal_delay_s=120"), \
        sweep.stderr
    assert not sacct_since(sweep.start)


def test_scontrol_requeue_mid_run_resumes(tmp_path):
    def requeue(sweep):
        job = wait_for_running(min_s=10)
        subprocess.run(["scontrol", "requeue", job], check=True)
        _log(sweep, f"scontrol requeue {job}")

    sweep = run_sweep(tmp_path, ["quant=rtn", "eval.num_prompts=6"], requeue)
    assert check_truthful(sweep, runs=1, videos=6)["exit"] == 0


def _kill_slurmd(sweep, down_s: float) -> None:
    wait_for_running(min_s=5)
    with open(SLURMD_PID) as f:
        pid = int(f.read())
    subprocess.run(["kill", str(pid)], check=True)
    _log(sweep, f"slurmd (pid {pid}) killed")
    time.sleep(down_s)
    subprocess.run([str(CLUSTER_SCRIPT), "start"], check=True, capture_output=True)
    _log(sweep, f"slurmd restarted after {down_s} s; node {subprocess.run(['sinfo', '-h', '-o', '%t'], capture_output=True, text=True).stdout.strip()}")


@pytest.mark.parametrize("down_s", [3, SLURMD_TIMEOUT_S + 25], ids=["restarted", "past_its_timeout"])
def test_slurmd_killed_loses_and_duplicates_nothing(tmp_path, down_s):
    sweep = run_sweep(tmp_path, [*TWO_RUNS, "eval.num_prompts=4"], lambda s: _kill_slurmd(s, down_s))
    row = check_truthful(sweep, runs=2, videos=4)
    # a job SLURM requeued (NODE_FAIL) while its orphaned process finished the run runs again later: a no-op
    records = {p: p.stat().st_mtime_ns for p in sweep.results.glob("runs/*/record.json")}
    wait_for_empty_queue()
    assert {p: p.stat().st_mtime_ns for p in sweep.results.glob("runs/*/record.json")} == records
    if row["exit"] != 0:  # a run the lost node did not finish: the rerun does, and nothing twice
        assert check_truthful(run_sweep(tmp_path, [*TWO_RUNS, "eval.num_prompts=4"]), runs=2, videos=4)["exit"] == 0
