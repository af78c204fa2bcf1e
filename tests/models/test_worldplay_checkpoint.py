"""The strict loader of the official HY-WorldPlay checkpoints: official-named files (single and sharded)
load and give bit-identical outputs; a checkpoint without action_in or a ProPE projection, with an extra key,
or missing its file is refused in one line naming it."""
from __future__ import annotations

import json

import pytest
import torch
import worldplay_model_kit as kit
from safetensors.torch import load_file, save_file

from jensenkv.models.loaders import MissingWeightsError
from jensenkv.models.worldplay.checkpoint import (candidate_files, load_transformer, official_keys, save_official,
                                                  weights_file)
from jensenkv.models.worldplay.config import WorldPlayTransformerConfig


@pytest.fixture(scope="module")
def model():
    return kit.tiny_model()


def _outputs(model):
    caches = kit.make_caches(model, kit.int2(), correction="taylor")
    driver = kit.Driver(model, caches)
    return [driver.run(i).v for i in range(3)]


def test_key_table_is_the_8b_model():
    cfg = WorldPlayTransformerConfig()
    keys = official_keys(cfg)
    assert len(keys) == len(set(keys)) == 1905
    assert sum(k.endswith("img_attn_prope_proj.weight") for k in keys) == 54
    with torch.device("meta"):
        from jensenkv.models.worldplay.model import WorldPlayTransformer

        m = WorldPlayTransformer(cfg)
    assert set(m.state_dict()) == set(keys)
    assert 8.5e9 < sum(p.numel() for p in m.parameters()) < 8.6e9


@pytest.mark.parametrize("variant,filename,shards", [
    ("ar_distilled_action_model", "model.safetensors", 1),
    ("ar_distilled_action_model", "diffusion_pytorch_model.safetensors", 3),
    ("ar_model", "diffusion_pytorch_model.safetensors", 1),
    ("ar_rl_model", "diffusion_pytorch_model.safetensors", 2),
])
def test_official_files_round_trip_bit_identical(model, tmp_path, variant, filename, shards):
    written = save_official(model, tmp_path / variant, filename, shards)
    found = weights_file(tmp_path, variant)
    assert found == written
    if shards > 1:
        assert len(json.loads(found.read_text())["weight_map"]) == len(official_keys(model.config))
    loaded = load_transformer(found, model.config)
    assert torch.equal(load_transformer(tmp_path / variant, model.config).final_layer.linear.weight,
                       loaded.final_layer.linear.weight)  # the folder is enough
    for name, p in model.state_dict().items():
        assert torch.equal(p, loaded.state_dict()[name]), name
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert torch.equal(a, b)


def _without(tmp_path, model, drop=(), add=None):
    path = save_official(model, tmp_path / "ar_model")
    state = load_file(str(path))
    for key in drop:
        del state[key]
    state.update(add or {})
    save_file(state, str(path))
    return path


@pytest.mark.parametrize("key", ["action_in.mlp.0.weight", "action_in.mlp.2.bias",
                                 "double_blocks.1.img_attn_prope_proj.weight"])
def test_missing_action_or_prope_key_is_refused_by_name(model, tmp_path, key):
    path = _without(tmp_path, model, drop=[key])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as err:
        load_transformer(path, model.config)
    assert "not a WorldPlay action checkpoint" in str(err.value) and "\n" not in str(err.value)


def test_missing_base_and_unexpected_keys_are_refused(model, tmp_path):
    with pytest.raises(ValueError, match=r"double_blocks\.0\.txt_attn_q\.bias"):
        load_transformer(_without(tmp_path, model, drop=["double_blocks.0.txt_attn_q.bias"]), model.config)
    with pytest.raises(ValueError, match=r"unexpected key single_blocks\.0\.linear2\.fc\.weight"):
        load_transformer(_without(tmp_path, model, add={"single_blocks.0.linear2.fc.weight": torch.ones(2)}), model.config)
    with pytest.raises(ValueError, match=r"time_in\.mlp\.0\.weight has shape"):
        load_transformer(_without(tmp_path, model, add={"time_in.mlp.0.weight": torch.ones(3, 3)}), model.config)


def test_missing_file_names_every_path_looked_in(tmp_path):
    with pytest.raises(MissingWeightsError) as err:
        weights_file(tmp_path, "ar_distilled_action_model")
    message = str(err.value)
    for path in candidate_files(tmp_path, "ar_distilled_action_model"):
        assert str(path) in message
    assert "make fetch-weights" in message and "\n" not in message
    with pytest.raises(ValueError, match="variant='bidirectional_model' is not allowed"):
        weights_file(tmp_path, "bidirectional_model")
    with pytest.raises(MissingWeightsError, match="model.safetensors"):
        load_transformer(tmp_path, WorldPlayTransformerConfig.tiny())  # a folder without weights


def test_missing_shard_is_named(model, tmp_path):
    index = save_official(model, tmp_path / "ar_model", shards=2)
    shard = sorted(set(json.loads(index.read_text())["weight_map"].values()))[1]
    (tmp_path / "ar_model" / shard).unlink()
    with pytest.raises(MissingWeightsError, match=shard):
        load_transformer(tmp_path / "ar_model", model.config)
