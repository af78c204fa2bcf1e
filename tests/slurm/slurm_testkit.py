"""The `slurm` test set's tools: a sweep through hydra/launcher=slurm against the single-node cluster of
scripts/slurm_cluster.sh, a fault done to it while it runs, and the check that the summary, the results store,
the W&B logs and sacct tell the same story. Every test prints its fault table row (what the summary said, the
store's and sacct's view) so the CI log shows them side by side."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
SWEEP_TIMEOUT_S = 1500   # one sweep, requeue holds of about 2 min included (the time-limit test took 840 s loaded)
SUMMARY = re.compile(r"summary: (\d+) run\(s\): (\d+) done.*?, (\d+) skipped .*?, (\d+) failed, (\d+) missing"
                     r"(?:, queued: (\d+))?")


def cluster_ready() -> str | None:
    """None when the test cluster's node takes jobs; else why not (the set is skipped with that line)."""
    try:
        state = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no SLURM cluster here ({e}): run `make test-slurm`, which starts it"
    if state.returncode != 0 or state.stdout.split()[:1] not in (["idle"], ["mix"], ["alloc"]):
        return f"the SLURM node is not up ({(state.stdout or state.stderr).strip()}): run scripts/slurm_cluster.sh start"
    return None


def squeue() -> dict[str, str]:
    """job id -> state of the jobs in the queue."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def sacct_since(start: str) -> dict[str, str]:
    """job id -> sacct's state (first word) of every job (not step) submitted since ``start`` (sacct -S alone
    also lists an earlier job still running then). Times are sacct's ISO format, so they compare as text."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Submit", "-S", start], capture_output=True,
                         text=True).stdout
    rows = (line.split("|") for line in out.splitlines() if line.count("|") == 2)
    return {job: state.split()[0] for job, state, submit in rows if submit >= start}


def wait_for_running(min_s: float = 0, timeout: float = 240) -> str:
    """The id of the first job that has run for ``min_s`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %M"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            job, elapsed = line.split()
            parts = [int(p) for p in re.split(r"[:-]", elapsed)]
            seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
            if seconds >= min_s:
                return job
        time.sleep(1)
    raise AssertionError(f"no job ran for {min_s} s within {timeout} s: {squeue()}")


def wait_for_empty_queue(timeout: float = 300) -> None:
    """Until no job is queued or running (a requeued job waits out SLURM's hold of about 2 minutes)."""
    deadline = time.monotonic() + timeout
    while squeue():
        assert time.monotonic() < deadline, f"jobs still queued after {timeout} s: {squeue()}"
        time.sleep(2)


@dataclass
class Sweep:
    args: list[str]
    folder: Path
    returncode: int = -1
    stderr: str = ""
    start: str = ""
    fault_log: list[str] = field(default_factory=list)

    @property
    def results(self) -> Path:
        return self.folder / "results"

    def summary_counts(self) -> dict[str, int]:
        match = SUMMARY.search(self.stderr)
        assert match, f"no summary line in:\n{self.stderr[-3000:]}"
        keys = ("runs", "done", "skipped", "failed", "missing", "queued")
        return {k: int(v or 0) for k, v in zip(keys, match.groups())}

    def summary_text(self) -> str:
        return "\n".join(line for line in self.stderr.splitlines()
                         if line.startswith(("summary:", "  failed:", "  missing:", "  queued:", "  done:",
                                             "error:")))


def run_sweep(folder: Path, args: list[str], fault: Callable[[Sweep], None] | None = None) -> Sweep:
    """``python -m jensenkv.run -m hydra/launcher=slurm <args>`` in ``folder`` (its results there), with
    ``fault`` done from a thread while it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    wait_for_empty_queue()  # a fault acts on "the running job": none of an earlier test's may be left
    sweep = Sweep(args, folder, start=time.strftime("%Y-%m-%dT%H:%M:%S"))
    env = {**os.environ, "WANDB_MODE": "offline", "JENSENKV_RESULTS": str(folder / "results"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    env.pop("JENSENKV_SLURM_PARTITION", None)
    process = subprocess.Popen([sys.executable, "-m", "jensenkv.run", "-m", "hydra/launcher=slurm", *args],
                               cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    worker = threading.Thread(target=fault, args=(sweep,), daemon=True) if fault else None
    if worker:
        worker.start()
    try:
        _, sweep.stderr = process.communicate(timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, sweep.stderr = process.communicate()
        raise AssertionError(f"the sweep did not end in {SWEEP_TIMEOUT_S} s:\n{sweep.stderr[-3000:]}") from None
    if worker:
        worker.join(timeout=60)
    sweep.returncode = process.returncode
    return sweep


def store_view(results: Path) -> dict[str, dict]:
    """run id -> what the store holds: a sound record, its videos, its W&B log."""
    from jensenkv.store.results import ResultsStore

    store = ResultsStore(results)
    view = {}
    for run_dir in sorted(store.runs_dir.glob("*")) if store.runs_dir.exists() else []:
        run_id = run_dir.name
        videos = sorted(p.name for p in (run_dir / "videos").glob("*")) if (run_dir / "videos").exists() else []
        view[run_id] = {"record": store.has_record(run_id), "videos": videos,
                        "wandb": store.wandb_marker_path(run_id).exists()}
    return view


def check_truthful(sweep: Sweep, runs: int, videos: int) -> dict:
    """The summary's words and exit code equal the store's and sacct's view; every finished run has exactly
    one complete record, its ``videos`` videos and one W&B log. Returns the row of the fault table."""
    from jensenkv.exit_codes import DONE, PARTIAL

    counts = sweep.summary_counts()
    view = store_view(sweep.results)
    jobs = sacct_since(sweep.start)
    recorded = [r for r, v in view.items() if v["record"]]
    assert counts["runs"] == runs, sweep.summary_text()
    assert counts["done"] + counts["skipped"] == len(recorded), (sweep.summary_text(), view)
    assert counts["missing"] + counts["queued"] + counts["failed"] == runs - len(recorded), sweep.summary_text()
    assert all(view[r]["wandb"] for r in recorded), view  # one W&B log per finished run
    assert "W&B log" not in sweep.summary_text()  # no W&B failure it has not seen
    for run_id in recorded:  # each video once: a requeued or orphaned job added none
        assert len(view[run_id]["videos"]) == videos, (run_id, view[run_id])
    expected = DONE if len(recorded) == runs else PARTIAL
    assert sweep.returncode == expected, (sweep.returncode, sweep.summary_text())
    assert "Traceback" not in sweep.stderr, sweep.stderr[-3000:]
    # every job the summary names as ended, sacct names the same way
    for job, state in re.findall(r"SLURM job (\S+) ended (\w+)", sweep.stderr):
        assert jobs.get(job) == state, (job, state, jobs)
    row = {"summary": sweep.summary_text(), "exit": sweep.returncode, "records": f"{len(recorded)}/{runs}",
           "wandb": f"{sum(v['wandb'] for v in view.values())}", "sacct": jobs, "fault": sweep.fault_log}
    print(f"\nFAULT TABLE ROW: {row}", flush=True)
    return row
