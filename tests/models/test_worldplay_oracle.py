"""The cached WorldPlay path equals ONE masked forward over [text; context; current] (the oracle), in outputs
and in every block's cached K/V of both branches, for both memory modes, several chunks, non-contiguous
(retrieval-like) memories and a batch of two prompts of different lengths; controls show the comparisons
can fail (a wrong RoPE start, the camera keys quantized with the RoPE keys, the correction on text keys)."""
from __future__ import annotations

import pytest
import torch
import worldplay_model_kit as kit

from jensenkv.cache import Segment
from jensenkv.models.worldplay.cache import WorldPlayCaches
from jensenkv.quant import QuantConfig, make_quantizer
from jensenkv.quant.steps import GroupSteps

TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return kit.tiny_model()


@pytest.mark.parametrize("memory,batch", [("rebuild", 1), ("append", 1), ("rebuild", 2), ("append", 2)])
def test_cached_path_equals_masked_forward(model, memory, batch):
    caches = kit.make_caches(model, memory=memory)
    driver = kit.Driver(model, caches, batch=batch)
    worst_v, worst_kv = 0.0, 0.0
    for i in range(driver.chunks):
        run = driver.run(i, oracle=True)
        worst_v = max(worst_v, kit.rel_err(run.v, run.ref))
        if not run.memory:
            assert caches.nbytes == sum(s.nbytes for s in caches.text)  # chunk 0: text only
            continue
        assert caches.frames == run.memory
        for layer in range(model.config.num_layers):
            held = kit.cached_kv(caches, layer)
            for name, got in held.items():
                want = torch.cat([torch.cat([driver.written[f][b][layer][name] for f in run.memory], 2)
                                  for b in range(batch)])
                worst_kv = max(worst_kv, kit.rel_err(got, want))
    assert worst_v <= TOL, worst_v
    assert worst_kv <= TOL, worst_kv


def test_retrieval_memory_is_renumbered(model):
    """A non-contiguous memory [0-3, 8-11] gives the same cache as the same latents stored as frames 0-7 (the
    RoPE positions are the memory order, not the frame indices), and differs from [0-7]'s own latents."""
    caches = kit.make_caches(model)
    driver = kit.Driver(model, caches)
    mem = [0, 1, 2, 3, 8, 9, 10, 11]
    x = driver.clean[:, :, mem]
    caches.write_memory(model, x, mem, driver.cam.frames(mem), kit.CONTEXT_T)
    a = kit.cached_kv(caches, 1)["k"]
    caches.write_memory(model, x, list(range(8)), driver.cam.frames(mem), kit.CONTEXT_T)
    b = kit.cached_kv(caches, 1)["k"]
    assert torch.equal(a, b)
    caches.write_memory(model, driver.clean[:, :, :8], list(range(8)), driver.cam.frames(range(8)), kit.CONTEXT_T)
    assert kit.rel_err(kit.cached_kv(caches, 1)["k"], b) > 1e-3


class WrongRopeStart(WorldPlayCaches):
    """Control: the current chunk's temporal RoPE starts one frame late."""

    @property
    def num_frames(self) -> int:
        return len(self.frames) + 1


def test_control_wrong_rope_start_is_caught(model):
    driver = kit.Driver(model, kit.make_caches(model, cls=WrongRopeStart))
    errors = [kit.rel_err(r.v, r.ref) for r in (driver.run(i, oracle=True) for i in range(3))]
    assert min(errors) > 1e-3, errors  # chunk 0 too: its positions 1..4 instead of 0..3


def test_text_keys_are_neither_quantized_nor_corrected(model):
    """Chunk 0 sees only text + itself: under INT2 keys with the correction on, its output is the full-precision
    one exactly; the control (text counted as cache: quantized and corrected) moves it by > 1e-3."""
    fp = kit.Driver(model, kit.make_caches(model)).run(0).v
    q = kit.Driver(model, kit.make_caches(model, kit.int2(), correction="taylor")).run(0).v
    assert torch.equal(q, fp)
    text_cached = kit.make_caches(model, kit.int2(), correction="taylor", text_as_cache=True)
    moved = kit.Driver(model, text_cached).run(0).v
    assert kit.rel_err(moved, fp) > 1e-3
    assert text_cached.text_caches[0].nbytes < text_cached.text[0].nbytes  # the text really went through INT2


def _token_int2() -> QuantConfig:
    return QuantConfig(method="rtn", bits=2, granularity="token")


class MergedCameraCache(WorldPlayCaches):
    """Control: RoPE and ProPE keys quantized together ([k | P^-1 k] on the channel axis, one step per token,
    as QuantVideoGen lays out its WorldPlay cache), then split for the two attentions."""

    def reset(self):
        super().reset()
        self.merged = [[] for _ in range(self.num_layers)]

    def store_group(self, layer, k, v, k_prope, v_prope):
        quantizer = make_quantizer(_token_int2(), 2 * self.head_dim)
        stored = quantizer.quantize(torch.cat([k, k_prope], -1).float())  # (B, H, S, 2D)
        both, step = stored.dequantize(), stored.group_steps().step  # step (B, H, S, 1): shared by both halves
        d = self.head_dim
        self.merged[layer].append({"rope": Segment(both[..., :d], v.float(), GroupSteps(step)),
                                   "prope": Segment(both[..., d:], v_prope.float(), GroupSteps(step))})

    def segments(self, layer, stream):
        return [group[stream] for group in self.merged[layer]]

    def write_memory(self, *args, **kwargs):
        self.merged = [[] for _ in range(self.num_layers)]  # rebuild: replaced every chunk
        super().write_memory(*args, **kwargs)


def test_branches_have_their_own_quantizer_steps(model):
    """Each stream's stored steps are those of quantizing that stream's keys alone (the oracle's keys, by a
    fresh quantizer); the control (one step per token over both streams) moves the output by > 1e-3."""
    from jensenkv.cache import CacheConfig

    cfg = CacheConfig(key=_token_int2(), value=QuantConfig(method="none"))
    caches = kit.make_caches(model, cfg, correction="taylor")
    driver = kit.Driver(model, caches)
    runs = [driver.run(i, oracle=True) for i in range(3)]
    for layer in range(model.config.num_layers):
        for stream, name in (("rope", "k"), ("prope", "k_prope")):
            want = torch.cat([driver.written[f][0][layer][name] for f in runs[-1].memory], 2)  # (1, H, n*T, D)
            own = make_quantizer(_token_int2(), model.config.head_dim)
            groups = [own.quantize(want[:, :, s:s + 4 * kit.H * kit.W]) for s in range(0, want.shape[2], 4 * kit.H * kit.W)]
            got = caches.segments(layer, stream)
            assert len(got) == len(groups)
            for g, w in zip(got, groups):
                assert torch.allclose(g.steps.step, w.group_steps().step, rtol=1e-3, atol=0)
    merged = kit.Driver(model, kit.make_caches(model, cfg, correction="taylor", cls=MergedCameraCache))
    moved = [merged.run(i).v for i in range(3)]
    assert torch.equal(moved[0], runs[0].v)  # chunk 0 has no memory: identical
    assert kit.rel_err(moved[2], runs[2].v) > 1e-3
