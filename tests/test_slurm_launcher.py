"""hydra/launcher=slurm: partition and account overridable (command line or environment), requeue on timeout."""
from __future__ import annotations

from jensenkv.run.cli import compose_config


def _launcher(*overrides: str):
    return compose_config(["hydra/launcher=slurm", *overrides], hydra_config=True).hydra.launcher


def test_defaults_leave_partition_and_account_to_sbatch_and_requeue_on_timeout(monkeypatch):
    monkeypatch.delenv("JENSENKV_SLURM_PARTITION", raising=False)
    monkeypatch.delenv("JENSENKV_SLURM_ACCOUNT", raising=False)
    launcher = _launcher()
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition is None and launcher.account is None  # no #SBATCH line: sbatch's own defaults
    assert launcher.max_num_timeout > 0 and launcher.timeout_min > 0 and launcher.gpus_per_node == 1
    assert launcher.signal_delay_s > 0  # the warning before the time limit that triggers the requeue


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
                                          "hydra.launcher.gpus_per_node=0"), tmp_path)
    lines = set(script.splitlines())
    assert {"#SBATCH --partition=cpu", "#SBATCH --mem=3GB", "#SBATCH --cpus-per-task=8", "#SBATCH --time=240",
            "#SBATCH --signal=USR2@120"} <= lines
    assert "#SBATCH --gpus-per-node=0" in lines  # what submitit writes for a CPU job, and sbatch judges
    assert "#SBATCH --gpus-per-node=1" in submission_script(_container(), tmp_path)


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
             "Requested node configuration is not available": ("hydra.launcher.cpus_per_task=8",),
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
