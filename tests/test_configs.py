"""The real Hydra configs compose (every group option, experiments, launchers) and map to the intended runs."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from jensenkv.run import CONFIG_DIR, CONFIG_GROUPS, build_spec, check_group_overrides, group_options

from pipeline_testkit import write_random_tiny_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_random_tiny_weights(tmp_path_factory.mktemp("tiny") / "weights")


def _compose(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def _spec(weights, *overrides: str):
    return build_spec(_compose(f"model.weights_dir={weights}", "model.device=cpu", *overrides))


def test_every_group_has_its_options():
    assert set(group_options("quant")) == {"bf16", "rtn", "rtn_min_aligned", "rtn_dither", "rtn_smooth", "rtn_int4",
                                           "quarot", "qvg", "qvg_pro", "qvg_rtn", "kivi"}
    assert set(group_options("correction")) == {"none", "taylor", "exact", "taylor2"}
    assert set(group_options("experiment")) >= {"table1", "tradeoff", "attention_mass"}
    assert set(group_options("logger")) >= {"wandb_offline", "wandb_online", "disabled"}
    assert "tiny" in group_options("model")
    for group in CONFIG_GROUPS:
        assert group_options(group), group


@pytest.mark.parametrize(("quant", "label", "method"), [("bf16", "bf16", "none"), ("rtn", "rtn", "rtn"),
                                                         ("quarot", "quarot+rtn", "rtn"), ("qvg", "qvg", "qvg"),
                                                         ("qvg_pro", "qvg_pro", "qvg"), ("qvg_rtn", "qvg_rtn", "qvg"),
                                                         ("kivi", "kivi", "rtn")])
def test_quant_options_build_the_named_quantizer(weights, quant, label, method):
    spec = _spec(weights, f"quant={quant}", "quant.qvg_centroids=16")
    assert spec.key.label == label and spec.key.method == method
    if quant == "bf16":
        assert spec.value.method == "none" and spec.values_mode == "none"
    elif quant == "kivi":  # KIVI: per-channel keys, per-token values
        assert spec.key.granularity == "channel" and spec.value.granularity == "token_group"
    else:
        assert spec.value == spec.key  # values quantized like keys by default (cache.values=same)


def test_values_none_keeps_values_full_precision(weights):
    spec = _spec(weights, "cache.values=none")
    assert spec.key.method == "rtn" and spec.value.method == "none"
    assert spec.value.store_dtype == "bfloat16"  # the cache's full-precision dtype


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_correction_options(weights, correction):
    spec = _spec(weights, f"correction={correction}", "attention.strength=0.5")
    assert spec.attention.correction == correction and spec.attention.strength == 0.5


def test_taylor2_is_taylor_with_the_second_order_term(weights):
    spec = _spec(weights, "correction=taylor2")
    assert (spec.attention.correction, spec.attention.second_order) == ("taylor", True)
    assert spec.labels()["second_order"] is True
    assert _spec(weights, "correction=taylor").labels()["second_order"] is False
    variants = [("correction=taylor",), ("correction=taylor2",), ("correction=exact",),
                ("correction=exact", "attention.second_order=true")]
    ids = {_spec(weights, *o).run_id for o in variants}
    assert len(ids) == 4  # part of the run identity
    assert _spec(weights, "quant=bf16", "correction=taylor2").run_id == _spec(weights, "quant=bf16").run_id


@pytest.mark.parametrize("overrides, message", [
    (["correction=none", "attention.second_order=true"], r"attention.second_order=True is not allowed with "
                                                         r"correction='none': .*\('taylor', 'exact'\)"),
    (["correction=taylor2", "attention.backend=flex"], r"attention.second_order=True is not allowed: "
                                                       r"with backend='flex': .*\('cached', 'reference'\)"),
    (["attention.second_order=maybe"], r"attention.second_order"),
])
def test_second_order_needs_a_bias_and_a_backend_that_has_it(weights, overrides, message):
    from jensenkv.run.cli import precheck

    with pytest.raises(ValueError, match=message):
        precheck([f"model.weights_dir={weights}", *overrides])


def test_attention_config_refuses_a_non_boolean_second_order():
    from jensenkv.config.tree import AttentionConfig

    with pytest.raises(ValueError, match=r"attention.second_order=1 is not allowed: it must be true or false"):
        AttentionConfig(correction="taylor", second_order=1)
    with pytest.raises(ValueError, match=r"attention.second_order=True is not allowed: with backend='triton'"):
        AttentionConfig(correction="exact", backend="triton", second_order=True)


def test_cache_options_reach_the_cache_config(weights):
    spec = _spec(weights, "cache.sink_chunks=1", "cache.window_chunks=2")
    cache = spec.cache_config(keep_reference=True)
    assert (cache.sink_chunks, cache.window_chunks, cache.keep_reference) == (1, 2, True)
    assert spec.reference_cache_config().key.method == "none"


def test_run_id_ignores_bookkeeping_and_tracks_settings(weights):
    base = _spec(weights).run_id
    same = [("logger=disabled",), ("paths.results_dir=/elsewhere",), ("experiment_name=other",), ("threads=2",),
            ("quant.qvg_centroids=7",),  # an RTN run ignores QVG settings
            ("quant.rotation_seed=5",),  # ... and the rotation seed when nothing is rotated
            ("quant.dither_seed=5",)]  # ... and the dither seed without dither
    for overrides in same:
        assert _spec(weights, *overrides).run_id == base, overrides
    different = [("quant.bits=4",), ("quant.group_size=64",), ("correction=taylor",), ("eval.num_prompts=3",),
                 ("cache.sink_chunks=1",), ("cache.values=none",), ("generation.steps=3",), ("eval.seeds=[1]",),
                 ("quant.dither=subtractive",), ("quant.zero_point=fixed_point",), ("quant.smoothing=channel_mean",)]
    ids = {_spec(weights, *o).run_id for o in different}
    assert base not in ids and len(ids) == len(different)


def test_bf16_runs_are_one_run_whatever_the_other_axes(weights):
    ids = {_spec(weights, "quant=bf16", f"quant.bits={b}", f"correction={c}").run_id
           for b, c in itertools.product((2, 4), ("none", "taylor", "exact"))}
    assert len(ids) == 1


def _sweep(cfg) -> list[list[str]]:
    """Every job of an experiment's sweep, as override lists."""
    params = cfg.hydra.sweeper.params
    axes = [[f"{k}={v}" for v in str(values).split(",")] for k, values in params.items()]
    return [list(job) for job in itertools.product(*axes)]


