"""The chunk-wise generation loop: determinism, the kv-range schedule, and agreement with the tiny model's
cache-free block-causal sampler. Random-init models only (no weights)."""
from __future__ import annotations

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel

from jensenkv.cache import CacheConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import flow_sigmas, generate_video
from jensenkv.models.loaders import cast_like_diffusers
from jensenkv.models.adapters import full_precision_cache
from jensenkv.models.tiny.config import build_transformer, default_transformer_config
from jensenkv.models.tiny.data import COLOURS, SHAPES
from jensenkv.models.tiny.sampling import sample_block_causal
from jensenkv.models.tiny.text import TextConfig, build_text
from jensenkv.attention.config import AttentionConfig
from jensenkv.models.wan import WanChunkwiseAdapter

GEN = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=3.0, guidance_scale=5.0)


@pytest.fixture
def make_adapter(tiny_wan_adapter):
    """Factory: a tiny adapter whose sampling defaults are GEN unless ``generation`` is given."""
    def make(cls=SkyReelsV2Transformer3DModel, cache: CacheConfig | None = None,
             attention: AttentionConfig | None = None, generation: GenerationConfig = GEN) -> WanChunkwiseAdapter:
        return tiny_wan_adapter(cls, cache, attention, generation)

    return make


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("cls", [SkyReelsV2Transformer3DModel, WanTransformer3DModel], ids=lambda c: c.__name__)
def test_same_seed_same_video_bit_for_bit(cls, make_adapter, int2_cache):
    """(d) Same seed + config -> identical video and latents on CPU; another seed -> another video."""
    adapter = make_adapter(cls, int2_cache(), AttentionConfig(correction="taylor"))
    first = generate_video(adapter, "a red square", seed=7)
    second = generate_video(adapter, "a red square", seed=7)
    assert torch.equal(first.video, second.video) and torch.equal(first.latents, second.latents)
    other = generate_video(adapter, "a red square", seed=8)
    assert not torch.allclose(other.latents, first.latents)
    renoised = generate_video(adapter, "a red square", seed=7,
                              config=GenerationConfig(**{**GEN.__dict__, "sampler": "x0_renoise"}))
    again = generate_video(adapter, "a red square", seed=7,
                           config=GenerationConfig(**{**GEN.__dict__, "sampler": "x0_renoise"}))
    assert torch.equal(renoised.latents, again.latents) and not torch.allclose(renoised.latents, first.latents)


def test_result_layout_and_timings(make_adapter):
    adapter = make_adapter()
    result = generate_video(adapter, "a red square", seed=0)
    frames = GEN.num_chunks * GEN.frames_per_chunk
    assert result.latents.shape == (1, 4, frames, 16, 16)
    assert result.video.shape == (frames, 4, 16, 16) and result.video.dtype == torch.float32
    assert 0.0 <= float(result.video.min()) and float(result.video.max()) <= 1.0
    assert result.probes is None
    t = result.timings
    assert len(t["per_chunk_s"]) == GEN.num_chunks and t["total_s"] >= sum(t["per_chunk_s"]) > 0
    # Commit timing is opt-in (on CUDA it synchronizes twice per commit and layer): untimed unless asked for.
    assert t["quantize_s"] is None and adapter.state.quantize_seconds == 0.0
    adapter.time_quantize = True
    timed = generate_video(adapter, "a red square", seed=0)
    assert 0.0 < timed.timings["quantize_s"] < timed.timings["total_s"]  # a part of the whole, not a speed
    assert torch.equal(timed.latents, result.latents)
    with pytest.raises(ValueError, match="time_quantize"):
        adapter.time_quantize = 1


