"""attention.second_order reaches the kernels and the probes of the Wan/SkyReels and MAGI-1 attention processors."""
from __future__ import annotations

import pytest
import torch

from wan_testkit import WAN_FRAME
from jensenkv.attention import ATTENTION_BACKENDS, cached_attention, reference_attention
from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import generate_video
from jensenkv.attention.config import AttentionConfig
from magi_testkit import PROMPT, int2, tiny_adapter


@pytest.fixture
def recording(monkeypatch):
    """Backends "rec_cached" / "rec_reference": the built-in kernels, recording each call's keywords."""
    calls: list[dict] = []

    def wrap(inner):
        def kernel(q, k_cur, v_cur, segments, **kwargs):
            calls.append({"segments": len(segments), **kwargs})
            return inner(q, k_cur, v_cur, segments, **kwargs)
        return kernel

    monkeypatch.setitem(ATTENTION_BACKENDS, "rec_cached", wrap(cached_attention))
    monkeypatch.setitem(ATTENTION_BACKENDS, "rec_reference", wrap(reference_attention))
    return calls


def _wan_outputs(tiny_wan_adapter, int2_cache, attention: AttentionConfig) -> tuple[list[torch.Tensor], list]:
    adapter = tiny_wan_adapter(cache=int2_cache(), attention=attention,
                               generation=GenerationConfig(frames_per_chunk=2, steps=2))
    adapter.set_prompt("a red square", "")
    gen = torch.Generator().manual_seed(1)
    outs = []
    for c in range(3):
        noisy, clean = (torch.randn(1, WAN_FRAME[0], 2, *WAN_FRAME[1:], generator=gen) for _ in range(2))
        outs.append(adapter.denoise(noisy, 0.7, c, "cond", step=0))
        adapter.commit(clean, c, "cond")
    return outs, adapter.probes()


def test_wan_processor_passes_second_order_to_kernel_and_probes(tiny_wan_adapter, int2_cache, recording):
    first, first_probes = _wan_outputs(tiny_wan_adapter, int2_cache,
                                       AttentionConfig(backend="rec_cached", correction="taylor", probes=True))
    assert recording and all(call["second_order"] is False for call in recording)
    recording.clear()
    second, probes = _wan_outputs(tiny_wan_adapter, int2_cache, AttentionConfig(
        backend="rec_cached", correction="taylor", second_order=True, probes=True))
    assert recording and all(call["second_order"] is True for call in recording)
    oracle, _ = _wan_outputs(tiny_wan_adapter, int2_cache, AttentionConfig(
        backend="rec_reference", correction="taylor", second_order=True))
    assert torch.equal(second[0], first[0])  # nothing cached yet: nothing to correct
    for fast, slow, plain in zip(second[1:], oracle[1:], first[1:]):
        assert float((fast - slow).norm() / slow.norm()) <= 1e-4
        assert float((fast - plain).norm() / plain.norm()) > 1e-6
    # the probes see the second-order scores: less bias subtracted than first order, so more cached mass
    assert [p["layer"] for p in probes] == [p["layer"] for p in first_probes]
    assert all(s["bias_mean"] < f["bias_mean"] and s["p_s"] > f["p_s"] for s, f in zip(probes, first_probes))


def test_magi_attention_passes_second_order_to_kernel_and_probes(recording):
    runs = {}
    for second_order in (False, True):
        adapter = tiny_adapter(cache=int2(), attention=AttentionConfig(
            backend="rec_cached", correction="taylor", second_order=second_order, probes=True))
        runs[second_order] = generate_video(adapter, PROMPT, seed=0)
        cached_calls = [call for call in recording if call["segments"]]
        assert cached_calls and all(call["second_order"] is second_order for call in cached_calls)
        recording.clear()
    first, second = runs[False].probes[0], runs[True].probes[0]
    assert second["p_s_ref"] == first["p_s_ref"]  # the first probed call sees the same inputs in both runs
    assert second["bias_mean"] < first["bias_mean"] and second["p_s"] > first["p_s"]
