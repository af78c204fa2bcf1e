"""The chunk-wise generation loop: determinism, the kv-range schedule, and agreement with the tiny model's
cache-free block-causal sampler. Random-init models only (no weights)."""
from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before diffusers / huggingface_hub are imported

import zlib

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel

import jensenkv.attention as attention_lib
from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig, flow_sigmas, generate_video
from jensenkv.models.registry import full_precision_cache
from jensenkv.models.tiny.config import SamplerConfig, build_transformer, default_transformer_config
from jensenkv.models.tiny.data import COLOURS, SHAPES
from jensenkv.models.tiny.sampling import sample_block_causal
from jensenkv.models.tiny.text import TextConfig, build_text
from jensenkv.models.wan import AttentionSettings, ChunkwiseAdapter
from jensenkv.quant import QuantConfig

TEST_CONFIG = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4,
               "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2,
               "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
GEN = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=3.0, guidance_scale=5.0)


def encode_prompt(prompts: list[str]) -> torch.Tensor:
    return torch.stack([torch.randn(12, 16, generator=torch.Generator().manual_seed(zlib.crc32(p.encode())))
                        for p in prompts])  # (B, 12, 16)


def make_adapter(cls=SkyReelsV2Transformer3DModel, cache: CacheConfig | None = None,
                 attention: AttentionSettings | None = None, generation: GenerationConfig = GEN) -> ChunkwiseAdapter:
    torch.manual_seed(0)
    return ChunkwiseAdapter(cls(**TEST_CONFIG), encode_prompt, (4, 16, 16), generation,
                            cache or full_precision_cache(), attention)


def int2_cache() -> CacheConfig:
    return CacheConfig(key=QuantConfig(bits=2, group_size=4), value=QuantConfig(bits=2, group_size=4))


@pytest.mark.parametrize("cls", [SkyReelsV2Transformer3DModel, WanTransformer3DModel], ids=lambda c: c.__name__)
def test_same_seed_same_video_bit_for_bit(cls):
    """(d) Same seed + config -> identical video and latents on CPU; another seed -> another video."""
    adapter = make_adapter(cls, int2_cache(), AttentionSettings(correction="taylor"))
    first = generate_video(adapter, "a red square", seed=7)
    second = generate_video(adapter, "a red square", seed=7)
    assert torch.equal(first.video, second.video) and torch.equal(first.latents, second.latents)
    other = generate_video(adapter, "a red square", seed=8)
    assert not torch.allclose(other.latents, first.latents)
    renoised = generate_video(adapter, "a red square", seed=7,
                              config=GenerationConfig(**{**GEN.__dict__, "sampler": "x0_renoise"}))
    again = generate_video(adapter, "a red square", seed=7,
                           config=GenerationConfig(**{**GEN.__dict__, "sampler": "x0_renoise"}))
    assert torch.equal(renoised.latents, again.latents) and not torch.allclose(renoised.latents, first.latents)


def test_result_layout_and_timings():
    result = generate_video(make_adapter(), "a red square", seed=0)
    frames = GEN.num_chunks * GEN.frames_per_chunk
    assert result.latents.shape == (1, 4, frames, 16, 16)
    assert result.video.shape == (frames, 4, 16, 16) and result.video.dtype == torch.float32
    assert 0.0 <= float(result.video.min()) and float(result.video.max()) <= 1.0
    assert result.probes is None
    t = result.timings
    assert len(t["per_chunk_s"]) == GEN.num_chunks and t["total_s"] >= sum(t["per_chunk_s"]) > 0
    assert 0.0 < t["quantize_s"] < t["total_s"]


def test_probes_carry_their_coordinates():
    adapter = make_adapter(cache=int2_cache(), attention=AttentionSettings(correction="taylor", probes=True))
    probes = generate_video(adapter, "a red square", seed=0).probes
    keys = {(p["layer"], p["step"], p["chunk"], p["branch"]) for p in probes}
    # chunks 1 and 2 (chunk 0 has an empty cache) x 3 steps x 2 layers x 2 CFG branches, one record each
    assert len(probes) == len(keys) == 2 * 3 * 2 * 2
    assert {p["chunk"] for p in probes} == {1, 2} and {p["branch"] for p in probes} == {"cond", "uncond"}