def test_probes_carry_their_coordinates(make_adapter, int2_cache):
    adapter = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor", probes=True))
    probes = generate_video(adapter, "a red square", seed=0).probes
    keys = {(p["layer"], p["step"], p["chunk"], p["branch"]) for p in probes}
    # chunks 1 and 2 (chunk 0 has an empty cache) x 3 steps x 2 layers x 2 CFG branches, one record each
    assert len(probes) == len(keys) == 2 * 3 * 2 * 2
    assert {p["chunk"] for p in probes} == {1, 2} and {p["branch"] for p in probes} == {"cond", "uncond"}


def test_kv_range_schedule_is_honoured(make_adapter, attention_spy):
    """(f) Per-stage kv-range (MAGI-1 style): each denoising stage sees at most that many cached chunks."""
    gen = GenerationConfig(num_chunks=4, frames_per_chunk=2, steps=4, shift=2.0, kv_range=(None, 2, 1, 0),
                           commit_kv_range=1)
    adapter = make_adapter(generation=gen, attention=AttentionConfig(backend="spy"))
    seen: dict[tuple, int] = {}

    def record(q, k_cur, v_cur, segments):
        (chunk,) = adapter.state.window  # window_size 1: one chunk per forward
        seen[(adapter.state.mode, chunk.index, chunk.step)] = len(segments)

    attention_spy.hook(record)
    generate_video(adapter, "a red square", seed=0)
    for chunk in range(4):
        for step, limit in enumerate(gen.kv_range):
            assert seen[("cached", chunk, step)] == (chunk if limit is None else min(chunk, limit))
        assert seen[("commit", chunk, None)] == min(chunk, 1)


def test_generation_config_checks_and_stages():
    assert [GenerationConfig(steps=8, kv_range=(4, 3, 2, 1)).kv_range_at(i) for i in range(8)] == \
        [4, 4, 3, 3, 2, 2, 1, 1]
    assert GenerationConfig().kv_range_at(3) is None
    for bad, key in [({"steps": 0}, "steps"), ({"shift": 0.0}, "shift"), ({"sampler": "ddim"}, "sampler"),
                     ({"kv_range": (1, -1)}, "kv_range"), ({"steps": 2, "kv_range": (1, 1, 1)}, "kv_range"),
                     ({"commit_kv_range": 1.5}, "commit_kv_range"), ({"guidance_scale": -1.0}, "guidance_scale")]:
        with pytest.raises(ValueError, match=key):
            GenerationConfig(**bad).validate()


def test_flow_sigmas_follow_the_shifted_schedule():
    s = flow_sigmas(4, 5.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and bool((s[1:] < s[:-1]).all())
    # Self-Forcing's warped [1000, 750, 500, 250] at shift 5
    assert torch.allclose(s[:4], torch.tensor([1.0, 0.9375, 2.5 / 3, 0.625]))
    assert torch.allclose(flow_sigmas(4, 1.0), torch.linspace(1, 0, 5))


def test_matches_the_tiny_models_block_causal_sampler():
    """With a full-precision cache the generator reproduces the cache-free reference sampler of the tiny model."""
    torch.manual_seed(0)
    transformer = build_transformer(default_transformer_config())
    tokenizer, text_encoder = build_text(TextConfig())
    prompt = f"a {next(iter(COLOURS))} {next(iter(SHAPES))}"
    sampler = GenerationConfig(steps=3, shift=2.0, guidance_scale=3.0, frames_per_chunk=2, num_chunks=3)
    with torch.no_grad():
        reference = sample_block_causal(transformer, text_encoder, tokenizer, [prompt], seed=5, sampler=sampler)
    gen = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=3, shift=2.0, guidance_scale=3.0)
    adapter = WanChunkwiseAdapter(transformer, lambda p: text_encoder(tokenizer(p)), (3, 16, 16), gen,
                               full_precision_cache("float32"), clean_range=(-1.0, 1.0))
    ours = generate_video(adapter, prompt, seed=5)
    assert ours.video.shape == reference[0].shape
    assert float((ours.video - reference[0]).abs().max()) < 1e-4
    adapter.remove()  # stock processors and the model's own block-causal mask are back
    with torch.no_grad():
        again = sample_block_causal(transformer, text_encoder, tokenizer, [prompt], seed=5, sampler=sampler)
    assert torch.equal(again, reference)


