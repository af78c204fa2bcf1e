"""The fused Triton kernel against the oracle, on the CPU through TRITON_INTERPRET=1 (on the GPU when present).

Segments come from real caches (packed codes, steps, zero points), with ragged chunk and query
lengths that do not fill the 16-wide tiles.
"""
from __future__ import annotations


import pytest
import torch

from attention_testkit import GRID_REST, AllocationCounter, one_fast, pairwise_cover, relative_error
from jensenkv.attention import reference_attention
from jensenkv.attention.triton_kernel import triton_cached_attention
from jensenkv.cache import CacheConfig, Segment, ChunkedKVCache
from jensenkv.correction import GroupSteps
from jensenkv.quant import QuantConfig

D = 32
INT2 = QuantConfig(bits=2, group_size=8)  # token groups: G = 4 (unrolled bias)
CONFIGS = {
    "int2-g8": (INT2, INT2),
    "int4-g16": (QuantConfig(bits=4, group_size=16), QuantConfig(bits=4, group_size=16)),
    "int2-rotated": (QuantConfig(bits=2, group_size=8, rotation="hadamard"),) * 2,
    "kivi-int2": (QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
                  QuantConfig(bits=2, group_size=8, zero_dtype="float16")),  # G = D: bias as a tl.dot
    "kivi-int2-channel-values": (QuantConfig(bits=2, granularity="channel", group_size=5, zero_dtype="float16"),
                                 QuantConfig(bits=2, granularity="channel", group_size=3, zero_dtype="float16")),
    "int4-token-symmetric": (QuantConfig(bits=4, granularity="token", symmetric=True),) * 2,
    "int8-g2": (QuantConfig(bits=8, group_size=2),) * 2,  # G = 16: bias as a tl.dot
    "int2-fixed-point-zero": (QuantConfig(bits=2, group_size=8, zero_point="fixed_point", zero_dtype="int8"),) * 2,
    "int2-min-aligned-zero": (QuantConfig(bits=2, group_size=8, zero_point="min_aligned", zero_dtype="float16"),) * 2,
}


@pytest.fixture(autouse=True)
def triton_device(monkeypatch) -> str:
    """Interpret the kernel on the CPU unless a CUDA device is present."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return "cuda"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return "cpu"


def build(config: str, heads_kv: int = 2, sinks: int = 0, lengths=(20, 13, 7), seed: int = 0,
          key_scale: float = 1.0, device: str = "cpu") -> list:
    key, value = CONFIGS[config]
    cache = ChunkedKVCache(CacheConfig(key=key, value=value, sink_chunks=sinks), head_dim=D)
    gen = torch.Generator().manual_seed(seed)
    for n in lengths:
        k = torch.randn(1, heads_kv, n, D, generator=gen) * key_scale + 0.5  # (B, Hkv, S, D), offset groups
        cache.commit(k.to(device), torch.randn(1, heads_kv, n, D, generator=gen).to(device))
    return cache.segments()


# query scale per config: larger for finer steps, so that the bias is visible (INT8's is not, at any sane scale)
Q_SCALE = {"int4-g16": 6.0, "int4-token-symmetric": 6.0}


def inputs(heads_q: int, heads_kv: int, n_q: int = 10, n_cur: int = 10, seed: int = 1, device: str = "cpu",
           q_scale: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads_q, n_q, D, generator=gen) * q_scale  # (B, Hq, Q, D)
    k = torch.randn(1, heads_kv, n_cur, D, generator=gen)  # (B, Hkv, R, D)
    v = torch.randn(1, heads_kv, n_cur, D, generator=gen)
    return q.to(device), k.to(device), v.to(device)


def expand_heads(segments: list, group: int) -> list[Segment]:
    """The oracle's view of GQA: every KV head repeated for its query heads."""
    out = []
    for seg in segments:
        steps = None if seg.steps is None else GroupSteps(seg.steps.step.repeat_interleave(group, 1), seg.steps.rotation)
        out.append(Segment.from_tensors(k=seg.k.repeat_interleave(group, 1), v=seg.v.repeat_interleave(group, 1), steps=steps))
    return out


