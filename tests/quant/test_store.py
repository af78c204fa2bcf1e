"""ChunkStore: chunks appended back to back into growing buffers, views that dequantize exactly as the chunk
did alone, release of the oldest chunk, re-laying on growth, and the held versus stored bytes."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.quant import QuantConfig, make_quantizer
from jensenkv.quant.store import ChunkStore, back_to_back
from jensenkv.quant.tensors import FullPrecisionTensor

D = 32
CONFIGS = {
    "int2-g8": QuantConfig(bits=2, group_size=8),
    "int4-fp8-steps": QuantConfig(bits=4, group_size=16, scale_dtype="float8_e4m3fn"),
    "int8-symmetric": QuantConfig(bits=8, group_size=32, symmetric=True),
    "kivi-channel": QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
}


def chunks(lengths, seed: int = 0, batch: int = 1, heads: int = 2) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, D, generator=gen) * 3 for n in lengths]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stored_chunks_dequantize_as_alone_through_growth_and_release(name: str) -> None:
    quantizer = make_quantizer(CONFIGS[name], D)
    lengths = (7, 13, 20, 3, 11, 17, 9)
    alone = [quantizer.quantize(x) for x in chunks(lengths)]
    expected = [t.dequantize() for t in alone]
    nbytes = [t.nbytes for t in alone]
    store = ChunkStore(ChunkStore.accepts(alone[0]))
    live = []
    for i, t in enumerate(alone):
        store.append(t)
        live.append(i)
        if i in (3, 5):  # a sliding window drops the oldest two
            for _ in range(2):
                store.release(alone[live.pop(0)])
        for j in live:  # every live chunk still reads its own values after each growth or re-lay
            assert torch.equal(alone[j].dequantize(), expected[j]), (i, j)
            assert alone[j].nbytes == nbytes[j]
    views = [alone[j].packed for j in live]
    assert all(v.ndim == 4 for v in views)
    joined = back_to_back(views, dim=2)  # consecutive live chunks are one strided view of the buffer
    assert joined is not None and joined.untyped_storage().data_ptr() == views[0].untyped_storage().data_ptr()
    assert joined.shape[2] == sum(lengths[j] for j in live)
    assert store.held_nbytes >= sum(nbytes[j] for j in live)
    with pytest.raises(ValueError, match=r"oldest live chunk"):
        store.release(alone[live[-1]])


def test_views_handed_out_before_a_re_lay_keep_their_values() -> None:
    quantizer = make_quantizer(CONFIGS["int2-g8"], D)
    store = ChunkStore(ChunkStore.accepts(quantizer.quantize(chunks((4,))[0])))
    first = quantizer.quantize(chunks((12,), seed=1)[0])
    store.append(first)
    old_view, values = first.packed, first.dequantize()
    for x in chunks((40, 40), seed=2):  # forces growth: the live chunks move to fresh buffers
        store.append(quantizer.quantize(x))
    assert first.packed.untyped_storage().data_ptr() != old_view.untyped_storage().data_ptr()
    assert torch.equal(first.dequantize(), values) and old_view.shape == first.packed.shape


def test_a_cache_holds_its_chunks_in_layer_buffers_and_counts_held_bytes() -> None:
    int2 = CONFIGS["int2-g8"]
    cache = ChunkedKVCache(CacheConfig(key=int2, value=int2, sink_chunks=1, window_chunks=2), head_dim=D)
    for k, v in zip(chunks((8, 16, 16, 16, 16)), chunks((8, 16, 16, 16, 16), seed=5)):
        cache.commit(k, v)
    segments = cache.segments()
    assert cache.chunk_indices == [0, 3, 4]
    assert isinstance(segments[0].stored_k, FullPrecisionTensor)  # the sink: its own buffer
    quantized = back_to_back([s.stored_k.packed for s in segments[1:]], dim=2)
    assert quantized is not None  # the window is one view
    assert cache.nbytes == sum(s.stored_k.nbytes + s.stored_v.nbytes for s in segments)
    assert cache.nbytes < cache.held_nbytes  # doubling slack, and the evicted chunks' place until a re-lay
    reserved = ChunkedKVCache(CacheConfig(key=int2, value=int2), head_dim=D)
    reserved.reserve(48)
    for k, v in zip(chunks((16, 16, 16)), chunks((16, 16, 16), seed=5)):
        reserved.commit(k, v)
    assert reserved.held_nbytes == reserved.nbytes  # sized up front: no slack
    with pytest.raises(ValueError, match=r"tokens=-1 is not allowed"):
        reserved.reserve(-1)


def test_a_chunk_of_another_layout_is_refused() -> None:
    store = ChunkStore(ChunkStore.accepts(make_quantizer(CONFIGS["int2-g8"], D).quantize(chunks((4,))[0])))
    other = make_quantizer(CONFIGS["int4-fp8-steps"], D).quantize(chunks((4,))[0])
    with pytest.raises(ValueError, match=r"cannot join a store"):
        store.append(other)
    qvg = make_quantizer(QuantConfig(method="qvg", qvg_centroids=2, qvg_iters=1, group_size=8), D)
    assert ChunkStore.accepts(qvg.quantize(chunks((4,))[0])) is None  # stays per chunk
