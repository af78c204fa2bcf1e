"""Chunk-wise driving of diffusers' SkyReels-V2 / Wan transformers (and the plain-torch SkyReelsV2DiT) over a
(quantized) KV cache.

Tiny random-init models at diffusers' own test sizes (conftest: patch (1, 2, 2), 2 heads x head dim 12), so
no weights are needed; group size 4 divides the head dim.
"""
from __future__ import annotations

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel
from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2AttnProcessor

from wan_testkit import WAN_FRAME as FRAME, WAN_TEST_CONFIG as TEST_CONFIG, encode_prompt
from jensenkv.cache import CacheConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan import (
    CachedSelfAttnProcessor,
    SkyReelsV2DiT,
    WanChunkwiseAdapter,
    block_causal_mask,
    installed_rope_offset,
    limit_kv_range,
)
from jensenkv.quant import QuantConfig

FPC = 2  # frames per chunk
CLASSES = [SkyReelsV2Transformer3DModel, WanTransformer3DModel, SkyReelsV2DiT]


@pytest.fixture
def make_adapter(tiny_wan_adapter):
    """Factory: a tiny adapter (2 frames per chunk, 2 steps) with the prompt "a red square" set."""
    def make(cls=SkyReelsV2Transformer3DModel, cache: CacheConfig | None = None,
             attention: AttentionConfig | None = None, seed: int = 0) -> WanChunkwiseAdapter:
        adapter = tiny_wan_adapter(cls, cache, attention, GenerationConfig(frames_per_chunk=FPC, steps=2), seed)
        adapter.set_prompt("a red square", "")
        return adapter

    return make


def chunks(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, *FRAME[:1], FPC, *FRAME[1:], generator=gen) for _ in range(n)]  # (1, C, F, H, W)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def run_chunks(adapter: WanChunkwiseAdapter, n: int = 3, t: float = 0.7, branch: str = "cond",
               kv_range: int | None = None) -> list[torch.Tensor]:
    """Denoise output of each chunk at time t over the cache, committing fixed clean chunks in between."""
    clean, noisy = chunks(n, 1), chunks(n, 2)
    outs = []
    for c in range(n):
        outs.append(adapter.denoise(noisy[c], t, c, branch, kv_range=kv_range))
        adapter.commit(clean[c], c, branch, kv_range=kv_range)
    return outs


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("branch", ["cond", "uncond"])
def test_chunked_matches_block_causal_full_forward(cls, branch, make_adapter):
    """(a) Unquantized cache: every chunk's output equals one full block-causal forward to 1e-4."""
    adapter = make_adapter(cls)
    n, t = 3, 0.6
    clean, noisy = chunks(n, 1), chunks(n, 2)
    for c in range(n):
        out = adapter.denoise(noisy[c], t, c, branch)
        full = torch.cat([*clean[:c], noisy[c]], dim=2)  # (1, C, (c+1)*FPC, H, W)
        t_frames = torch.zeros(1, full.shape[2])
        t_frames[:, -FPC:] = t
        ref = adapter.forward_full(full, t_frames, branch)[:, :, -FPC:]
        assert rel_err(out, ref) < 1e-4, f"chunk {c}"
        adapter.commit(clean[c], c, branch)
    assert all(cache.num_committed == n for cache in adapter.caches(branch))


def test_full_forward_is_block_causal(make_adapter):
    """The reference mode really masks: later chunks do not change earlier chunks' outputs."""
    adapter = make_adapter()
    a, b = chunks(2, 3), chunks(2, 4)
    t = torch.full((1, 2 * FPC), 0.5)
    out_a = adapter.forward_full(torch.cat(a, 2), t)
    out_b = adapter.forward_full(torch.cat([a[0], b[1]], 2), t)
    assert torch.allclose(out_a[:, :, :FPC], out_b[:, :, :FPC], atol=1e-6)
    assert not torch.allclose(out_a[:, :, FPC:], out_b[:, :, FPC:], atol=1e-3)
    mask = block_causal_mask(6, frames_per_chunk=1, tokens_per_frame=2, device=torch.device("cpu"))
    assert mask.tolist()[2] == [True, True, True, True, False, False]


