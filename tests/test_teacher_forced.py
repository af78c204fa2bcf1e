"""Teacher-forced fidelity: each chunk read with the BF16 run's own history, quantized cache vs full precision.
Random-init tiny Wan-family models (no weights)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import generate_video
from jensenkv.generation.teacher_forced import teacher_forced_chunks

GEN = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=3.0, guidance_scale=5.0)
PROMPT = "a red square"


def _chunk(video: torch.Tensor, index: int) -> torch.Tensor:
    return video[index * GEN.frames_per_chunk:(index + 1) * GEN.frames_per_chunk]  # (F, C, H, W)


def test_the_reference_side_replays_the_bf16_run_and_equal_caches_give_zero_error(tiny_wan_adapter):
    bf16 = generate_video(tiny_wan_adapter(generation=GEN), PROMPT, seed=3).video  # (F, C, H, W)
    chunks = teacher_forced_chunks(tiny_wan_adapter(generation=GEN), tiny_wan_adapter(generation=GEN), PROMPT, 3)
    assert [c.chunk for c in chunks] == [1, 2]  # chunk 0 reads no cache
    for c in chunks:
        assert torch.equal(c.reference, _chunk(bf16, c.chunk))  # the BF16 run, bit for bit
        assert torch.equal(c.video, c.reference) and c.rel_err == 0 and c.latent_rel_err == 0  # the control


def test_a_quantized_cache_reads_the_bf16_history_not_its_own(tiny_wan_adapter, int2_cache):
    """Chunk 1's history (chunk 0) is the same in both runs, so its teacher-forced output is the quantized run's
    own chunk 1; chunk 2's history differs in the quantized run (its chunk 1 drifted), so there they differ."""
    quantized_run = generate_video(tiny_wan_adapter(cache=int2_cache(), generation=GEN), PROMPT, seed=3).video
    chunks = teacher_forced_chunks(tiny_wan_adapter(cache=int2_cache(), generation=GEN),
                                   tiny_wan_adapter(generation=GEN), PROMPT, 3)
    assert torch.allclose(chunks[0].video, _chunk(quantized_run, 1), atol=1e-6)
    assert not torch.allclose(chunks[1].video, _chunk(quantized_run, 2), atol=1e-4)
    assert all(c.rel_err > 1e-4 and c.latent_rel_err > 1e-4 for c in chunks)
    assert not torch.equal(chunks[0].video, chunks[0].reference)


def test_more_bits_give_a_smaller_direct_error(tiny_wan_adapter, int2_cache):
    from jensenkv.cache import CacheConfig
    from jensenkv.quant import QuantConfig

    int4 = CacheConfig(key=QuantConfig(bits=4, group_size=4), value=QuantConfig(bits=4, group_size=4))
    errors = {}
    for name, cache in (("int2", int2_cache()), ("int4", int4)):
        chunks = teacher_forced_chunks(tiny_wan_adapter(cache=cache, generation=GEN), tiny_wan_adapter(generation=GEN),
                                       PROMPT, 3)
        errors[name] = sum(c.rel_err for c in chunks)
    assert errors["int4"] < 0.5 * errors["int2"]


def test_the_plain_loop_only(tiny_wan_adapter):
    staircase = dataclasses.replace(GEN, window_size=3)
    with pytest.raises(ValueError, match="generation.window_size=3 is not allowed for teacher-forced fidelity"):
        teacher_forced_chunks(tiny_wan_adapter(generation=GEN), tiny_wan_adapter(generation=GEN), PROMPT, 0, staircase)


def test_a_run_records_teacher_forced_fidelity_per_chunk_and_video(tmp_path, tiny_weights):
    """eval.metrics with teacher_forced: per-video tf_psnr / tf_rel_err / tf_latent_rel_err (means over chunks >= 1)
    and the per-chunk rows in the prompt results; the BF16 run records it missing; a staircase schedule is refused
    when the config is built."""
    from jensenkv.run import compose_config, run_overrides
    from jensenkv.config.resolve import build_spec
    from pipeline_testkit import fast_overrides

    record = run_overrides(fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr,teacher_forced]",
                                          "correction=taylor"))
    video = record["per_prompt"][0]
    assert [row["chunk"] for row in video["teacher_forced"]] == [1]  # 2 chunks: chunk 1 reads the cache
    row = video["teacher_forced"][0]
    assert video["metrics"]["tf_psnr"] == pytest.approx(row["psnr"]) and row["rel_err"] > 0
    assert video["metrics"]["tf_rel_err"] == pytest.approx(row["rel_err"])
    assert record["metrics"]["tf_latent_rel_err"] == pytest.approx(row["latent_rel_err"])
    alone = run_overrides(fast_overrides(tmp_path, tiny_weights, "eval.metrics=[teacher_forced]", "correction=taylor",
                                         "eval.save_videos=false"))  # nothing scores the run's own video
    assert alone["per_prompt"][0]["reference_id"] is None and alone["per_prompt"][0]["video"] is None
    assert alone["metrics"]["tf_rel_err"] == pytest.approx(record["metrics"]["tf_rel_err"])  # the same computation
    bf16 = run_overrides(fast_overrides(tmp_path, tiny_weights, "eval.metrics=[psnr,teacher_forced]", "quant=bf16"))
    assert "teacher_forced" in bf16["missing"]
    with pytest.raises(ValueError, match="generation.window_size=2 is not allowed for teacher-forced"):
        build_spec(compose_config(fast_overrides(tmp_path, tiny_weights, "eval.metrics=[teacher_forced]",
                                                 "generation.window_size=2")))
