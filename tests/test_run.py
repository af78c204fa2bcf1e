"""The run pipeline end to end on the real generator (random-init tiny model, CPU): ids, BF16 references
shared across runs, no-op reruns, resume after an interruption, records, and one-line errors for bad input."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import jensenkv.generation.loop
import jensenkv.run as run_module
from jensenkv.run import Runner, build_spec, compose_config, run_overrides
from jensenkv.report.store_frame import load_results
from jensenkv.store.results import ResultsStore

from pipeline_testkit import fast_overrides, write_random_tiny_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_random_tiny_weights(tmp_path_factory.mktemp("tiny") / "weights")


@pytest.fixture
def count_generations(monkeypatch):
    """Count the videos the real generator makes (it still runs): one entry per video of each batch."""
    calls: list[str] = []
    real = jensenkv.generation.loop.generate_videos

    def counting(adapter, prompts, *args, **kwargs):
        calls.extend(prompts)
        return real(adapter, prompts, *args, **kwargs)

    monkeypatch.setattr(jensenkv.generation.loop, "generate_videos", counting)
    return calls


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_quantized_run_writes_a_complete_record(tmp_path, weights):
    record = run_overrides(fast_overrides(tmp_path, weights, "quant.bits=2", "correction=taylor"))
    store = ResultsStore(tmp_path)
    labels, metrics, missing = record["labels"], record["metrics"], record["missing"]
    assert (labels["quantizer"], labels["bits"], labels["group_size"], labels["correction"]) == ("rtn", 2, 32, "taylor")
    assert metrics["effective_bits"] == pytest.approx(2 + 24 / 32)  # fp16 step + uint8 zero per group of 32
    assert 0 < metrics["ssim"] <= 1 and metrics["psnr"] > 0
    assert "alexnet-owt-7be5be79.pth" in missing["lpips"]  # no backbone here: missing, with the reason
    assert record["vbench_dimensions_used"] == ["temporal_flickering"]
    assert metrics["vbench"] == pytest.approx(100 * metrics["vbench_temporal_flickering"])
    for key in ("p_s_mean", "p_s_ref_mean", "delta_p_s_mean", "delta_p_s_median", "jsd_mean", "out_mse_mean"):
        assert key in metrics
    prompt = record["per_prompt"][0]
    video = store.run_dir(record["run_id"]) / "videos" / prompt["video"]
    assert video.suffix == ".mp4" and video.stat().st_size > 0
    attention = store.run_dir(record["run_id"]) / "attention.csv"
    import pandas as pd

    probes = pd.read_csv(attention)
    assert set(probes["layer"]) == {0, 1, 2, 3} and {"p_s", "p_r", "jsd"} <= set(probes.columns)
    # the run's summaries are the statistics of the denoising-step probes it stored (step -1: commit pass)
    denoising = probes[probes["step"] != -1]
    assert metrics["delta_p_s_median"] == pytest.approx(denoising["delta_p_s"].median())
    assert metrics["delta_p_s_mean"] == pytest.approx(denoising["delta_p_s"].mean())


def test_content_is_scored_for_bf16_and_quantized_runs_and_missing_outside_the_grammar(tmp_path, weights):
    from jensenkv.eval.content import content_match

    store = ResultsStore(tmp_path)
    bf16 = run_overrides(fast_overrides(tmp_path, weights, "quant=bf16"))
    prompt = bf16["per_prompt"][0]
    ref = torch.load(store.ref_path(prompt["reference_id"]), weights_only=True)["video"]  # (F, C, H, W) uint8
    expected = content_match(ref.float() / 255, prompt["prompt"])  # BF16 scores its own video
    assert {k: prompt["metrics"][k] for k in expected} == expected
    assert bf16["metrics"]["content"] == prompt["metrics"]["content"] and "content" not in bf16["missing"]
    quantized = run_overrides(fast_overrides(tmp_path, weights, "quant=rtn"))
    assert {"content", "content_colour", "content_direction"} <= set(quantized["per_prompt"][0]["metrics"])
    outside = run_overrides(fast_overrides(tmp_path, weights, "eval.prompts=[a red circle on a dark background]"))
    assert "content" not in outside["metrics"] and "grammar" in outside["missing"]["content"]


def test_metrics_equal_a_direct_recomputation(tmp_path, weights):
    """Regenerate both videos by hand with the generator and score them: the record must agree exactly."""
    from jensenkv.eval.fidelity import video_psnr, video_ssim
    from jensenkv.generation.loop import generate_video
    from jensenkv.models import build_adapter
    from jensenkv.attention.config import AttentionConfig

    overrides = fast_overrides(tmp_path, weights, "quant.bits=2", "correction=taylor")
    record = run_overrides(overrides)
    spec = build_spec(compose_config(overrides))
    prompt = record["per_prompt"][0]
    stored_ref = torch.load(ResultsStore(tmp_path).ref_path(prompt["reference_id"]), weights_only=True)["video"]
    assert stored_ref.dtype == torch.uint8 and stored_ref.shape[1] == 3  # (F, C, H, W)

    def u8(video):
        return (video.clamp(0, 1) * 255).round().to(torch.uint8)

    adapter = build_adapter(spec.model, cache=spec.reference_cache_config(), generation=spec.generation)
    ref = u8(generate_video(adapter, prompt["prompt"], prompt["seed"]).video)
    assert torch.equal(ref, stored_ref)
    adapter.configure(cache=spec.cache_config(keep_reference=False),
                      attention=AttentionConfig(correction="taylor", strength=1.0))
    video = u8(generate_video(adapter, prompt["prompt"], prompt["seed"]).video)
    x, y = video.float() / 255, ref.float() / 255
    assert prompt["metrics"]["psnr"] == pytest.approx(video_psnr(x, y), rel=1e-12)
    assert prompt["metrics"]["ssim"] == pytest.approx(video_ssim(x, y), rel=1e-12)


def test_reference_is_generated_once_and_shared(tmp_path, weights, count_generations):
    first = run_overrides(fast_overrides(tmp_path, weights, "correction=none"))
    assert len(count_generations) == 2  # BF16 reference + the quantized video
    second = run_overrides(fast_overrides(tmp_path, weights, "correction=taylor"))
    assert len(count_generations) == 3  # only the quantized video: the reference is reused
    assert first["run_id"] != second["run_id"]
    assert first["per_prompt"][0]["reference_id"] == second["per_prompt"][0]["reference_id"]
    assert len(list(ResultsStore(tmp_path).refs_dir.glob("*.pt"))) == 1
    bf16 = run_overrides(fast_overrides(tmp_path, weights, "quant=bf16"))
    assert len(count_generations) == 3  # the BF16 run IS the reference
    assert bf16["labels"]["quantizer"] == "bf16" and bf16["metrics"]["effective_bits"] == 16.0
    assert "own reference" in bf16["missing"]["psnr"]


def test_rerunning_a_finished_run_is_a_no_op(tmp_path, weights, monkeypatch):
    overrides = fast_overrides(tmp_path, weights)
    record = run_overrides(overrides)
    before = _tree(tmp_path)
    monkeypatch.setattr("jensenkv.models.build_adapter", lambda *a, **k: pytest.fail("loaded the model again"))
    assert run_overrides(overrides) == record
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("batch", ["1", "2"])
def test_an_interrupted_run_resumes_at_the_first_unfinished_prompt(batch, tmp_path, weights, monkeypatch,
                                                                   count_generations):
    """Killed while scoring the second video: the first one's result stays, and the rerun makes only the
    second (its reference and its video), alone or in a batch of two."""
    overrides = fast_overrides(tmp_path, weights, "eval.num_prompts=2", f"generation.batch_size={batch}")
    real = Runner.score

    def die_on_second(self, video, *args):
        if video.index == 1:
            raise KeyboardInterrupt
        return real(self, video, *args)

    monkeypatch.setattr(Runner, "score", die_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_overrides(overrides)
    spec = build_spec(compose_config(overrides))
    store = ResultsStore(tmp_path)
    assert not store.has_record(spec.run_id) and store.prompt_result_path(spec.run_id, 0).exists()
    made = len(count_generations)
    assert made == 4  # both references and both videos: the kill came after the generation
    monkeypatch.setattr(Runner, "score", real)
    record = run_overrides(overrides)
    assert len(count_generations) == made + 1  # prompt 1's video only (its reference is stored)
    assert [p["index"] for p in record["per_prompt"]] == [0, 1]
    assert [p["prompt"] for p in record["per_prompt"]] == list(spec.prompts)


def test_load_results_gathers_runs(tmp_path, weights):
    for correction in ("none", "taylor"):
        run_overrides(fast_overrides(tmp_path, weights, f"correction={correction}"))
    df = load_results(tmp_path)
    assert sorted(df["correction"]) == ["none", "taylor"]
    assert {"psnr", "ssim", "vbench", "delta_p_s_mean", "lpips_missing_reason", "effective_bits"} <= set(df.columns)
    assert df["psnr"].notna().all() and str(df["bits"].dtype) == "Int64"


def test_a_run_held_by_another_live_process_is_skipped(tmp_path, weights, count_generations):
    overrides = fast_overrides(tmp_path, weights)
    spec = build_spec(compose_config(overrides))
    lock = ResultsStore(tmp_path).run_lock(spec.run_id)
    assert lock.try_acquire()  # held by this (live) process, as a parallel sweep job would
    assert Runner(spec).run() is None and count_generations == []
    lock.release()
    assert Runner(spec).run()["run_id"] == spec.run_id


def test_offline_wandb_gets_config_metrics_video_and_attention_plot(tmp_path, weights, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "")
    record = run_overrides([*fast_overrides(tmp_path, weights), "logger=wandb_offline"])
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))  # logger.dir = <results_dir>/wandb
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    media = runs[0] / "files" / "media"
    assert list((media / "videos").glob("sample_video_*.mp4")) and list((media / "images").glob("attention_mass_*"))
    assert record["run_id"]


@pytest.mark.parametrize(("overrides", "key", "value"), [
    (["quant.group_size=33"], "quant.group_size", "33"),
    (["quant.bits=5"], "quant.bits", "5"),
    (["quant.rotation=foo"], "quant.rotation", "'foo'"),
    (["attention.correction=bar"], "attention.correction", "'bar'"),
    (["attention.strength=nan"], "attention.strength", "nan"),  # signed strengths are allowed, non-finite ones not
    (["correction=taylor", "attention.calibration=absent.json"], "attention.calibration", "'absent.json'"),
    (["quant=qvg", "quant.qvg_centroids=256"], "quant.qvg_centroids", "256"),
    (["quant=kivi", "quant.group_size=512"], "quant.group_size", "512"),
    (["cache.values=half"], "cache.values", "'half'"),
    (["cache.sink_chunks=-1"], "cache.sink_chunks", "-1"),
    (["eval.num_prompts=99"], "eval.num_prompts", "99"),
    (["eval.metrics=[psnr,fvd]"], "eval.metrics", "fvd"),
    (["eval.vbench.dimensions=[sharpness]"], "eval.vbench.dimensions", "sharpness"),
    (["generation.steps=0"], "generation.steps", "0"),
    (["logger.mode=cloud"], "logger.mode", "'cloud'"),
])
def test_bad_values_name_key_value_and_allowed(weights, monkeypatch, overrides, key, value):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose_config([f"model.weights_dir={weights}", "model.device=cpu", *overrides])
    with pytest.raises(ValueError) as info:
        build_spec(cfg)
    message = str(info.value)
    assert key in message and value in message and "allowed" in message


def test_precheck_validates_every_swept_value_before_any_job(weights):
    from jensenkv.run import precheck, sweep_variants

    fixed = [f"model.weights_dir={weights}", "model.device=cpu"]
    precheck(["-m", *fixed, "quant.bits=2,4", "correction=none,taylor,exact"])
    with pytest.raises(ValueError, match=r"^quant.bits=5 is not allowed: must be one of \(2, 3, 4, 8\)$"):
        precheck(["-m", *fixed, "quant.bits=2,5", "correction=none,taylor"])  # the 2nd value of the 1st axis
    with pytest.raises(ValueError, match=r"quant.foo is not allowed: quant has no key 'foo'; allowed keys: \["):
        precheck([*fixed, "quant.foo=1"])
    variants = sweep_variants(["-m", *fixed, "experiment=table1"])  # sweeps declared in the experiment file
    assert {v for variant in variants for v in variant if v.startswith("quant=")} == \
        {"quant=bf16", "quant=rtn", "quant=rtn_min_aligned", "quant=rtn_dither", "quant=rtn_smooth", "quant=rtn_int4",
         "quant=quarot", "quant=qvg"}
    assert len(variants) == 1 + 2 + 7 + 1  # first values, then each other value once (not the 48-job product)
    with pytest.raises(ValueError, match="quant.group_size=33"):
        precheck(["-m", *fixed, "experiment=table1", "quant.group_size=33"])
    assert sweep_variants(["--cfg", "job"]) is None  # Hydra's own flags: left to Hydra


def _cli(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    env.pop("JENSENKV_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "jensenkv.run", *args, f"hydra.run.dir={tmp_path / 'out'}",
                           f"hydra.sweep.dir={tmp_path / 'multirun'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def one_result(weights, tmp_path_factory) -> Path:
    """A results dir holding one finished run: an existing result a bad command line must leave untouched."""
    results = tmp_path_factory.mktemp("one_result") / "results"
    run_overrides(fast_overrides(results, weights))
    return results


def _cli_here(args: list[str], tmp_path: Path, monkeypatch, capsys) -> tuple[int, str]:
    """``python -m jensenkv.run`` in this process (as _cli, without the interpreter start): exit code, output."""
    from jensenkv.run.cli import main

    monkeypatch.delenv("JENSENKV_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main([*args, f"hydra.run.dir={tmp_path / 'out'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"])
    out = capsys.readouterr()
    return stopped.value.code, out.out + out.err


# the first case as a real process (exit code and stderr of the command); the others in process (same main())
@pytest.mark.parametrize(("args", "expected", "process"), [
    (["correction=bar"],
     "error: correction='bar' is not allowed: choose one of ['exact', 'none', 'taylor', 'taylor2']", True),
    (["quant.group_size=33"], "error: quant.group_size=33 is not allowed: with granularity=token_group it must "
                              "divide head_dim=128", False),
    (["-m", "quant.bits=2,2.0"], "error: Error merging override quant.bits=2.0: quant.bits: Value '2.0' of type "
                                 "'float' could not be converted to Integer", False),
    (["-m", "correction=none,taylor", "attention.strength=inf"],
     "error: attention.strength=inf is not allowed: must be a finite number (NaN and inf are not settings)", False),
])
def test_cli_rejects_bad_input_in_one_line_without_touching_results(tmp_path, weights, one_result, args, expected,
                                                                   process, monkeypatch, capsys):
    import shutil

    results = tmp_path / "results"
    shutil.copytree(one_result, results)  # copy2: the mtimes _tree compares are kept
    before = _tree(results)
    full = [*args, f"model.weights_dir={weights}", f"paths.results_dir={results}"]
    if process:
        proc = _cli(full, tmp_path)
        code, output, stderr = proc.returncode, proc.stdout + proc.stderr, proc.stderr
    else:
        code, output = _cli_here(full, tmp_path, monkeypatch, capsys)
        stderr = output
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [expected], stderr
    assert "Traceback" not in output
    assert _tree(results) == before


def test_a_sweep_with_missing_weights_stops_before_any_job(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    code, output = _cli_here(["-m", "quant.bits=2,4", f"model.weights_dir={tmp_path / 'absent'}",
                              f"paths.results_dir={results}"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in output
    assert [line for line in output.splitlines() if line.strip()] == [
        f"error: model.weights_dir='{tmp_path / 'absent'}': model.safetensors is missing there (`make train-tiny` "
        "writes the built-in model's weights; null uses the packaged ones)"]
    assert not results.exists() and not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_cli_sweep_then_rerun_is_a_no_op(tmp_path, weights):
    results = tmp_path / "results"
    args = ["-m", *fast_overrides(results, weights, "correction=none,taylor")]
    first = _cli(args, tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    records = sorted(results.glob("runs/*/record.json"))
    assert len(records) == 2
    before = _tree(results)
    second = _cli(args, tmp_path, timeout=300)
    assert second.returncode == 0
    assert (second.stdout + second.stderr).count("already finished: nothing to do") == 2
    assert _tree(results) == before


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_sweep(tmp_path, weights):
    results = tmp_path / "results"
    proc = _cli(["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                 *fast_overrides(results, weights, "quant.bits=2,4")], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = load_results(results)
    assert sorted(df["bits"]) == [2, 4]
    assert list((tmp_path / "multirun" / ".submitit").glob("*/*_result.pkl"))


def test_runs_in_one_results_dir_never_collide(tmp_path, weights):
    ids = {run_overrides(fast_overrides(tmp_path, weights, f"quant.bits={b}"))["run_id"] for b in (2, 4)}
    assert len(ids) == 2 and {p.name for p in (tmp_path / "runs").iterdir()} == ids


def test_module_exposes_the_hydra_entry_point():
    assert callable(run_module.main) and run_module.CONFIG_DIR == REPO / "configs"


def test_weights_digest_changes_when_the_tiny_weights_change(tmp_path):
    """Retrained built-in weights must not reuse runs made with the old ones."""
    from jensenkv.config.tree import ModelConfig
    from jensenkv.models.registry import family

    def weights_digest(model):
        return family(model.kind).weights_digest(model)

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"old weights")
    model = ModelConfig(kind="tiny", weights_dir=str(tmp_path))
    before = weights_digest(model)
    weights.write_bytes(b"new weights, retrained")
    assert before is not None and weights_digest(model) != before
    assert weights_digest(ModelConfig(kind="diffusers", transformer_class="WanTransformer3DModel", path="x",
                                      height=32, width=32)) is None


def test_a_batched_run_records_what_one_video_at_a_time_records(tmp_path, weights, monkeypatch):
    """The same run at batch 1 and at a batch larger than its videos (clipped to 2): one run id, per-video
    records that agree to float32 rounding, and the batched run made its two videos in one call each."""
    batches: list[int] = []
    real = jensenkv.generation.loop.generate_videos
    monkeypatch.setattr(jensenkv.generation.loop, "generate_videos",
                        lambda adapter, prompts, *a, **k: batches.append(len(prompts)) or real(adapter, prompts, *a, **k))
    records = {}
    for size in ("1", "50"):
        overrides = fast_overrides(tmp_path / size, weights, "eval.num_prompts=2", "quant.bits=2",
                                   "correction=taylor", f"generation.batch_size={size}")
        records[size] = run_overrides(overrides)
    one, batched = records["1"], records["50"]
    assert one["run_id"] == batched["run_id"]
    for a, b in zip(one["per_prompt"], batched["per_prompt"]):
        assert (a["prompt"], a["seed"], a["cache_bytes"]) == (b["prompt"], b["seed"], b["cache_bytes"])
        assert a["timings"]["batch_size"] == 1 and b["timings"]["batch_size"] == 2
        for key, value in a["metrics"].items():
            assert b["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert batches == [1, 1, 1, 1, 2, 2]  # batch 1: reference, video, reference, video; then both at once


def test_a_batch_that_does_not_fit_names_the_batch_size(tmp_path, weights, monkeypatch):
    """Out of device memory in a batch: one line naming generation.batch_size and a value to try."""
    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(jensenkv.generation.loop, "generate_videos", out_of_memory)
    overrides = fast_overrides(tmp_path, weights, "eval.num_prompts=2", "generation.batch_size=8")
    with pytest.raises(ValueError, match=r"generation.batch_size=8: a batch of 2 videos does not fit on cpu "
                                         r"\(CUDA out of memory.*\); use generation.batch_size=1"):
        run_overrides(overrides)


def test_a_record_holds_exactly_the_fields_of_its_type(tmp_path, weights):
    """The record's type (jensenkv.store.record) is its contract: a real run's record, its videos and its files
    hold the fields the types declare, no more, and every required one."""
    from typing import get_type_hints

    from jensenkv.store.record import FileEntry, SealedRecord, VideoResult

    record = run_overrides(fast_overrides(tmp_path, weights, "eval.metrics=[psnr,attention,teacher_forced]"))
    assert set(record) == set(get_type_hints(SealedRecord)) == SealedRecord.__required_keys__
    for video in record["per_prompt"]:
        assert VideoResult.__required_keys__ <= set(video) <= set(get_type_hints(VideoResult))
        assert {"cache_bytes", "teacher_forced"} <= set(video)
    assert record["files"] and all(set(entry) <= set(get_type_hints(FileEntry)) for entry in record["files"].values())
