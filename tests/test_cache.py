"""ChunkedKVCache: quantize once on commit, sinks and window, exact byte accounting, clear errors."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig

B, H, S, D = 1, 2, 16, 64
KEY_INT2 = QuantConfig(bits=2, group_size=32)
VALUE_NONE = QuantConfig(method="none")
# per chunk: INT2 keys (codes + fp16 step + uint8 zero per 32 channels), float32 values
KEY_BYTES = B * H * (S * D // 4 + S * (D // 32) * 3)
VALUE_BYTES = B * H * S * D * 4


def chunk(i: int, s: int = S) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, s, D) keys and values; chunk i's values are offset by i so chunks are recognisable."""
    gen = torch.Generator().manual_seed(i)
    return torch.randn(B, H, s, D, generator=gen), torch.randn(B, H, s, D, generator=gen) + 100 * i


def make_cache(**overrides) -> ChunkedKVCache:
    cfg = CacheConfig(**{"key": KEY_INT2, "value": VALUE_NONE, **overrides})
    return ChunkedKVCache(cfg, head_dim=D)


def chunk_ids(cache: ChunkedKVCache) -> list[int]:
    """Which commits the visible segments came from (read back from the values' offsets)."""
    return [round(float(seg.v.mean()) / 100) for seg in cache.segments()]


def held_tensor_bytes(obj, seen: set[int] | None = None) -> int:
    """Bytes of every tensor storage reachable from ``obj`` (attributes, lists, dicts), each storage once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if ("storage", storage.data_ptr()) in seen:
            return 0
        seen.add(("storage", storage.data_ptr()))
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(held_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(held_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return held_tensor_bytes(vars(obj), seen)
    return 0


def quantizer_state_bytes(cache: ChunkedKVCache) -> int:
    """The quantizers' own tensors (Hadamard signs, QVG warm-start centroids): not chunk storage."""
    seen: set = set()
    return held_tensor_bytes(cache.key_quantizer, seen) + held_tensor_bytes(cache.value_quantizer, seen)


@pytest.mark.parametrize("keep_reference", [False, True])
@pytest.mark.parametrize(
    "key",
    [KEY_INT2, QuantConfig(bits=4, granularity="channel", group_size=5, zero_dtype="float16"),
     QuantConfig(bits=2, rotation="hadamard"), QuantConfig(method="qvg", qvg_centroids=4, qvg_iters=1)],
)
def test_cache_holds_only_the_stored_form_after_attention(key, keep_reference):
    """After commits and attention calls the cache holds nbytes (+ the probes' reference copies) and nothing else."""
    from jensenkv.attention import cached_attention, reference_attention

    cache = make_cache(key=key, value=QuantConfig(bits=2, group_size=16), sink_chunks=1, keep_reference=keep_reference)
    for i in range(4):
        cache.commit(*chunk(i))
    (q, k), (_, v) = chunk(9), chunk(8)
    for correction in ("none", "taylor", "exact"):
        cached_attention(q, k, v, cache.segments(), correction=correction)
    reference_attention(q, k, v, cache.segments(), correction="taylor")  # builds the views' k, v, steps
    references = 4 * 2 * B * H * S * D * 4 if keep_reference else 0  # float32 copies of K and V
    assert held_tensor_bytes(cache) == cache.held_nbytes + references + quantizer_state_bytes(cache)
    assert cache.nbytes <= cache.held_nbytes <= 4 * cache.nbytes  # the layer buffers' doubling slack
    assert cache.key_quantizer.num_calls == 3 and cache.value_quantizer.num_calls == 3  # the sink is not quantized


def test_segments_are_fresh_views_of_the_stored_chunks():
    cache = make_cache()
    for i in range(3):
        cache.commit(*chunk(i))
    first, again = cache.segments(), cache.segments()
    assert all(a is not b and a.stored_k is b.stored_k for a, b in zip(first, again))
    assert torch.equal(first[0].k, again[0].k)  # same stored form, same reconstruction
    assert first[0].k is first[0].k  # a view keeps what it built while the caller holds it
    cache.commit(*chunk(3))
    assert cache.key_quantizer.num_calls == 4