def test_rope_hook_shifts_positions_by_start_frame(make_adapter):
    """RoPE of a chunk starting at frame s equals the tail of RoPE over s + F frames."""
    adapter = make_adapter()
    rope = adapter.transformer.rope
    x = torch.zeros(1, *FRAME[:1], FPC, *FRAME[1:])
    adapter.state.start_frame = 0
    cos_long, sin_long = rope(torch.zeros(1, FRAME[0], 3 * FPC, *FRAME[1:]))  # (1, S, 1, D)
    adapter.state.start_frame = 2 * FPC
    cos, sin = rope(x)
    tokens = FPC * 64
    assert torch.equal(cos, cos_long[:, -tokens:]) and torch.equal(sin, sin_long[:, -tokens:])
    assert not torch.equal(cos, cos_long[:, :tokens])
    adapter.state.start_frame = TEST_CONFIG["rope_max_seq_len"]
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        rope(x)
    assert installed_rope_offset(rope)
    adapter.remove()
    assert not installed_rope_offset(rope)
    assert rope(x)[0].shape[1] == tokens  # the stock RoPE again: frames from 0


def test_processors_on_self_attention_only_and_removable(make_adapter):
    adapter = make_adapter()
    procs = adapter.transformer.attn_processors
    assert {n for n, p in procs.items() if isinstance(p, CachedSelfAttnProcessor)} == {
        "blocks.0.attn1.processor", "blocks.1.attn1.processor"}
    assert all(isinstance(p, SkyReelsV2AttnProcessor) for n, p in procs.items() if ".attn2." in n)
    assert [p.layer_index for p in adapter.processors] == [0, 1]
    # The stock model with block-causal mask agrees with our reference mode after removal.
    noisy = torch.cat(chunks(2, 5), 2)
    t = torch.full((1, 2 * FPC), 0.4)
    ours = adapter.forward_full(noisy, t)
    adapter.remove()
    assert not any(isinstance(p, CachedSelfAttnProcessor) for p in adapter.transformer.attn_processors.values())
    adapter.transformer.register_to_config(num_frame_per_block=FPC)  # stock SkyReels builds the mask itself
    with torch.no_grad():
        stock = adapter.transformer(hidden_states=noisy, timestep=t * 1000, enable_diffusion_forcing=True,
                                    encoder_hidden_states=encode_prompt(["a red square"]), return_dict=False)[0]
    assert rel_err(ours, stock) < 1e-5


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_int2_cache_moves_the_output(cls, make_adapter, int2_cache):
    """(b) INT2 keys/values: the first chunk (empty cache) is unchanged, later chunks move."""
    exact = run_chunks(make_adapter(cls))
    int2 = run_chunks(make_adapter(cls, int2_cache()))
    assert torch.equal(exact[0], int2[0])
    assert all(rel_err(q, e) > 1e-3 for q, e in zip(int2[1:], exact[1:]))


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_correction_touches_cached_scores_only(correction, make_adapter, int2_cache):
    """(c) Correction changes nothing without cached keys in view, and something with them."""
    plain = make_adapter(cache=int2_cache())
    fixed = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction=correction))
    out_plain, out_fixed = run_chunks(plain), run_chunks(fixed)
    assert torch.equal(out_plain[0], out_fixed[0])  # first chunk: empty cache
    assert all(rel_err(f, p) > 1e-5 for f, p in zip(out_fixed[1:], out_plain[1:]))
    # Cache full, but nothing of it visible (kv_range=0): only current-chunk attention -> identical.
    noisy = chunks(1, 9)[0]
    a = plain.denoise(noisy, 0.5, 3, kv_range=0)
    b = fixed.denoise(noisy, 0.5, 3, kv_range=0)
    assert torch.equal(a, b)
    # Strength 0 is the uncorrected path.
    fixed.configure(attention=AttentionConfig(correction=correction, strength=0.0))
    assert torch.allclose(run_chunks(fixed)[2], out_plain[2], atol=1e-5)