def oracle(q, k, v, segments, correction, strength=1.0):
    group = q.shape[1] // k.shape[1]
    return reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                               expand_heads(segments, group), correction, strength=strength)


CORRECTIONS = ("taylor", "exact", "none")  # in this order the cover gives "none" to layouts without a bias path


@pytest.mark.parametrize(("config", "correction"), pairwise_cover(list(CONFIGS), CORRECTIONS))
def test_triton_matches_oracle(config: str, correction: str, triton_device: str) -> None:
    segments = build(config, device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device, q_scale=Q_SCALE.get(config, 2.0))
    expected = oracle(q, k, v, segments, correction, strength=0.8)
    actual = triton_cached_attention(q, k, v, segments, correction, strength=0.8)
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    assert relative_error(actual, expected) <= 1e-3
    if correction != "none" and not config.startswith("int8"):  # dropping the bias could not pass
        assert relative_error(oracle(q, k, v, segments, "none"), expected) > 1e-2


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_triton_gqa_with_sinks_several_segments_and_ragged_tails(correction: str, triton_device: str) -> None:
    """4 query heads on 2 KV heads; a full-precision sink chunk; 4 cached chunks; 3 in-flight tokens."""
    segments = build("int2-g8", heads_kv=2, sinks=1, lengths=(9, 17, 20, 3, 11), seed=3, device=triton_device)
    assert segments[0].steps is None and len(segments) == 5
    q, k, v = inputs(4, 2, n_q=19, n_cur=3, seed=4, device=triton_device)
    expected = oracle(q, k, v, segments, correction)
    assert relative_error(triton_cached_attention(q, k, v, segments, correction), expected) <= 1e-3


def test_triton_exact_beyond_the_series_range(triton_device: str) -> None:
    """Wide keys give steps whose |x| exceeds SERIES_MAX_ARG: the kernel sums log(sinh x / x) per channel."""
    segments = build("int2-g8", lengths=(12, 5), key_scale=40.0, device=triton_device)
    q, k, v = inputs(2, 2, n_q=5, seed=6, device=triton_device)
    expected = oracle(q, k, v, segments, "exact")
    assert relative_error(triton_cached_attention(q, k, v, segments, "exact"), expected) <= 1e-3


def test_triton_merges_chunks_of_different_layouts(triton_device: str) -> None:
    segments = build("int2-g8", lengths=(12,), device=triton_device) + build("kivi-int2", lengths=(9, 4), seed=2,
                                                                            device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device)
    for correction in ("none", "taylor"):
        expected = oracle(q, k, v, segments, correction)
        assert relative_error(triton_cached_attention(q, k, v, segments, correction), expected) <= 1e-3


@pytest.mark.parametrize("config", ["kivi-int2", "kivi-int2-channel-values", "int2-g8"])
def test_triton_reads_any_list_of_stored_chunks(config: str, triton_device: str) -> None:
    """Chunks that are not one cache's in order: one left out, reversed, two caches' interleaved. Their steps
    are concatenated, and a per-channel (KIVI) layout's stat rows are read from each chunk's place in the
    concatenation, not from its rows in its own store (NaN or relative error ~1 before)."""
    ours = build(config, lengths=(9, 6, 5), device=triton_device)
    other = build(config, lengths=(7, 4), seed=5, device=triton_device)
    q, k, v = inputs(2, 2, n_q=5, n_cur=3, device=triton_device)
    lists = {"left out": [ours[0], ours[2]], "reversed": ours[::-1],
             "interleaved": [ours[0], other[0], ours[1], other[1]]}
    for name, segments in lists.items():
        expected = oracle(q, k, v, segments, "taylor")
        assert relative_error(triton_cached_attention(q, k, v, segments, "taylor"), expected) <= 1e-5, name


