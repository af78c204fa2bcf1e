"""SkyReelsV2DiT, the plain-torch SkyReels-V2 transformer, against diffusers' SkyReelsV2Transformer3DModel:
the same state dict gives the same bits, in the stock forward and through the chunk-wise adapter (an INT2 cache,
the correction and the probes); configs it does not cover fail by name. That a real built-in run imports neither
diffusers nor transformers is tests/test_import_light.py's."""
from __future__ import annotations

import copy

import pytest
import torch
from diffusers import SkyReelsV2Transformer3DModel

from wan_testkit import WAN_FRAME, WAN_TEST_CONFIG, encode_prompt
from jensenkv.attention.config import AttentionConfig
from jensenkv.cache import CacheConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.models.loaders import cast_like_diffusers
from jensenkv.models.tiny.weights import load_tiny
from jensenkv.models.wan import SkyReelsV2DiT, WanChunkwiseAdapter
from jensenkv.quant import QuantConfig


def pair(config: dict, state: dict | None = None) -> tuple[SkyReelsV2DiT, SkyReelsV2Transformer3DModel]:
    """The port and diffusers' class holding the same weights (the port's random init unless ``state``)."""
    port = SkyReelsV2DiT(**config).eval()
    if state is not None:
        port.load_state_dict(state)
    stock = SkyReelsV2Transformer3DModel(**config).eval()
    stock.load_state_dict(port.state_dict(), strict=True)
    return port, stock


@pytest.fixture(scope="module")
def builtin_pair():
    transformer, _, _, stored = load_tiny()
    return pair(dict(stored["transformer"]), transformer.state_dict())


def forward(model, x, timestep, text, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False, **kwargs)[0]


def test_the_state_dict_and_config_are_diffusers(builtin_pair):
    port, stock = builtin_pair
    assert list(port.state_dict()) == list(stock.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(port.state_dict().values(), stock.state_dict().values()))
    assert set(port.attn_processors) == set(stock.attn_processors)
    assert port.config.patch_size == tuple(stock.config.patch_size)
    for key in ("num_attention_heads", "attention_head_dim", "num_layers", "num_frame_per_block"):
        assert getattr(port.config, key) == getattr(stock.config, key)
    assert port.dtype == stock.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("forcing", [True, False], ids=["per-frame t (block-causal mask)", "one t per video"])
def test_the_forward_is_bit_equal(builtin_pair, dtype, forcing):
    """The built-in model's weights, 3 videos of 4 frames (2 chunks: the model's own block-causal mask)."""
    port, stock = (cast_like_diffusers(copy.deepcopy(m), dtype) for m in builtin_pair)  # the shared pair stays float32
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 4, 16, 16, generator=gen).to(dtype)  # (B, C, F, H, W)
    t = torch.rand(3, 4, generator=gen) * 1000 if forcing else torch.rand(3, generator=gen) * 1000
    text = torch.randn(3, 12, port.config.text_dim, generator=gen).to(dtype)
    a = forward(port, x, t, text, enable_diffusion_forcing=forcing)
    b = forward(stock, x, t, text, enable_diffusion_forcing=forcing)
    assert a.dtype == b.dtype == dtype and torch.equal(a, b)


def test_bit_equal_at_two_heads_and_an_odd_head_dim():
    """diffusers' own test sizes: 2 heads of 12 (RoPE's t/h/w split 4/4/4), random weights."""
    port, stock = pair(dict(WAN_TEST_CONFIG, num_frame_per_block=1))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, *WAN_FRAME[:1], 3, *WAN_FRAME[1:], generator=gen)
    t = torch.rand(2, 3, generator=gen) * 1000
    text = encode_prompt(["a red square", "a blue circle"])
    assert torch.equal(forward(port, x, t, text, enable_diffusion_forcing=True),
                       forward(stock, x, t, text, enable_diffusion_forcing=True))


def test_chunkwise_generation_and_probes_are_bit_equal(builtin_pair):
    """Through the adapter: INT2 keys and values, the Taylor correction, CFG, two videos, probes on."""
    from jensenkv.generation.loop import generate_videos

    transformer, text_encoder, tokenizer, stored = load_tiny()
    cache = CacheConfig(key=QuantConfig(bits=2, group_size=32), value=QuantConfig(bits=2, group_size=32))
    attention = AttentionConfig(correction="taylor", probes=True)
    generation = GenerationConfig(**{**stored["sampler"], "num_chunks": 3})

    def encode(prompts):
        return text_encoder(tokenizer(prompts))

    frame = (3, stored["data"]["height"], stored["data"]["width"])
    results = []
    for model in builtin_pair:
        adapter = WanChunkwiseAdapter(model, encode, frame, generation, cache, attention, clean_range=(-1.0, 1.0))
        try:
            videos = generate_videos(adapter, ["a red square moving right", "a green circle"], seeds=[0, 1])
            results.append(([v.video for v in videos], [v.probes for v in videos]))
        finally:
            adapter.remove()
    (videos_port, probes_port), (videos_stock, probes_stock) = results
    assert all(torch.equal(a, b) for a, b in zip(videos_port, videos_stock))
    assert all(probes_port) and probes_port == probes_stock


@pytest.mark.parametrize("key, value", [("image_dim", 1280), ("added_kv_proj_dim", 64), ("inject_sample_info", True),
                                        ("pos_embed_seq_len", 514), ("qk_norm", "rms_norm")])
def test_configs_it_does_not_cover_fail_by_name(key, value):
    with pytest.raises(ValueError, match=rf"^{key}={value!r} is not allowed: .*SkyReelsV2Transformer3DModel") as err:
        SkyReelsV2DiT(**{**WAN_TEST_CONFIG, key: value})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"config keys \['window_size'\] are not allowed"):
        SkyReelsV2DiT(**WAN_TEST_CONFIG, window_size=(-1, -1))
