"""attn_implementation="jensenkv" and JensenKVCache against transformers' eager attention and the suite's oracle.

Tiny random Llama / Mistral / Qwen2 models (GQA, each with its own RoPE settings: Llama 3's frequency scaling) stand
in for the real ones: the code path is the one a 7B model takes. Each property is checked to fail on a planted bug.
"""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, \
    Qwen2Config, Qwen2ForCausalLM

from jensenkv.attention.backends import ATTENTION_BACKENDS
from jensenkv.attention.config import AttentionConfig
from jensenkv.attention.reference import reference_attention
from jensenkv.correction import group_bias
from jensenkv.llm import JensenKVCache, PrefixPolicy, QuantizedPrefixLayer, register
from jensenkv.llm.attention import jensenkv_attention
from jensenkv.quant import QuantConfig

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "mistral": (MistralForCausalLM, MistralConfig(**COMMON, sliding_window=None)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**COMMON)),
}
FULL = QuantConfig(method="none", store_dtype="float32")
INT2 = QuantConfig(bits=2, group_size=8)  # head_dim 16: two groups of 8 channels


def tiny(family: str):
    cls, config = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(config).eval()
    register()
    return model


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def window(model, length: int = 40) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def prefix_then_rest(model, ids: torch.Tensor, cache, prefix: int) -> torch.Tensor:
    """Logits (1, L, V) of a prefix forward, then the rest teacher-forced over the same cache."""
    model.set_attn_implementation("jensenkv")
    first = model(ids[:, :prefix], past_key_values=cache, use_cache=True).logits
    rest = model(ids[:, prefix:], past_key_values=cache, use_cache=True).logits
    return torch.cat([first, rest], dim=1)


@torch.no_grad()
def eager(model, ids: torch.Tensor) -> torch.Tensor:
    model.set_attn_implementation("eager")
    return model(ids).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_full_precision_cache_equals_eager_attention(family):
    """Over a whole window, prefix then continuation: a full-precision prefix (and no cache at all) gives eager's
    logits to 1e-5 relative, with any correction (nothing is quantized, so nothing is corrected)."""
    model = tiny(family)
    ids = window(model)
    expected = eager(model, ids)
    model.set_attn_implementation("jensenkv")
    with torch.no_grad():
        assert relative(model(ids).logits, expected) < 1e-5
    for correction in ("none", "taylor", "exact"):
        cache = JensenKVCache(model.config, FULL, AttentionConfig(correction=correction))
        got = prefix_then_rest(model, ids, cache, prefix=24)
        assert relative(got, expected) < 1e-5
        assert cache.layers[0].committed == 24 and cache.layers[0].keys.shape[2] == 16


def test_rope_positions_off_by_one_at_the_prefix_boundary_is_caught(monkeypatch):
    """Planted twice. (1) The continuation's RoPE positions start one late (its position ids): the equivalence to
    eager no longer holds. (2) The cache reports one token more than it holds: the causal mask transformers builds
    from that is off by one too, and the attention refuses it in one line."""
    model = tiny("llama")
    ids = window(model)
    expected = eager(model, ids)
    model.set_attn_implementation("jensenkv")
    cache = JensenKVCache(model.config, FULL)
    with torch.no_grad():
        first = model(ids[:, :24], past_key_values=cache).logits
        late = torch.arange(25, 41).unsqueeze(0)  # the continuation's positions should be 24 .. 39
        rest = model(ids[:, 24:], past_key_values=cache, position_ids=late).logits
    assert relative(torch.cat([first, rest], dim=1), expected) > 1e-3
    held = QuantizedPrefixLayer.get_seq_length
    monkeypatch.setattr(QuantizedPrefixLayer, "get_seq_length", lambda self: held(self) + 1)
    with pytest.raises(ValueError, match="attention_mask"):
        prefix_then_rest(model, ids, JensenKVCache(model.config, FULL), prefix=24)