@pytest.mark.parametrize("operands", [None, "float16"])
def test_triton_bf16_queries_under_the_interpreter(operands, triton_device: str) -> None:
    """The interpreter's bf16 tl.dot multiplies bit patterns (|out| ~ 1e9 before): bf16 queries take float32
    operands there (or float16 ones, asked for), and match the oracle of the same bf16 inputs; bf16 operands
    asked for are refused in one line."""
    if triton_device != "cpu":
        pytest.skip("the interpreter's dots only (on a GPU: test_triton_bf16_tensor_core_path_on_a_gpu)")
    segments = build("int2-g8", lengths=(9, 6), sinks=1)
    q, k, v = (t.bfloat16() for t in inputs(2, 2, n_q=5, n_cur=3))
    expected = oracle(q, k, v, segments, "taylor")
    actual = triton_cached_attention(q, k, v, segments, "taylor", operands=operands)
    assert actual.dtype == torch.bfloat16 and relative_error(actual, expected) <= 1e-2
    with pytest.raises(ValueError, match=r"^operands='bfloat16' is not allowed under TRITON_INTERPRET=1[^\n]*$"):
        triton_cached_attention(q, k, v, segments, "taylor", operands="bfloat16")


def test_triton_without_cached_chunks_is_plain_attention(triton_device: str) -> None:
    q, k, v = inputs(2, 2, device=triton_device)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert relative_error(triton_cached_attention(q, k, v, [], "taylor"), expected) <= 1e-5


def test_triton_rejects_what_it_cannot_read(triton_device: str) -> None:
    q, k, v = inputs(2, 2, device=triton_device)
    with pytest.raises(ValueError, match=r"3 KV heads .* multiple of the KV heads"):
        triton_cached_attention(q, k[:, :1].expand(1, 3, -1, -1), v[:, :1].expand(1, 3, -1, -1), [], "none")
    qvg = QuantConfig(method="qvg", qvg_centroids=2, qvg_iters=1, group_size=8)
    cache = ChunkedKVCache(CacheConfig(key=qvg, value=qvg), head_dim=D)
    cache.commit(k, v)
    with pytest.raises(ValueError, match=r"segments\[0\].stored_k is QVGTensor.*backend=cached"):
        triton_cached_attention(q, k, v, cache.segments(), "taylor")
    dithered = QuantConfig(bits=2, group_size=8, dither="subtractive")
    cache = ChunkedKVCache(CacheConfig(key=dithered, value=dithered), head_dim=D)
    cache.commit(k, v)
    with pytest.raises(ValueError, match=r"stored_k is dithered.*backend=cached"):
        triton_cached_attention(q, k, v, cache.segments(), "taylor")
    (seg,) = build("int2-g8", lengths=(4,), device=triton_device)
    dense = Segment.from_tensors(k=seg.k, v=seg.v, steps=seg.steps)
    with pytest.raises(ValueError, match=r"segments\[0\] carries steps but no stored form"):
        triton_cached_attention(q, k, v, [dense], "taylor")
    with pytest.raises(ValueError, match=r"block_n=24 .*power of two"):
        triton_cached_attention(q, k, v, [], "none", block_n=24)


def test_triton_bias_only_on_cached_keys(triton_device: str) -> None:
    """Huge strength: the quantized chunks lose all mass; the current chunk keeps its own attention."""
    segments = build("int2-g8", lengths=(12, 5), device=triton_device)
    q, k, v = inputs(2, 2, device=triton_device)
    actual = triton_cached_attention(q, k, v, segments, "taylor", strength=1e4)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert relative_error(actual, expected) <= 1e-5


def test_triton_backend_in_the_processor_matches_cached(triton_device: str) -> None:
    """backend="triton" reaches the kernel through the adapter: same denoiser output as backend="cached"."""
    from diffusers import SkyReelsV2Transformer3DModel

    from jensenkv.generation.config import GenerationConfig
    from jensenkv.attention.config import AttentionConfig
    from jensenkv.models.wan import WanChunkwiseAdapter

    config = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4,
              "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 32, "num_layers": 1,
              "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
    int2 = QuantConfig(bits=2, group_size=8)
    outputs = {}
    for backend in ("cached", "triton"):
        torch.manual_seed(0)
        adapter = WanChunkwiseAdapter(SkyReelsV2Transformer3DModel(**config).to(triton_device),
                                   lambda prompts: torch.ones(len(prompts), 4, 16, device=triton_device),
                                   (4, 4, 8), GenerationConfig(frames_per_chunk=2, steps=2),
                                   CacheConfig(key=int2, value=int2),
                                   AttentionConfig(backend=backend, correction="taylor"))
        adapter.set_prompt("a red square", "")
        gen = torch.Generator().manual_seed(1)
        frames = [torch.randn(1, 4, 2, 4, 8, generator=gen).to(triton_device) for _ in range(3)]  # (1, C, F, H, W)
        outs = []
        for c, x in enumerate(frames):
            outs.append(adapter.denoise(x, 0.7, c, "cond"))
            adapter.commit(x, c, "cond")
        outputs[backend] = torch.cat([o.flatten() for o in outs])
    assert relative_error(outputs["triton"], outputs["cached"]) <= 1e-4


