"""QuantVideoGen: k-means smoothing beats plain RTN on clustered tokens, exact storage, warm start."""
from __future__ import annotations

import pytest
import torch

from jensenkv.quant import QuantConfig, QVGTensor, make_quantizer
from jensenkv.quant.qvg import lloyd_kmeans, nearest_centroid


def clustered_tokens(b=1, h=2, s=128, d=64, clusters=8, seed=0) -> torch.Tensor:
    """(B, H, S, D): tokens scattered tightly around a few far-apart centres (per head)."""
    gen = torch.Generator().manual_seed(seed)
    centres = 4 * torch.randn(b, h, clusters, d, generator=gen)
    which = torch.randint(0, clusters, (b, h, s), generator=gen)
    tokens = centres.gather(2, which[..., None].expand(-1, -1, -1, d))
    return tokens + 0.3 * torch.randn(b, h, s, d, generator=gen)


def qvg_cfg(**overrides) -> QuantConfig:
    return QuantConfig(**{"method": "qvg", "bits": 2, "qvg_centroids": 8, "qvg_iters": 5, **overrides})


def test_qvg_error_below_rtn_on_clustered_tokens():
    x = clustered_tokens()
    rtn = make_quantizer(QuantConfig(bits=2), 64).quantize(x)
    # more centroids than clusters, so a random start leaves no cluster without one
    qvg = make_quantizer(qvg_cfg(qvg_centroids=32), 64).quantize(x)
    rtn_mse = (rtn.dequantize() - x).pow(2).mean()
    qvg_mse = (qvg.dequantize() - x).pow(2).mean()
    assert qvg_mse < 0.05 * rtn_mse


@pytest.mark.parametrize("granularity", ["token_group", "channel", "token"])
def test_error_within_half_residual_step(granularity):
    x = clustered_tokens(s=40)
    t = make_quantizer(qvg_cfg(granularity=granularity, group_size=16), 64).quantize(x)
    steps = t.group_steps()
    assert steps.rotation is None
    per_element = steps.step.repeat_interleave(64 // steps.step.shape[-1], dim=-1)  # (B, H, S, D)
    assert ((t.dequantize() - x).abs() <= per_element / 2 * (1 + 1e-5) + 1e-6).all()
    assert torch.equal(steps.step, t.residual.group_steps().step)


def test_nbytes_counts_centroids_assignments_and_residual():
    b, h, s, d, c = 1, 2, 64, 128, 16
    t = make_quantizer(qvg_cfg(qvg_centroids=c, qvg_stages=2), d).quantize(clustered_tokens(b, h, s, d))
    assert isinstance(t, QVGTensor) and len(t.centroids) == len(t.assignments) == 2
    assert t.centroids[0].dtype == torch.float16 and t.assignments[0].dtype == torch.uint8
    residual = b * h * (s * d // 4 + s * (d // 32) * 3)  # INT2 codes + fp16 step + uint8 zero per group
    per_stage = b * h * (c * d * 2 + s * 1)
    assert t.residual.nbytes == residual
    assert t.nbytes == residual + 2 * per_stage


def test_more_than_256_centroids_use_int16_assignments():
    x = torch.randn(1, 1, 300, 16)
    t = make_quantizer(qvg_cfg(qvg_centroids=257, qvg_iters=1, group_size=16), 16).quantize(x)
    assert t.assignments[0].dtype == torch.int16
    assert int(t.assignments[0].max()) > 255  # real indices above the uint8 range are kept


def test_more_centroids_than_tokens_is_an_error():
    with pytest.raises(ValueError, match=r"quant\.qvg_centroids=256 .*S=64"):
        make_quantizer(qvg_cfg(qvg_centroids=256), 64).quantize(torch.randn(1, 1, 64, 64))


def test_warm_start_reuses_previous_chunk_centroids():
    first, second = clustered_tokens(seed=1), clustered_tokens(seed=2)
    # With zero Lloyd iterations the second chunk's centroids ARE the first chunk's stored centroids.
    q = make_quantizer(qvg_cfg(qvg_iters=0), 64)
    assert q.warm_centroids is None
    a = q.quantize(first)
    assert q.warm_centroids is not None
    b = q.quantize(second)
    assert torch.equal(b.centroids[0], a.centroids[0])
    cold = make_quantizer(qvg_cfg(qvg_iters=0, qvg_seed=1), 64).quantize(second)
    assert not torch.equal(cold.centroids[0], a.centroids[0])
    q.reset()
    assert q.warm_centroids is None


def test_warm_start_changes_the_result_and_is_deterministic():
    first, second = clustered_tokens(seed=1), clustered_tokens(seed=2)
    warm = make_quantizer(qvg_cfg(qvg_iters=1), 64)
    warm.quantize(first)
    warm_second = warm.quantize(second)
    cold_second = make_quantizer(qvg_cfg(qvg_iters=1), 64).quantize(second)
    assert not torch.equal(warm_second.centroids[0], cold_second.centroids[0])
    again = make_quantizer(qvg_cfg(qvg_iters=1), 64)
    again.quantize(first)
    assert torch.equal(again.quantize(second).centroids[0], warm_second.centroids[0])


def test_hadamard_qvg_returns_original_basis():
    x = clustered_tokens()
    t = make_quantizer(qvg_cfg(rotation="hadamard"), 64).quantize(x)
    steps = t.group_steps()
    assert steps.rotation is t.rotation and steps.rotation is not None
    err_rot = (steps.rotation.apply(t.dequantize()) - steps.rotation.apply(x)).abs()
    assert (err_rot <= steps.step.repeat_interleave(32, dim=-1) / 2 * (1 + 1e-5) + 1e-6).all()


def test_lloyd_kmeans_recovers_separated_clusters():
    centres = torch.tensor([[[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]])  # (1, 3, 2)
    labels = torch.arange(30) % 3
    x = centres[0, labels][None] + 0.1 * torch.randn(1, 30, 2, generator=torch.Generator().manual_seed(0))
    init = x[:, [0, 1, 2]]  # one token of each cluster
    fitted = lloyd_kmeans(x, init, iters=3)
    assert torch.allclose(fitted, centres, atol=0.1)
    assert torch.equal(nearest_centroid(x, fitted)[0], labels)
