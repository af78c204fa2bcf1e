"""WorldPlay's caches: what they store and when (quantization off / INT2, rebuild re-quantizes every chunk,
append keeps held codes), byte counts, CFG branches apart, probes of both streams, batch = videos alone,
bad input."""
from __future__ import annotations

import pytest
import torch
import worldplay_model_kit as kit

from jensenkv.cache import CacheConfig
from jensenkv.models.worldplay.cache import WorldPlayCaches
from jensenkv.quant import QuantConfig


@pytest.fixture(scope="module")
def model():
    return kit.tiny_model()


class Recording(WorldPlayCaches):
    """Records what each memory pass hands to the caches (the full-precision K/V before storing)."""

    def reset(self):
        super().reset()
        self.handed = {}

    def write_memory(self, *args, **kwargs):
        self.handed = {}
        super().write_memory(*args, **kwargs)

    def store_group(self, layer, k, v, k_prope, v_prope):
        self.handed.setdefault(layer, []).append((k.clone(), v.clone(), k_prope.clone(), v_prope.clone()))
        super().store_group(layer, k, v, k_prope, v_prope)


@pytest.mark.parametrize("store", ["float32", "bfloat16"])
def test_quantization_off_stores_full_precision_exactly(model, store):
    full = QuantConfig(method="none", store_dtype=store)
    caches = kit.make_caches(model, CacheConfig(key=full, value=full), cls=Recording)
    driver = kit.Driver(model, caches)
    dtype = getattr(torch, store)
    for i in range(4):
        driver.run(i)
        for layer, groups in caches.handed.items():
            rope, prope = caches.segments(layer, "rope"), caches.segments(layer, "prope")
            assert len(rope) == len(prope) == len(groups)
            for (k, v, kp, vp), r, p in zip(groups, rope, prope):
                for got, want in ((r.k, k), (r.v, v), (p.k, kp), (p.v, vp)):
                    assert torch.equal(got, want.to(dtype).float())


def test_int2_leaves_chunk0_and_moves_later_chunks(model):
    fp = kit.Driver(model, kit.make_caches(model))
    q = kit.Driver(model, kit.make_caches(model, kit.int2()))
    diffs = []
    for i in range(4):
        a, b = fp.run(i).v, q.run(i).v
        if i == 0:
            assert torch.equal(a, b)
        else:
            diffs.append(kit.rel_err(b, a))
    assert min(diffs) > 1e-4, diffs


def test_rebuild_quantizes_every_chunk_afresh(model):
    caches = kit.make_caches(model, kit.int2())
    driver = kit.Driver(model, caches)
    previous, calls = [], 0
    for i in range(1, 5):
        driver.run(i)  # memories of 4, 8, 8, 12 frames: 1, 2, 2, 3 commits
        segs = caches.segments(0, "rope")
        assert len(segs) == len(driver.memory(i)) // kit.CHUNK
        now = caches.rope[0].key_quantizer.num_calls
        assert now - calls == len(segs)  # each held group quantized in this chunk's pass
        calls = now
        assert not {id(s.stored_k) for s in segs} & set(previous)  # nothing survives from the last chunk
        previous = [id(s.stored_k) for s in segs]
    # frames 0-3 are re-quantized from a recomputed context: their codes change between chunks 1 and 2
    first = kit.Driver(model, kit.make_caches(model, kit.int2()))
    first.run(1)
    sink_1 = first.caches.segments(1, "rope")[0].k
    first.run(2)
    assert not torch.equal(first.caches.segments(1, "rope")[0].k, sink_1)


def test_append_keeps_held_codes_bit_for_bit(model):
    caches = kit.make_caches(model, kit.int2(), memory="append")
    driver = kit.Driver(model, caches)
    held: list[tuple[object, torch.Tensor, torch.Tensor]] = []
    for i in range(1, 5):
        driver.run(i)
        for layer in range(model.config.num_layers):
            for stream in ("rope", "prope"):
                segs = caches.segments(layer, stream)
                assert len(segs) == i  # one group per past chunk, only the newest written now
        segs = caches.segments(1, "prope")
        for (obj, k, v), seg in zip(held, segs):
            assert seg.stored_k is obj and torch.equal(seg.k, k) and torch.equal(seg.v, v)
        held.append((segs[-1].stored_k, segs[-1].k.clone(), segs[-1].v.clone()))
        assert caches.prope[1].key_quantizer.num_calls == i  # one quantizer call per chunk, ever


def test_bytes_count_both_streams_and_text(model):
    caches = kit.make_caches(model, kit.int2())
    driver = kit.Driver(model, caches)
    text_bytes = sum(s.nbytes for s in caches.text)
    cfg = model.config
    assert text_bytes == cfg.num_layers * 2 * 4 * cfg.num_heads * caches.text[0].kv[0][0].shape[2] * cfg.head_dim
    driver.run(2)  # 8 frames in memory
    tokens = 8 * kit.H * kit.W
    bf16_video = cfg.num_layers * 2 * 2 * 2 * cfg.num_heads * tokens * cfg.head_dim  # layers, streams, K+V, bytes
    assert sum(c.bf16_nbytes for c in caches.video_caches()) == bf16_video
    video = sum(c.nbytes for c in caches.video_caches())
    assert video < 0.75 * bf16_video  # INT2 keys (values stay full precision here)
    assert caches.nbytes == video + text_bytes
    assert len(caches.stores()) == 3 * cfg.num_layers


def test_cfg_branches_are_separate_caches(model):
    cond = kit.make_caches(model)
    alone = kit.Driver(model, kit.make_caches(model))
    driver = kit.Driver(model, cond)
    uncond = kit.Driver(model, kit.make_caches(model), text=kit.text_inputs(model, seed=9))
    for i in range(3):
        other = uncond.run(i).v
        v = driver.run(i).v
        assert torch.equal(v, alone.run(i).v)
        assert kit.rel_err(other, v) > 1e-3