@pytest.mark.parametrize(("correction", "key_scale"), [("taylor", 1.0), pytest.param("exact", 1.0, marks=GRID_REST),
                                                      ("exact", 40.0)])  # exact at 1.0 folds like taylor
def test_triton_head_strengths_equal_a_loop_of_float_strengths(correction: str, key_scale: float,
                                                               triton_device: str) -> None:
    """A (Hq,) strength on 4 query heads over 2 KV heads: folded into the bias columns (taylor, series) or
    read per head in the kernel (exact beyond the series' range, key_scale 40)."""
    segments = build("int2-g8", lengths=(12, 5), key_scale=key_scale, device=triton_device)
    q, k, v = inputs(4, 2, n_q=7, seed=8, device=triton_device)
    strength = torch.tensor([0.8, -1.2, 0.0, 2.0], device=triton_device)  # (Hq,)
    actual = triton_cached_attention(q, k, v, segments, correction, strength=strength)
    for h, s in enumerate(strength.tolist()):
        alone = triton_cached_attention(q, k, v, segments, correction, strength=s)[:, h]
        assert relative_error(actual[:, h], alone) <= 1e-5, h
    assert relative_error(actual, oracle(q, k, v, segments, correction, strength=strength)) <= 1e-3
    with pytest.raises(ValueError, match=r"strength has shape \(2,\).*\(H,\) = \(4,\)"):
        triton_cached_attention(q, k, v, segments, correction, strength=strength[:2])  # KV heads, not query heads


# The shapes scaled down (head dim 128 kept, fewer heads and tokens, odd lengths): SkyReels-V2 (12 x 128
# heads: 2 here, INT2 g32, a BF16 sink and a 2-chunk window that has evicted a chunk), MAGI-1 (24q/8kv GQA: 6q/2kv,
# INT2 g32 with float8 steps, a kv-range limit of 2 chunks), WorldPlay (16 x 128: 4, INT4 g32, min-aligned
# zeros), INT8, and INT2 keys with BF16 values (cache.values=none). Keys carry one outlier channel per 32-channel
# group, where the queries are 0: the steps are wide while the scores stay moderate, so the bias moves the output
# by 5-50% (dropping it fails every case).
PAPER_D = 128
PAPER_CASES = {
    "skyreels-int2": dict(heads=(2, 2), quant=QuantConfig(bits=2, group_size=32, store_dtype="bfloat16"),
                          lengths=(37, 29, 21), sinks=1,
                          window=2, limit=None, amp=2.5),
    "magi-int2-fp8-gqa": dict(heads=(6, 2), quant=QuantConfig(bits=2, group_size=32, scale_dtype="float8_e4m3fn"),
                              lengths=(24, 24, 17), sinks=0, window=None, limit=2, amp=2.5),
    "worldplay-int4": dict(heads=(4, 4), quant=QuantConfig(bits=4, group_size=32, zero_point="min_aligned",
                                                           zero_dtype="float16"),
                           lengths=(33, 31), sinks=1, window=None, limit=None, amp=12.0),
    "int8": dict(heads=(2, 2), quant=QuantConfig(bits=8, group_size=32), lengths=(30, 19), sinks=0, window=None,
                 limit=None, amp=300.0),
    "values-none": dict(heads=(4, 2), quant=QuantConfig(bits=2, group_size=32), lengths=(19, 26, 11), sinks=1,
                        window=None, limit=None, amp=2.5, value=QuantConfig(method="none", store_dtype="bfloat16")),
}