def test_bfloat16_model_runs_end_to_end(make_adapter, int2_cache):
    """Real checkpoints run in bf16: the cast model (fp32-kept modules as diffusers keeps them) generates a
    finite video close to the fp32 one."""
    fp32 = generate_video(make_adapter(WanTransformer3DModel, int2_cache()), "a red square", seed=3)
    adapter = make_adapter(WanTransformer3DModel, int2_cache(), AttentionConfig(correction="taylor"))
    cast_like_diffusers(adapter.transformer, torch.bfloat16)
    bf16 = generate_video(adapter, "a red square", seed=3)
    assert bool(torch.isfinite(bf16.video).all()) and float((bf16.video - fp32.video).abs().max()) < 0.1


# --- MAGI-1's pipelined staircase (window_size chunks in flight) ---------------------------------------------

def sequential_reference(adapter: WanChunkwiseAdapter, prompt: str, seed: int, cfg: GenerationConfig) -> torch.Tensor:
    """One chunk at a time, written out with one forward per step for both CFG branches (as the generator
    runs them): (1, C, F_total, H, W) clean latents."""
    branches = ("cond", "uncond") if cfg.use_cfg else ("cond",)
    adapter.reset()
    adapter.set_prompt(prompt, cfg.negative_prompt if cfg.use_cfg else None)
    sigmas = flow_sigmas(cfg.steps, cfg.shift).tolist()
    gen = torch.Generator().manual_seed(seed)
    shape = (1, 4, cfg.frames_per_chunk, 16, 16)
    chunks = []
    for c in range(cfg.num_chunks):
        x = torch.randn(shape, generator=gen)
        for step in range(cfg.steps):
            t, t_next = sigmas[step], sigmas[step + 1]
            v = adapter.denoise_branches(x, [t], c, branches, steps=[step], kv_ranges=[cfg.kv_range_at(step)])
            vel = v["cond"] if not cfg.use_cfg else v["uncond"] + cfg.guidance_scale * (v["cond"] - v["uncond"])
            if cfg.sampler == "euler":
                x = x + (t_next - t) * vel
            else:
                x0 = x - t * vel
                x = x0 if t_next == 0 else (1 - t_next) * x0 + t_next * torch.randn(shape, generator=gen)
        adapter.commit_branches(x, c, branches, kv_range=cfg.commit_kv_range)
        chunks.append(x)
    return torch.cat(chunks, dim=2)