def _layer_call(quant: QuantConfig, attention: AttentionConfig, recent: int = 6, seed: int = 0):
    """One layer's call: a cache holding a quantized prefix of 20 tokens (KV heads 2), queries of 4 heads over
    ``recent`` current tokens. Returns (cache, query (1, 4, R, 16), key, value (1, 2, R, 16) as returned)."""
    torch.manual_seed(seed)
    model = tiny("llama")
    cache = JensenKVCache(model.config, quant, attention)
    prefix = [(torch.randn(1, 2, 20, 16) * 2, torch.randn(1, 2, 20, 16)) for _ in range(2)]
    cache.prefill(prefix)
    key, value = cache.layers[0].update(torch.randn(1, 2, recent, 16) * 2, torch.randn(1, 2, recent, 16), 0)
    return cache, torch.randn(1, 4, recent, 16) * 2, key, value


class _Module:
    """What transformers hands the attention function: the layer's index (and GQA groups)."""

    layer_idx = 0


def oracle(cache, query, key, value, correction: str) -> torch.Tensor:
    """Written out here, independently of the suite's attention: float64 softmax over [dequantized prefix with the
    bias subtracted | current tokens, causally], heads expanded for GQA. -> (1, R, H, D)."""
    segments = cache.layers[0].segments()
    k_pre = torch.cat([s.k for s in segments], dim=2).double().repeat_interleave(2, dim=1)  # (1, 4, 20, 16)
    v_pre = torch.cat([s.v for s in segments], dim=2).double().repeat_interleave(2, dim=1)
    k_cur, v_cur = key.double().repeat_interleave(2, dim=1), value.double().repeat_interleave(2, dim=1)
    q = query.double()
    scores_pre = q @ k_pre.transpose(-1, -2) / 4.0  # (1, 4, R, 20)
    if correction != "none":
        for start, seg in zip((0,), segments):
            steps = type(seg.steps)(seg.steps.step.repeat_interleave(2, dim=1), seg.steps.rotation)
            scores_pre = scores_pre - group_bias(q, steps, correction, 0.25)
    scores_cur = q @ k_cur.transpose(-1, -2) / 4.0  # (1, 4, R, R)
    scores_cur = scores_cur.masked_fill(torch.ones_like(scores_cur, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(torch.cat([scores_pre, scores_cur], dim=-1), dim=-1)
    return (probs @ torch.cat([v_pre, v_cur], dim=2)).transpose(1, 2)


@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
@pytest.mark.parametrize("backend", ["cached", "reference"])
def test_quantized_prefix_equals_the_oracle_on_the_same_stored_segments(backend, correction):
    cache, query, key, value = _layer_call(INT2, AttentionConfig(backend=backend, correction=correction))
    got, _ = jensenkv_attention(_Module(), query, key, value, None, scaling=0.25)
    assert relative(got.double(), oracle(cache, query, key, value, correction)) < 1e-6


@pytest.mark.parametrize("correction,second_order", [("none", False), ("taylor", False), ("exact", False),
                                                     ("taylor", True)])
def test_cached_backend_equals_the_reference_backend(correction, second_order):
    """The fast CPU path against the suite's float64 oracle on the very same stored segments: 1e-6."""
    outs = {}
    for backend in ("cached", "reference"):
        cache, query, key, value = _layer_call(INT2, AttentionConfig(backend=backend, correction=correction,
                                                                     second_order=second_order))
        outs[backend] = jensenkv_attention(_Module(), query, key, value, None, scaling=0.25)[0]
    assert relative(outs["cached"], outs["reference"]) < 1e-6


def test_bias_on_the_recent_tokens_is_caught(monkeypatch):
    """Planted: a backend that also subtracts the bias from the current (full-precision) tokens' scores. The
    oracle check above fails on it."""
    def biased_everywhere(q, k_cur, v_cur, segments, correction="none", scale=None, strength=1.0,
                          second_order=False, causal=False):
        steps = segments[0].steps
        mean_step = steps.step.mean(dim=2, keepdim=True).expand(-1, -1, k_cur.shape[2], -1)  # (B, H, R, G)
        bias = group_bias(q, type(steps)(mean_step, steps.rotation), correction, scale)  # (B, H, Q, R)
        shifted = [type(s)(s.k, s.v, s.steps) for s in segments]
        out = reference_attention(q, k_cur, v_cur, shifted, correction, scale, strength, causal=causal)
        # redo the current block's scores with the bias: the attention over [prefix | current - bias]
        keys = torch.cat([s.k for s in segments] + [k_cur], dim=2).double()
        values = torch.cat([s.v for s in segments] + [v_cur], dim=2).double()
        scores = scale * q.double() @ keys.transpose(-1, -2)
        n = sum(s.k.shape[2] for s in segments)
        for seg, start in zip(segments, [0]):
            scores[..., :n] -= group_bias(q, seg.steps, correction, scale).double()
        scores[..., n:] -= bias.double()
        scores[..., n:] = scores[..., n:].masked_fill(torch.ones_like(scores[..., n:], dtype=torch.bool).triu(1),
                                                      float("-inf"))
        return (torch.softmax(scores, -1) @ values).to(out.dtype)

    monkeypatch.setitem(ATTENTION_BACKENDS, "planted", biased_everywhere)
    cache, query, key, value = _layer_call(INT2, AttentionConfig(backend="planted", correction="taylor"))
    got, _ = jensenkv_attention(_Module(), query, key, value, None, scaling=0.25)
    assert relative(got.double(), oracle(cache, query, key, value, "taylor")) > 1e-3


def test_generate_runs_over_the_quantized_cache():
    """model.generate with the cache: greedy tokens equal DynamicCache's with a full-precision prefix; with INT2
    and Taylor it runs, commits tokens as its policy says (a residual of 8, chunks of 8) and never re-quantizes."""
    model = tiny("qwen2")
    ids = window(model, 20)
    model.set_attn_implementation("eager")
    expected = model.generate(ids, past_key_values=DynamicCache(config=model.config), max_new_tokens=12,
                              do_sample=False)
    model.set_attn_implementation("jensenkv")
    policy = PrefixPolicy(residual_tokens=8, commit_tokens=8)
    got = model.generate(ids, past_key_values=JensenKVCache(model.config, FULL, policy=policy), max_new_tokens=12,
                         do_sample=False)
    assert torch.equal(got, expected)
    cache = JensenKVCache(model.config, INT2, AttentionConfig(correction="taylor"), policy=policy)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=12, do_sample=False)
    assert out.shape == (1, 32)
    layer = cache.layers[0]
    assert layer.committed == 16 and layer.store.num_chunks == 2 and layer.keys.shape[2] == 15
    assert layer.store.key_quantizer.num_calls == 2  # each committed chunk quantized once


def test_a_padded_batch_is_refused_in_one_line():
    model = tiny("llama")
    model.set_attn_implementation("jensenkv")
    ids = window(model, 10).repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="takes no padding"):
        model(ids, attention_mask=mask, past_key_values=JensenKVCache(model.config, INT2))


def test_the_prefix_cache_holds_what_it_stores():
    """Read from the buffers it holds: no growth slack after a prefill, and exactly the packed INT2 bytes of its
    settings (2 layers x K and V x 2 KV heads x 20 tokens x 16 channels)."""
    from jensenkv.quant import bits_per_element

    cache, *_ = _layer_call(INT2, AttentionConfig())
    cache.drop_tail()
    stats = cache.stats()
    assert stats.held == stats.stored
    assert stats.stored * 8 == bits_per_element(cache.cache_config.key, 16, 20) * 2 * 2 * 2 * 20 * 16
    assert stats.bf16 == 2 * 2 * 2 * 2 * 20 * 16 and stats.tail == 0
