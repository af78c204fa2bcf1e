"""MAGI-1 with attention.backend=triton: the kernel reads the GQA caches' stored, unexpanded chunks and the
in-flight KV heads in place, and the video matches backend=reference (the kernel under TRITON_INTERPRET=1 on a CPU)."""
from __future__ import annotations

import pytest
import torch

from jensenkv.attention import backends
from jensenkv.attention.triton_kernel import triton_cached_attention
from jensenkv.cache import CacheConfig, Segment
from jensenkv.generation.loop import generate_video
from jensenkv.attention.config import AttentionConfig
from jensenkv.quant import QuantConfig
from magi_testkit import PROMPT, tiny_adapter


@pytest.fixture(autouse=True)
def interpret(monkeypatch) -> None:
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def int2_kv() -> CacheConfig:
    """INT2 keys and values and a full-precision sink chunk: the kernel's quantized and full-precision runs."""
    int2 = QuantConfig(method="rtn", bits=2, group_size=8)
    return CacheConfig(key=int2, value=int2, sink_chunks=1)


def latents(backend: str, correction: str) -> tuple[torch.Tensor, object]:
    adapter = tiny_adapter(cache=int2_kv(), attention=AttentionConfig(backend=backend, correction=correction),
                           num_chunks=4, steps=2, kv_range=None)  # every cached chunk visible
    return generate_video(adapter, PROMPT, seed=3).latents, adapter


def check_matches_reference(correction: str, monkeypatch) -> None:
    seen = []

    def spy(q, k_cur, v_cur, segments, **kwargs):
        seen.append((q.shape[1], k_cur.shape[1], [type(s) for s in segments], [s.k_shape[1] for s in segments]))
        return triton_cached_attention(q, k_cur, v_cur, segments, **kwargs)

    monkeypatch.setitem(backends.ATTENTION_BACKENDS, "triton", spy)
    actual, adapter = latents("triton", correction)
    expected, _ = latents("reference", correction)  # the float64 oracle on query-head-expanded segments
    cfg = adapter.model.config
    assert cfg.num_kv_heads < cfg.num_heads and all(c._batch_heads == (1, cfg.num_kv_heads) for c in adapter.caches())
    # the kernel got query heads against KV heads as stored: the cache's own views, never an expanded copy
    with_cache = [s for s in seen if s[2]]
    assert with_cache and all(h_q == cfg.num_heads and h_kv == cfg.num_kv_heads for h_q, h_kv, _, _ in seen)
    assert all(kinds == [Segment] * len(kinds) and set(heads) == {cfg.num_kv_heads}
               for _, _, kinds, heads in with_cache)
    assert any(len(kinds) >= 2 for _, _, kinds, _ in with_cache)  # the sink and a quantized chunk together
    err = ((actual - expected).norm() / expected.norm()).item()
    assert err <= 1e-4, err


def test_magi_tiny_with_the_triton_backend_matches_the_reference(monkeypatch) -> None:
    check_matches_reference("taylor", monkeypatch)


@pytest.mark.slow
def test_magi_tiny_with_the_triton_backend_matches_the_reference_exact(monkeypatch) -> None:
    check_matches_reference("exact", monkeypatch)