def test_kv_range_schedule_is_honoured(monkeypatch):
    """(f) Per-stage kv-range (MAGI-1 style): each denoising stage sees at most that many cached chunks."""
    gen = GenerationConfig(num_chunks=4, frames_per_chunk=2, steps=4, shift=2.0, kv_range=(None, 2, 1, 0),
                           commit_kv_range=1)
    adapter = make_adapter(generation=gen)
    seen: dict[tuple, int] = {}
    inner = attention_lib.cached_attention

    def recording(q, k_cur, v_cur, segments, **kwargs):
        s = adapter.state
        seen[(s.mode, s.chunk_index, s.step)] = len(segments)
        return inner(q, k_cur, v_cur, segments, **kwargs)

    monkeypatch.setattr(attention_lib, "cached_attention", recording)
    generate_video(adapter, "a red square", seed=0)
    for chunk in range(4):
        for step, limit in enumerate(gen.kv_range):
            assert seen[("cached", chunk, step)] == (chunk if limit is None else min(chunk, limit))
        assert seen[("commit", chunk, None)] == min(chunk, 1)


def test_generation_config_checks_and_stages():
    assert [GenerationConfig(steps=8, kv_range=(4, 3, 2, 1)).kv_range_at(i) for i in range(8)] == \
        [4, 4, 3, 3, 2, 2, 1, 1]
    assert GenerationConfig().kv_range_at(3) is None
    for bad, key in [({"steps": 0}, "steps"), ({"shift": 0.0}, "shift"), ({"sampler": "ddim"}, "sampler"),
                     ({"kv_range": (1, -1)}, "kv_range"), ({"steps": 2, "kv_range": (1, 1, 1)}, "kv_range"),
                     ({"commit_kv_range": 1.5}, "commit_kv_range"), ({"guidance_scale": -1.0}, "guidance_scale")]:
        with pytest.raises(ValueError, match=key):
            GenerationConfig(**bad).validate()


def test_flow_sigmas_follow_the_shifted_schedule():
    s = flow_sigmas(4, 5.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and bool((s[1:] < s[:-1]).all())
    # Self-Forcing's warped [1000, 750, 500, 250] at shift 5
    assert torch.allclose(s[:4], torch.tensor([1.0, 0.9375, 2.5 / 3, 0.625]))
    assert torch.allclose(flow_sigmas(4, 1.0), torch.linspace(1, 0, 5))


def test_matches_the_tiny_models_block_causal_sampler():
    """With a full-precision cache the generator reproduces the cache-free reference sampler of the tiny model."""
    torch.manual_seed(0)
    transformer = build_transformer(default_transformer_config())
    tokenizer, text_encoder = build_text(TextConfig())
    prompt = f"a {next(iter(COLOURS))} {next(iter(SHAPES))}"
    sampler = SamplerConfig(steps=3, shift=2.0, cfg_scale=3.0, frames_per_chunk=2, num_chunks=3)
    with torch.no_grad():
        reference = sample_block_causal(transformer, text_encoder, tokenizer, [prompt], seed=5, sampler=sampler)
    gen = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=2.0, guidance_scale=3.0)
    adapter = ChunkwiseAdapter(transformer, lambda p: text_encoder(tokenizer(p)), (3, 16, 16), gen,
                               full_precision_cache(), clean_range=(-1.0, 1.0))
    ours = generate_video(adapter, prompt, seed=5)
    assert ours.video.shape == reference[0].shape
    assert float((ours.video - reference[0]).abs().max()) < 1e-4
    adapter.remove()  # stock processors and the model's own block-causal mask are back
    with torch.no_grad():
        again = sample_block_causal(transformer, text_encoder, tokenizer, [prompt], seed=5, sampler=sampler)
    assert torch.equal(again, reference)


def test_bfloat16_model_runs_end_to_end():
    """Real checkpoints run in bf16: the cast model (fp32-kept modules as diffusers keeps them) generates a
    finite video close to the fp32 one."""
    from jensenkv.models.wan import cast_like_diffusers

    fp32 = generate_video(make_adapter(WanTransformer3DModel, int2_cache()), "a red square", seed=3)
    adapter = make_adapter(WanTransformer3DModel, int2_cache(), AttentionSettings(correction="taylor"))
    cast_like_diffusers(adapter.transformer, torch.bfloat16)
    bf16 = generate_video(adapter, "a red square", seed=3)
    assert bool(torch.isfinite(bf16.video).all()) and float((bf16.video - fp32.video).abs().max()) < 0.1
