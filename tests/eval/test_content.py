"""Prompt-content recovery: exact on ground-truth procedural videos, near chance on mismatched prompts."""
from __future__ import annotations

import pytest
import torch

from jensenkv.eval.content import content_accuracy, content_match, estimate_background, recover_content
from jensenkv.models.tiny.data import COLOURS, DIRECTIONS, VideoSpec, all_specs, render_video


def _ground_truth(seeds: int = 2) -> tuple[torch.Tensor, list[str]]:
    specs = [s for s in all_specs() for _ in range(seeds)]
    videos = torch.stack([render_video(s, 100 + i) for i, s in enumerate(specs)])  # (N, F, C, H, W)
    return videos, [s.prompt for s in specs]


def test_ground_truth_videos_are_recovered_exactly():
    videos, prompts = _ground_truth()
    assert content_accuracy(videos, prompts) == {"colour": 1.0, "direction": 1.0, "both": 1.0}


def test_recovery_survives_pixel_noise():
    videos, prompts = _ground_truth(1)
    noisy = (videos + 0.03 * torch.randn(videos.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    acc = content_accuracy(noisy, prompts)
    assert acc["both"] >= 0.97


def test_mismatched_prompts_score_near_chance():
    videos, prompts = _ground_truth(1)
    # Rotate colour and direction to a different value for every video: nothing may match.
    colours, directions = list(COLOURS), list(DIRECTIONS)
    wrong = []
    for p in prompts:
        words = p.split()
        words[1] = colours[(colours.index(words[1]) + 1) % len(colours)]
        words[4] = directions[(directions.index(words[4]) + 1) % len(directions)]
        wrong.append(" ".join(words))
    assert content_accuracy(videos, wrong) == {"colour": 0.0, "direction": 0.0, "both": 0.0}
    # Randomly shuffled prompts: about chance (1/7 colour, 1/4 direction).
    perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = content_accuracy(videos, [prompts[i] for i in perm])
    assert shuffled["colour"] < 0.35 and shuffled["direction"] < 0.45 and shuffled["both"] < 0.15


def test_background_plane_is_recovered_under_a_bright_shape():
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, 16), torch.linspace(-1, 1, 16), indexing="ij")
    plane = torch.stack([0.1 + 0.05 * xs, 0.2 - 0.1 * ys, 0.15 + 0.03 * xs + 0.02 * ys])  # (C, H, W)
    video = plane[None].repeat(6, 1, 1, 1)  # (F, C, H, W)
    for f in range(6):
        video[f, :, 5:11, 2 + f: 8 + f] = torch.tensor([0.9, 0.9, 0.1]).view(3, 1, 1)
    assert torch.allclose(estimate_background(video), plane, atol=1e-4)
    got = recover_content(video)
    assert got.colour == "yellow" and got.direction == "right"


def test_empty_or_static_video_has_no_direction():
    background = torch.full((8, 3, 16, 16), 0.1)
    empty = recover_content(background)
    assert empty.colour is None and empty.direction is None and empty.foreground_fraction == 0.0
    static = background.clone()
    static[:, :, 4:9, 4:9] = torch.tensor([0.95, 0.1, 0.1]).view(3, 1, 1)
    got = recover_content(static)
    assert got.colour == "red" and got.direction is None


def test_each_direction_of_a_rendered_video():
    for direction in DIRECTIONS:
        video = render_video(VideoSpec("cyan", "circle", direction, "gradient"), 9)
        assert recover_content(video).direction == direction


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="video shape"):
        recover_content(torch.zeros(8, 16, 16))
    with pytest.raises(ValueError, match="at least 2"):
        recover_content(torch.zeros(1, 3, 16, 16))
    with pytest.raises(ValueError, match="len\\(videos\\)=1"):
        content_accuracy(torch.zeros(1, 8, 3, 16, 16), ["a", "b"])
    with pytest.raises(ValueError, match="grammar"):
        content_accuracy(torch.zeros(1, 8, 3, 16, 16), ["a red thing"])


def test_content_match_scores_one_video_and_rejects_prompts_outside_the_grammar():
    spec = VideoSpec("cyan", "square", "up", "gradient")
    video = render_video(spec, 7)  # (F, C, H, W)
    assert content_match(video, spec.prompt) == {"content": 1.0, "content_colour": 1.0, "content_direction": 1.0}
    wrong_direction = spec.prompt.replace(" up ", " down ")
    assert content_match(video, wrong_direction) == {"content": 0.0, "content_colour": 1.0, "content_direction": 0.0}
    with pytest.raises(ValueError, match="grammar"):
        content_match(video, "a fox in the snow")