def test_probes_record_both_streams(model):
    caches = kit.make_caches(model, kit.int2(), correction="taylor", attention={"probes": True})
    driver = kit.Driver(model, caches)
    driver.run(0)
    assert caches.probe_records == []  # no memory: nothing cached to probe
    driver.run(1)
    records = caches.probe_records
    assert {(r["layer"], r["stream"]) for r in records} == {(l, s) for l in range(model.config.num_layers)
                                                           for s in ("rope", "prope")}
    assert all(r["chunk"] == 1 and 0.0 < r["p_s"] < 1.0 and r["delta_p_s"] == r["delta_p_s"] for r in records)


def test_batch_rows_equal_videos_alone(model):
    """Two prompts of different lengths in one batch, INT2 keys: each video as it would be alone."""
    text = kit.text_inputs(model, batch=2, lengths=(5, 3))
    both = kit.Driver(model, kit.make_caches(model, kit.int2(), correction="taylor"), batch=2, text=text)
    outs = [both.run(i).v for i in range(3)]
    for b in range(2):
        own = slice(b, b + 1)
        alone_text = kit.TextInputs(text.text_states[own], text.text_mask[own], text.byt5_states[own],
                                    text.byt5_mask[own], text.vision_states[own])
        alone = kit.Driver(model, kit.make_caches(model, kit.int2(), correction="taylor"), batch=1, text=alone_text)
        alone.clean, alone.noisy = both.clean[own], both.noisy[own]
        alone.cam = kit.CameraInputs(both.cam.viewmats[own], both.cam.ks[own], both.cam.action[own])
        alone.t_cur = both.t_cur[own]
        for i in range(3):
            assert kit.rel_err(outs[i][own], alone.run(i).v) <= 1e-5


def test_bad_input_is_refused(model):
    caches = kit.make_caches(model)
    x = kit.latents(model, 1, 4, 0)
    cam = kit.camera(1, 4)
    with pytest.raises(ValueError, match="before set_text"):
        caches.write_memory(model, x, [0, 1, 2, 3], cam, 14.0)
    caches.set_text(model, kit.text_inputs(model))
    with pytest.raises(ValueError, match="strictly increasing"):
        caches.write_memory(model, x, [0, 2, 1, 3], cam, 14.0)
    with pytest.raises(ValueError, match="frames"):
        caches.write_memory(model, x, [0, 1, 2], cam.frames([0, 1, 2]), 14.0)
    append = kit.make_caches(model, memory="append")
    append.set_text(model, kit.text_inputs(model))
    with pytest.raises(ValueError, match="append"):
        append.write_memory(model, x, [0, 1, 2, 4], cam, 14.0)
    with pytest.raises(ValueError, match="memory='ring'"):
        kit.make_caches(model, memory="ring")
    with pytest.raises(ValueError, match="cache.window_chunks=2 is not allowed"):
        kit.make_caches(model, CacheConfig(key=QuantConfig(), value=QuantConfig(), window_chunks=2))


@pytest.mark.parametrize("memory", ["rebuild", "append"])
def test_sink_chunk_keeps_frames_0_to_3_full_precision(model, memory):
    cache = CacheConfig(key=QuantConfig(method="rtn", bits=2, group_size=16), value=QuantConfig(method="none"),
                        sink_chunks=1)
    caches = kit.make_caches(model, cache, memory=memory, cls=Recording)
    driver = kit.Driver(model, caches)
    for i in range(1, 5):
        driver.run(i)
        segs = caches.segments(1, "prope")
        assert caches.frames[:4] == [0, 1, 2, 3]
        assert segs[0].steps is None and all(s.steps is not None for s in segs[1:])
        if memory == "rebuild":  # recomputed this chunk: stored exactly as handed over
            assert torch.equal(segs[0].k, caches.handed[1][0][2])


@pytest.mark.parametrize("cache", [kit.full_precision(), kit.int2(), kit.int2("token"),
                                   CacheConfig(key=QuantConfig(method="rtn", bits=4), value=QuantConfig(method="rtn", bits=4))])
def test_memory_bytes_from_settings_equal_the_held_bytes(model, cache):
    from jensenkv.models.worldplay.cache import memory_bytes

    caches = kit.make_caches(model, cache)
    driver = kit.Driver(model, caches)
    cfg = model.config
    for i in (1, 3, 4):
        driver.run(i)
        want = memory_bytes(cfg.num_layers, cfg.num_heads, cfg.head_dim, cache, len(driver.memory(i)), kit.H * kit.W)
        assert want == {"stored": sum(c.nbytes for c in caches.video_caches()),
                        "bf16": sum(c.bf16_nbytes for c in caches.video_caches())}


@pytest.mark.parametrize("backend", ["reference", pytest.param("flex", marks=pytest.mark.slow),  # ~10 s on CPU
                                     pytest.param("triton", marks=pytest.mark.slow)])  # TRITON_INTERPRET=1: ~5 s
def test_backends_agree_with_the_fast_path(model, backend, monkeypatch):
    """The caches call the suite's backends by name: the float64 oracle, FlexAttention and the fused Triton
    kernel give the fast path's output under INT2 keys and values with the correction on (both caches)."""
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    both = QuantConfig(method="rtn", bits=2, group_size=16)  # triton reads packed K and V
    cache = CacheConfig(key=both, value=both)
    fast = kit.Driver(model, kit.make_caches(model, cache, correction="taylor"))
    other = kit.Driver(model, kit.make_caches(model, cache, correction="taylor", attention={"backend": backend}))
    for i in range(3):
        assert kit.rel_err(other.run(i).v, fast.run(i).v) <= 1e-5
