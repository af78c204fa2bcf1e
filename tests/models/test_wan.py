"""Chunk-wise driving of diffusers' SkyReels-V2 / Wan transformers over a (quantized) KV cache.

Tiny random-init models at diffusers' own test sizes (patch (1, 2, 2), 2 heads x head dim 12), so no
weights are needed; group size 4 divides the head dim.
"""
from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before diffusers / huggingface_hub are imported

import socket
import sys
import zlib
from pathlib import Path

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel
from diffusers.hooks import HookRegistry
from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2AttnProcessor
from omegaconf import OmegaConf

from jensenkv.cache import CacheConfig
from jensenkv.generate import GenerationConfig, generate_video
from jensenkv.models import build_adapter
from jensenkv.models.registry import full_precision_cache, generation_config
from jensenkv.models.wan import (
    AttentionSettings,
    CachedSelfAttnProcessor,
    ChunkwiseAdapter,
    MissingWeightsError,
    ROPE_HOOK_NAME,
    RopeFrameOffsetHook,
    block_causal_mask,
    cast_like_diffusers,
    load_original_wan_checkpoint,
)
from jensenkv.quant import QuantConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline_testkit import write_random_tiny_weights  # noqa: E402

TEST_CONFIG = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4,
               "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2,
               "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
FRAME = (4, 16, 16)  # (C, H, W) of one latent frame
FPC = 2  # frames per chunk
CLASSES = [SkyReelsV2Transformer3DModel, WanTransformer3DModel]


def encode_prompt(prompts: list[str]) -> torch.Tensor:
    """A deterministic stand-in text encoder: (B, 12, 16), seeded by the prompt text."""
    return torch.stack([torch.randn(12, 16, generator=torch.Generator().manual_seed(zlib.crc32(p.encode())))
                        for p in prompts])


def int2_cache(**kw) -> CacheConfig:
    return CacheConfig(key=QuantConfig(bits=2, group_size=4), value=QuantConfig(bits=2, group_size=4), **kw)


def make_adapter(cls=SkyReelsV2Transformer3DModel, cache: CacheConfig | None = None,
                 attention: AttentionSettings | None = None, seed: int = 0) -> ChunkwiseAdapter:
    torch.manual_seed(seed)
    model = cls(**TEST_CONFIG)
    adapter = ChunkwiseAdapter(model, encode_prompt, FRAME, GenerationConfig(frames_per_chunk=FPC, steps=2),
                               cache or full_precision_cache(), attention)
    adapter.set_prompt("a red square", "")
    return adapter


def chunks(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, *FRAME[:1], FPC, *FRAME[1:], generator=gen) for _ in range(n)]  # (1, C, F, H, W)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def run_chunks(adapter: ChunkwiseAdapter, n: int = 3, t: float = 0.7, branch: str = "cond",
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
def test_chunked_matches_block_causal_full_forward(cls, branch):
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


def test_full_forward_is_block_causal():
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


def test_rope_hook_shifts_positions_by_start_frame():
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
    assert isinstance(HookRegistry.check_if_exists_or_initialize(rope).get_hook(ROPE_HOOK_NAME), RopeFrameOffsetHook)


def test_processors_on_self_attention_only_and_removable():
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
def test_int2_cache_moves_the_output(cls):
    """(b) INT2 keys/values: the first chunk (empty cache) is unchanged, later chunks move."""
    exact = run_chunks(make_adapter(cls))
    int2 = run_chunks(make_adapter(cls, int2_cache()))
    assert torch.equal(exact[0], int2[0])
    assert all(rel_err(q, e) > 1e-3 for q, e in zip(int2[1:], exact[1:]))


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_correction_touches_cached_scores_only(correction):
    """(c) Correction changes nothing without cached keys in view, and something with them."""
    plain = make_adapter(cache=int2_cache())
    fixed = make_adapter(cache=int2_cache(), attention=AttentionSettings(correction=correction))
    out_plain, out_fixed = run_chunks(plain), run_chunks(fixed)
    assert torch.equal(out_plain[0], out_fixed[0])  # first chunk: empty cache
    assert all(rel_err(f, p) > 1e-5 for f, p in zip(out_fixed[1:], out_plain[1:]))
    # Cache full, but nothing of it visible (kv_range=0): only current-chunk attention -> identical.
    noisy = chunks(1, 9)[0]
    a = plain.denoise(noisy, 0.5, 3, kv_range=0)
    b = fixed.denoise(noisy, 0.5, 3, kv_range=0)
    assert torch.equal(a, b)
    # Strength 0 is the uncorrected path.
    fixed.configure(attention=AttentionSettings(correction=correction, strength=0.0))
    assert torch.allclose(run_chunks(fixed)[2], out_plain[2], atol=1e-5)


def test_kv_range_is_honoured():
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


