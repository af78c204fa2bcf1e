"""Loading real Wan-family checkpoints and the model configs, offline: clear errors for missing weights,
original-format checkpoints, dtype casting, and complete tiny diffusers folders that load and generate."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel
from omegaconf import OmegaConf

from wan_testkit import WAN_TEST_CONFIG
from jensenkv.models.config import RunGenerationConfig
from jensenkv.generation.loop import generate_video
from jensenkv.models import build_adapter
from jensenkv.models.loaders import MissingWeightsError, cast_like_diffusers, load_original_wan_checkpoint


def test_bf16_cast_keeps_diffusers_fp32_modules(tiny_wan_model):
    model = cast_like_diffusers(tiny_wan_model(), torch.bfloat16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["scale_shift_table"] == dtypes["blocks.0.scale_shift_table"] == torch.float32
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    assert dtypes["blocks.0.attn1.to_q.weight"] == dtypes["proj_out.weight"] == torch.bfloat16
    assert model.rope.freqs_cos.dtype == tiny_wan_model().rope.freqs_cos.dtype  # untouched


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_missing_hub_weights_give_a_clear_error_without_network(tmp_path, monkeypatch):
    """(e) A Hub id absent from the (empty) cache: MissingWeightsError naming the id, the cache and the fix."""
    _no_network(monkeypatch)
    cfg = {"kind": "diffusers", "transformer_class": "SkyReelsV2Transformer3DModel", "height": 544, "width": 960,
           "path": "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers", "cache_dir": str(tmp_path)}
    with pytest.raises(MissingWeightsError) as err:
        build_adapter(cfg)
    message = str(err.value)
    assert "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers" in message
    assert str(tmp_path) in message and "make fetch-weights" in message


def test_missing_local_folder_and_subfolder_errors(tmp_path, monkeypatch):
    _no_network(monkeypatch)
    missing = tmp_path / "nope"
    cfg = {"kind": "diffusers", "transformer_class": "WanTransformer3DModel", "height": 480, "width": 832, "path": str(missing)}
    with pytest.raises(MissingWeightsError, match="nope.*make fetch-weights"):
        build_adapter(cfg)
    (tmp_path / "model").mkdir()
    with pytest.raises(MissingWeightsError, match="transformer"):
        build_adapter({**cfg, "path": str(tmp_path / "model")})
    with pytest.raises(MissingWeightsError, match="self_forcing_dmd.pt"):
        load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator_ema")


def test_model_config_errors_name_the_key():
    with pytest.raises(ValueError, match="model.kind='nope'"):
        build_adapter({"kind": "nope"})
    with pytest.raises(ValueError, match="stepz"):
        build_adapter({"kind": "diffusers", "transformer_class": "WanTransformer3DModel", "path": "x/y", "stepz": 3})
    with pytest.raises(ValueError, match="model.height=None"):
        build_adapter({"kind": "diffusers", "transformer_class": "WanTransformer3DModel", "path": "x/y"})


def _to_original_wan_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Invert diffusers' Wan key renaming (the layout of Wan / Self-Forcing checkpoints)."""
    renames = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
               ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
               ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
               ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
               ("condition_embedder.time_proj", "time_projection.1"), ("attn2", "cross_attn"), ("attn1", "self_attn"),
               (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
               ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
               ("norm2", "norm__tmp"), ("norm3", "norm2"), ("norm__tmp", "norm3")]
    out = {}
    for name, tensor in state.items():
        for new, old in renames:
            name = name.replace(new, old)
        if name == "scale_shift_table":
            name = "head.modulation"
        elif name.startswith("proj_out"):
            name = name.replace("proj_out", "head.head")
        name = name.replace("scale_shift_table", "modulation")
        out[name] = tensor
    return out


