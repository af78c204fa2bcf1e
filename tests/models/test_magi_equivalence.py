"""Chunk-wise MAGI-1 over a full-precision cache equals one cache-free full-sequence forward per tick.

The tiny config has GQA (4 query heads on 2 KV heads), partial RoPE (24 of 32 channels), a staircase of 2
chunks in flight with per-stage kv ranges, the clean-chunk refresh and (base) three-way guidance or
(distilled) the single pass with the nearly-clean re-run.
"""
from __future__ import annotations

import pytest
import torch

from jensenkv.generation.loop import generate_video
from magi_testkit import PROMPT, Recorder, full_sequence_velocity, tiny_adapter

TOL = 1e-5


def _run(**overrides):
    adapter = tiny_adapter(**overrides)
    recorder = Recorder()
    recorder.attach(adapter)
    generate_video(adapter, PROMPT, seed=3)
    return adapter, recorder


def _worst_rel_err(adapter, recorder) -> float:
    worst = 0.0
    for tick in recorder.ticks:
        ref = full_sequence_velocity(adapter, recorder, tick)
        worst = max(worst, ((tick.velocity - ref).norm() / ref.norm()).item())
    return worst


def _exercised(adapter, recorder) -> None:
    """The run covers what the check is about: GQA, partial RoPE, several chunks in flight, refreshes, a kv
    range that hides an older chunk, and cached chunks that are read."""
    cfg = adapter.model.config
    assert cfg.num_heads // cfg.num_kv_heads == 2 and cfg.rotary_dim == 24 < cfg.head_dim
    assert max(len(t.sigmas) for t in recorder.ticks) == 2
    assert sum(t.refreshed is not None for t in recorder.ticks) == adapter.generation.num_chunks - 1
    assert any(t.first >= 2 and min(r for r in t.kv_ranges) < t.first for t in recorder.ticks)
    assert all(c.num_chunks == adapter.generation.num_chunks - 1 for c in adapter.caches())


@pytest.mark.parametrize("overrides", [
    {},                                                            # base: cond / prefix / uncond
    {"model_overrides": {"distill": True}, "magi": {"cfg_number": 1}},  # distilled single pass
    {"model_overrides": {"gated_linear_unit": True, "half_channel_vae": True, "in_channels": 8, "out_channels": 8,
                         "x_rescale_factor": 0.1}},             # 24B-style SwiGLU + half-channel VAE
])
def test_chunkwise_equals_full_sequence(overrides):
    adapter, recorder = _run(**overrides)
    adapter._recorder = recorder
    _exercised(adapter, recorder)
    assert _worst_rel_err(adapter, recorder) <= TOL


def test_distilled_nearly_clean_rerun_is_exercised():
    adapter, recorder = _run(model_overrides={"distill": True}, magi={"cfg_number": 1})
    threshold = adapter.sampling.distill_nearly_clean_chunk_threshold
    assert any(1 - t.sigmas[0] > threshold for t in recorder.ticks)
    assert any(1 - t.sigmas[0] <= threshold for t in recorder.ticks)


def test_wrong_rope_offset_fails_the_check(monkeypatch):
    """Negative control: RoPE that ignores the cached frames (offset 0 for every forward) breaks equality."""
    from jensenkv.models.magi.adapter import MagiChunkwiseAdapter

    run = MagiChunkwiseAdapter._run

    def run_at_frame_zero(self, x, t, captions, dropped, window, start_frame, *args, **kwargs):
        return run(self, x, t, captions, dropped, window, 0, *args, **kwargs)

    monkeypatch.setattr(MagiChunkwiseAdapter, "_run", run_at_frame_zero)
    adapter, recorder = _run()
    monkeypatch.setattr(MagiChunkwiseAdapter, "_run", run)
    assert _worst_rel_err(adapter, recorder) > 1e-3


def test_same_seed_same_video_bit_for_bit():
    a, b = tiny_adapter(), tiny_adapter()
    va, vb = generate_video(a, PROMPT, seed=5).video, generate_video(b, PROMPT, seed=5).video
    assert torch.equal(va, vb)
    assert not torch.equal(va, generate_video(a, PROMPT, seed=6).video)