def test_cfg_branches_have_separate_caches():
    adapter = make_adapter()
    run_chunks(adapter, n=2, branch="cond")
    assert [c.num_committed for c in adapter.caches("cond")] == [2, 2]
    assert [c.num_committed for c in adapter.caches("uncond")] == [0, 0]
    with pytest.raises(ValueError, match="branch"):
        adapter.denoise(chunks(1, 0)[0], 0.5, 0, "other")


def test_probes_recorded_per_layer_and_step():
    adapter = make_adapter(cache=int2_cache(), attention=AttentionSettings(correction="taylor", probes=True))
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
    adapter.configure(attention=AttentionSettings(probes=True, probe_layers=(1,)))
    run_chunks(adapter, n=2)
    assert {p["layer"] for p in adapter.probes()} == {1}
    assert make_adapter().probes() is None


def test_commits_must_come_in_order_and_settings_are_checked():
    adapter = make_adapter()
    with pytest.raises(ValueError, match="chunk_index=1"):
        adapter.commit(chunks(1, 0)[0], 1, "cond")
    with pytest.raises(ValueError, match="backend"):
        make_adapter(attention=AttentionSettings(backend="cuda_graphs"))
    with pytest.raises(ValueError, match="correction"):
        make_adapter(attention=AttentionSettings(correction="linear"))
    with pytest.raises(ValueError, match="group_size|head_dim"):
        make_adapter(cache=CacheConfig(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(method="none")))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_attention_backends_agree(backend):
    """The config switch reaches the suite's other attention paths (flex runs eagerly on CPU)."""
    fast = run_chunks(make_adapter(cache=int2_cache(), attention=AttentionSettings(correction="taylor")))
    other = run_chunks(make_adapter(cache=int2_cache(), attention=AttentionSettings(backend=backend,
                                                                                     correction="taylor")))
    assert all(rel_err(f, r) < 1e-4 for f, r in zip(fast, other))


