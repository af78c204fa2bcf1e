"""QVG as published (svg-project/Quant-VideoGen): storage format and bytes, k-means semantics, spans, presets."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hydra import compose, initialize_config_dir

from jensenkv.quant import QuantConfig, QVGTensor, bits_per_element, make_quantizer, qvg_paper_bits
from jensenkv.quant.qvg import gather_centroids, nearest_centroid, published_kmeans, span_bounds, update_centroids
from jensenkv.run import CONFIG_DIR

PAPER_SPAN = 49_920  # tokens clustered together in QVG's reported compression


def preset(name: str, *overrides: str) -> QuantConfig:
    """The quant=<name> preset as Hydra composes it."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"quant={name}", *overrides])
    return QuantConfig.from_dict(cfg.quant)


def clustered(b=1, h=2, s=256, d=128, clusters=8, seed=0) -> torch.Tensor:
    """(B, H, S, D) tokens around a few far-apart centres."""
    gen = torch.Generator().manual_seed(seed)
    centres = 4 * torch.randn(b, h, clusters, d, generator=gen)
    which = torch.randint(0, clusters, (b, h, s), generator=gen)
    return centres.gather(2, which[..., None].expand(-1, -1, -1, d)) + 0.3 * torch.randn(b, h, s, d, generator=gen)


@pytest.mark.parametrize("name, block, stages, ratio", [("qvg", 64, 1, 7.05), ("qvg_pro", 16, 4, 5.20)])
def test_presets_reproduce_the_papers_compression(name, block, stages, ratio):
    cfg = preset(name)
    assert (cfg.method, cfg.bits, cfg.symmetric, cfg.group_size, cfg.qvg_stages) == ("qvg", 2, True, block, stages)
    assert (cfg.scale_dtype, cfg.qvg_centroid_dtype, cfg.qvg_centroids, cfg.qvg_kmeans) == \
        ("float8_e4m3fn", "bfloat16", 256, "published")
    assert cfg.label == name
    assert 16 / qvg_paper_bits(block, stages, PAPER_SPAN) == pytest.approx(ratio, abs=0.005)
    assert bits_per_element(cfg, 128, PAPER_SPAN) == pytest.approx(qvg_paper_bits(block, stages, PAPER_SPAN), rel=1e-12)
    # real bytes of one quantized (B=1, H=1, S=49920, D=128) tensor (one k-means round: bytes do not depend on it)
    x = torch.randn(1, 1, PAPER_SPAN, 128, generator=torch.Generator().manual_seed(0))
    t = make_quantizer(dataclasses.replace(cfg, qvg_iters=1), 128).quantize(x)
    assert x.numel() * 2 / t.nbytes == pytest.approx(ratio, abs=0.005)
    assert t.nbytes * 8 == pytest.approx(bits_per_element(cfg, 128, PAPER_SPAN) * x.numel(), rel=1e-12)


def test_storage_format_symmetric_int2_fp8_scale_bf16_centroids_uint8_ids():
    cfg = preset("qvg", "quant.qvg_centroids=16")
    x = clustered()
    t = make_quantizer(cfg, 128).quantize(x)
    assert isinstance(t, QVGTensor) and t.residual.zero is None  # absmax: no zero point stored
    assert t.residual.step.dtype == torch.float8_e4m3fn and t.residual.step.shape == (1, 2, 256, 2)  # block 64
    assert t.centroids[0].dtype == torch.bfloat16 and t.centroids[0].shape == (1, 2, 16, 128)
    assert t.assignments[0].dtype == torch.uint8
    assert set(t.residual.codes().unique().tolist()) <= {1, 2, 3}  # codes -1, 0, 1 stored with offset 2
    # the scale is the residual block's absmax rounded up into e4m3 (the next e4m3 value down is below it)
    residual = x - (t.dequantize() - t.residual.dequantize())  # what the residual quantizer saw
    absmax = residual.abs().reshape(1, 2, 256, 2, 64).amax(-1)
    step = t.residual.step
    below = (step.view(torch.int8) - 1).view(torch.float8_e4m3fn).float()
    assert (step.float() >= absmax * (1 - 1e-6)).all() and (below < absmax * (1 + 1e-6)).all()
    # group_steps: the residual's scale per block of 64, per token: the error the correction models
    steps = t.group_steps()
    assert steps.step.shape == (1, 2, 256, 2) and torch.equal(steps.step, step.float())
    err = (t.dequantize() - x).abs()
    assert (err <= steps.step.repeat_interleave(64, -1) / 2 * (1 + 1e-5) + 1e-5).all()