def test_kv_range_is_honoured(make_adapter, int2_cache):
    """(f) kv_range=0 equals attending to an empty cache; kv_range=1 everywhere equals a one-chunk window."""
    adapter = make_adapter(cache=int2_cache())
    run_chunks(adapter, n=3)
    noisy = chunks(1, 7)[0]
    fresh = make_adapter(cache=int2_cache())
    assert torch.equal(adapter.denoise(noisy, 0.5, 3, kv_range=0), fresh.denoise(noisy, 0.5, 3))
    limited = make_adapter(cache=int2_cache())
    run_chunks(limited, n=3, kv_range=1)  # denoise and commit passes limited to the last cached chunk
    windowed = make_adapter(cache=int2_cache(window_chunks=1))
    run_chunks(windowed, n=3)
    out = limited.denoise(noisy, 0.5, 3, kv_range=1)
    assert torch.allclose(out, windowed.denoise(noisy, 0.5, 3), atol=1e-6)
    assert rel_err(out, adapter.denoise(noisy, 0.5, 3)) > 1e-4  # the limit changed something
    with pytest.raises(ValueError, match="kv_range"):
        adapter.denoise(noisy, 0.5, 3, kv_range=-1)


def test_cfg_branches_have_separate_caches(make_adapter):
    adapter = make_adapter()
    run_chunks(adapter, n=2, branch="cond")
    assert [c.num_committed for c in adapter.caches("cond")] == [2, 2]
    assert [c.num_committed for c in adapter.caches("uncond")] == [0, 0]
    with pytest.raises(ValueError, match="branch"):
        adapter.denoise(chunks(1, 0)[0], 0.5, 0, "other")


def test_probes_recorded_per_layer_and_step(make_adapter, int2_cache):
    adapter = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor", probes=True))
    clean, noisy = chunks(2, 1), chunks(2, 2)
    for c in range(2):
        for step in range(2):
            adapter.denoise(noisy[c], 0.8 - 0.3 * step, c, "cond", step=step)
        adapter.commit(clean[c], c, "cond")
    probes = adapter.probes()
    # chunk 0 has no cache to probe; chunk 1: 2 layers x 2 steps
    assert [(p["layer"], p["step"], p["chunk"], p["branch"]) for p in probes] == [
        (0, 0, 1, "cond"), (1, 0, 1, "cond"), (0, 1, 1, "cond"), (1, 1, 1, "cond")]
    assert all(0.0 < p["p_s"] < 1.0 and abs(p["p_s"] + p["p_r"] - 1) < 1e-6 for p in probes)
    adapter.configure(attention=AttentionConfig(probes=True, probe_layers=(1,)))
    run_chunks(adapter, n=2)
    assert {p["layer"] for p in adapter.probes()} == {1}
    adapter.configure(attention=AttentionConfig(probes=True, probe_layers=[0], probe_steps=[1]))
    for c in range(2):
        for step in range(2):
            adapter.denoise(noisy[c], 0.8 - 0.3 * step, c, "cond", step=step)
        adapter.commit(clean[c], c, "cond")
    assert [(p["layer"], p["step"]) for p in adapter.probes()] == [(0, 1)]
    assert "em_slope" not in adapter.probes()[0]
    adapter.configure(attention=AttentionConfig(probes=True, diagnostics=True))
    for c in range(2):
        adapter.denoise(noisy[c], 0.8, c, "cond", step=0)
        adapter.commit(clean[c], c, "cond")
    probe = adapter.probes()[0]
    assert 0 < probe["em_var_ratio"] < 2 and probe["em_n_eff"] >= 1
    assert probe["em_log_zs_shift"] == pytest.approx(probe["em_first_order"] + probe["em_jensen"])
    assert make_adapter().probes() is None


