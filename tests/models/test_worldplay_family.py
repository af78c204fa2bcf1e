"""HY-WorldPlay as a family: generation.worldplay belongs to it alone, its checks are one line naming the key,
its geometry, every file it needs (and what `make fetch-weights` fetches), the licence in `make check-weights`,
and run ids of the other models unchanged by its new fields."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jensenkv.config.tree import RunConfig
from jensenkv.models.config import ModelConfig, RunGenerationConfig
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.models.registry import family
from jensenkv.models.worldplay.settings import WorldPlaySettings

REPO = Path(__file__).resolve().parents[2]
TINY = dict(kind="worldplay", device="cpu", preset="tiny", latent_height=8, latent_width=8)
REAL = dict(kind="worldplay", device="cpu", preset="8b_distilled", path="tencent/HY-WorldPlay",
            hunyuan_path="hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v", height=480, width=832, dtype="bfloat16")


def gen(**worldplay) -> RunGenerationConfig:
    settings = dict(memory_frames=12, context_frames=4, sink_frames=4, trajectory="orbit")
    settings.update(worldplay)
    return RunGenerationConfig(num_chunks=5, frames_per_chunk=4, steps=4, shift=5.0, worldplay=WorldPlaySettings(**settings))


def run_config(model=TINY, generation=None, **kwargs) -> RunConfig:
    return RunConfig(model=ModelConfig(**model), generation=generation or gen(), **kwargs)


def test_generation_worldplay_belongs_to_worldplay_alone():
    run_config()  # control: accepted
    with pytest.raises(ValueError, match=r"^generation.worldplay=WorldPlaySettings\(.*\) is not allowed: HY-WorldPlay "
                                         r"models need it \(configs/model/worldplay_\*.yaml set it\)"):
        RunConfig(model=ModelConfig(kind="tiny", device="cpu"), generation=RunGenerationConfig(worldplay=WorldPlaySettings()))
    with pytest.raises(ValueError, match=r"generation.worldplay=None is not allowed: HY-WorldPlay models need it"):
        run_config(generation=RunGenerationConfig(num_chunks=5, frames_per_chunk=4))
    with pytest.raises(ValueError, match=r"generation.magi=MagiScheduleConfig"):  # and MAGI-1's node is MAGI-1's
        run_config(generation=RunGenerationConfig(num_chunks=5, frames_per_chunk=4, worldplay=WorldPlaySettings(
            memory_frames=12, context_frames=4, trajectory="orbit"), magi=MagiScheduleConfig()))


def test_a_memory_larger_than_the_frames_generated_is_refused():
    with pytest.raises(ValueError, match=r"generation.worldplay.memory_frames=24 is not allowed: it must be <= the 20 "
                                         r"latent frames generated"):
        run_config(generation=gen(memory_frames=24))
    run_config(generation=gen(memory_frames=20))  # control: equal is fine


def test_a_trajectory_shorter_than_the_video_is_refused_when_the_tree_is_built():
    with pytest.raises(ValueError, match=r"generation.worldplay.trajectory='w-3' is not allowed: it has 4 latent "
                                         r"frames but the video has 20"):
        run_config(generation=gen(trajectory="w-3"))
    run_config(generation=gen(trajectory="w-19"))  # control: 20 frames


@pytest.mark.parametrize(("change", "message"), [
    (dict(frames_per_chunk=2), r"generation.frames_per_chunk=2 is not allowed: HY-WorldPlay needs chunks of at least 3"),
    (dict(window_size=2, steps=4), r"generation.window_size / kv_range / commit_kv_range=\(2, None, None\)"),
    (dict(sampler="x0_renoise"), r"generation.sampler='x0_renoise' is not allowed: HY-WorldPlay samples with Euler"),
    (dict(batch_size=2), r"generation.batch_size=2 is not allowed: model.kind=worldplay generates one video at a time"),
])
def test_the_loop_settings_it_cannot_run_are_refused(change, message):
    values = dict(num_chunks=5, frames_per_chunk=4, steps=4, shift=5.0,
                  worldplay=WorldPlaySettings(memory_frames=12, context_frames=4, trajectory="orbit"))
    values.update(change)
    if values["frames_per_chunk"] == 2:
        values["num_chunks"] = 10
    with pytest.raises(ValueError, match=message):
        run_config(generation=RunGenerationConfig(**values))


@pytest.mark.parametrize(("settings", "message"), [
    (dict(memory="forever"), r"generation.worldplay.memory='forever' is not allowed: use one of \('rebuild', 'append'\)"),
    (dict(memory_frames=10, context_frames=8, sink_frames=4), r"generation.worldplay.memory_frames=10 is not allowed"),
    (dict(latent_dtype="float16"), r"generation.worldplay.latent_dtype='float16' is not allowed"),
    (dict(fov_degrees=[60.0]), r"generation.worldplay.fov_degrees=\[60.0\] is not allowed"),
    (dict(scenes=[{"prompt": "a", "camera": "x"}]), r"generation.worldplay.scenes=\{'prompt': 'a', 'camera': 'x'\}"),
])
def test_bad_worldplay_settings_name_the_key(settings, message):
    with pytest.raises(ValueError, match=message):
        WorldPlaySettings(**settings)


def test_bad_model_fields_name_the_key():
    with pytest.raises(ValueError, match=r"model.preset='9b' is not allowed: use one of \('tiny', '8b_distilled'"):
        ModelConfig(**{**TINY, "preset": "9b"})
    with pytest.raises(ValueError, match=r"model.hunyuan_path=None is not allowed: preset 8b_distilled needs path"):
        ModelConfig(**{**REAL, "hunyuan_path": None})
    with pytest.raises(ValueError, match=r"model.height=470 is not allowed: must be a multiple of 16"):
        ModelConfig(**{**REAL, "height": 470})
    with pytest.raises(ValueError, match=r"model.model_overrides=\{'depth': 3\} is not allowed: \['depth'\] are not"):
        ModelConfig(**{**TINY, "model_overrides": {"depth": 3}})
    with pytest.raises(ValueError, match=r"model.precision=\{'autocast': 'yes'\} is not allowed"):
        ModelConfig(**{**TINY, "precision": {"autocast": "yes"}})
    with pytest.raises(ValueError, match=r"model.hunyuan_path='x' is not allowed: kind=magi does not read it"):
        ModelConfig(kind="magi", device="cpu", preset="tiny", hunyuan_path="x")


def test_geometry_of_the_8b_at_480p_and_of_the_tiny_model():
    own = family("worldplay")
    real = own.geometry(ModelConfig(**REAL), RunGenerationConfig(frames_per_chunk=4, worldplay=WorldPlaySettings()))
    assert (real.head_dim, real.heads, real.kv_heads, real.layers, real.tokens_per_chunk) == (128, 16, 16, 54, 6240)
    tiny = own.geometry(ModelConfig(**TINY), gen())
    assert (tiny.head_dim, tiny.heads, tiny.layers, tiny.tokens_per_chunk) == (32, 2, 2, 4 * 8 * 8)


def test_its_new_model_fields_leave_every_other_run_id_alone():
    assert "hunyuan_path" not in ModelConfig(kind="tiny", device="cpu").to_dict()
    assert "precision" not in ModelConfig(**TINY).to_dict()  # null: absent
    assert ModelConfig(**{**TINY, "precision": {"autocast": True}}).to_dict()["precision"] == {"autocast": True}
    assert "worldplay" not in RunGenerationConfig().sampling()
    assert gen().sampling()["worldplay"]["memory"] == "rebuild"


def test_every_file_it_needs_is_listed_and_the_first_missing_one_named(tmp_path):
    own = family("worldplay")
    model = ModelConfig(**{**REAL, "path": str(tmp_path / "wp"), "hunyuan_path": str(tmp_path / "hy")})
    (tmp_path / "wp" / "ar_distilled_action_model").mkdir(parents=True)
    (tmp_path / "hy").mkdir()
    files = [str(p.relative_to(tmp_path)) for p, _ in own.files(model)]
    assert files == ["wp/ar_distilled_action_model/model.safetensors", "hy/vae/config.json",
                     "hy/text_encoder/config.json", "hy/tokenizer/tokenizer_config.json",
                     "hy/text_encoder_2/config.json", "hy/tokenizer_2/tokenizer_config.json",
                     "hy/image_encoder/config.json", "hy/feature_extractor/preprocessor_config.json"]
    with pytest.raises(FileNotFoundError, match=r"HY-WorldPlay file not found: .*ar_distilled_action_model/model."
                                                r"safetensors \(model tiny; 8 missing in all"):
        own.check_weights(model)
    weights = tmp_path / "wp" / "ar_distilled_action_model" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"x")  # the loader's second name (download_models.py's copy) also counts
    assert own.files(model)[0] == (weights, True)
    for path, _ in own.files(model)[1:]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    own.check_weights(model)  # every file present: no error
    assert all(ok for _, ok in own.files(model))
    own.check_weights(ModelConfig(**TINY))  # the tiny model needs no file


def test_fetch_weights_knows_the_checkpoint_and_every_hunyuan_part(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    own = family("worldplay")
    items = own.downloads("m", own.view({**REAL}))
    assert [(i.source, i.how) for i in items] == [("tencent/HY-WorldPlay", "hf-snapshot"),
                                                  ("hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v", "hf-snapshot")]
    assert items[0].patterns == ("ar_distilled_action_model/*",)
    assert set(items[1].patterns) == {"vae/*", "text_encoder/*", "tokenizer/*", "text_encoder_2/*", "tokenizer_2/*",
                                      "image_encoder/*", "feature_extractor/*"}
    assert own.downloads("m", own.view(TINY)) == []
    sys.path.insert(0, str(REPO / "scripts"))
    import fetch_weights

    assert fetch_weights.main(["--dry-run", "--only", "models", "--models", "worldplay_8b", "worldplay_tiny"]) == 0
    out = capsys.readouterr().out
    assert "[would fetch] model worldplay_8b transformer" in out and "tencent/HY-WorldPlay" in out
    assert "HunyuanVideo-1.5-480p_i2v" in out and "worldplay_tiny" not in out


def test_check_weights_shows_the_licence():
    from jensenkv import doctor

    configs = doctor.model_configs()
    out = doctor.format_report([doctor.check_model(n, configs[n]) for n in ("worldplay_8b_distilled", "worldplay_tiny")])
    licence = [line for line in out.splitlines() if line.strip().startswith("licence")]
    assert len(licence) == 1  # the official weights' model; the tiny one's random weights are not Tencent's
    assert "not licensed in the EU, the UK or South Korea" in licence[0] and "1 million monthly" in licence[0]
    assert "[MISSING] model worldplay_8b_distilled" in out and "[ready] model worldplay_tiny" in out
    from jensenkv.readiness import Check

    assert Check("model m", terms=["a licence"]).ready  # shown, never a reason a model is not ready


def test_the_memory_mode_is_part_of_the_results_model_label():
    from jensenkv.config.resolve import resolve

    assert resolve(run_config()).labels()["model"] == "tiny+rebuild"  # ModelConfig's default name
    assert resolve(run_config(generation=gen(memory="append"))).labels()["model"] == "tiny+append"
    other = resolve(RunConfig(model=ModelConfig(kind="tiny", device="cpu")))
    assert other.labels()["model"] == "tiny"  # the other families: the model name, as before


def test_table1_worldplay_sweeps_three_quantizers_and_bf16_each_none_to_taylor_in_both_memory_modes():
    from omegaconf import OmegaConf

    from jensenkv.config.resolve import compose_config, resolve

    cfg = compose_config(["experiment=table1_worldplay"], hydra_config=True)
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    assert params == {"quant": ["bf16", "rtn", "quarot", "qvg"], "correction": ["none", "taylor"],
                      "generation.worldplay.memory": ["rebuild", "append"]}
    labels = set()
    for memory in params["generation.worldplay.memory"]:
        spec = resolve(OmegaConf.to_object(compose_config(["experiment=table1_worldplay", "quant=qvg",
                                                           f"generation.worldplay.memory={memory}"])))
        assert (spec.model.preset, spec.generation.steps, spec.generation.guidance_scale) == ("8b_distilled", 4, 1.0)
        assert len(spec.prompts) == 4 and len(spec.generation.worldplay.scenes) == 4  # eval=worldplay's triplets
        assert spec.key.qvg_centroids <= spec.geometry.tokens_per_chunk == 6240
        labels.add(spec.labels()["model"])
    assert labels == {"worldplay_8b_distilled+rebuild", "worldplay_8b_distilled+append"}
