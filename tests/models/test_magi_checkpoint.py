"""Official MAGI-1 checkpoint files: key names, sharded loading, missing-file errors."""
from __future__ import annotations

import json

import pytest
import torch

from jensenkv.models.magi.build import build_tiny
from jensenkv.models.magi.checkpoint import load_dit, official_keys, resolve_root, save_official, weights_dir
from jensenkv.models.magi.model import range_attention
from jensenkv.models.loaders import MissingWeightsError


def _forward(model, seed=0):
    """One 2-chunk forward with per-chunk kv ranges (chunk 1 sees chunk 0)."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, cfg.latent_channels, 4, 4, 4, generator=gen)
    caps = [torch.randn(5, cfg.caption_channels, generator=gen), torch.randn(3, cfg.caption_channels, generator=gen)]

    def attend(layer, q, k, v):
        tokens = q.shape[2] // 2
        return range_attention(q, k, v, tokens, [(0, tokens), (0, 2 * tokens)])

    return model(x, torch.tensor([0.3, 0.7]), caps, torch.tensor([False, True]), 2, attend)


def test_official_names_load_strictly_and_reproduce_outputs(tmp_path):
    model = build_tiny(seed=1)
    folder = tmp_path / "ckpt" / "magi" / "4.5B_base" / "inference_weight"
    save_official(model, folder, shards=3)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(official_keys(model.config.num_layers))  # named as the official checkpoint
    assert len(set(index.values())) == 3
    loaded = load_dit(model.config, weights_dir(resolve_root(tmp_path), "4.5B_base"), torch.float32)
    assert torch.equal(_forward(loaded), _forward(model))


def test_prefixed_single_file_loads(tmp_path):
    from safetensors.torch import save_file

    model = build_tiny(seed=2)
    save_file({f"module.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    loaded = load_dit(model.config, weights_dir(tmp_path, "4.5B_distill"), torch.float32)
    assert torch.equal(_forward(loaded, 4), _forward(model, 4))


def test_wrong_preset_and_missing_files_are_named(tmp_path):
    model = build_tiny(seed=1)
    save_official(model, tmp_path / "w", shards=2)
    with pytest.raises(ValueError, match="missing keys"):
        load_dit(build_tiny(seed=1, num_layers=3).config, tmp_path / "w", torch.float32)
    shard = sorted((tmp_path / "w").glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(MissingWeightsError, match=shard.name):
        load_dit(model.config, tmp_path / "w", torch.float32)
    with pytest.raises(MissingWeightsError, match="ckpt/magi/24B_base/inference_weight"):
        weights_dir(tmp_path, "24B_base")
    with pytest.raises(MissingWeightsError, match="Hugging Face cache"):
        resolve_root("sand-ai/MAGI-1", cache_dir=tmp_path / "empty-cache")


def test_real_config_stops_on_each_missing_file_naming_it(tmp_path, monkeypatch):
    """configs/model/magi1_4_5b.yaml with no files: the Hub cache, then (with a local DiT of the preset's
    layout, shrunk through model_overrides) the T5 folder, each named."""
    from dataclasses import asdict
    from pathlib import Path

    from omegaconf import OmegaConf

    from jensenkv.models.magi.config import model_preset
    from jensenkv.models.adapters import build_adapter

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from jensenkv.models.config import RunGenerationConfig

    preset = OmegaConf.to_container(
        OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/magi1_4_5b.yaml"), resolve=True)
    cfg, generation = preset["model"], RunGenerationConfig(**preset["generation"])
    cfg.update(device="cpu", dtype="float32", cache_dir=str(tmp_path / "hub"))
    with pytest.raises(MissingWeightsError, match="Hugging Face cache"):
        build_adapter(cfg, generation=generation)
    tiny = asdict(model_preset("tiny"))
    shrink = {k: v for k, v in tiny.items() if v != getattr(model_preset("4.5B"), k)}
    save_official(build_tiny(seed=0), tmp_path / "ckpt" / "magi" / "4.5B_base" / "inference_weight")
    cfg.update(path=str(tmp_path), model_overrides=shrink)
    with pytest.raises(MissingWeightsError, match="t5-v1_1-xxl"):
        build_adapter(cfg, generation=generation)
