"""A SLURM job's device follows what it asks for: planned on this GPU-less host, a job that asks for a GPU gets
the run id it writes on a (simulated) GPU node, its "auto" device pinned to what was planned; checks that need
a GPU are judged as on the node; other launchers keep this host's own answer."""
from __future__ import annotations

import pytest
import torch

from jensenkv.devices import planned_node
from jensenkv.config.resolve import build_spec, compose_config

SLURM = "hydra/launcher=slurm"
SWEEP = ["quant=bf16,rtn"]


def _gpu_less(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _launcher(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    node = compose_config([SLURM, *overrides], hydra_config=True).hydra.launcher
    return OmegaConf.to_container(node, resolve=True)


def test_what_a_job_asks_for_decides_its_node():
    from jensenkv.run.slurm_resources import job_asks_for_gpu

    assert job_asks_for_gpu(_launcher("hydra.launcher.gpus_per_node=1"))
    assert job_asks_for_gpu({"gpus_per_node": "a100:2"}) and job_asks_for_gpu({"gres": "gpu:1"})
    assert job_asks_for_gpu({"additional_parameters": {"gres": "gpu:a100:1"}})
    assert not job_asks_for_gpu(_launcher("hydra.launcher.gpus_per_node=0"))
    assert not job_asks_for_gpu(_launcher()) and not job_asks_for_gpu({"gres": "tmpdisk:10"})


def _fake_hydra_launcher(monkeypatch, *overrides: str):
    """The SLURM launcher as Hydra sets it up for a sweep of ``overrides``, its submission and wait recorded."""
    from types import SimpleNamespace

    from jensenkv.run.slurm_launcher import SlurmLauncher

    base = compose_config([SLURM, *overrides], hydra_config=True)
    launcher = SlurmLauncher(**{k: v for k, v in _launcher(*overrides).items() if k != "_target_"})
    loader = SimpleNamespace(load_sweep_config=lambda config, job: compose_config([SLURM, *overrides, *job],
                                                                                  hydra_config=True))
    launcher.config, launcher.hydra_context = base, SimpleNamespace(config_loader=loader)
    submitted: list[tuple[int, list[str], str]] = []
    monkeypatch.setattr(launcher, "_submit", lambda submit: submitted.extend(submit) or
                        [SimpleNamespace(job_id=f"1_{i}") for i in range(len(submit))])
    monkeypatch.setattr(launcher, "_wait", lambda jobs, run_ids: [])
    return launcher, submitted


def _node_run_id(overrides: list[str], gpu_visible: bool, monkeypatch) -> str:
    """The run id the job writes on its node: the task builds the spec of its overrides with the node's own
    answer (no planned node), here a patched torch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_visible)
    return build_spec(compose_config(overrides)).run_id


@pytest.mark.parametrize("gpus", [1, 0])
def test_the_run_id_the_launcher_plans_is_the_one_the_job_writes_on_its_node(gpus, tmp_path, monkeypatch):
    import jensenkv.run.slurm_launcher as slurm_launcher

    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path))
    _gpu_less(monkeypatch)
    launcher, submitted = _fake_hydra_launcher(monkeypatch, f"hydra.launcher.gpus_per_node={gpus}")
    jobs = [["quant=bf16"], ["quant=rtn"]]
    launcher.launch(jobs, initial_job_idx=0)
    device = "cuda" if gpus else "cpu"
    assert [overrides for _, overrides, _ in submitted] == [[*job, f"model.device={device}"] for job in jobs]
    for job, (_, overrides, run_id) in zip(jobs, submitted):
        assert run_id in slurm_launcher.sweep_jobs()
        # the job's node: a GPU where it asked for one; a CPU job's node may see GPUs too (no cgroup isolation)
        for visible in ((True,) if gpus else (False, True)):
            assert _node_run_id(overrides, visible, monkeypatch) == run_id, (job, visible)
        _gpu_less(monkeypatch)
        with planned_node(bool(gpus)):
            assert build_spec(compose_config(job)).run_id == run_id  # the device is what the id hashes
    # the device is part of the run id: a GPU job is not the CPU run this host would plan for itself
    cpu_ids = {build_spec(compose_config(job)).run_id for job in jobs}
    assert (cpu_ids == {r for _, _, r in submitted}) == (gpus == 0)


def test_pinning_the_planned_device_keeps_every_run_id(monkeypatch):
    _gpu_less(monkeypatch)
    for overrides in ([], ["quant=bf16"], ["model.device=auto", "correction=taylor"]):
        written = build_spec(compose_config(overrides)).run_id
        assert build_spec(compose_config([*overrides, "model.device=cpu"])).run_id == written
        with planned_node(True):
            assert build_spec(compose_config([*overrides, "model.device=cuda"])).run_id == \
                build_spec(compose_config(overrides)).run_id


def test_a_device_set_by_the_user_is_not_pinned():
    from jensenkv.run.slurm_resources import pinned_device

    assert pinned_device(["quant=rtn", "model.device=cpu"], "cpu", "cpu") == ["quant=rtn", "model.device=cpu"]
    assert pinned_device(["model.device=auto", "quant=rtn"], "auto", "cuda") == ["quant=rtn", "model.device=cuda"]


def test_the_summary_plans_the_run_ids_of_the_jobs(tmp_path, monkeypatch):
    from jensenkv.run.summary import plan_runs

    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path))
    _gpu_less(monkeypatch)
    planned = {r.run_id for r in plan_runs(["-m", SLURM, "hydra.launcher.gpus_per_node=1", *SWEEP])}
    with planned_node(True):
        assert planned == {build_spec(compose_config([f"quant={q}"])).run_id for q in ("bf16", "rtn")}
    # another launcher runs its jobs here: this host's ids
    local = {r.run_id for r in plan_runs(["-m", "hydra/launcher=local_parallel", *SWEEP])}
    assert local == {build_spec(compose_config([f"quant={q}"])).run_id for q in ("bf16", "rtn")}


GPU_ONLY = {"model.device=cuda": "model.device='cuda' is not allowed: no CUDA device is visible",
            "attention.backend=triton": "attention.backend='triton' is not allowed: it needs a CUDA device"}


@pytest.mark.parametrize("setting", sorted(GPU_ONLY))
def test_a_gpu_only_setting_passes_where_the_job_asks_for_a_gpu_and_is_refused_elsewhere(setting, tmp_path,
                                                                                         monkeypatch):
    from test_slurm_launcher import _fake_slurm

    from jensenkv.run.cli import precheck, with_family_resources

    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _gpu_less(monkeypatch)
    _fake_slurm(tmp_path, monkeypatch, None)  # a scheduler that accepts (sbatch --test-only)
    precheck(with_family_resources(["-m", SLURM, "hydra.launcher.gpus_per_node=1", setting, *SWEEP]))
    for args in (["-m", SLURM, "hydra.launcher.gpus_per_node=0"], ["-m"], []):  # a CPU job; the basic launcher
        with pytest.raises(ValueError) as err:
            precheck(with_family_resources([*args, setting, *SWEEP]))
        assert str(err.value).startswith(GPU_ONLY[setting]) and "\n" not in str(err.value), args
        node = "on the SLURM job's node (it asks for no GPU" in str(err.value)
        assert node == (SLURM in args) or setting != "model.device=cuda", str(err.value)


def test_a_gpu_job_on_a_node_without_one_fails_with_one_line_the_summary_reports():
    from jensenkv.run.slurm_launcher import one_line

    ended = ("Job 5_0 (task: 0) with path /x/.submitit/5_0/5_0_0_result.pkl\n"
             "has not produced any output (state: FAILED)\nError stream produced:\n" + "-" * 40 + "\n"
             "error: model.device='cuda' is not allowed: no CUDA device is visible on this machine; use auto or "
             "cpu\nsrun: error: n3: task 0: Exited with exit code 2\n")
    assert one_line(ended) == ("model.device='cuda' is not allowed: no CUDA device is visible on this machine; "
                               "use auto or cpu")