def test_qvg_pro_round_trip_bound_per_block_of_16():
    cfg = preset("qvg_pro", "quant.qvg_centroids=16")
    x = clustered(s=128)
    t = make_quantizer(cfg, 128).quantize(x)
    assert len(t.centroids) == 4 and t.group_steps().step.shape == (1, 2, 128, 8)
    err = (t.dequantize() - x).abs()
    assert (err <= t.group_steps().step.repeat_interleave(16, -1) / 2 * (1 + 1e-5) + 1e-5).all()
    assert t.nbytes * 8 == pytest.approx(bits_per_element(cfg, 128, 128) * x.numel(), rel=1e-12)


def test_published_kmeans_matches_an_independent_run_of_its_rules():
    """Start from C tokens drawn with replacement (torch.randint on the quantizer's generator); with one round
    the labels are those of the start (before the update) and the centroids are the update."""
    cfg = preset("qvg", "quant.qvg_centroids=16", "quant.qvg_iters=1", "quant.qvg_seed=3")
    x = clustered(s=64)
    q = make_quantizer(cfg, 128)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):  # fresh each call: the second call draws the next start, no warm start
        t = q.quantize(x)
        flat = x.reshape(2, 64, 128)  # (N, S, D)
        start = gather_centroids(flat, torch.randint(0, 64, (2, 16), generator=gen))
        labels = nearest_centroid(flat, start)
        assert torch.equal(t.assignments[0].reshape(2, 64).long(), labels)
        expected = update_centroids(flat, labels, start).to(torch.bfloat16)
        assert torch.equal(t.centroids[0].reshape(2, 16, 128), expected)
    assert q.warm_centroids is not None  # kept for inspection, never used by the published k-means


def test_published_kmeans_stops_early_and_keeps_the_assigned_centroids():
    x = clustered(s=200, clusters=4).reshape(2, 200, 128)
    labels, centroids, rounds = published_kmeans(x, 4, 100, 1e-4, torch.Generator().manual_seed(0))
    assert rounds < 100  # converged: fewer than 1e-4 of the labels changed
    assert torch.equal(labels, nearest_centroid(x, centroids))  # stopped before adopting the update
    _, _, rounds = published_kmeans(x, 4, 100, 0.0, torch.Generator().manual_seed(0))
    assert rounds == 100  # tol 0 never stops early
    _, _, rounds = published_kmeans(x, 4, 100, 0.999, torch.Generator().manual_seed(0))
    assert rounds == 2  # the first comparison already stops


def test_empty_cluster_keeps_its_centroid():
    x = torch.tensor([[[0.0], [0.1], [10.0]]])  # (1, 3, 1)
    centroids = torch.tensor([[[0.0], [10.0], [-50.0]]])  # the third wins no token
    updated = update_centroids(x, nearest_centroid(x, centroids), centroids)
    assert torch.allclose(updated, torch.tensor([[[0.05], [10.0], [-50.0]]]))


def test_spans_cluster_separately_and_count_their_centroids():
    assert span_bounds(150, 64) == [(0, 64), (64, 150)]  # the remainder joins the last span
    assert span_bounds(50, 64) == [(0, 50)] and span_bounds(50, None) == [(0, 50)]
    cfg = preset("qvg", "quant.qvg_centroids=8", "quant.qvg_span=64")
    x = clustered(s=150)
    t = make_quantizer(cfg, 128).quantize(x)
    assert t.spans == [(0, 64), (64, 150)] and t.centroids[0].shape == (1, 2, 16, 128)
    assert int(t.assignments[0].max()) < 8  # ids index within the span
    err = (t.dequantize() - x).abs()
    assert (err <= t.group_steps().step.repeat_interleave(64, -1) / 2 * (1 + 1e-5) + 1e-5).all()
    assert t.nbytes * 8 == pytest.approx(bits_per_element(cfg, 128, 150) * x.numel(), rel=1e-12)
    whole = make_quantizer(dataclasses.replace(cfg, qvg_span=None), 128).quantize(x)
    assert t.nbytes - whole.nbytes == 2 * 8 * 128 * 2  # one more span: C bf16 centroids per (B, H)


def test_first_qvg_stays_under_its_own_name():
    old = preset("qvg_rtn", "quant.qvg_centroids=16")
    assert old == QuantConfig(method="qvg", qvg_centroids=16, store_dtype=old.store_dtype)
    assert old.label == "qvg_rtn" and old.qvg_kmeans == "warm_start" and not old.symmetric
    t = make_quantizer(old, 128).quantize(clustered())
    assert t.centroids[0].dtype == torch.float16 and t.residual.zero.dtype == torch.uint8


def test_built_in_model_needs_fewer_centroids_than_tokens_per_chunk():
    with pytest.raises(ValueError, match=r"quant\.qvg_centroids=256 .*S=128"):
        make_quantizer(preset("qvg"), 128).quantize(torch.randn(1, 1, 128, 128))
