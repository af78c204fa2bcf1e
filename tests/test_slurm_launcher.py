"""hydra/launcher=slurm: partition and account overridable (command line or environment), requeue on timeout."""
from __future__ import annotations

import pytest

from jensenkv.run.cli import compose_config


def _launcher(*overrides: str):
    return compose_config(["hydra/launcher=slurm", *overrides], hydra_config=True).hydra.launcher


def test_defaults_leave_partition_and_account_to_sbatch_and_requeue_on_timeout(monkeypatch):
    monkeypatch.delenv("JENSENKV_SLURM_PARTITION", raising=False)
    monkeypatch.delenv("JENSENKV_SLURM_ACCOUNT", raising=False)
    launcher = _launcher()
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition is None and launcher.account is None  # no #SBATCH line: sbatch's own defaults
    assert launcher.max_num_timeout > 0 and launcher.timeout_min > 0
    assert launcher.signal_delay_s > 0  # the warning before the time limit that triggers the requeue
    # resources are the model family's: left null here, filled in by the command line
    assert launcher.gpus_per_node is None and launcher.cpus_per_task is None and launcher.mem_gb is None


def _resources(*args: str) -> dict[str, str]:
    from jensenkv.run.cli import with_family_resources

    added = with_family_resources(["-m", "hydra/launcher=slurm", *args])[len(args) + 2:]
    return dict(a.removeprefix("hydra.launcher.").split("=") for a in added)


def test_the_built_in_model_asks_for_no_gpu_and_what_its_family_states():
    from jensenkv.models.registry import family

    assert _resources() == {"gpus_per_node": "0", "cpus_per_task": "1", "mem_gb": "2"}
    assert _resources("experiment=table1") == {"gpus_per_node": "0", "cpus_per_task": "1", "mem_gb": "2"}
    # the user's own setting wins, and is not repeated
    assert _resources("hydra.launcher.mem_gb=5") == {"gpus_per_node": "0", "cpus_per_task": "1"}
    tiny = family("tiny")
    assert tiny.resources(_model("tiny"), video=2**30).mem_gb == 2 + tiny.cpu_batch_size  # its CPU batch in RAM


def _model(name: str, device: str = "auto"):
    from jensenkv.config.resolve import compose_config

    model = compose_config([f"model={name}"]).model
    model.device = device  # as written: composing resolved "auto" on this GPU-less host
    return model


def test_a_real_model_asks_for_a_gpu_and_the_memory_its_family_states():
    from jensenkv.models.family import NodeResources
    from jensenkv.models.registry import family

    for name in ("skyreels_v2_df_1_3b", "magi1_4_5b", "worldplay_8b"):
        model = _model(name)
        own = family(model.kind)
        assert own.resources(model, video=0) == NodeResources(1, own.node_cpus, own.node_memory_gb), name
        assert own.resources(_model(name, "cpu"), video=0).gpus == 0  # model.device=cpu: no GPU asked


def test_a_launcher_elsewhere_gets_no_resource_override():
    from jensenkv.run.cli import with_family_resources

    args = ["-m", "quant=bf16,rtn", "hydra/launcher=local_parallel"]
    assert with_family_resources(args) == args


def test_a_requeue_signal_the_job_cannot_catch_yet_is_refused():
    import pytest

    from jensenkv.run.slurm_resources import check_time_limit

    check_time_limit({"timeout_min": 3, "signal_delay_s": 60})  # measured: requeued and resumed
    check_time_limit({"timeout_min": 240, "signal_delay_s": 120})  # the defaults
    for timeout_min, delay in ((1, 120), (1, 30), (2, 60)):  # measured: (1, 120) killed, (1, 30) died requeued
        with pytest.raises(ValueError, match=r"^hydra.launcher.signal_delay_s=\d+ is not allowed: with "
                                             r"hydra.launcher.timeout_min=\d+ the requeue signal may come"):
            check_time_limit({"timeout_min": timeout_min, "signal_delay_s": delay})