def paper_case(name: str, device: str = "cpu", amp: float | None = None, batch: int = 1, seed: int = 0):
    """(q, k_cur, v_cur, segments) of a PAPER_CASES entry: 19 queries, 23 current tokens."""
    c = PAPER_CASES[name]
    heads_q, heads_kv = c["heads"]
    gen = torch.Generator().manual_seed(seed)
    cache = ChunkedKVCache(CacheConfig(key=c["quant"], value=c.get("value", c["quant"]), sink_chunks=c["sinks"],
                                       window_chunks=c["window"]), head_dim=PAPER_D)
    for n in c["lengths"]:
        k = torch.randn(batch, heads_kv, n, PAPER_D, generator=gen)  # (B, Hkv, S, D)
        k[..., ::32] = (amp or c["amp"]) * torch.randn(batch, heads_kv, n, PAPER_D // 32, generator=gen)
        cache.commit(k.to(device), torch.randn(batch, heads_kv, n, PAPER_D, generator=gen).to(device))
    segments = cache.segments()[-c["limit"]:] if c["limit"] else cache.segments()
    q = torch.randn(batch, heads_q, 19, PAPER_D, generator=gen) * 2.0  # (B, Hq, Q, D)
    q[..., ::32] = 0.0  # blind to the outlier channels
    k_cur, v_cur = (torch.randn(batch, heads_kv, 23, PAPER_D, generator=gen).to(device) for _ in range(2))
    return q.to(device), k_cur, v_cur, segments


@pytest.mark.parametrize(("case", "correction"), pairwise_cover(list(PAPER_CASES), CORRECTIONS))
def test_triton_matches_the_oracle_at_the_papers_shapes_scaled_down(case: str, correction: str,
                                                                    triton_device: str) -> None:
    q, k, v, segments = paper_case(case, triton_device)
    expected = oracle(q, k, v, segments, correction, strength=0.9)
    assert relative_error(triton_cached_attention(q, k, v, segments, correction, strength=0.9), expected) <= 1e-5
    if correction != "none":  # control: the bias is large enough that dropping it fails by far
        assert relative_error(oracle(q, k, v, segments, "none"), expected) > 1e-2


def test_triton_reads_a_batch_and_one_videos_rows_in_place(triton_device: str) -> None:
    """A cache of 2 videos: the batched call matches the oracle, and video 1's rows (views of the same
    buffers, ``Segment.video``) give that video's output alone."""
    q, k, v, segments = paper_case("magi-int2-fp8-gqa", triton_device, batch=2)
    batched = triton_cached_attention(q, k, v, segments, "taylor")
    assert relative_error(batched, oracle(q, k, v, segments, "taylor")) <= 1e-5
    own = [seg.video(1) for seg in segments]
    assert own[0].stored_k.packed.untyped_storage().data_ptr() == segments[0].stored_k.packed.untyped_storage().data_ptr()
    alone = triton_cached_attention(q[1:], k[1:], v[1:], own, "taylor")
    assert relative_error(alone, batched[1:]) <= 1e-6


def per_call_bytes(q, k, v, segments, correction: str) -> int:
    triton_cached_attention(q, k, v, segments, correction)  # warm: the per-device constants are made once
    with AllocationCounter() as counter:
        triton_cached_attention(q, k, v, segments, correction)
    return counter.bytes


@pytest.mark.parametrize("correction", one_fast(CORRECTIONS, "exact"))
def test_a_call_allocates_nothing_proportional_to_the_cache(correction: str, triton_device: str) -> None:
    """Bytes of tensors created per call, with 2 and with 6 cached chunks (a sink + INT2 chunks, a window
    selecting from the layer buffers): equal, and bounded by the queries' size. Control: the same chunks handed over
    not back to back (one in every other position of two caches) are concatenated, and the count sees it."""
    def cache_of(chunks: int, seed: int = 0) -> ChunkedKVCache:
        cache = ChunkedKVCache(CacheConfig(key=INT2, value=INT2, sink_chunks=1, window_chunks=6), head_dim=D)
        gen = torch.Generator().manual_seed(seed)
        for n in [4] + [24] * chunks:  # a small float32 sink, INT2 chunks
            cache.commit(torch.randn(1, 2, n, D, generator=gen), torch.randn(1, 2, n, D, generator=gen))
        return cache

    q, k, v = inputs(4, 2, n_q=8, n_cur=8)
    small, large = cache_of(2), cache_of(6)
    assert large.nbytes > 2 * small.nbytes and large.num_chunks == 7
    per_call = {name: per_call_bytes(q, k, v, cache.segments(), correction) for name, cache in
                (("small", small), ("large", large))}
    # what a call makes is the queries' (bias columns, outputs): independent of the cache
    assert per_call["small"] == per_call["large"] <= 32 * q.numel() * q.element_size()
    other = cache_of(2, seed=1)
    mixed = [seg for pair in zip(small.segments()[1:], other.segments()[1:]) for seg in pair]  # not back to back
    codes = sum(seg.stored_k.packed.numel() + seg.stored_v.packed.numel() for seg in mixed)
    assert per_call_bytes(q, k, v, mixed, correction) >= per_call["large"] + codes


@pytest.mark.parametrize("correction", one_fast(CORRECTIONS, "exact"))
def test_a_cached_call_reads_nothing_back_to_the_host(correction: str, host_reads, triton_device: str) -> None:
    """No .item / .tolist / bool / float / int of a tensor inside a call (each would be a device sync on a GPU):
    the exact bias picks series or elementwise per tile on the device, and its series length from the dtype."""
    segments = build("int2-g8", heads_kv=2, sinks=1, lengths=(9, 17, 20), seed=3, device=triton_device)
    q, k, v = inputs(4, 2, n_q=7, n_cur=5, device=triton_device)
    strength = torch.tensor([0.5, 1.0, 1.5, 2.0], device=triton_device)  # (Hq,)
    triton_cached_attention(q, k, v, segments, correction, strength=strength)
    host_reads.clear()  # count only the calls below
    triton_cached_attention(q, k, v, segments, correction)
    assert host_reads == []
    triton_cached_attention(q, k, v, segments, correction, strength=strength)
    # a CPU strength tensor is checked for finite values (no sync there); a device one is the caller's to check
    assert host_reads == (["__bool__"] if triton_device == "cpu" else [])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PAPER_CASES))