def test_table1_experiment_runs_48_videos_per_row_and_three_rotation_seeds(weights):
    cfg = _compose("experiment=table1", hydra_cfg=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    specs = [_spec(weights, "experiment=table1", *job) for job in _sweep(cfg)]
    runs = {s.run_id: s for s in specs}  # jobs that differ only in a setting a run ignores are one run
    assert all(len(s.prompts) >= 16 and len(s.eval.seeds) >= 3 and len(set(s.prompts)) == len(s.prompts)
               for s in runs.values())  # >= 48 distinct videos per run
    rows = {}
    for s in runs.values():
        rows.setdefault((s.key.label, s.key.bits, s.attention.correction), set()).add(s.key.rotation_seed)
    expected = {("rtn", 2), ("rtn+min_aligned", 2), ("rtn+dither", 2), ("rtn+channel_mean", 2), ("rtn", 4),
                ("quarot+rtn", 2), ("qvg", 2)}
    assert {(label, bits, c) for label, bits in expected for c in ("none", "taylor")} | {("bf16", 2, "none")} \
        == set(rows)
    assert rows[("quarot+rtn", 2, "none")] == rows[("quarot+rtn", 2, "taylor")] == {0, 1, 2}
    assert len(runs) == 1 + 2 * (len(expected) - 1) + 2 * 3  # BF16, 6 rows x 2, QuaRot x 3 seeds x 2
    # one context: probes, diagnostics, prompts and seeds equal for every run, so every row is comparable
    assert len({(tuple(s.attention.probe_steps or ()), s.attention.diagnostics, tuple(s.prompts), tuple(s.eval.seeds))
                for s in runs.values()}) == 1
    qvg = next(s for s in runs.values() if s.key.method == "qvg")
    assert qvg.key.qvg_kmeans == "published" and qvg.key.qvg_centroids == 16 and qvg.key.group_size == 64


def test_tradeoff_shares_the_bf16_references_with_table1(weights):
    cfg = _compose("experiment=tradeoff", hydra_cfg=True)
    params = cfg.hydra.sweeper.params
    assert params["quant.bits"] == "2,4" and params["quant.group_size"] == "32,64,128"
    assert params["correction"] == "none,taylor"
    table1 = _spec(weights, "experiment=table1", "quant=rtn", "correction=taylor")
    tradeoff = _spec(weights, "experiment=tradeoff", "quant.bits=2", "quant.group_size=32", "correction=taylor")
    assert set(tradeoff.prompts) <= set(table1.prompts) and set(tradeoff.eval.seeds) <= set(table1.eval.seeds)
    prompt, seed = tradeoff.prompts[0], tradeoff.eval.seeds[0]
    assert table1.reference_identity(prompt, seed) == tradeoff.reference_identity(prompt, seed)  # made once


def test_attention_mass_experiment(weights):
    cfg = _compose("experiment=attention_mass", hydra_cfg=True)
    assert cfg.hydra.sweeper.params["correction"] == "none,taylor,exact"
    assert "attention" in cfg.eval.metrics


@pytest.mark.parametrize(("launcher", "target"), [
    ("local_parallel", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
    ("joblib", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
    ("slurm", "hydra_plugins.jensenkv_slurm_launcher.SlurmLauncher"),
    ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ("submitit_local", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"),
])
def test_launchers_compose(launcher, target):
    cfg = _compose(f"hydra/launcher={launcher}", hydra_cfg=True)
    assert cfg.hydra.launcher._target_ == target
    if launcher == "local_parallel":
        assert cfg.hydra.launcher.n_jobs == 2
    if launcher == "slurm":  # the model family's resources, filled in by the command line
        assert cfg.hydra.launcher.gpus_per_node is None


def test_logger_modes():
    assert _compose().logger.mode == "offline"
    assert _compose().logger.dir.endswith("wandb")
    assert _compose("logger=wandb_online").logger.mode == "online"
    assert _compose("logger=disabled").logger.mode == "disabled"


def test_group_override_check_names_group_value_and_options():
    check_group_overrides(["quant=rtn", "correction=none,taylor", "quant.bits=2,4", "experiment=table1"])
    with pytest.raises(ValueError,
                       match=r"correction='bar' is not allowed: choose one of \['exact', 'none', 'taylor', 'taylor2'\]"):
        check_group_overrides(["correction=bar"])
    with pytest.raises(ValueError, match="quant='nope'"):
        check_group_overrides(["-m", "quant=rtn,nope"])


def test_fetch_weights_dry_run_lists_targets_without_network(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    import fetch_weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path / "vbench"))
    monkeypatch.setattr(fetch_weights, "fetch", lambda item: pytest.fail(f"dry run fetched {item}"))
    assert fetch_weights.main(["--dry-run", "--only", "lpips", "vbench"]) == 0
    out = capsys.readouterr().out
    alexnet = tmp_path / "torch" / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth"
    assert f"[would fetch] LPIPS backbone (alex): {alexnet}" in out
    assert str(tmp_path / "vbench" / "clip_model" / "ViT-B-32.pt") in out
    alexnet.parent.mkdir(parents=True)
    alexnet.write_bytes(b"x")
    assert fetch_weights.main(["--dry-run", "--only", "lpips"]) == 0
    assert "[present] LPIPS backbone" in capsys.readouterr().out
    assert fetch_weights.main(["--dry-run", "--only", "vbench", "--vbench-dims", "nope"]) == 2


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes_into_valid_runs(weights, experiment, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = _compose(f"experiment={experiment}", hydra_cfg=True)
    assert cfg.experiment_name == experiment and cfg.hydra.sweeper.params
    override = f"experiment={experiment}"
    if cfg.model.kind != "tiny":  # real weights are checked before any job starts: absent here
        with pytest.raises(FileNotFoundError, match="make fetch-weights"):
            build_spec(_compose(override))
        return
    spec = _spec(weights, override)
    assert spec.experiment_name == experiment and len(spec.prompts) == cfg.eval.num_prompts


# --- one setting, one definition -----------------------------------------------------------------------

def test_quant_presets_state_only_what_differs_from_the_defaults():
    """A preset file restating a default is a second definition that can drift (the old rtn.yaml said
    zero_dtype: uint8 while QuantConfig said int8): every key a preset sets must differ from QuantConfig's."""
    import dataclasses

    from omegaconf import OmegaConf

    from jensenkv.quant import QuantConfig

    defaults = dataclasses.asdict(QuantConfig())
    for path in sorted((CONFIG_DIR / "quant").glob("*.yaml")):
        values = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
        restated = {k: v for k, v in values.items() if k != "method" and defaults.get(k) == v}
        assert not restated, f"{path.name} restates defaults {restated}"


def test_rtn_label_names_one_quantizer_everywhere(weights):
    """Table 1's "rtn", the Python default QuantConfig() and the bench/scripts preset are the same quantizer."""
    import dataclasses

    from jensenkv.quant import QuantConfig

    spec = _spec(weights, "quant=rtn")
    assert spec.key == dataclasses.replace(QuantConfig(), store_dtype=spec.cache.full_precision_dtype)
    assert spec.key.label == "rtn"


def test_bf16_means_one_cache_everywhere(weights):
    """The BF16 reference of a run, the registry's default cache and the bf16 preset store the same dtype."""
    from jensenkv.models.adapters import full_precision_cache

    spec = _spec(weights, "quant=bf16")
    reference = spec.reference_cache_config()
    assert reference.key.store_dtype == reference.value.store_dtype == "bfloat16"
    assert full_precision_cache() == reference
    assert spec.key == reference.key and spec.value == reference.value


def test_stored_tiny_sampler_equals_the_tiny_preset(weights):
    """The sampler saved with the built-in weights (the model card's setting) is the model=tiny preset."""
    import json

    from jensenkv.models.tiny.config import CONFIG_FILE, WEIGHTS_DIR

    stored = json.loads((WEIGHTS_DIR / CONFIG_FILE).read_text())["sampler"]
    preset = build_spec(_compose("model.device=cpu")).generation
    assert {k: getattr(preset, k) for k in stored} == stored


def test_every_field_is_reachable_from_the_command_line(weights):
    spec = _spec(weights, "attention.backend=reference", "generation.window_size=2", "generation.kv_range=[4,3,2,1]",
                 "attention.probe_layers=[0,2]", "generation.commit_kv_range=1", "cache.sink_chunks=1")
    assert (spec.attention.backend, spec.generation.window_size, spec.generation.kv_range,
            spec.attention.probe_layers, spec.generation.commit_kv_range, spec.cache.sink_chunks) == \
        ("reference", 2, [4, 3, 2, 1], [0, 2], 1, 1)
    assert spec.run_id != _spec(weights).run_id


@pytest.mark.parametrize("override, key", [
    ("quant.bits=2.0", "quant.bits"), ("eval.save_videos=maybe", "eval.save_videos"),
    ("attention.strength=inf", "attention.strength"), ("model.dtype=foo", "model.dtype"),
    ("model.device=tpu", "model.device"), ("generation.kv_range=[-1]", "generation.kv_range"),
    ("generation.window_size=3", "generation.window_size"), ("cache.window_chunks=-1", "cache.window_chunks"),
])
def test_bad_values_fail_in_one_line_naming_the_key(weights, override, key):
    from jensenkv.run.cli import precheck

    with pytest.raises(ValueError) as err:
        precheck([f"model.weights_dir={weights}", override])
    message = str(err.value)
    assert key in message and "\n" not in message


def test_calibration_prompts_are_disjoint_from_the_evaluation_prompts(weights):
    """Fitted strengths are judged on prompts they never saw."""
    calibration = set(_spec(weights, "eval=calibration").prompts)
    evaluation = set(_spec(weights, "eval=default", "eval.num_prompts=null").prompts)
    assert calibration and evaluation and not calibration & evaluation


def test_magi_schedule_is_reachable_for_magi_and_refused_elsewhere(weights):
    from jensenkv.run.cli import precheck

    spec = build_spec(_compose("model=magi1_tiny", "model.device=cpu", "generation.magi.clean_t=0.99",
                               "generation.magi.cfg_number=1", "+model.model_overrides.distill=true"))
    assert (spec.generation.magi.clean_t, spec.generation.magi.cfg_number) == (0.99, 1)
    with pytest.raises(ValueError, match="generation.magi is null for this model"):
        precheck([f"model.weights_dir={weights}", "generation.magi.clean_t=0.5"])
    with pytest.raises(ValueError, match=r"generation.magi.cfg_number=2 is not allowed"):
        precheck(["model=magi1_tiny", "generation.magi.cfg_number=2"])


@pytest.mark.parametrize("model", ["skyreels_v2_df_1_3b", "self_forcing_wan_1_3b", "magi1_4_5b", "magi1_4_5b_distill",
                                   "magi1_24b", "magi1_24b_distill"])
def test_real_model_probe_subsets_are_evenly_spaced_over_their_layers_and_steps(model):
    """A probe subset naming a step or layer the model does not have would silently record nothing."""
    from omegaconf import OmegaConf

    from jensenkv.attention.probes import evenly_spaced
    from jensenkv.models.magi.config import model_preset

    cfg = _compose(f"model={model}")
    generation, attention = cfg.generation, cfg.attention
    # Wan2.1 / SkyReels-V2 1.3B have 30 blocks (their transformer config.json, not on this machine)
    depth = model_preset(cfg.model.preset).num_layers if cfg.model.kind == "magi" else 30
    assert list(attention.probe_layers) == list(evenly_spaced(depth, len(attention.probe_layers)))
    assert attention.probe_steps is None or list(attention.probe_steps) == \
        list(evenly_spaced(generation.steps, len(attention.probe_steps)))
    assert OmegaConf.select(cfg, "eval.probes") is None


def test_require_ready_stops_a_run_whose_metric_cannot_be_computed(weights, tmp_path, monkeypatch):
    """eval.require_ready (on in eval=natural): a metric without its weights stops the run at validation."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # no LPIPS backbone there
    with pytest.raises(FileNotFoundError, match="not ready: metric lpips"):
        _spec(weights, "eval.require_ready=true", "eval.metrics=[psnr,lpips]")
    assert _spec(weights, "eval.require_ready=true", "eval.metrics=[psnr,ssim]").eval.require_ready
    assert "lpips" in _spec(weights, "eval.metrics=[psnr,lpips]").eval.metrics  # default: recorded missing


@pytest.mark.parametrize("window", [0, 2, None])
def test_the_run_config_and_the_cache_accept_the_same_windows(weights, window):
    """One rule for the window: a sinks-only window (0) a run accepts is one the cache accepts, and back."""
    spec = _spec(weights, "cache.sink_chunks=1", f"cache.window_chunks={'null' if window is None else window}")
    assert spec.cache_config(keep_reference=False).window_chunks == window
    with pytest.raises(ValueError, match="cache.window_chunks=-1"):
        _spec(weights, "cache.window_chunks=-1")
    with pytest.raises(ValueError, match="cache.window_chunks=-1"):
        spec.cache_config(False).__class__(key=spec.key, value=spec.value, window_chunks=-1)