def test_sinks_stay_full_precision_and_visible_window_slides():
    cache = make_cache(sink_chunks=1, window_chunks=2)
    inputs = [chunk(i) for i in range(5)]
    for k, v in inputs:
        cache.commit(k, v)
    assert chunk_ids(cache) == [0, 3, 4]
    assert cache.chunk_indices == [0, 3, 4]
    segs = cache.segments()
    assert segs[0].steps is None and torch.equal(segs[0].k, inputs[0][0])  # sink: exact keys
    assert all(seg.steps is not None for seg in segs[1:])
    assert cache.num_chunks == 3 and cache.num_tokens == 3 * S and cache.num_committed == 5
    assert cache.key_quantizer.num_calls == 4  # the sink was never quantized


def test_dropped_chunks_free_their_bytes():
    cache = make_cache(sink_chunks=1, window_chunks=2)
    sink_bytes = 2 * B * H * S * D * 4  # float32 keys and values
    for i in range(5):
        cache.commit(*chunk(i))
    assert cache.nbytes == sink_bytes + 2 * (KEY_BYTES + VALUE_BYTES)
    assert cache.bf16_nbytes == 2 * 2 * B * H * 3 * S * D


def test_nbytes_hand_count_without_window():
    cache = make_cache()
    assert cache.nbytes == 0 and cache.bf16_nbytes == 0
    for i in range(3):
        cache.commit(*chunk(i))
    assert cache.nbytes == 3 * (KEY_BYTES + VALUE_BYTES)
    assert cache.bf16_nbytes == 2 * 2 * B * H * 3 * S * D


def test_quantized_values_and_short_chunks():
    cache = make_cache(value=QuantConfig(bits=4, granularity="token"))
    cache.commit(*chunk(0))
    cache.commit(*chunk(1, s=5))  # a chunk may be shorter
    value_bytes = B * H * ((S + 5) * D // 2 + (S + 5) * 3)
    key_bytes = B * H * ((S + 5) * D // 4 + (S + 5) * (D // 32) * 3)
    assert cache.nbytes == key_bytes + value_bytes
    assert cache.num_tokens == S + 5
    assert [seg.k.shape[2] for seg in cache.segments()] == [S, 5]


def test_keep_reference_is_not_counted():
    plain, ref = make_cache(), make_cache(keep_reference=True)
    k, v = chunk(0)
    plain.commit(k, v)
    ref.commit(k, v)
    (seg,) = ref.segments()
    assert torch.equal(seg.k_ref, k) and torch.equal(seg.v_ref, v)
    assert ref.nbytes == plain.nbytes
    k.add_(1)  # the reference is a copy, not the caller's buffer
    assert not torch.equal(seg.k_ref, k)


def test_window_zero_keeps_only_sinks():
    cache = make_cache(sink_chunks=1, window_chunks=0)
    for i in range(3):
        cache.commit(*chunk(i))
    assert chunk_ids(cache) == [0]
    assert cache.key_quantizer.num_calls == 0


def test_clear_forgets_everything():
    cache = make_cache(key=QuantConfig(method="qvg", qvg_centroids=4, qvg_iters=1), sink_chunks=1)
    for i in range(3):
        cache.commit(*chunk(i))
    assert cache.key_quantizer.warm_centroids is not None
    cache.clear()
    assert cache.segments() == [] and cache.nbytes == 0 and cache.num_tokens == 0
    assert cache.key_quantizer.warm_centroids is None
    cache.commit(*chunk(7))
    assert cache.segments()[0].steps is None  # the first chunk after clear is a sink again


def test_config_from_mappings():
    cfg = CacheConfig.from_dict({"key": {"bits": 4}, "value": {"method": "none"}, "window_chunks": 3})
    assert cfg.key == QuantConfig(bits=4) and cfg.value.label == "bf16" and cfg.window_chunks == 3
    with pytest.raises(ValueError, match=r"cache\.windows"):
        CacheConfig.from_dict({"key": {}, "value": {}, "windows": 3})


def test_shape_errors_are_clear():
    cache = make_cache()
    k, v = chunk(0)
    with pytest.raises(ValueError, match=r"k shape .* and v shape .* must match"):
        cache.commit(k, v[:, :, :5])
    with pytest.raises(ValueError, match=r"head dim 32 .*head_dim=64"):
        cache.commit(k[..., :32], v[..., :32])
    with pytest.raises(ValueError, match=r"\(B, H, S, D\)"):
        cache.commit(k[0], v[0])
    cache.commit(k, v)
    with pytest.raises(ValueError, match=r"\(B, H\)=\(1, 1\) .*\(1, 2\)"):
        cache.commit(k[:, :1], v[:, :1])
    assert cache.num_committed == 1  # failed commits store nothing


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"sink_chunks": -1}, r"cache\.sink_chunks=-1"),
        ({"window_chunks": -2}, r"cache\.window_chunks=-2"),
        ({"key": QuantConfig(group_size=48)}, r"quant\.group_size=48 .*head_dim=64"),
        ({"key": "int2"}, r"cache\.key='int2'"),
    ],
)
def test_config_errors_are_clear(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_cache(**overrides)


def test_config_from_hydra_node():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"key": {"bits": 4, "granularity": "channel"}, "value": {"method": "none"}})
    cfg = CacheConfig.from_dict(node)
    # per-channel keys with the default uint8 integer zero: KIVI layout, not KIVI's min-aligned zero
    assert cfg.key.label == "kivi+integer" and cfg.key.bits == 4 and cfg.value.method == "none"


