"""RandomHadamard: orthogonal, q.k preserved, seeded, power-of-two only."""
from __future__ import annotations

import pytest
import torch

from jensenkv.quant import RandomHadamard, walsh_hadamard


def test_inverse_undoes_apply_and_dot_products_are_kept():
    rot = RandomHadamard(64, seed=1)
    q, k = torch.randn(3, 5, 64), torch.randn(3, 7, 64)
    assert torch.allclose(rot.inverse(rot.apply(k)), k, atol=1e-5)
    assert torch.allclose(rot.apply(q) @ rot.apply(k).transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-4)


def test_walsh_hadamard_matches_dense_sylvester_matrix():
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    x = torch.randn(4, 16)
    assert torch.allclose(walsh_hadamard(x), x @ h.T / 4, atol=1e-5)


def _butterfly_by_stacking(x: torch.Tensor) -> torch.Tensor:
    """The textbook butterfly, a new tensor per stage: what the stored results were computed with."""
    d = x.shape[-1]
    y, h = x.reshape(-1, d), 1
    while h < d:
        y = y.view(-1, d // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0, :] + y[:, :, 1, :], y[:, :, 0, :] - y[:, :, 1, :]), dim=2)
        h *= 2
    return (y.reshape(x.shape) / d**0.5).to(x.dtype)


@pytest.mark.parametrize("dim", [1, 2, 4, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_walsh_hadamard_equals_the_stacking_butterfly_bit_for_bit_and_leaves_its_input(dim, dtype):
    x = torch.randn(3, 2, 5, dim).to(dtype)
    before = x.clone()
    assert torch.equal(walsh_hadamard(x), _butterfly_by_stacking(x))  # so the stored QuaRot runs stay as they are
    assert torch.equal(x, before)
    sliced = torch.randn(4, 6, dim)[:, ::2]  # (4, 3, dim): not contiguous in the leading dims
    assert torch.equal(walsh_hadamard(sliced), _butterfly_by_stacking(sliced.contiguous()))
    columns = torch.randn(5, 2 * dim)[:, :dim]  # (5, dim) with a row stride of 2 * dim: reshape keeps the view
    assert torch.equal(walsh_hadamard(columns), _butterfly_by_stacking(columns.contiguous()))


def test_seeded_signs():
    assert torch.equal(RandomHadamard(32, 7).signs, RandomHadamard(32, 7).signs)
    assert not torch.equal(RandomHadamard(32, 7).signs, RandomHadamard(32, 8).signs)


def test_non_power_of_two_is_rejected():
    with pytest.raises(ValueError, match=r"head_dim=96 .*power of two"):
        RandomHadamard(96)


def test_signs_are_copied_to_a_device_once_and_reused(monkeypatch):
    """apply / inverse reuse one copy of the signs per (device, dtype) instead of copying them every call."""
    rot = RandomHadamard(16, seed=3)
    x = torch.randn(2, 16, dtype=torch.float64)
    expected = walsh_hadamard(x * rot.signs.double())
    copies = []
    original_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if self is rot.signs:
            copies.append(args)
        return original_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    for _ in range(3):
        assert torch.allclose(rot.apply(x), expected)
        rot.inverse(x)
    assert len(copies) == 1
    assert rot.signs_on("cpu", torch.float64) is rot.signs_on(torch.device("cpu"), torch.float64)
