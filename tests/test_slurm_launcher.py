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