def test_one_segment_type_for_cache_views_and_hand_built_chunks():
    """A cache's view and a hand-built segment are one type with the same typed fields: stored forms always
    present, shapes and has_steps known without dequantizing, a hand-built tensor kept as given (its dtype too)."""
    from jensenkv.cache import GivenTensor, Segment
    from jensenkv.correction import GroupSteps

    cache = ChunkedKVCache(CacheConfig(key=QuantConfig(bits=2, group_size=8), value=QuantConfig(bits=2, group_size=8),
                                       sink_chunks=1), head_dim=16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        cache.commit(torch.randn(2, 3, 5, 16, generator=gen), torch.randn(2, 3, 5, 16, generator=gen))
    sink, quantized = cache.segments()
    assert type(sink) is type(quantized) is Segment
    assert (sink.has_steps, quantized.has_steps) == (False, True) and sink.steps is None
    assert quantized.k_shape == (2, 3, 5, 16) and "k" not in vars(quantized)  # the shape built nothing
    assert quantized.steps.step.shape[:3] == (2, 3, 5)

    k = torch.randn(2, 3, 4, 16, dtype=torch.float64, generator=gen)
    steps = GroupSteps(torch.rand(2, 3, 4, 2, dtype=torch.float64, generator=gen))
    built = Segment(k, k.flip(-1), steps)
    assert isinstance(built.stored_k, GivenTensor) and built.k is k and built.k.dtype == torch.float64
    assert built.has_steps and built.steps is steps and not Segment(k, k).has_steps
    video = built.video(1)
    assert torch.equal(video.k, k[1:2]) and torch.equal(video.steps.step, steps.step[1:2])
    wide = quantized.expanded(2)
    assert wide.k_shape == (2, 6, 5, 16) and torch.equal(wide.k[:, 1], quantized.k[:, 0])
    with pytest.raises(ValueError, match="steps is not allowed with stored keys"):
        Segment(quantized.stored_k, quantized.stored_v, steps)