def test_commits_must_come_in_order_and_settings_are_checked(make_adapter):
    adapter = make_adapter()
    with pytest.raises(ValueError, match="chunk_index=1"):
        adapter.commit(chunks(1, 0)[0], 1, "cond")
    with pytest.raises(ValueError, match="backend"):
        make_adapter(attention=AttentionConfig(backend="no_such_kernel"))
    with pytest.raises(ValueError, match="correction"):
        make_adapter(attention=AttentionConfig(correction="linear"))
    with pytest.raises(ValueError, match="group_size|head_dim"):
        make_adapter(cache=CacheConfig(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(method="none")))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_attention_backends_agree(backend, make_adapter, int2_cache):
    """The config switch reaches the suite's other attention paths (flex runs eagerly on CPU)."""
    fast = run_chunks(make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor")))
    other = run_chunks(make_adapter(cache=int2_cache(), attention=AttentionConfig(backend=backend,
                                                                                     correction="taylor")))
    assert all(rel_err(f, r) < 1e-4 for f, r in zip(fast, other))


# --- kv_range limits above what the cache shows --------------------------------------------------------------

@pytest.mark.parametrize("visible, limit", [(2, 3), (3, 4), (3, 5), (1, 2), (3, 3)])
def test_a_limit_above_the_visible_count_shows_every_cached_chunk(visible, limit):
    segments = [object() for _ in range(visible)]
    assert limit_kv_range(segments, limit) == segments
    assert limit_kv_range(segments, visible - 1) == segments[1:]
    assert limit_kv_range(segments, 0) == [] and limit_kv_range(segments, None) == segments


@pytest.mark.parametrize("cached, limit", [(2, 3), (3, 4), (3, 5)])
def test_denoise_with_a_limit_above_the_cache_equals_no_limit(cached, limit, make_adapter, int2_cache,
                                                              attention_spy):
    """2 or 3 cached chunks and kv_range 3..5: every cached chunk is in view, as with no limit at all."""
    adapter = make_adapter(cache=int2_cache(), attention=AttentionConfig(backend="spy"))
    run_chunks(adapter, n=cached)
    noisy = chunks(1, 7)[0]
    attention_spy.calls.clear()
    limited = adapter.denoise(noisy, 0.5, cached, kv_range=limit)
    assert [len(call[3]) for call in attention_spy.calls] == [cached, cached]  # per layer
    assert torch.equal(limited, adapter.denoise(noisy, 0.5, cached))


def test_a_temporal_patch_is_refused_at_construction(tiny_wan_model):
    model = tiny_wan_model(patch_size=(2, 2, 2))
    with pytest.raises(ValueError, match=r"patch_size=\(2, 2, 2\) is not allowed.*temporal patch size must be 1"):
        WanChunkwiseAdapter(model, encode_prompt, FRAME, GenerationConfig(frames_per_chunk=FPC, steps=2),
                         CacheConfig(key=QuantConfig(method="none"), value=QuantConfig(method="none")))


class BandMaskedStockProcessor:
    """diffusers' own attention processor, fed the oracle's (1, 1, S, S) mask instead of the model's."""

    def __init__(self, stock, holder: dict):
        self.stock, self.holder = stock, holder

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None,
                 **kwargs):
        return self.stock(attn, hidden_states, encoder_hidden_states, self.holder["mask"], rotary_emb, **kwargs)


def band_mask(limits: list[int | None], tokens_per_chunk: int) -> torch.Tensor:
    """(1, 1, S, S) bool: chunk i sees chunk j iff j <= i and i - j <= limits[i] (None: no limit)."""
    n = len(limits)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    limit = torch.tensor([n if x is None else x for x in limits])[:, None]  # (n, 1)
    chunk_mask = (j <= i) & (i - j <= limit)  # (n, n)
    return chunk_mask.repeat_interleave(tokens_per_chunk, 0).repeat_interleave(tokens_per_chunk, 1)[None, None]