def test_partition_and_account_from_environment_and_command_line(monkeypatch):
    monkeypatch.setenv("JENSENKV_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("JENSENKV_SLURM_ACCOUNT", "proj_env")
    launcher = _launcher("hydra.launcher.account=proj_cli")
    assert launcher.partition == "gpu" and launcher.account == "proj_cli"


# --- the pre-check asks the scheduler: sbatch --test-only on the script submitit would submit ----------------
def _container(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_launcher(*overrides), resolve=True)


def test_the_tested_script_is_the_one_the_launcher_submits(tmp_path, monkeypatch):
    """The #SBATCH lines come from submitit, from the launcher's own settings: what sbatch --test-only judges is
    what the jobs would ask for."""
    from jensenkv.run.slurm_check import submission_script

    _fake_slurm(tmp_path, monkeypatch, None)  # submitit's executor wants srun on PATH

    script = submission_script(_container("hydra.launcher.partition=cpu", "hydra.launcher.mem_gb=3",
                                          "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=8"),
                               tmp_path)
    lines = set(script.splitlines())
    assert {"#SBATCH --partition=cpu", "#SBATCH --mem=3GB", "#SBATCH --cpus-per-task=8", "#SBATCH --time=240",
            "#SBATCH --signal=USR2@120"} <= lines
    assert "#SBATCH --gpus-per-node=0" in lines  # what submitit writes for a CPU job, and sbatch judges
    assert "#SBATCH --gpus-per-node=1" in submission_script(_container("hydra.launcher.gpus_per_node=1"), tmp_path)


def _fake_slurm(tmp_path, monkeypatch, refusal):
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bad_inputs", root / "scripts" / "bad_inputs.py")
    bad_inputs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bad_inputs)
    folder = bad_inputs.fake_slurm(tmp_path / "bin", refusal)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    return pathlib.Path(folder)


def test_a_scheduler_that_accepts_lets_the_sweep_go(tmp_path, monkeypatch):
    from jensenkv.run.slurm_check import check_slurm_accepts

    folder = _fake_slurm(tmp_path, monkeypatch, None)
    check_slurm_accepts(_container())
    assert (folder / "sbatch.calls").read_text().startswith("--test-only ")  # asked once, submitted nothing


def test_each_refusal_names_the_setting_behind_it(tmp_path, monkeypatch):
    import pytest

    from jensenkv.run.slurm_check import check_slurm_accepts

    cases = {"Invalid partition name specified": ("hydra.launcher.partition='gpu'", "hydra.launcher.partition=gpu"),
             "Invalid account or account/partition combination specified": ("hydra.launcher.account='x'",
                                                                            "hydra.launcher.account=x"),
             "Requested time limit is invalid (missing or exceeds some limit)": ("hydra.launcher.timeout_min=240",),
             "Requested node configuration is not available": ("hydra.launcher.cpus_per_task=8",
                                                               "hydra.launcher.cpus_per_task=8"),
             "Something new": ("hydra/launcher='slurm'",)}
    for i, (refusal, (named, *overrides)) in enumerate(cases.items()):
        _fake_slurm(tmp_path / str(i), monkeypatch, refusal)
        with pytest.raises(ValueError) as err:
            check_slurm_accepts(_container(*overrides))
        assert str(err.value).startswith(named) and refusal in str(err.value) and "\n" not in str(err.value)


def test_a_controller_that_never_answers_is_one_line(tmp_path, monkeypatch):
    import pytest

    import jensenkv.run.slurm_check as slurm_check

    folder = _fake_slurm(tmp_path, monkeypatch, None)
    (folder / "sbatch").write_text("#!/bin/sh\nsleep 30\n")
    monkeypatch.setattr(slurm_check, "TEST_ONLY_TIMEOUT_S", 0.5)
    with pytest.raises(ValueError, match=r"^hydra/launcher='slurm' is not allowed: the SLURM controller did not "
                                         r"answer `sbatch --test-only` in 0.5 s"):
        slurm_check.check_slurm_accepts(_container())


# --- a job's end as one line, and the summary's words for a SLURM sweep -----------------------------------
SUBMITIT_CANCELLED = """Job 17_0 (task: 0) with path /x/.submitit/17_0/17_0_0_result.pkl
has not produced any output (state: CANCELLED by 0)
Error stream produced:
----------------------------------------

run e884ba125e38b3b9 (rtn):   0%|          | 0/4 [00:00<?, ?video/s]srun: got SIGCONT
slurmstepd-vm: error: *** JOB 18 ON vm CANCELLED AT 2026-12-07T10:12:55 ***
srun: forcing job termination
"""


def test_a_job_that_ended_without_a_result_is_one_line_with_the_schedulers_words():
    from jensenkv.run.slurm_launcher import one_line, sbatch_reason

    assert one_line(SUBMITIT_CANCELLED) == "JOB 18 ON vm CANCELLED AT 2026-12-07T10:12:55"
    assert one_line("Job 3_1 (task: 0) with path p\nhas not produced any output (state: NODE_FAIL)\n") == \
        "has not produced any output (state: NODE_FAIL)"
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\nValueError: bad prompt\n'
    assert one_line(traceback) == "ValueError: bad prompt"
    import subprocess

    refused = subprocess.CalledProcessError(1, ["sbatch"], output=b"", stderr=b"sbatch: error: Batch job submission "
                                            b"failed: Requested node configuration is not available\n")
    assert sbatch_reason(refused) == "Batch job submission failed: Requested node configuration is not available"


