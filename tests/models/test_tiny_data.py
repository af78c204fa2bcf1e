"""The tiny model's procedural data, tokenizer/text encoder, reference sampler and weight loading."""
from __future__ import annotations

import pytest
import torch

from jensenkv.generation.config import GenerationConfig
from jensenkv.models.tiny import load_tiny, save_tiny
from jensenkv.models.tiny.config import CONFIG_FILE, WEIGHTS_DIR, WEIGHTS_FILE, build_transformer
from jensenkv.models.tiny.data import (
    BACKGROUNDS,
    COLOURS,
    DIRECTIONS,
    SHAPES,
    DataConfig,
    VideoSpec,
    all_specs,
    held_out_specs,
    parse_prompt,
    render_video,
    sample_batch,
    train_specs,
)
from jensenkv.models.tiny.sampling import sample_block_causal
from jensenkv.models.tiny.text import TextConfig, WordTokenizer, build_text

SMALL_TRANSFORMER = {
    "patch_size": [1, 2, 2], "num_attention_heads": 1, "attention_head_dim": 16, "in_channels": 3,
    "out_channels": 3, "text_dim": 8, "freq_dim": 32, "ffn_dim": 16, "num_layers": 1, "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 32, "num_frame_per_block": 2,
}


def _bright_centroid(frame: torch.Tensor) -> tuple[float, float]:
    """(C, H, W) -> centroid (x, y) of pixels whose brightest channel exceeds every background."""
    mask = frame.amax(dim=0) > 0.6  # (H, W)
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return float(xs.float().mean()), float(ys.float().mean())


def test_render_is_deterministic_in_seed_with_shape_and_range():
    spec = VideoSpec("red", "circle", "left", "gradient")
    a, b, c = render_video(spec, 3), render_video(spec, 3), render_video(spec, 4)
    assert a.shape == (8, 3, 16, 16) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 1


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_shape_moves_in_the_prompted_direction_and_stays_in_frame(direction):
    cfg = DataConfig()
    for seed in range(5):
        video = render_video(VideoSpec("white", "square", direction, "dark"), seed, cfg)
        (x0, y0), (x1, y1) = _bright_centroid(video[0]), _bright_centroid(video[-1])
        dx, dy = DIRECTIONS[direction]
        assert (x1 - x0) * dx + (y1 - y0) * dy > 4.0  # >= 0.8 px/frame over 7 frames, minus edge effects
        assert abs((x1 - x0) * dy) + abs((y1 - y0) * dx) < 0.5  # no motion across the direction
        # The whole shape stays inside: the bright area only varies by sub-pixel rounding, never shrinks away.
        area = (video.amax(dim=1) > 0.6).sum(dim=(1, 2)).float()
        assert float(area.min()) >= 0.75 * float(area.max())


@pytest.mark.parametrize("colour", list(COLOURS))
def test_shape_colour_matches_palette_within_jitter(colour):
    video = render_video(VideoSpec(colour, "square", "right", "gradient"), 11)
    frame = video[0]
    core = frame.amax(dim=0) > 0.6
    mean = frame.permute(1, 2, 0)[core].mean(dim=0)
    assert torch.allclose(mean, torch.tensor(COLOURS[colour]), atol=DataConfig().colour_jitter + 0.03)


def test_backgrounds_stay_dark():
    for spec in all_specs()[::7]:
        video = render_video(spec, 5)
        untouched = (video == video[:1]).all(dim=(0, 1))  # (H, W): pixels the moving shape never covers
        assert untouched.any()
        assert float(video[0][:, untouched].max()) <= DataConfig().background_max + 1e-6


def test_prompt_round_trip_and_grammar_errors():
    for spec in all_specs():
        assert parse_prompt(spec.prompt) == spec
    with pytest.raises(ValueError, match="grammar"):
        parse_prompt("a red circle")
    with pytest.raises(ValueError, match="colour='purple'"):
        parse_prompt("a purple circle moving left on a dark background")
    with pytest.raises(ValueError, match="direction"):
        VideoSpec("red", "circle", "sideways", "dark")


def test_held_out_split_is_disjoint_and_keeps_every_attribute_in_training():
    held, train = set(held_out_specs()), set(train_specs())
    assert held and not held & train and held | train == set(all_specs())
    assert len(all_specs()) == len(COLOURS) * len(SHAPES) * len(DIRECTIONS) * len(BACKGROUNDS)
    for attr, values in (("colour", COLOURS), ("shape", SHAPES), ("direction", DIRECTIONS),
                         ("background", BACKGROUNDS)):
        assert {getattr(s, attr) for s in train} == set(values)
    assert {(s.colour, s.direction) for s in train} == {(c, d) for c in COLOURS for d in DIRECTIONS}


