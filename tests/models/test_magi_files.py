"""MAGI-1's ViT VAE decoder, T5 prompt wrapper with special tokens, and fetch-weights entries."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from jensenkv.models.magi.build import load_vae_decoder
from jensenkv.models.magi.text import MagiT5PromptEncoder, load_special_tokens
from jensenkv.models.magi.vae import ViTDecoder, ViTDecoderConfig
from jensenkv.models.loaders import MissingWeightsError

DDCONFIG = dict(video_size=16, video_length=4, patch_size=4, patch_length=2, in_chans=3, z_chans=4, double_z=True,
                embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, qkv_bias=True, with_cls_token=True,
                conv_last_layer=True, ln_in_attn=True)


def _random_decoder(seed: int = 0) -> ViTDecoder:
    torch.manual_seed(seed)
    decoder = ViTDecoder(ViTDecoderConfig.from_ddconfig(DDCONFIG))
    for p in decoder.parameters():
        p.data.normal_(0, 0.1)
    return decoder


def test_official_vae_folder_loads_the_decoder(tmp_path):
    from safetensors.torch import save_file

    decoder = _random_decoder()
    state = {f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()}
    state["encoder.proj_in.weight"] = torch.zeros(2, 2)  # the encoder's keys are ignored
    save_file(state, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"ddconfig": DDCONFIG, "model_type": "vit"}))
    vae = load_vae_decoder(tmp_path, torch.float32, torch.device("cpu"), latent_scale=1.0)
    z = torch.randn(1, 4, 2, 4, 4)  # the trained latent grid: 4/2 frames x 16/4 x 16/4
    assert torch.equal(vae.decoder(z), decoder(z))
    video = vae(z)
    assert video.shape == (4, 3, 16, 16) and 0 <= video.min() and video.max() <= 1
    (tmp_path / "config.json").unlink()
    with pytest.raises(MissingWeightsError, match="config.json"):
        load_vae_decoder(tmp_path, torch.float32, torch.device("cpu"), 1.0)


def test_pos_embed_is_resized_only_off_the_trained_grid():
    decoder = _random_decoder(1)
    assert decoder._pos_embed(2, 4, 4) is decoder.pos_embed
    grid = decoder._pos_embed(3, 5, 6)  # trilinear resize for another latent size
    assert grid.shape == (1, 1 + 3 * 5 * 6, 64) and torch.equal(grid[:, :1], decoder.pos_embed[:, :1])
    out = decoder(torch.randn(1, 4, 3, 5, 6))
    assert out.shape == (1, 3, 6, 20, 24)


def _special_tokens(tmp_path: Path, channels: int) -> Path:
    rng = np.random.default_rng(0)
    file = tmp_path / "special_tokens.npz"
    np.savez(file, caption_token=rng.normal(size=(1, channels)), logo_token=rng.normal(size=(1, channels)),
             other_tokens=rng.normal(size=(17, channels)))
    return file


def test_t5_wrapper_prepends_duration_and_hq_tokens_per_chunk(tmp_path):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    encoder = T5EncoderModel(T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)).eval()

    def tokenizer(texts, max_length, **kwargs):
        ids = torch.zeros(1, max_length, dtype=torch.long)
        ids[0, :3] = torch.tensor([5, 7, 1])
        mask = (ids != 0).long()
        return SimpleNamespace(input_ids=ids, attention_mask=mask)

    tokens = load_special_tokens(_special_tokens(tmp_path, 16))
    wrap = MagiT5PromptEncoder(tokenizer, encoder, max_length=10, special_tokens=tokens,
                               special_token_keys=("HQ_TOKEN", "DURATION_TOKEN"))
    chunks = wrap("a prompt", num_chunks=3)
    states = encoder(input_ids=tokenizer([""], 10).input_ids,
                     attention_mask=tokenizer([""], 10).attention_mask).last_hidden_state[0, :3]
    for i, caption in enumerate(chunks):
        assert caption.shape == (5, 16)  # [duration, HQ, 3 prompt tokens]
        assert torch.equal(caption[0], tokens[f"DURATION_TOKEN_{3 - i}"][0].float())  # chunks still to come
        assert torch.equal(caption[1], tokens["HQ_TOKEN"][0].float())
        assert torch.allclose(caption[2:], states)
    with pytest.raises(MissingWeightsError, match="special_tokens.npz"):
        load_special_tokens(tmp_path / "absent" / "special_tokens.npz")


def test_fetch_weights_lists_magi_files(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import fetch_weights

    assert fetch_weights.main(["--dry-run", "--only", "models", "--models", "magi1_24b_distill", "magi1_tiny"]) == 0
    out = capsys.readouterr().out
    assert "[would fetch] model magi1_24b_distill" in out and "sand-ai/MAGI-1" in out
    assert "special_tokens.npz" in out and "magi1_tiny" not in out
    from jensenkv.models.registry import family

    magi = family("magi")
    items = magi.downloads("m", magi.view({"preset": "24B_distill", "path": "sand-ai/MAGI-1", "special_tokens": []}))
    assert items[0].patterns[0] == "ckpt/magi/24B_distill/*" and len(items) == 1
    tokens = magi.downloads("m", magi.view({"preset": "24B", "path": "sand-ai/MAGI-1", "special_tokens": ["x"],
                                            "special_tokens_file": str(tmp_path / "special_tokens.npz")}))
    assert tokens[-1].how == "file" and tokens[-1].source.endswith("special_tokens.npz")
    special = [i for i in fetch_weights.model_items(["magi1_24b_distill"]) if i.what.endswith("special tokens")]
    assert [i.urls for i in special] == [(special[0].source,)]  # a plain file is fetched from its URL


def test_tiled_decode_of_a_local_decoder_equals_the_untiled_decode():
    """With a decoder that maps each latent pixel to its own output patch, the official tiling (overlapping
    tiles, raw-neighbour blending, crops) must reassemble exactly the untiled output."""
    from jensenkv.models.magi.vae import Tiling, tiled_decode

    torch.manual_seed(0)
    mix = torch.randn(3, 4)

    def local(z):  # (B, 4, T, H, W) -> (B, 3, T, 2H, 2W)
        rgb = torch.einsum("oc,bcthw->bothw", mix, z)
        return rgb.repeat_interleave(2, dim=3).repeat_interleave(2, dim=4)

    z = torch.randn(1, 4, 5, 7, 9)
    tiling = Tiling(sample_height=8, sample_width=8, sample_length=2, spatial_overlap=0.25)
    out = tiled_decode(local, z, tiling, spatial_factor=2, temporal_factor=1)
    assert out.shape == (1, 3, 5, 14, 18)
    assert torch.allclose(out, local(z), atol=1e-6)
    shifted = tiled_decode(lambda t: local(t) + t.mean(), z, tiling, 2, 1)  # tile-dependent output: seams show
    assert not torch.allclose(shifted, local(z) + z.mean(), atol=1e-3)


def test_prompt_cleaning_normalises_case_quotes_and_space():
    from jensenkv.models.magi.text import clean_prompt

    assert clean_prompt("  A “Red”  Ball\u2014rolls  ") == 'a "red" ball-rolls'
    assert clean_prompt("a%20cat") == "a cat"
