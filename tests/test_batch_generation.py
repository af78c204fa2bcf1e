"""Batched generation beyond the family kit: the kit (tests/models/test_family_kit.py) checks that every video of a
batch is the video it is alone, for every family and every cache, correction and schedule setting; here the fps
embedding with CFG, a control, the seeds a batch needs and ``auto`` on a GPU. Frames and latents to 1e-5 relative
(max-norm), every probe value v to 1e-5 max(|v|, 1) (several probes are differences of O(1) masses,
delta_p_s = p_s - p_s_ref, that cannot keep a rounding error relative to themselves).

The Wan adapter runs the Wan class's Conv3d patch embedding one video at a time and gives it per-token timesteps
(batched, those two steps rounded a video differently from the video alone, ~1e-7, enough to flip an INT2
code of a committed chunk), and the exact correction's attention runs video by video. SkyReels-V2's per-frame
time embedding still runs batched: 2e-7 (frames) to 1.5e-6 (latents) on the random test model, within tolerance;
the built-in model's trained chain grows it past it (README, the kit's known defect).
"""
from __future__ import annotations

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import generate_videos
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant import QuantConfig
from batch_testkit import batch_errors, within_tolerance

PROMPTS = ["a red square", "a blue circle moving left", "a red square"]
SEEDS = [3, 3, 11]  # prompt 0 and 1 share a seed, prompt 0 and 2 share a prompt
GEN = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=3.0, guidance_scale=4.0)
PROBES = dict(probes=True, diagnostics=True, head_moments=True)


def int2(granularity: str = "token_group", **extra) -> CacheConfig:
    quant = QuantConfig(bits=2, granularity=granularity, group_size=4 if granularity != "channel" else 3, **extra)
    values = quant if granularity != "channel" else QuantConfig(bits=2, granularity="token_group", group_size=4)
    return CacheConfig(key=quant, value=values)


@pytest.mark.parametrize("videos", [1, 2], ids=lambda n: f"batch{n}")
def test_the_fps_embedding_batches_with_cfg(videos, tiny_wan_adapter):
    """SkyReels-V2-DF checkpoints embed the fps (inject_sample_info): with CFG the forward holds two rows per
    video, and each video batched (with CFG) is the video alone, frames, latents and probes."""
    adapter = tiny_wan_adapter(SkyReelsV2Transformer3DModel, int2(), AttentionConfig(correction="exact", **PROBES),
                               GEN, inject_sample_info=True)
    assert GEN.use_cfg and adapter.transformer.config.inject_sample_info
    errors = batch_errors(adapter, PROMPTS[:videos], SEEDS[:videos], GEN)
    assert within_tolerance(errors), errors


def test_control_a_cache_that_mixes_the_videos_statistics_fails(tiny_wan_adapter, monkeypatch):
    """Quantize the batch as one tensor (per-tensor statistics over all videos, as a naive batched cache
    would): the same check then sees the videos change, so the test above can fail."""
    def mixed(self, k, v):
        return self.key_quantizer.quantize(k), self.value_quantizer.quantize(v)

    monkeypatch.setattr(ChunkedKVCache, "_quantize", mixed)
    adapter = tiny_wan_adapter(SkyReelsV2Transformer3DModel, int2("tensor"), AttentionConfig(), GEN)
    errors = batch_errors(adapter, PROMPTS, SEEDS, GEN)
    assert errors["frames"] > 1e-3 and errors["latents"] > 1e-3, errors


def test_a_batch_needs_one_seed_per_prompt(tiny_wan_adapter):
    adapter = tiny_wan_adapter()
    with pytest.raises(ValueError, match="equally many"):
        generate_videos(adapter, PROMPTS, SEEDS[:2])


def test_auto_on_a_gpu_fills_the_free_memory_by_the_per_video_model(monkeypatch):
    """auto on CUDA: floor(0.8 x free / video_bytes), at least 1 and at most GPU_MAX_BATCH; the per-video bytes
    grow with the cached chunks and double with the probes' reference copies."""
    import dataclasses

    from jensenkv.config.tree import RunConfig
    from jensenkv.models import family as family_module
    from jensenkv.models.config import ModelConfig
    from jensenkv.models.registry import family
    from jensenkv.config.resolve import resolve

    spec = resolve(RunConfig(model=ModelConfig(kind="tiny", device="cpu")))
    per_video = family_module.video_bytes(spec)
    longer = dataclasses.replace(spec, generation=dataclasses.replace(spec.generation, num_chunks=8))
    assert family_module.video_bytes(longer) > per_video
    plain = dataclasses.replace(spec, eval=dataclasses.replace(spec.eval, metrics=["psnr"]))
    assert spec.attention.probes and not plain.attention.probes
    assert family_module.video_bytes(plain) < per_video
    for free, expected in ((10 * per_video, 8), (per_video // 2, 1), (10_000 * per_video, family_module.GPU_MAX_BATCH)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 2 * free))
        assert family("tiny").auto_batch_size(spec, "cuda") == expected
