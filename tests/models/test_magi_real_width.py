"""The 4.5B preset's real widths (3072 hidden, 24 query / 8 KV heads x 128, 96 rotated channels, 4096-d
captions) run chunk-wise and match the full-sequence forward; one layer, a small latent, random weights."""
from __future__ import annotations

import pytest

from jensenkv.generation.loop import generate_video
from magi_testkit import PROMPT, Recorder, full_sequence_velocity, tiny_adapter


@pytest.mark.slow
def test_real_width_layer_chunkwise_equals_full_sequence():
    from jensenkv.models.magi.config import model_preset

    real = model_preset("4.5B")
    overrides = {k: getattr(real, k) for k in ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads",
                                               "head_dim", "in_channels", "out_channels", "caption_channels",
                                               "cond_hidden_ratio")}
    adapter = tiny_adapter(model_overrides={**overrides, "num_layers": 1, "caption_max_length": 64},
                           num_chunks=3, steps=2, kv_range=[1], latent_height=4, latent_width=4)
    assert adapter.model.config.rotary_dim == 96 and adapter.model.config.groups == 3
    recorder = Recorder()
    recorder.attach(adapter)
    generate_video(adapter, PROMPT, seed=0)
    cache = adapter.caches()[0]
    assert cache._batch_heads == (1, 8) and cache.num_chunks == 2
    for tick in recorder.ticks:
        ref = full_sequence_velocity(adapter, recorder, tick)
        assert ((tick.velocity - ref).norm() / ref.norm()).item() <= 1e-5
