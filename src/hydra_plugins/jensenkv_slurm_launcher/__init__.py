"""hydra/launcher=slurm's launcher, where Hydra accepts launchers (the hydra_plugins package); its logic lives
in jensenkv.run.slurm_launcher."""
from jensenkv.run.slurm_launcher import SlurmLauncher as _SlurmLauncher


class SlurmLauncher(_SlurmLauncher):
    """jensenkv.run.slurm_launcher.SlurmLauncher, defined here so Hydra will instantiate it."""