def test_bf16_cast_keeps_diffusers_fp32_modules():
    model = cast_like_diffusers(SkyReelsV2Transformer3DModel(**TEST_CONFIG), torch.bfloat16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["scale_shift_table"] == dtypes["blocks.0.scale_shift_table"] == torch.float32
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    assert dtypes["blocks.0.attn1.to_q.weight"] == dtypes["proj_out.weight"] == torch.bfloat16
    assert model.rope.freqs_cos.dtype == SkyReelsV2Transformer3DModel(**TEST_CONFIG).rope.freqs_cos.dtype  # untouched


# --- configs and loaders --------------------------------------------------------------------------------

def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_missing_hub_weights_give_a_clear_error_without_network(tmp_path, monkeypatch):
    """(e) A Hub id absent from the (empty) cache: MissingWeightsError naming the id, the cache and the fix."""
    _no_network(monkeypatch)
    cfg = {"kind": "diffusers", "class": "SkyReelsV2Transformer3DModel", "height": 544, "width": 960,
           "path": "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers", "cache_dir": str(tmp_path)}
    with pytest.raises(MissingWeightsError) as err:
        build_adapter(cfg)
    message = str(err.value)
    assert "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers" in message
    assert str(tmp_path) in message and "make fetch-weights" in message


def test_missing_local_folder_and_subfolder_errors(tmp_path, monkeypatch):
    _no_network(monkeypatch)
    missing = tmp_path / "nope"
    cfg = {"kind": "diffusers", "class": "WanTransformer3DModel", "height": 480, "width": 832, "path": str(missing)}
    with pytest.raises(MissingWeightsError, match="nope.*make fetch-weights"):
        build_adapter(cfg)
    (tmp_path / "model").mkdir()
    with pytest.raises(MissingWeightsError, match="transformer"):
        build_adapter({**cfg, "path": str(tmp_path / "model")})
    with pytest.raises(MissingWeightsError, match="self_forcing_dmd.pt"):
        load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator_ema")


def test_model_config_errors_name_the_key():
    with pytest.raises(ValueError, match="kind='magi'"):
        build_adapter({"kind": "magi"})
    with pytest.raises(ValueError, match="stepz"):
        build_adapter({"kind": "diffusers", "class": "WanTransformer3DModel", "path": "x/y", "stepz": 3})
    with pytest.raises(ValueError, match="model.height is missing"):
        build_adapter({"kind": "diffusers", "class": "WanTransformer3DModel", "path": "x/y"})
    gen = generation_config({"steps": 8, "kv_range": [2, None]}, {"steps": 4, "shift": 3.0})
    assert (gen.steps, gen.shift, gen.kv_range) == (8, 3.0, (2, None))


def _to_original_wan_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Invert diffusers' Wan key renaming (the layout of Wan / Self-Forcing checkpoints)."""
    renames = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
               ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
               ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
               ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
               ("condition_embedder.time_proj", "time_projection.1"), ("attn2", "cross_attn"), ("attn1", "self_attn"),
               (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
               ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
               ("norm2", "norm__tmp"), ("norm3", "norm2"), ("norm__tmp", "norm3")]
    out = {}
    for name, tensor in state.items():
        for new, old in renames:
            name = name.replace(new, old)
        if name == "scale_shift_table":
            name = "head.modulation"
        elif name.startswith("proj_out"):
            name = name.replace("proj_out", "head.head")
        name = name.replace("scale_shift_table", "modulation")
        out[name] = tensor
    return out


def test_self_forcing_style_checkpoint_loads_into_diffusers_wan(tmp_path):
    """An original-format checkpoint (Self-Forcing: {"generator_ema": {"model.<wan key>": ...}}) round-trips."""
    torch.manual_seed(3)
    source = WanTransformer3DModel(**TEST_CONFIG)
    ckpt = {"generator_ema": {f"model.{k}": v for k, v in _to_original_wan_names(source.state_dict()).items()}}
    torch.save(ckpt, tmp_path / "self_forcing_dmd.pt")
    state = load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator_ema")
    target = WanTransformer3DModel(**TEST_CONFIG)
    target.load_state_dict(state, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    with pytest.raises(ValueError, match="checkpoint_key='generator'"):
        load_original_wan_checkpoint(tmp_path / "self_forcing_dmd.pt", "generator")


# --- the shipped model configs --------------------------------------------------------------------------

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


def _model_config(name: str, *overrides: str) -> dict:
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"), OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("name", ["skyreels_v2_df_1_3b", "self_forcing_wan_1_3b"])
def test_real_model_configs_are_valid_and_fail_cleanly_without_weights(name, tmp_path, monkeypatch):
    _no_network(monkeypatch)
    cfg = _model_config(name, f"cache_dir={tmp_path}", "num_chunks=2")
    assert cfg["num_chunks"] == 2 and generation_config(cfg).num_chunks == 2  # plain keys, Hydra-overridable
    with pytest.raises(MissingWeightsError, match="make fetch-weights"):
        build_adapter(cfg)


def test_tiny_config_builds_from_stored_defaults(tmp_path):
    write_random_tiny_weights(tmp_path / "weights", steps=2, num_chunks=2)
    adapter = build_adapter(_model_config("tiny", f"weights_dir={tmp_path / 'weights'}", "device=cpu"))
    assert (adapter.generation.steps, adapter.generation.num_chunks) == (2, 2)  # from config.json
    assert adapter.latent_frame_shape == (3, 16, 16) and adapter.clean_range == (-1.0, 1.0)
    result = generate_video(adapter, "a red square", seed=0)
    assert result.video.shape == (4, 3, 16, 16)
    overridden = build_adapter(_model_config("tiny", f"weights_dir={tmp_path / 'weights'}", "steps=3",
                                             "kv_range=[1,0]"))
    assert overridden.generation.steps == 3 and overridden.generation.kv_range == (1, 0)
    with pytest.raises(FileNotFoundError, match="make train-tiny"):
        build_adapter(_model_config("tiny", f"weights_dir={tmp_path / 'empty'}"))


def _save_tiny_diffusers_folder(folder: Path, class_name: str) -> None:
    """A complete diffusers-layout model folder at test sizes: transformer, Wan VAE, UMT5 and its tokenizer."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    cls = {"SkyReelsV2Transformer3DModel": SkyReelsV2Transformer3DModel, "WanTransformer3DModel": WanTransformer3DModel}
    cls[class_name](**{**TEST_CONFIG, "in_channels": 16, "out_channels": 16, "text_dim": 32}).save_pretrained(
        folder / "transformer")
    AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True, True]).save_pretrained(folder / "vae")
    UMT5EncoderModel(UMT5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8)).save_pretrained(folder / "text_encoder")
    words = ["<pad>", "</s>", "<unk>", "a", "red", "square", "moving", "left"]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder / "tokenizer")


@pytest.mark.parametrize("class_name", ["SkyReelsV2Transformer3DModel", "WanTransformer3DModel"])
def test_diffusers_folder_loads_offline_and_generates(class_name, tmp_path, monkeypatch):
    _save_tiny_diffusers_folder(tmp_path / "model", class_name)
    _no_network(monkeypatch)
    cfg = _model_config("skyreels_v2_df_1_3b", f"class={class_name}", f"path={tmp_path / 'model'}", "height=32",
                        "width=32", "dtype=float32", "device=cpu", "max_sequence_length=8", "num_chunks=2",
                        "frames_per_chunk=2", "steps=2", "guidance_scale=2.0")
    adapter = build_adapter(cfg, cache=int2_cache())
    assert type(adapter.transformer).__name__ == class_name and adapter.latent_frame_shape == (16, 4, 4)
    result = generate_video(adapter, "a red square moving left", seed=1)
    assert result.latents.shape == (1, 16, 4, 4, 4)
    assert result.video.shape == (13, 3, 32, 32)  # Wan VAE: 1 + 4 * (4 - 1) frames, 8x upsampling
    assert 0.0 <= float(result.video.min()) and float(result.video.max()) <= 1.0
