"""Weights holding NaN or inf are refused where each family loads them, naming the file and the tensor."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from jensenkv.models.finite_weights import NonFiniteWeightsError


def _poisoned_file(path, value=float("nan")):
    state = {"blocks.0.weight": torch.ones(4, 4), "blocks.1.weight": torch.ones(4, 4),
             "steps": torch.arange(3)}  # an integer tensor: never non-finite
    state["blocks.1.weight"][2, 3] = value
    save_file(state, str(path))
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_each_family_loader_names_the_file_and_the_tensor(tmp_path, value):
    from jensenkv.models.magi.checkpoint import load_state_dict as magi_state
    from jensenkv.models.worldplay.checkpoint import load_state_dict as worldplay_state

    file = _poisoned_file(tmp_path / "model.safetensors", value)
    for load in (lambda: magi_state(tmp_path), lambda: worldplay_state(file)):
        with pytest.raises(NonFiniteWeightsError) as err:
            load()
        message = str(err.value)
        assert str(file) in message and "'blocks.1.weight'" in message and "1 non-finite values" in message
        assert "\n" not in message


def test_the_wan_folder_loader_checks_every_shard(tmp_path):
    from jensenkv.models.loaders import _folder_state_dict, load_original_wan_checkpoint

    save_file({"a": torch.ones(2)}, str(tmp_path / "shard-1.safetensors"))
    bad = _poisoned_file(tmp_path / "shard-2.safetensors")
    with pytest.raises(NonFiniteWeightsError, match="shard-2.safetensors: tensor 'blocks.1.weight'"):
        _folder_state_dict(tmp_path)
    with pytest.raises(NonFiniteWeightsError, match="shard-2"):
        load_original_wan_checkpoint(bad)


def test_finite_weights_load_unchanged(tmp_path):
    from jensenkv.models.worldplay.checkpoint import load_state_dict

    save_file({"w": torch.randn(3, 3)}, str(tmp_path / "ok.safetensors"))
    assert load_state_dict(tmp_path / "ok.safetensors")["w"].shape == (3, 3)