def stock_oracle_latents(model: torch.nn.Module, prompt: str, seed: int, cfg: GenerationConfig,
                         fps: int | None = None) -> torch.Tensor:
    """Generation by definition, with no cache and no processor of ours: each tick is one forward of the stock
    diffusers model over [committed clean chunks at t = 0, in-flight chunks at their own t], its self-attention
    masked so that every chunk sees the chunks its limit allows (commit_kv_range for committed chunks, the
    stage's kv_range for in-flight ones, counted back from itself). Euler, no CFG. (1, C, F_total, H, W).
    fps: for inject_sample_info models, passed as diffusers' SkyReels-V2 DF pipeline passes it for one video."""
    from jensenkv.generation.loop import flow_sigmas

    holder: dict = {}
    model.set_attn_processor({name: BandMaskedStockProcessor(proc, holder) if ".attn1." in name else proc
                              for name, proc in model.attn_processors.items()})
    embeds = encode_prompt([prompt])  # (1, L, text_dim)
    sigmas = flow_sigmas(cfg.steps, cfg.shift).tolist()
    gen = torch.Generator().manual_seed(seed)
    fpc, lag = cfg.frames_per_chunk, cfg.steps // cfg.window_size
    tokens_per_frame = FRAME[1] * FRAME[2] // 4  # patch (1, 2, 2)
    clean: list[torch.Tensor] = []
    noisy: dict[int, torch.Tensor] = {}
    tick = 0
    while len(clean) < cfg.num_chunks:
        if tick % lag == 0 and tick // lag < cfg.num_chunks:
            noisy[tick // lag] = torch.randn((1, FRAME[0], fpc, *FRAME[1:]), generator=gen)
        order = sorted(noisy)
        steps = [tick - i * lag for i in order]
        holder["mask"] = band_mask([cfg.commit_kv_range] * len(clean) + [cfg.kv_range_at(s) for s in steps],
                                   fpc * tokens_per_frame)
        t_frames = torch.tensor([0.0] * (len(clean) * fpc) + [sigmas[s] for s in steps for _ in range(fpc)])[None]
        timestep = t_frames * 1000.0  # (1, F)
        kwargs = {}
        if isinstance(model, (SkyReelsV2Transformer3DModel, SkyReelsV2DiT)):
            kwargs["enable_diffusion_forcing"] = True
        else:
            timestep = timestep.repeat_interleave(tokens_per_frame, dim=1)  # (1, S): per token
        if fps is not None:
            kwargs["fps"] = [0 if fps == 16 else 1]  # the pipeline's mapping, one entry per video
        with torch.no_grad():
            v = model(hidden_states=torch.cat([*clean, *(noisy[i] for i in order)], dim=2), timestep=timestep,
                      encoder_hidden_states=embeds, return_dict=False, **kwargs)[0]
        v = v[:, :, len(clean) * fpc:]  # (1, C, n*F, H, W): the in-flight chunks
        for j, (i, s) in enumerate(zip(order, steps)):
            noisy[i] = noisy[i] + (sigmas[s + 1] - sigmas[s]) * v[:, :, j * fpc:(j + 1) * fpc]
        if steps[0] == cfg.steps - 1:
            clean.append(noisy.pop(order[0]))
        tick += 1
    return torch.cat(clean, dim=2)


KV_LIMIT_CASES = {
    # MAGI-1's stage schedule one chunk at a time: stage kv_range 3 and 4 meet 2 and 3 cached chunks
    "staged": dict(num_chunks=5, steps=4, kv_range=(4, 3, 2, 1)),
    # two chunks in flight: the younger one's cache limit (3 or 2) meets 2 cached chunks
    "staircase2": dict(num_chunks=5, steps=4, window_size=2, kv_range=(4, 3, 2, 1)),
    # MAGI-1's 4.5B staircase (window 4, noise2clean_kvrange [5, 4, 3, 2])
    "staircase4": dict(num_chunks=6, steps=4, window_size=4, kv_range=(4, 3, 2, 1)),
    # the commit pass: limit 3 meets 2 cached chunks when chunk 2 is committed (and hides chunk 0 from chunk 4's)
    "commit": dict(num_chunks=6, steps=2, commit_kv_range=3),
    "commit_and_stages": dict(num_chunks=5, steps=4, window_size=2, kv_range=(None, 2), commit_kv_range=3),
}


def amplify_self_attention(model: torch.nn.Module, factor: float = 10.0) -> torch.nn.Module:
    """At random init the self-attention output barely moves the residual stream, so a chunk hidden from a
    commit pass changes the video by ~1e-5; scaling attn1's output projection makes a wrong limit show."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn1.to_out[0].weight.mul_(factor)
    return model


@pytest.mark.parametrize("case", KV_LIMIT_CASES)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_kv_limited_generation_matches_a_stock_diffusers_oracle(cls, case, tiny_wan_adapter, tiny_wan_model):
    """Unquantized cache: chunk-wise generation under kv_range / commit_kv_range limits, including limits
    above the number of chunks the cache holds, equals the stock model's masked full-sequence forwards."""
    from jensenkv.generation.loop import generate_video

    cfg = GenerationConfig(frames_per_chunk=FPC, shift=2.0, **KV_LIMIT_CASES[case])
    adapter = tiny_wan_adapter(cls, generation=cfg)
    amplify_self_attention(adapter.transformer)
    ours = generate_video(adapter, "a red square", seed=3).latents
    oracle = stock_oracle_latents(amplify_self_attention(tiny_wan_model(cls)).eval(), "a red square", 3, cfg)
    assert rel_err(ours, oracle) < 1e-5  # float32 rounding: about 1e-7
    unlimited = generate_video(adapter, "a red square", seed=3,
                               config=GenerationConfig(frames_per_chunk=FPC, shift=2.0, num_chunks=cfg.num_chunks,
                                                       steps=cfg.steps, window_size=cfg.window_size)).latents
    assert rel_err(unlimited, oracle) > 1e-4  # the limits matter: the oracle notices a wrong one


@pytest.mark.parametrize("fps", [16, 24])
def test_the_fps_embedding_matches_the_stock_diffusers_oracle(fps, tiny_wan_adapter, tiny_wan_model):
    """inject_sample_info (the SkyReels-V2-DF checkpoints): chunk-wise generation conditioned on ``fps`` equals
    the stock model's forwards given the fps as diffusers' pipeline gives it, and the other fps (the control)
    moves the video, so the embedding is used and the check would see it dropped or swapped."""
    from jensenkv.generation.loop import generate_video

    cfg = GenerationConfig(frames_per_chunk=FPC, shift=2.0, num_chunks=3, steps=2)
    other = 24 if fps == 16 else 16
    ours = generate_video(tiny_wan_adapter(generation=cfg, fps=fps, inject_sample_info=True), "a red square",
                          seed=3).latents
    def oracle(with_fps: int) -> torch.Tensor:
        return stock_oracle_latents(tiny_wan_model(inject_sample_info=True).eval(), "a red square", 3, cfg, with_fps)

    assert rel_err(ours, oracle(fps)) < 1e-5
    assert rel_err(ours, oracle(other)) > 1e-3
    moved = generate_video(tiny_wan_adapter(generation=cfg, fps=other, inject_sample_info=True), "a red square",
                           seed=3).latents
    assert rel_err(moved, ours) > 1e-3


def test_an_fps_the_embedding_lacks_is_refused(tiny_wan_adapter):
    from jensenkv.models.config import ModelConfig

    with pytest.raises(ValueError, match=r"^fps=30 is not allowed: this SkyReels-V2 model embeds only 16 or 24 fps$"):
        tiny_wan_adapter(fps=30, inject_sample_info=True)
    assert tiny_wan_adapter(fps=30).fps == 30  # a model without the embedding never reads it
    node = dict(kind="diffusers", device="cpu", transformer_class="SkyReelsV2Transformer3DModel", path="Org/Not-Cached",
                height=64, width=64)
    with pytest.raises(ValueError, match=r"^model\.fps=30 is not allowed: use one of \(16, 24\)$"):
        ModelConfig(**node, fps=30)  # the config refuses it before any weights load
    assert ModelConfig(**node, fps=16).fps == 16 and ModelConfig(**node).fps is None
