"""attention.diagnostic_steps: probes on every step, the costlier error-model diagnostics on a few; the run id of
a config that leaves it unset is unchanged (tests/test_run_ids.py), and setting it is part of the id."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from jensenkv.attention.config import AttentionConfig
from jensenkv.attention.videos import probe_videos
from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig
from jensenkv.config.resolve import compose_config, resolve


def _inputs():
    gen = torch.Generator().manual_seed(3)
    int2 = QuantConfig(method="rtn", bits=2, granularity="token_group", group_size=16)
    cache = ChunkedKVCache(CacheConfig(key=int2, value=int2, keep_reference=True), head_dim=16)
    for _ in range(2):
        cache.commit(torch.randn(1, 2, 8, 16, generator=gen), torch.randn(1, 2, 8, 16, generator=gen))
    q, k, v = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3))  # (B, H, T, D)
    return q, k, v, cache.segments()


@pytest.mark.parametrize("step, diagnosed", [(0, True), (4, False), (9, True)])
def test_diagnostics_only_on_their_steps(step, diagnosed):
    settings = AttentionConfig(correction="taylor", probes=True, diagnostics=True, head_moments=True,
                               diagnostic_steps=[0, 9])
    (record,) = probe_videos(*_inputs(), settings, 1.0, step=step)
    assert "delta_p_s" in record  # the probe itself on every step
    assert any(k.startswith("em_") for k in record) is diagnosed
    assert any(k.startswith("hm_") for k in record) is diagnosed


def test_unset_diagnoses_every_probed_step():
    settings = AttentionConfig(correction="taylor", probes=True, diagnostics=True)
    (record,) = probe_videos(*_inputs(), settings, 1.0, step=4)
    assert any(k.startswith("em_") for k in record)


def test_bad_diagnostic_steps_name_the_key():
    with pytest.raises(ValueError, match="attention.diagnostic_steps"):
        AttentionConfig(diagnostic_steps=[-1])


def test_diagnostic_steps_enter_the_run_id_only_when_set():
    def spec(*overrides):
        return resolve(OmegaConf.to_object(compose_config(["quant=rtn", *overrides])))

    plain, every = spec(), spec("attention.diagnostic_steps=null")
    assert plain.run_id == every.run_id and "diagnostic_steps" not in plain.identity()
    assert spec("attention.diagnostic_steps=[0]").run_id != plain.run_id
