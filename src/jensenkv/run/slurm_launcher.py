"""hydra/launcher=slurm: hydra-submitit-launcher's SLURM launcher, with what a sweep on a real scheduler needs.

- Finished runs are skipped before submission, and a run that several jobs of the sweep share (bf16 under
  each correction, a rotation seed of an unrotated quantizer) is submitted once: a rerun of a finished sweep
  submits no job.
- It waits for every job, a failed one included, so the summary never calls a queued run "missing"; each
  job's end (sacct's state, the one-line reason of a failure) is kept in ``sweep_jobs()`` for the summary,
  instead of a Hydra/submitit traceback.
- On the node, SIGTERM (``scancel``, the node going down) stops the run at once, as Ctrl-C does (finished
  videos kept, lock released); submitit itself ignores SIGTERM until SLURM's SIGKILL, and the run would go on.
"""
from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

log = logging.getLogger(__name__)

# sacct states of a job that may still run its task (requeued jobs go back to PENDING)
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING")


@dataclass
class SweepJob:
    """One submitted job of the sweep: its run, its SLURM id and, once it ended, sacct's state and why."""
    run_id: str
    job_id: str
    state: str = "PENDING"
    reason: str = ""        # one line: why it ended without a result ("" when it returned)


_SWEEP: dict[str, SweepJob] = {}   # run id -> its job, for this process's last sweep


def sweep_jobs() -> dict[str, SweepJob]:
    """run id -> the SLURM job this process submitted for it (empty when no SLURM sweep ran here)."""
    return dict(_SWEEP)