def test_triton_exact_with_tiles_beyond_the_series_range_at_the_papers_shapes(case: str, triton_device: str) -> None:
    """Outliers 2.4x wider: some tiles exceed the series' range and take log(sinh x / x) channel by channel,
    others stay on the series, chosen per tile on the device."""
    q, k, v, segments = paper_case(case, triton_device, amp=PAPER_CASES[case]["amp"] * 2.4)
    expected = oracle(q, k, v, segments, "exact", strength=0.9)
    assert relative_error(triton_cached_attention(q, k, v, segments, "exact", strength=0.9), expected) <= 1e-5
    assert relative_error(oracle(q, k, v, segments, "none"), expected) > 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
@pytest.mark.parametrize("case", list(PAPER_CASES))
def test_triton_bf16_tensor_core_path_on_a_gpu(case: str, correction: str) -> None:
    """BF16 queries and current chunk: the autotuned kernel with BF16 tensor-core dots against the float64
    oracle of the same inputs (BF16 rounding of the dequantized keys and the weights: 2e-2), and with float32
    operands (IEEE dots; the output is still rounded to BF16: 1e-2). The bias still matters at that tolerance (control)."""
    q, k, v, segments = paper_case(case, "cuda")
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    expected = oracle(q, k, v, segments, correction, strength=0.9)
    tuned = triton_cached_attention(q, k, v, segments, correction, strength=0.9)
    assert tuned.dtype == torch.bfloat16 and relative_error(tuned, expected) <= 2e-2
    exact_dots = triton_cached_attention(q, k, v, segments, correction, strength=0.9, operands="float32")
    assert relative_error(exact_dots, expected) <= 1e-2  # the output itself is rounded to BF16
    if correction != "none":
        assert relative_error(oracle(q, k, v, segments, "none"), expected) > 4e-2
