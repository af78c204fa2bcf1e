"""QuantConfig: validation errors name key, value and what is allowed; labels; construction from mappings."""
from __future__ import annotations

import pytest

from jensenkv.quant import QuantConfig, make_quantizer


def test_group_size_must_divide_head_dim():
    with pytest.raises(ValueError, match=r"quant\.group_size=33.*divide head_dim=128"):
        QuantConfig(group_size=33).validate(128)
    # channel granularity groups tokens, so any group size is fine there
    QuantConfig(granularity="channel", group_size=33).validate(128)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"bits": 5}, r"quant\.bits=5 .*\(2, 3, 4, 8\)"),
        ({"bits": True}, r"quant\.bits=True"),
        ({"method": "gptq"}, r"quant\.method='gptq' .*'none', 'rtn', 'qvg'"),
        ({"granularity": "block"}, r"quant\.granularity='block' .*token_group"),
        ({"rotation": "random"}, r"quant\.rotation='random' .*hadamard"),
        ({"group_size": 0}, r"quant\.group_size=0 .*positive"),
        ({"scale_dtype": "float8"}, r"quant\.scale_dtype='float8'"),
        ({"zero_dtype": "int4"}, r"quant\.zero_dtype='int4'"),
        ({"store_dtype": "int8"}, r"quant\.store_dtype='int8'"),
        ({"qvg_centroids": 0}, r"quant\.qvg_centroids=0"),
        ({"qvg_stages": 0}, r"quant\.qvg_stages=0"),
        ({"qvg_iters": -1}, r"quant\.qvg_iters=-1"),
    ],
)
def test_bad_values_raise_naming_key_value_and_allowed(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        QuantConfig(**overrides)


def test_hadamard_needs_power_of_two_head_dim():
    cfg = QuantConfig(rotation="hadamard")
    cfg.validate(64)
    with pytest.raises(ValueError, match=r"quant\.rotation='hadamard'.*power-of-two head_dim.*96"):
        cfg.validate(96)


def test_method_none_ignores_grouping_and_rotation():
    QuantConfig(method="none", group_size=48, rotation="hadamard").validate(96)


@pytest.mark.parametrize(
    "overrides, label",
    [
        ({"method": "none"}, "bf16"),
        ({}, "rtn"),
        ({"rotation": "hadamard"}, "quarot+rtn"),
        ({"method": "qvg"}, "qvg"),
        ({"granularity": "channel"}, "kivi"),
    ],
)
def test_label(overrides, label):
    assert QuantConfig(**overrides).label == label


def test_from_dict_merges_overrides_and_rejects_unknown_keys():
    cfg = QuantConfig.from_dict({"_target_": "jensenkv.quant.QuantConfig", "bits": 4}, group_size=64)
    assert cfg == QuantConfig(bits=4, group_size=64)
    with pytest.raises(ValueError, match=r"quant\.bitz=4 .*unknown key"):
        QuantConfig.from_dict({"bitz": 4})


def test_make_quantizer_validates_first():
    with pytest.raises(ValueError, match=r"quant\.group_size=48"):
        make_quantizer(QuantConfig(group_size=48), head_dim=128)
    with pytest.raises(ValueError, match=r"head_dim=0"):
        make_quantizer(QuantConfig(), head_dim=0)
    assert make_quantizer({"bits": 4}, head_dim=64).cfg.bits == 4