def one_line(error: BaseException | str) -> str:
    """A job's failure as one line: the last line of a traceback that says something (the exception with its
    message), or the first line of submitit's own message ("has not produced any output (state: ...)")."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, BaseException) else "no reason given"
    if "has not produced any output" in text:  # submitit: the job ended without a result file
        said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]  # the task's own
        said += [line.split("error:", 1)[1].strip(" *") for line in lines if "*** JOB" in line and "error:" in line]
        said += [line for line in lines if line.startswith("stopped by SIGTERM")]
        ended = next(line for line in lines if "has not produced any output" in line)
        return said[-1] if said else ended
    if "Traceback (most recent call last)" in text:
        last = [line for line in lines if not line.startswith(("File ", "^", "~", "During handling",
                                                                 "The above exception", "Traceback"))]
        return last[-1] if last else lines[-1]
    return lines[0]


def sbatch_reason(error: BaseException) -> str:
    """sbatch's own words from a failed submission (``sbatch: error: ...``), else the error's first line."""
    text = "\n".join(str(part) for part in (getattr(error, "stderr", None), getattr(error, "output", None), error)
                     if part)
    for line in text.replace("\\n", "\n").splitlines():
        if "sbatch: error:" in line:
            return line.split("sbatch: error:", 1)[1].strip().strip("'\"")
    return one_line(error)


@dataclass(frozen=True)
class PlannedJob:
    """A job's run as planned on the submitting host, its devices resolved as on the job's node."""
    run_id: str
    finished: bool          # the store has its record already
    overrides: list[str]    # the job's overrides, model.device pinned to the planned device (``pinned_device``)


def plan_job(config: Any, overrides: Sequence[str], launcher: Any) -> PlannedJob:
    """The run of a job's composed ``config`` (Hydra's sweep config of ``overrides``), planned as on the node a
    job of ``launcher`` runs on (``slurm_resources.job_node``)."""
    from omegaconf import open_dict

    from jensenkv.run.slurm_resources import job_node, pinned_device
    from jensenkv.config.resolve import build_spec
    from jensenkv.store.results import ResultsStore

    with open_dict(config):
        config.pop("hydra", None)  # the task's view, as Hydra hands it to the job
    written = str(config.model.device)  # before build_spec resolves it
    with job_node(launcher):
        spec = build_spec(config)
    return PlannedJob(spec.run_id, ResultsStore(spec.results_dir).has_record(spec.run_id),
                      pinned_device(overrides, written, spec.model.device))


STOPPED_EXIT = 128 + signal.SIGTERM  # as a shell reports a process ended by SIGTERM


class SlurmLauncher(SubmititSlurmLauncher):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """On the node: SIGTERM (scancel, scontrol requeue, the node going down) stops the run at once by the
        runner's Ctrl-C path (finished videos kept, lock released), where submitit would ignore it until
        SLURM's SIGKILL. The process then ends without a result file: a cancelled job reads CANCELLED in
        sacct, and a requeued one is still waited for. submitit's SIGUSR2 handler (checkpoint and requeue at
        the time limit) stays."""
        import os

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, stop)
        try:
            return super().__call__(*args, **kwargs)
        except KeyboardInterrupt:
            print("stopped by SIGTERM (scancel, requeue or the node going down): finished videos are kept, the "
                  "rerun or the requeued job resumes", file=sys.stderr, flush=True)
            os._exit(STOPPED_EXIT)  # no result file: submitit reads the job's end from sacct

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        assert self.config is not None and self.hydra_context is not None
        _SWEEP.clear()
        submit: list[tuple[int, list[str], str]] = []
        seen: set[str] = set()
        for i, overrides in enumerate(job_overrides):
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            job = plan_job(config, overrides, self.params)
            if job.finished or job.run_id in seen:  # finished before, or another job of this sweep runs it
                continue
            seen.add(job.run_id)
            submit.append((initial_job_idx + i, job.overrides, job.run_id))
        skipped = len(job_overrides) - len(submit)
        log.info("SLURM: %d job(s) to submit, %d skipped (run finished already or shared with another job)",
                 len(submit), skipped)
        if not submit:
            return []
        jobs = self._submit(submit)
        for (_, _, run_id), job in zip(submit, jobs):
            _SWEEP[run_id] = SweepJob(run_id, str(job.job_id))
        return self._wait(jobs, [run_id for _, _, run_id in submit])

    def _submit(self, submit: list[tuple[int, list[str], str]]) -> list[Any]:
        """The jobs, one per run, as submitit's array job; sbatch's refusal is one line and exit FAILED."""
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        from jensenkv.exit_codes import FAILED
        from jensenkv.run.slurm_check import make_executor

        assert self.config is not None
        executor = make_executor(self.params, Path(str(self.params["submitit_folder"])))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("Submitit 'slurm' sweep output dir : %s", sweep_dir)
        params = []
        for idx, overrides, _ in submit:
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            params.append((overrides, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        try:
            return executor.map_array(self, *zip(*params))
        except Exception as e:  # noqa: BLE001 - sbatch refused at submission: its reason, one line
            print(f"error: sbatch refused the sweep's jobs: {sbatch_reason(e)}", file=sys.stderr, flush=True)
            sys.exit(FAILED)

    @staticmethod
    def _wait(jobs: list[Any], run_ids: list[str]) -> list[Any]:
        """Every job's end (a failed one does not stop the wait for the others); the results of those that
        returned. A failure is kept as one line for the summary."""
        returns = []
        for job, run_id in zip(jobs, run_ids):
            entry = _SWEEP[run_id]
            try:
                returns.append(job.results()[0])
            except Exception as e:  # noqa: BLE001 - the job's error, or SLURM ended it without a result
                entry.reason = one_line(e)
            entry.state = job_state(job)
            if entry.reason and entry.state in REQUEUE_STATES and wait_requeued(job):
                # SLURM put the job back in the queue (its node was lost): its next attempt is its end
                entry.reason, entry.state = "", sacct_state(str(job.job_id))
                try:
                    returns.append(job.results()[0])
                except Exception as e:  # noqa: BLE001 - the requeued attempt ended without a result too
                    entry.reason = one_line(e)
            if entry.reason:
                log.warning("job %s (run %s) ended %s: %s", entry.job_id, run_id, entry.state, entry.reason)
        return returns


STATE_SETTLE_S = 20  # how long an ended job may still read RUNNING/COMPLETING in sacct
REQUEUE_STATES = ("NODE_FAIL", "PREEMPTED")  # ends SLURM may undo by requeueing the job (JobRequeue=1)
REQUEUE_NOTICE_S = 60  # how long SLURM may take to put such a job back in the queue


def sacct_state(job_id: str) -> str:
    """sacct's current state of a job, asked directly (submitit's watcher stops asking once a job ended)."""
    import subprocess

    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return "UNKNOWN"
    return out[-1].split()[0] if out and out[-1].strip() else "UNKNOWN"


def wait_requeued(job: Any) -> bool:
    """Whether SLURM requeued a job that lost its node (or was preempted); if it did, after that attempt ended
    (its own time limit bounds the wait). False: the job's end is final."""
    import time

    job_id = str(job.job_id)
    deadline = time.monotonic() + REQUEUE_NOTICE_S
    state = sacct_state(job_id)
    while state in REQUEUE_STATES and time.monotonic() < deadline:
        time.sleep(2)
        state = sacct_state(job_id)
    if state in REQUEUE_STATES or state == "UNKNOWN":
        return False
    log.info("SLURM job %s was requeued after losing its node: waiting for its next attempt", job_id)
    while state in ACTIVE_STATES:
        time.sleep(5)
        state = sacct_state(job_id)
    return True


def job_state(job: Any) -> str:
    """sacct's state of an ended job (``CANCELLED by 0`` -> ``CANCELLED``), asked again until it is a final
    one; UNKNOWN when sacct has none (no accounting)."""
    import time

    deadline = time.monotonic() + STATE_SETTLE_S
    state = "UNKNOWN"
    while True:
        try:
            state = str(job.get_info(mode="force").get("State") or "UNKNOWN").split()[0]
        except Exception:  # noqa: BLE001 - sacct unreachable: unknown; the store still says what ran
            return "UNKNOWN"
        if state not in ACTIVE_STATES or time.monotonic() > deadline:
            return state
        time.sleep(2)
