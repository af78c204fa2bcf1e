"""Before a SLURM sweep submits anything, the scheduler itself is asked whether it would take the jobs:
``sbatch --test-only`` on the very script submitit would submit (built by submitit from the launcher's own
settings, as hydra-submitit-launcher builds it). A refusal becomes one line naming the launcher setting behind
it, instead of a submitit traceback after launch.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

from jensenkv.checks import fail

TEST_ONLY_TIMEOUT_S = 30  # a controller that does not answer in this long will not run the sweep either
# sbatch's refusals (Slurm 22.05 wording, lower case) -> the hydra.launcher settings that ask for that resource
REFUSALS = {
    "generic resource": ("gpus_per_node", "gres", "gpus_per_task"),
    "gres": ("gpus_per_node", "gres", "gpus_per_task"),
    "memory specification": ("mem_gb", "mem_per_cpu", "mem_per_gpu"),
    "cpu count": ("cpus_per_task",),
    "node configuration is not available": ("cpus_per_task", "gpus_per_node", "mem_gb", "constraint"),
    "partition": ("partition",),
    "account": ("account",),
    "qos": ("qos",),
    "time limit": ("timeout_min",),
    "node count": ("nodes",),
    "constraint": ("constraint",),
}
ESCAPE = "or run locally with hydra/launcher=local_parallel"


def make_executor(launcher: dict[str, Any], folder: Path) -> Any:
    """submitit's SLURM executor for this launcher config, its parameters named as hydra-submitit-launcher
    names them (the one place that translates them: the pre-check and the launcher share it)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    params = {k: v for k, v in launcher.items() if k not in ("_target_", "submitit_folder")}
    init = {"slurm_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", **init)
    base = set(OmegaConf.structured(BaseQueueConf).keys())  # the launcher's rule: other keys get "slurm_"
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return executor


def submission_script(launcher: dict[str, Any], folder: Path) -> str:
    """The sbatch script submitit writes for one job of this launcher config (``_target_`` and all)."""
    executor = make_executor(launcher, folder)
    return executor._executor._make_submission_file_text("true", "precheck")  # noqa: SLF001 - submitit's own text


def largest_node() -> dict[str, int] | None:
    """The most CPUs, memory (MB) and GPUs any node offers (``sinfo``); None when sinfo does not answer."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%c %m %G"], capture_output=True, text=True,
                             timeout=TEST_ONLY_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = []
    for line in out.splitlines():
        cpus, memory, gres = (line.split() + ["", "", ""])[:3]
        gpus = sum(int(part.rsplit(":", 1)[-1].split("(")[0]) for part in gres.split(",")
                   if part.startswith("gpu") and part.rsplit(":", 1)[-1].split("(")[0].isdigit())
        if cpus.rstrip("+").isdigit() and memory.rstrip("+").isdigit():
            nodes.append({"cpus_per_task": int(cpus.rstrip("+")), "mem_gb": int(memory.rstrip("+")) // 1024,
                          "gpus_per_node": gpus})
    return {k: max(n[k] for n in nodes) for k in nodes[0]} if nodes else None


def refused_setting(message: str, launcher: dict[str, Any]) -> tuple[str, Any] | None:
    """(setting, value) of the launcher behind sbatch's refusal ``message``; None when it names none. For
    "node configuration is not available", the resource that exceeds every node (sinfo) when one does."""
    text = message.lower()
    if "node configuration is not available" in text:
        largest = largest_node()
        for key in ("gpus_per_node", "mem_gb", "cpus_per_task"):
            value = launcher.get(key)
            if largest is not None and isinstance(value, int) and value > largest[key]:
                return key, value
    for phrase, keys in REFUSALS.items():
        if phrase in text:
            for key in keys:
                value = launcher.get(key)
                if value is not None and value != {} and (key != "gpus_per_node" or value):
                    return key, value
    return None


def check_slurm_accepts(launcher: dict[str, Any]) -> None:
    """ValueError (one line) when the scheduler cannot be reached or would refuse this launcher's jobs."""
    with tempfile.TemporaryDirectory(prefix="jensenkv-sbatch-") as tmp:
        script = Path(tmp) / "test_only.sh"
        script.write_text(submission_script(launcher, Path(tmp)))
        try:
            done = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                                  timeout=TEST_ONLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            fail("hydra/launcher", "slurm", f"the SLURM controller did not answer `sbatch --test-only` in "
                 f"{TEST_ONLY_TIMEOUT_S} s; check the cluster (sinfo), {ESCAPE}")
        except OSError as e:
            fail("hydra/launcher", "slurm", f"sbatch cannot be run here ({e.strerror or e}); {ESCAPE}")
    if done.returncode == 0:
        return
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    message = (lines[-1] if lines else f"sbatch exited {done.returncode}").removeprefix("sbatch: error: ")
    setting = refused_setting(message, launcher)
    if setting is None:
        fail("hydra/launcher", "slurm", f"the scheduler refuses its jobs (sbatch --test-only: {message}); {ESCAPE}")
    key, value = setting
    fail(f"hydra.launcher.{key}", value, f"the scheduler refuses it (sbatch --test-only: {message}); set "
         f"hydra.launcher.{key}=<what this cluster offers> (sinfo -o '%P %c %m %G' lists it), {ESCAPE}")
