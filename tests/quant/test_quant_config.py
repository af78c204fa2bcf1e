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
        ({"zero_point": "zero"}, r"quant\.zero_point='zero' .*'integer', 'min_aligned', 'fixed_point'"),
        ({"zero_point": "integer", "zero_dtype": "float16"}, r"quant\.zero_point='integer' .*int8 or uint8"),
        ({"zero_point": "fixed_point", "bits": 8}, r"quant\.zero_point='fixed_point' .*bits <= 4"),
        ({"dither": "additive"}, r"quant\.dither='additive' .*'none', 'subtractive'"),
        ({"dither": "subtractive", "zero_point": "integer"}, r"quant\.dither='subtractive' .*min_aligned"),
        ({"dither": "subtractive", "symmetric": True}, r"quant\.dither='subtractive' .*symmetric=false"),
        ({"dither_seed": -1}, r"quant\.dither_seed=-1 .*>= 0"),
        ({"smoothing": "mean"}, r"quant\.smoothing='mean' .*channel_mean"),
        ({"scale_dtype": "float8_e5m2"}, r"quant\.scale_dtype='float8_e5m2' .*float8_e4m3fn"),
        ({"qvg_kmeans": "faiss"}, r"quant\.qvg_kmeans='faiss' .*published"),
        ({"qvg_kmeans": "published", "qvg_iters": 0}, r"quant\.qvg_iters=0 .*>= 1"),
        ({"qvg_tol": 1.5}, r"quant\.qvg_tol=1\.5"),
        ({"qvg_span": 100}, r"quant\.qvg_span=100 .*>= qvg_centroids=256"),
        ({"qvg_centroid_dtype": "int8"}, r"quant\.qvg_centroid_dtype='int8'"),
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
        ({"method": "qvg"}, "qvg_rtn"),  # the suite's first QVG: warm-started k-means, RTN residual
        ({"method": "qvg", "qvg_kmeans": "published", "symmetric": True}, "qvg"),
        ({"method": "qvg", "qvg_kmeans": "published", "symmetric": True, "qvg_stages": 4}, "qvg_pro"),
        ({"method": "qvg", "qvg_kmeans": "published"}, "qvg+asym+integer"),
        ({"method": "qvg", "qvg_kmeans": "published", "zero_dtype": "bfloat16"}, "qvg+asym"),  # QVG's asymmetric
        ({"granularity": "channel", "zero_dtype": "float16"}, "kivi"),
        ({"granularity": "channel"}, "kivi+integer"),
        ({"zero_point": "min_aligned"}, "rtn+min_aligned"),
        ({"zero_dtype": "float16"}, "rtn+min_aligned"),  # a float zero dtype is the min-aligned grid
        ({"zero_point": "fixed_point"}, "rtn+fixed_point"),
        ({"dither": "subtractive"}, "rtn+dither"),
        ({"symmetric": True}, "rtn+sym"),
        ({"smoothing": "channel_mean", "rotation": "hadamard"}, "quarot+rtn+channel_mean"),
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
