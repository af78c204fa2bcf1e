"""Every video of a MAGI-1 batch is the video it is alone: frames and latents to 1e-5 relative (max-norm), every
probe value v to 1e-5 max(|v|, 1) (the rule of tests/batch_testkit.py, where the floor is explained). The family kit
(tests/models/test_family_kit.py, MAGI_BATCH) runs the batches; here what is MAGI-1's own.

The kit's tiny MAGI-1 runs a batch of 3 (prompts of different caption lengths, a repeated prompt and a repeated seed)
through the three guidance passes (cond, prefix, uncond) on the staircase with kv ranges and the clean-chunk
refresh, and through the distilled single pass with its nearly-clean re-run; INT2 RTN per-tensor and per token
group, correction none / taylor / exact, probes with diagnostics. A control shows that a cache mixing the
videos' quantization statistics fails the same check.

Measured on CPU (1 and 2 threads): every case 0 in frames, latents and probes, i.e. bit for bit. It has to be
close to that: INT2 rounding is discontinuous, so a 1e-7 difference in a committed key can flip a code and move
the video by 1e-3. Before the patch embedding (Conv3d) and the exact correction's attention ran video by video
(see MagiDiT.forward, WindowAttention._attend) errors were ~5e-7, and cfg3-tensor-exact at 1 thread was 1.5e-3.
"""
from __future__ import annotations


import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.loop import generate_video, generate_videos
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant import QuantConfig
from batch_testkit import batch_errors
from magi_testkit import PROMPT, tiny_adapter

PROMPTS = [PROMPT, "a cat", PROMPT]  # 6 and 2 caption tokens; videos 0 and 2 share a prompt
SEEDS = [3, 3, 11]                   # videos 0 and 1 share a seed
PROBES = dict(probes=True, diagnostics=True, head_moments=True)
DISTILLED = {"model_overrides": {"distill": True}, "magi": {"cfg_number": 1}}


def int2(granularity: str) -> CacheConfig:
    quant = QuantConfig(method="rtn", bits=2, granularity=granularity, group_size=8)
    return CacheConfig(key=quant, value=quant)


def pass_spy(adapter) -> list[str]:
    """The names of the passes the adapter runs from now on (cond, prefix, uncond, alone)."""
    names, run = [], adapter._run

    def spy(x, t, captions, dropped, window, start_frame, pass_name, *args, **kwargs):
        names.append(pass_name)
        return run(x, t, captions, dropped, window, start_frame, pass_name, *args, **kwargs)

    adapter._run = spy
    return names


@pytest.mark.parametrize("mode", ["cfg3", "distilled"])
def test_the_kits_magi_variants_run_the_passes_they_are_about(mode):
    """The family kit batches MAGI-1 in both modes (tests/models/family_testkit.py MAGI_BATCH): each runs the
    staircase with kv ranges and its mode's passes."""
    import family_testkit as kit

    variant = next(v for name, v in kit.MAGI_BATCH.items() if name.startswith(mode))
    spec = kit.spec_of(kit.CASES["magi1_tiny"], None, *variant)
    adapter = kit.adapter_of(spec, probes=None)
    passes = pass_spy(adapter)
    generate_video(adapter, PROMPT, seed=0)
    g = adapter.generation
    assert g.window_size == 2 and g.kv_range == [2, 1] and g.commit_kv_range == 0
    assert set(passes) == ({"cond", "alone"} if mode == "distilled" else {"cond", "prefix", "uncond"})


def test_the_prompts_have_different_caption_lengths():
    adapter = tiny_adapter()
    adapter.set_prompts(PROMPTS)
    lengths = [adapter.caption(0, b).shape[0] for b in range(len(PROMPTS))]
    assert adapter.batch_size == 3 and lengths[0] == lengths[2] != lengths[1]


def test_control_a_cache_that_mixes_the_videos_statistics_fails(monkeypatch):
    """Quantize the batch as one tensor (per-tensor statistics over all videos): the check sees it."""
    def mixed(self, k, v):
        return self.key_quantizer.quantize(k), self.value_quantizer.quantize(v)

    monkeypatch.setattr(ChunkedKVCache, "_quantize", mixed)
    adapter = tiny_adapter(cache=int2("tensor"), attention=AttentionConfig(correction="taylor", **PROBES))
    errors = batch_errors(adapter, PROMPTS, SEEDS)
    assert errors["latents"] > 1e-3 and errors["probes"] > 1e-3, errors


def test_probes_are_one_record_per_video_marked_by_sample():
    adapter = tiny_adapter(cache=int2("token_group"), attention=AttentionConfig(correction="taylor", **PROBES))
    generate_video(adapter, PROMPT, seed=0)
    alone = adapter.probes()
    assert alone and {r["sample"] for r in alone} == {0}  # batch 1: the records are unchanged but for sample 0
    results = generate_videos(adapter, PROMPTS, SEEDS)
    assert len(adapter.probes()) == len(PROMPTS) * len(alone)
    assert all("sample" not in r.probes[0] and len(r.probes) == len(alone) for r in results)
    assert {r["branch"] for r in alone} == {"cond", "prefix"}


def test_a_batch_needs_its_prompts():
    adapter = tiny_adapter()
    with pytest.raises(ValueError, match="one prompt per video"):
        adapter.set_prompts(PROMPT)
    adapter.set_prompts(PROMPTS[:2])
    c, h, w = adapter.latent_frame_shape
    with pytest.raises(ValueError, match="set_prompts gave 2 prompts"):
        adapter.denoise_window(torch.zeros(3, c, 2, h, w), [1.0], 0)