def test_sample_batch_is_reproducible_from_the_generator():
    a, pa = sample_batch(4, torch.Generator().manual_seed(0), train_specs())
    b, pb = sample_batch(4, torch.Generator().manual_seed(0), train_specs())
    assert a.shape == (4, 8, 3, 16, 16) and torch.equal(a, b) and pa == pb
    assert all(parse_prompt(p) in set(train_specs()) for p in pa)
    with pytest.raises(ValueError, match="specs"):
        sample_batch(2, torch.Generator(), [])


def test_tokenizer_round_trip_padding_and_errors():
    tok = WordTokenizer(TextConfig().vocab, max_length=12)
    prompt = "a red circle moving left on a dark background"
    ids = tok([prompt, ""])  # (2, L)
    assert ids.shape == (2, 12) and ids.dtype == torch.long
    assert tok.decode(ids[0]) == prompt
    assert torch.all(ids[1] == tok.pad_id) and torch.all(ids[0, 9:] == tok.pad_id)
    with pytest.raises(ValueError, match="purple"):
        tok("a purple circle")
    with pytest.raises(ValueError, match="max_length"):
        tok(" ".join(["a"] * 13))


def test_text_encoder_maps_padding_to_zero_and_words_to_distinct_vectors():
    tok, enc = build_text(TextConfig(text_dim=16))
    emb = enc(tok(["a red circle moving left on a dark background", ""]))  # (2, L, 16)
    assert emb.shape == (2, 12, 16)
    assert torch.all(emb[1] == 0) and torch.all(emb[0, 9:] == 0)
    assert not torch.allclose(emb[0, 1], emb[0, 2])


def _small_model(seed: int = 0):
    torch.manual_seed(seed)
    transformer = build_transformer(SMALL_TRANSFORMER).eval()
    tok, enc = build_text(TextConfig(text_dim=8))
    return transformer, enc, tok


def test_reference_sampler_is_chunk_causal_and_in_range():
    transformer, enc, tok = _small_model()
    prompt = ["a red circle moving left on a dark background"]
    two = sample_block_causal(transformer, enc, tok, prompt, 7, 
                                GenerationConfig(steps=2, num_chunks=2, guidance_scale=1.5))
    three = sample_block_causal(transformer, enc, tok, prompt, 7, 
                                GenerationConfig(steps=2, num_chunks=3, guidance_scale=1.5))
    assert two.shape == (1, 4, 3, 16, 16) and three.shape == (1, 6, 3, 16, 16)
    assert two.min() >= 0 and two.max() <= 1
    # Later chunks never change earlier ones (block-causal mask + per-chunk noise draws).
    assert torch.allclose(two, three[:, :4], atol=1e-5)
    other = sample_block_causal(transformer, enc, tok, prompt, 8, 
                                GenerationConfig(steps=2, num_chunks=2, guidance_scale=1.5))
    assert not torch.allclose(two, other)


def test_save_load_round_trip(tmp_path):
    transformer, enc, tok = _small_model(1)
    text = TextConfig(text_dim=8)
    config = {"transformer": SMALL_TRANSFORMER, "text": text.to_dict(), "data": DataConfig().to_dict(),
              "sampler": {"steps": 2, "guidance_scale": 1.5}}
    save_tiny(tmp_path, transformer, enc, config)
    t2, e2, tok2, cfg2 = load_tiny(tmp_path)
    assert cfg2 == config and tok2.vocab == tok.vocab
    for a, b in zip(transformer.state_dict().values(), t2.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(enc.embedding.weight, e2.embedding.weight)


def test_load_tiny_names_missing_file_and_make_target(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json.*make train-tiny"):
        load_tiny(tmp_path)


@pytest.mark.skipif(not (WEIGHTS_DIR / WEIGHTS_FILE).is_file(), reason="tiny weights not trained")
def test_committed_weights_load_and_fit_the_budget():
    transformer, enc, tok, config = load_tiny()
    assert (WEIGHTS_DIR / WEIGHTS_FILE).stat().st_size <= 25e6
    assert (WEIGHTS_DIR / CONFIG_FILE).is_file()
    assert transformer.config.attention_head_dim == 128 and transformer.config.num_frame_per_block == 2
    assert set(config) >= {"transformer", "text", "data", "sampler"}


@pytest.mark.slow  # ~100 s on one core: 2 seeds x every held-out prompt through the trained model
@pytest.mark.skipif(not (WEIGHTS_DIR / WEIGHTS_FILE).is_file(), reason="tiny weights not trained")
def test_committed_weights_draw_the_prompted_content_for_held_out_prompts():
    """The model card's protocol at 2 seeds per held-out prompt (prompts never seen in training)."""
    from jensenkv.eval.content import content_accuracy

    transformer, enc, tok, config = load_tiny()
    sampler = GenerationConfig(**config["sampler"])
    prompts = [s.prompt for s in held_out_specs() for _ in range(2)]
    videos = torch.cat([sample_block_causal(transformer, enc, tok, [p], 1000 + i, sampler)
                        for i, p in enumerate(prompts)])  # (N, F, C, H, W)
    assert content_accuracy(videos, prompts)["both"] >= 0.8