def test_a_queued_job_is_queued_and_an_ended_one_says_how(tmp_path, monkeypatch):
    import jensenkv.run.slurm_launcher as launcher
    from jensenkv.exit_codes import PARTIAL
    from jensenkv.run.summary import PlannedRun, summary_status

    runs = [PlannedRun(f"run{i}", tmp_path, "rtn", finished_before=False, videos=1, wandb=True) for i in range(2)]
    monkeypatch.setattr(launcher, "_SWEEP", {"run0": launcher.SweepJob("run0", "7_0", "PENDING"),
                                             "run1": launcher.SweepJob("run1", "7_1", "CANCELLED", "JOB 9 CANCELLED")})
    text, status = summary_status(runs, started_at=0)
    assert status == PARTIAL and "1 missing, queued: 1" in text.splitlines()[0]
    assert "queued: run run0 (rtn): SLURM job 7_0 still queued or running" in text
    assert "missing: run run1 (rtn): no record: SLURM job 7_1 ended CANCELLED: JOB 9 CANCELLED" in text
    assert "W&B" not in text  # no W&B failure for runs that have not ended


def test_a_run_finished_by_an_orphan_of_a_lost_node_is_done_and_its_requeued_job_a_no_op(tmp_path, monkeypatch):
    import jensenkv.run.slurm_launcher as launcher
    from jensenkv.run.summary import outcome, PlannedRun
    from jensenkv.store.results import ResultsStore

    run = PlannedRun("0" * 16, tmp_path, "rtn", finished_before=False)
    monkeypatch.setattr(ResultsStore, "has_record", lambda self, run_id: True)
    monkeypatch.setattr(launcher, "_SWEEP", {run.run_id: launcher.SweepJob(run.run_id, "65_0", "PENDING")})
    status, detail = outcome(run, started_at=0)
    assert status == "done" and "65_0 is PENDING again, requeued after the record was written" in detail
    monkeypatch.setattr(launcher, "_SWEEP", {run.run_id: launcher.SweepJob(run.run_id, "65_0", "CANCELLED")})
    assert outcome(run, started_at=0) == ("done", "SLURM job 65_0 ended CANCELLED after the record was written")


def test_a_node_configuration_refusal_names_the_resource_no_node_offers(tmp_path, monkeypatch):
    from jensenkv.run.slurm_check import refused_setting

    folder = _fake_slurm(tmp_path, monkeypatch, None)
    (folder / "sinfo").write_text("#!/bin/sh\necho '2 24105 (null)'\n")  # one 2-CPU, 23 GB node, no GPU
    message = "allocation failure: Requested node configuration is not available"
    assert refused_setting(message, {"gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 64}) == ("mem_gb", 64)
    assert refused_setting(message, {"gpus_per_node": 0, "cpus_per_task": 8, "mem_gb": 2}) == ("cpus_per_task", 8)
    assert refused_setting(message, {"gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 2}) == ("gpus_per_node", 1)


class _LostNodeJob:
    """A submitit job whose first attempt lost its node: results() fails until a requeued attempt ran."""

    job_id = "5_0"

    def __init__(self, requeued_result):
        self.calls = 0
        self.requeued_result = requeued_result

    def results(self):
        self.calls += 1
        if self.calls == 1 or self.requeued_result is None:
            raise RuntimeError("Job 5_0 has not produced any output (state: NODE_FAIL)")
        return [self.requeued_result]

    def get_info(self, mode="force"):
        return {"State": "NODE_FAIL"}  # submitit's watcher stops asking once a job ended


@pytest.mark.parametrize("requeued", [True, False], ids=["requeued", "not_requeued"])
def test_a_job_that_lost_its_node_is_waited_for_when_slurm_requeues_it(requeued, monkeypatch):
    """sacct says NODE_FAIL, then (requeued) PENDING, RUNNING, COMPLETED: the summary's end is the last
    attempt's; a job SLURM did not requeue keeps its NODE_FAIL and the reason."""
    import jensenkv.run.slurm_launcher as launcher

    states = iter(["NODE_FAIL", "PENDING", "RUNNING", "COMPLETED", "COMPLETED"] if requeued else [])
    monkeypatch.setattr(launcher, "sacct_state", lambda job_id: next(states, "NODE_FAIL"))
    monkeypatch.setattr(launcher, "REQUEUE_NOTICE_S", 0.05)
    monkeypatch.setattr("time.sleep", lambda s: None)
    monkeypatch.setattr(launcher, "_SWEEP", {"run0": launcher.SweepJob("run0", "5_0")})
    job = _LostNodeJob("record" if requeued else None)
    returns = launcher.SlurmLauncher._wait([job], ["run0"])
    entry = launcher.sweep_jobs()["run0"]
    if requeued:
        assert returns == ["record"] and entry.state == "COMPLETED" and entry.reason == "" and job.calls == 2
    else:
        assert returns == [] and entry.state == "NODE_FAIL" and "NODE_FAIL" in entry.reason and job.calls == 1
