"""End to end through ``generate_video`` on the tiny MAGI-1, probes on; schedule and RoPE details."""
from __future__ import annotations

import pytest
import torch

from jensenkv.attention import PROBE_KEYS
from jensenkv.generation.loop import generate_video
from jensenkv.models.magi.config import magi_times
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.models.magi.model import apply_rope
from jensenkv.attention.config import AttentionConfig
from magi_testkit import PROMPT, int2, tiny_adapter


def test_generation_with_probes_int2():
    adapter = tiny_adapter(cache=int2(), attention=AttentionConfig(correction="taylor", probes=True))
    result = generate_video(adapter, PROMPT, seed=0)
    g = adapter.generation
    assert result.video.shape[0] == g.num_chunks * g.frames_per_chunk  # tiny decoder: 1 frame per latent frame
    assert 0.0 <= result.video.min() and result.video.max() <= 1.0 and result.video.std() > 0
    probes = result.probes
    assert probes and set(PROBE_KEYS) <= set(probes[0])
    assert {p["branch"] for p in probes} == {"cond", "prefix"}  # uncond never reads the cache
    assert {p["layer"] for p in probes} == set(range(adapter.model.config.num_layers))
    assert all(p["chunk"] >= 1 for p in probes)  # chunk 0 has nothing cached before it
    assert any(abs(p["delta_p_s"]) > 0 for p in probes) and any(p["bias_mean"] > 0 for p in probes)

    # The first probed call sees the same inputs in a full-precision run: its BF16-reference mass is that run's mass.
    ref = tiny_adapter(attention=AttentionConfig(probes=True))
    ref_probes = generate_video(ref, PROMPT, seed=0).probes
    assert ref_probes[0]["p_s"] == pytest.approx(probes[0]["p_s_ref"], rel=1e-6)
    assert all(p["delta_p_s"] == 0 for p in ref_probes)


def test_magi_time_schedule_matches_official_formula():
    # linspace(0, 1, 3) = [0, .5, 1] -> squared [0, .25, 1] -> shift 3: (t/3) / (1 + (1/3 - 1) t)
    assert torch.allclose(magi_times(2, 3.0), torch.tensor([0.0, 0.1, 1.0]), atol=1e-7)
    adapter = tiny_adapter()
    assert torch.allclose(adapter.noise_levels(adapter.generation), 1 - magi_times(4, 3.0))


def test_guidance_scales_follow_the_piecewise_table():
    s = MagiScheduleConfig()
    assert s.guidance_scales(0.0) == (1.5, 7.5)
    assert s.guidance_scales(0.05) == (1.5, 7.5)
    assert s.guidance_scales(0.5) == (1.0, 0.0)
    assert s.guidance_scales(s.clean_t) == (1.0, 0.0)
    with pytest.raises(ValueError, match="cfg_number"):
        MagiScheduleConfig.from_dict({"cfg_number": 2})


def test_partial_rotate_half_rope():
    x = torch.randn(1, 2, 5, 32)
    angles = torch.randn(5, 12)
    out = apply_rope(x, angles.sin(), angles.cos())
    assert torch.equal(out[..., 24:], x[..., 24:])  # channels past the rotary dim pass through
    pairs = lambda t: t[..., :12] ** 2 + t[..., 12:24] ** 2  # noqa: E731 - (i, i + 12) pairs keep their norm
    assert torch.allclose(pairs(out), pairs(x), atol=1e-5)
    assert not torch.allclose(out[..., :24], x[..., :24])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="guidance_scale"):
        tiny_adapter(guidance_scale=5.0)
    with pytest.raises(ValueError, match="negative_prompt"):
        tiny_adapter().set_prompt(PROMPT, "blurry")
    with pytest.raises(ValueError, match="not allowed"):
        tiny_adapter(unknown_key=1)


def test_null_caption_longer_than_the_table_is_refused():
    with pytest.raises(ValueError, match="null_caption_tokens"):
        tiny_adapter(magi={"null_caption_tokens": 17})


def test_distill_step_embedding_follows_the_official_rule_unless_set():
    distilled = {"model_overrides": {"distill": True}, "magi": {"cfg_number": 1}}
    assert tiny_adapter(**distilled).distill_dt() == 4 / 4 * 2
    assert tiny_adapter(**{**distilled, "magi": {"cfg_number": 1, "distill_dt": 3.0}}).distill_dt() == 3.0
    assert tiny_adapter().distill_dt() is None
    a = generate_video(tiny_adapter(**distilled), PROMPT, seed=0).latents
    b = generate_video(tiny_adapter(**{**distilled, "magi": {"cfg_number": 1, "distill_dt": 3.0}}), PROMPT, seed=0)
    assert not torch.allclose(a, b.latents)  # the step embedding reaches the model