def staircase_reference(adapter: WanChunkwiseAdapter, prompt: str, seed: int, cfg: GenerationConfig) -> torch.Tensor:
    """The staircase by definition, without a cache: each tick is one block-causal full forward over
    [committed clean chunks at t = 0, in-flight chunks at their own t]. Euler, no CFG, no kv-range."""
    adapter.reset()
    adapter.set_prompt(prompt)
    sigmas = flow_sigmas(cfg.steps, cfg.shift).tolist()
    gen = torch.Generator().manual_seed(seed)
    fpc, lag = cfg.frames_per_chunk, cfg.steps // cfg.window_size
    clean: list[torch.Tensor] = []
    noisy: dict[int, torch.Tensor] = {}
    tick = 0
    while len(clean) < cfg.num_chunks:
        if tick % lag == 0 and tick // lag < cfg.num_chunks:
            noisy[tick // lag] = torch.randn((1, 4, fpc, 16, 16), generator=gen)
        order = sorted(noisy)
        steps = [tick - i * lag for i in order]
        t_frames = torch.tensor([0.0] * (len(clean) * fpc) + [sigmas[s] for s in steps for _ in range(fpc)])[None]
        v = adapter.forward_full(torch.cat([*clean, *(noisy[i] for i in order)], dim=2), t_frames)
        v = v[:, :, len(clean) * fpc:]  # (1, C, n*F, H, W): the in-flight chunks
        for j, (i, s) in enumerate(zip(order, steps)):
            noisy[i] = noisy[i] + (sigmas[s + 1] - sigmas[s]) * v[:, :, j * fpc:(j + 1) * fpc]
        if steps[0] == cfg.steps - 1:
            clean.append(noisy.pop(order[0]))
        tick += 1
    return torch.cat(clean, dim=2)


@pytest.mark.parametrize("sampler", ["euler", "x0_renoise"])
def test_window_size_one_is_the_sequential_loop_bit_for_bit(sampler, make_adapter, int2_cache):
    """window_size=1 (the default) is the one-chunk-at-a-time loop, down to the last bit (CFG, INT2, Taylor)."""
    cfg = GenerationConfig(**{**GEN.__dict__, "sampler": sampler, "kv_range": (None, 1, 0), "commit_kv_range": 1})
    adapter = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor"))
    ours = generate_video(adapter, "a red square", seed=4, config=cfg)
    assert torch.equal(ours.latents, sequential_reference(adapter, "a red square", 4, cfg))


@pytest.mark.parametrize("cls", [SkyReelsV2Transformer3DModel, WanTransformer3DModel], ids=lambda c: c.__name__)
def test_staircase_matches_the_block_causal_definition(cls, make_adapter):
    """Unquantized cache: the windowed, cached generator equals ticks of full block-causal forwards."""
    cfg = GenerationConfig(num_chunks=4, frames_per_chunk=2, steps=4, shift=2.0, window_size=2)
    adapter = make_adapter(cls, generation=cfg)
    ours = generate_video(adapter, "a red square", seed=2).latents
    reference = staircase_reference(adapter, "a red square", 2, cfg)
    assert float((ours - reference).abs().max()) < 1e-4
    one_at_a_time = generate_video(adapter, "a red square", seed=2,
                                   config=GenerationConfig(**{**cfg.__dict__, "window_size": 1})).latents
    assert float((ours - one_at_a_time).abs().max()) > 1e-3  # the schedule changes the video


@pytest.mark.parametrize("cache", ["bf16", "int2"])
def test_staircase_is_deterministic_and_commits_each_chunk_once(cache, make_adapter, int2_cache):
    cfg = GenerationConfig(num_chunks=4, frames_per_chunk=2, steps=6, shift=3.0, guidance_scale=5.0, window_size=3,
                           sampler="x0_renoise", kv_range=(3, 2, 1))
    adapter = make_adapter(cache=None if cache == "bf16" else int2_cache(),
                           attention=AttentionConfig(correction="taylor"), generation=cfg)
    first = generate_video(adapter, "a red square", seed=1)
    for branch in ("cond", "uncond"):  # every chunk quantized exactly once per layer and branch
        for layer_cache in adapter.caches(branch):
            assert layer_cache.num_committed == cfg.num_chunks
            assert layer_cache.key_quantizer.num_calls == layer_cache.value_quantizer.num_calls == cfg.num_chunks
    second = generate_video(adapter, "a red square", seed=1)
    assert torch.equal(first.latents, second.latents) and torch.equal(first.video, second.video)
    assert first.latents.shape == (1, 4, cfg.num_chunks * cfg.frames_per_chunk, 16, 16)
    assert len(first.timings["per_chunk_s"]) == cfg.num_chunks and bool(torch.isfinite(first.latents).all())


@pytest.mark.parametrize("kv_range", [(4, 3, 2, 1), (1, 1, 0, 0), (None, 2, 1, 0)])
def test_staircase_kv_range_counts_in_flight_chunks_first(monkeypatch, kv_range, make_adapter, int2_cache,
                                                          attention_spy):
    """Each in-flight chunk attends to itself, the most recent preceding chunks in its stage's range, in flight
    first (full precision, as k_cur), then from the quantized cache. (4, 3, 2, 1) is MAGI-1's 4.5B schedule
    (window 4, noise2clean_kvrange [5, 4, 3, 2]): at most one cached chunk is ever in view."""
    cfg = GenerationConfig(num_chunks=6, frames_per_chunk=2, steps=4, shift=2.0, window_size=4, kv_range=kv_range)
    adapter = make_adapter(cache=int2_cache(), generation=cfg,
                           attention=AttentionConfig(backend="spy", correction="taylor", probes=True))
    tokens = cfg.frames_per_chunk * 8 * 8  # per chunk: frames x (16 / 2) x (16 / 2) patches
    forwards: list[list[tuple]] = []
    inner_window = adapter.denoise_window

    def recording_window(*args, **kwargs):
        forwards.append([])
        return inner_window(*args, **kwargs)

    def record(q, k_cur, v_cur, segments):
        if adapter.state.mode == "cached":
            assert all(s.steps is not None for s in segments)  # only committed, quantized chunks are cached
            forwards[-1].append((k_cur.shape[2] // tokens, len(segments), adapter.caches()[0].num_committed))

    attention_spy.hook(record)
    monkeypatch.setattr(adapter, "denoise_window", recording_window)
    probes = generate_video(adapter, "a red square", seed=0).probes

    lag = cfg.steps // cfg.window_size
    assert len(forwards) == (cfg.num_chunks - 1) * lag + cfg.steps  # one forward per tick, no CFG
    probed, seen_cache = {(p["chunk"], p["step"]) for p in probes}, set()
    for tick, calls in enumerate(forwards):
        window = [i for i in range(cfg.num_chunks) if 0 <= tick - i * lag < cfg.steps]
        assert len(calls) == 2 * len(window)  # per layer, one attention call per in-flight chunk
        for call, (position, chunk) in zip(calls, [*enumerate(window)] * 2):
            limit = cfg.kv_range_at(tick - chunk * lag)
            in_flight = position if limit is None else min(position, limit)
            committed = call[2]
            assert committed == window[0]  # everything older than the window is committed, nothing else
            assert call[:2] == (in_flight + 1, committed if limit is None else min(committed, limit - in_flight))
            assert call[1] <= 1 or kv_range != (4, 3, 2, 1)
            if call[1]:
                seen_cache.add((chunk, tick - chunk * lag))
    assert probed == seen_cache and len(probes) == 2 * len(seen_cache)  # probes: chunks that saw the cache


def test_correction_acts_only_when_cached_chunks_are_in_view(make_adapter, int2_cache):
    """A window forward whose kv_ranges hide every cached chunk (the chunks see only each other, which are
    never quantized) is untouched by the correction; with the cache in view the correction acts. The
    earlier chunk ignores the later one (block-causal)."""
    plain = make_adapter(cache=int2_cache())
    fixed = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor"))
    gen = torch.Generator().manual_seed(3)
    clean = [torch.randn(1, 4, 2, 16, 16, generator=gen) for _ in range(2)]
    window = torch.randn(1, 4, 4, 16, 16, generator=gen)  # two in-flight chunks (2 and 3)
    for adapter in (plain, fixed):
        adapter.set_prompt("a red square")
        for c in range(2):
            adapter.commit(clean[c], c)
    hidden = {"t": [0.3, 0.7], "first_chunk_index": 2, "steps": [2, 1], "kv_ranges": [0, 1]}
    assert torch.equal(plain.denoise_window(window, **hidden), fixed.denoise_window(window, **hidden))
    seen = {**hidden, "kv_ranges": [None, None]}
    out_fixed = fixed.denoise_window(window, **seen)
    assert rel_err(out_fixed, plain.denoise_window(window, **seen)) > 1e-5
    alone = fixed.denoise(window[:, :, :2], 0.3, 2, step=2)
    assert rel_err(out_fixed[:, :, :2], alone) < 1e-5


def test_window_settings_are_checked(make_adapter):
    for bad in ({"window_size": 0}, {"window_size": True}, {"steps": 4, "window_size": 3}):
        with pytest.raises(ValueError, match="window_size"):
            GenerationConfig(**bad).validate()
    GenerationConfig(steps=4, window_size=4).validate()
    adapter = make_adapter()
    adapter.set_prompt("a red square")
    window = torch.zeros(1, 4, 4, 16, 16)
    with pytest.raises(ValueError, match="t with 3"):
        adapter.denoise_window(window, [0.5, 0.4, 0.3], 0)
    with pytest.raises(ValueError, match="kv_ranges"):
        adapter.denoise_window(window, [0.5, 0.4], 0, kv_ranges=[None])
    with pytest.raises(ValueError, match="kv_range"):
        adapter.denoise_window(window, [0.5, 0.4], 0, kv_ranges=[None, -1])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_staircase_agrees_across_attention_backends(backend, make_adapter, int2_cache):
    """The window's k_cur (earlier in-flight chunks + itself) is longer than q: every backend takes it."""
    cfg = GenerationConfig(num_chunks=3, frames_per_chunk=2, steps=4, shift=2.0, window_size=2, kv_range=(2, 1))
    fast = make_adapter(cache=int2_cache(), attention=AttentionConfig(correction="taylor"), generation=cfg)
    other = make_adapter(cache=int2_cache(), attention=AttentionConfig(backend=backend, correction="taylor"),
                         generation=cfg)
    ours, theirs = (generate_video(a, "a red square", seed=0).latents for a in (fast, other))
    assert float((ours - theirs).abs().max()) < 1e-5


ADAPTER_CLASSES = ("jensenkv.models.wan.adapter:WanChunkwiseAdapter", "jensenkv.models.magi.adapter:MagiChunkwiseAdapter",
                   "jensenkv.models.worldplay.adapter:WorldPlayChunkwiseAdapter")
OWN_METHODS = ("configure", "reset", "caches", "denoise_window", "commit", "decode")  # the base has no default


def test_the_contract_names_every_method_of_the_base_and_every_adapter_subclasses_it():
    import importlib
    import inspect

    from jensenkv.generation.loop import ChunkwiseAdapterBase, ChunkwiseModel

    public = {name for name, _ in inspect.getmembers(ChunkwiseAdapterBase) if not name.startswith("_")}
    helpers = {"check_prompts", "window_args", "denoise"}  # argument checks and a convenience, not the loop's
    contract = {name for name in dir(ChunkwiseModel) if not name.startswith("_")} | set(ChunkwiseModel.__annotations__)
    assert public - helpers <= contract
    assert contract - public <= {"generation", "latent_frame_shape", "device", *OWN_METHODS}
    for path in ADAPTER_CLASSES:
        module, name = path.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, ChunkwiseAdapterBase)
        for method in OWN_METHODS:
            assert getattr(cls, method) is not getattr(ChunkwiseAdapterBase, method), (name, method)
        assert (cls.set_prompt is not ChunkwiseAdapterBase.set_prompt) or (cls.set_prompts is not
                                                                           ChunkwiseAdapterBase.set_prompts), name
        assert cls.batches_videos == (cls.set_prompts is not ChunkwiseAdapterBase.set_prompts), name


def test_an_adapter_that_generates_one_video_at_a_time_refuses_a_batch(make_adapter):
    adapter = make_adapter(generation=GenerationConfig(num_chunks=2, frames_per_chunk=2, steps=1))
    adapter.batches_videos = False  # as HY-WorldPlay's
    with pytest.raises(ValueError, match=r"a batch of 2 videos is not allowed for WanChunkwiseAdapter"):
        from jensenkv.generation.loop import generate_videos

        generate_videos(adapter, ["a", "b"], [0, 1])
