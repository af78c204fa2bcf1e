"""The training recipe's noise-level sampler (scripts/train_tiny.py): clean prefix, chunk-0 weighting, t range."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_tiny.py"


@pytest.fixture(scope="module")
def train_tiny():
    spec = importlib.util.spec_from_file_location("train_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny"] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    yield module
    del sys.modules["train_tiny"]


@pytest.mark.parametrize("timesteps", ["uniform", "logit_normal"])
def test_chunk_timesteps_clean_prefix_then_noise(train_tiny, timesteps):
    gen = torch.Generator().manual_seed(0)
    t = train_tiny.chunk_timesteps(20_000, 4, gen, first_chunk_prob=0.4, timesteps=timesteps)  # (B, 4)
    assert t.shape == (20_000, 4)
    noisy = t > 0
    current = noisy.float().argmax(dim=1)  # first noisy chunk
    assert noisy.any(dim=1).all()  # every video has a chunk to learn from
    assert torch.equal(noisy, torch.arange(4)[None] >= current[:, None])  # clean prefix, then all noisy
    assert (current == 0).float().mean() == pytest.approx(0.4, abs=0.015)
    for k in (1, 2, 3):
        assert (current == k).float().mean() == pytest.approx(0.2, abs=0.015)
    levels = t[noisy]
    assert levels.min() >= 1e-3 and levels.max() <= 1.0
    middle = ((levels > 0.25) & (levels < 0.75)).float().mean()
    # logit-normal: P(0.25 < sigmoid(z) < 0.75) = 2 Phi(ln 3) - 1 = 0.728
    assert middle == pytest.approx(0.5 if timesteps == "uniform" else 0.728, abs=0.02)