def test_self_forcing_style_checkpoint_loads_into_diffusers_wan(tmp_path):
    """An original-format checkpoint (Self-Forcing: {"generator_ema": {"model.<wan key>": ...}}) round-trips."""
    torch.manual_seed(3)
    source = WanTransformer3DModel(**WAN_TEST_CONFIG)
    ckpt = {"generator_ema": {f"model.{k}": v for k, v in _to_original_wan_names(source.state_dict()).items()}}
    torch.save(ckpt, tmp_path / "self_forcing_dmd.pt")
    state = load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator_ema")
    target = WanTransformer3DModel(**WAN_TEST_CONFIG)
    target.load_state_dict(state, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    with pytest.raises(ValueError, match="checkpoint_key='generator'"):
        load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator")


# --- the shipped model configs --------------------------------------------------------------------------

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


def _model_config(name: str, *overrides: str) -> dict:
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"), OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(cfg, resolve=True)  # {"model": ..., "generation": ...}


@pytest.mark.parametrize("name", ["skyreels_v2_df_1_3b", "self_forcing_wan_1_3b"])
def test_real_model_configs_are_valid_and_fail_cleanly_without_weights(name, tmp_path, monkeypatch):
    _no_network(monkeypatch)
    cfg = _model_config(name, f"model.cache_dir={tmp_path}", "generation.num_chunks=2")
    generation = RunGenerationConfig(**cfg["generation"])
    assert generation.num_chunks == 2
    with pytest.raises(MissingWeightsError, match="make fetch-weights"):
        build_adapter(cfg["model"], generation=generation)


def test_tiny_config_builds_from_the_config_tree(tiny_weights, tmp_path):
    from jensenkv.run import build_spec, compose_config

    spec = build_spec(compose_config([f"model.weights_dir={tiny_weights}", "model.device=cpu",
                                      "generation.steps=2", "generation.num_chunks=2", "generation.kv_range=[1,0]"]))
    adapter = build_adapter(spec.model, generation=spec.generation)
    assert (adapter.generation.steps, adapter.generation.num_chunks, adapter.generation.kv_range) == (2, 2, [1, 0])
    assert adapter.latent_frame_shape == (3, 16, 16) and adapter.clean_range == (-1.0, 1.0)
    result = generate_video(adapter, "a red square", seed=0)
    assert result.video.shape == (4, 3, 16, 16)
    with pytest.raises(FileNotFoundError, match="make train-tiny"):
        build_adapter({"kind": "tiny", "weights_dir": str(tmp_path / "empty")})


def _save_tiny_diffusers_folder(folder: Path, class_name: str) -> None:
    """A complete diffusers-layout model folder at test sizes: transformer, Wan VAE, UMT5 and its tokenizer."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    cls = {"SkyReelsV2Transformer3DModel": SkyReelsV2Transformer3DModel, "WanTransformer3DModel": WanTransformer3DModel}
    cls[class_name](**{**WAN_TEST_CONFIG, "in_channels": 16, "out_channels": 16, "text_dim": 32}).save_pretrained(
        folder / "transformer")
    AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True, True]).save_pretrained(folder / "vae")
    UMT5EncoderModel(UMT5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8)).save_pretrained(folder / "text_encoder")
    words = ["<pad>", "</s>", "<unk>", "a", "red", "square", "moving", "left"]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder / "tokenizer")


@pytest.mark.parametrize("class_name", ["SkyReelsV2Transformer3DModel", "WanTransformer3DModel"])
def test_diffusers_folder_loads_offline_and_generates(class_name, tmp_path, monkeypatch, int2_cache):
    _save_tiny_diffusers_folder(tmp_path / "model", class_name)
    _no_network(monkeypatch)
    cfg = _model_config("skyreels_v2_df_1_3b", f"model.transformer_class={class_name}", f"model.path={tmp_path / 'model'}",
                        "model.height=32", "model.width=32", "model.dtype=float32", "model.device=cpu",
                        "model.max_sequence_length=8", "generation.num_chunks=2", "generation.frames_per_chunk=2",
                        "generation.steps=2", "generation.guidance_scale=2.0")
    adapter = build_adapter(cfg["model"], cache=int2_cache(), generation=RunGenerationConfig(**cfg["generation"]))
    assert type(adapter.transformer).__name__ == class_name and adapter.latent_frame_shape == (16, 4, 4)
    result = generate_video(adapter, "a red square moving left", seed=1)
    assert result.latents.shape == (1, 16, 4, 4, 4)
    assert result.video.shape == (13, 3, 32, 32)  # Wan VAE: 1 + 4 * (4 - 1) frames, 8x upsampling
    assert 0.0 <= float(result.video.min()) and float(result.video.max()) <= 1.0
