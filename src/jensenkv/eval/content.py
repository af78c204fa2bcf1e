"""Prompt-content recovery for the tiny model's videos: which colour is the shape and which way does it move.

No learned evaluator: the background of the procedural videos is a plane per channel (a constant tint or a
linear ramp) that does not change over time, and every shape colour is bright while every background is
dark. So a robust planar fit over all frames estimates the background; pixels far from it are the shape;
their mean colour gives the colour (nearest palette entry) and the slope of their centroid over frames gives
the direction.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jensenkv.models.tiny.data import COLOURS, DIRECTIONS, parse_prompt

FOREGROUND_THRESHOLD = 0.3   # RGB distance from the background above which a pixel belongs to the shape
CORE_THRESHOLD = 0.5         # stricter threshold for the colour estimate (skips blended edge pixels)
INLIER_THRESHOLD = 0.12      # RGB distance under which a pixel counts as background when refitting
MIN_SPEED = 0.1              # pixels per frame; slower centroid motion counts as "no direction"


@dataclass(frozen=True)
class Content:
    """What was recovered from one video; None where nothing shape-like was found."""

    colour: str | None
    direction: str | None
    foreground_fraction: float   # mean fraction of pixels per frame assigned to the shape


def _check_video(video: torch.Tensor) -> torch.Tensor:
    if video.ndim != 4 or video.shape[1] != 3:
        raise ValueError(f"video shape {tuple(video.shape)} is not allowed: expected (F, 3, H, W) in [0, 1]")
    if video.shape[0] < 2:
        raise ValueError(f"video has {video.shape[0]} frame(s): direction needs at least 2")
    return video.detach().float().cpu()


def estimate_background(video: torch.Tensor, iters: int = 3) -> torch.Tensor:
    """(F, C, H, W) video -> (C, H, W) background: per-channel plane a + b x + c y, fit to the background pixels.

    Starts from the darker 70% of pixels (shapes are bright and cover < 20% of a frame) and refits on the
    pixels within INLIER_THRESHOLD of the current plane.
    """
    video = _check_video(video)
    f, c, h, w = video.shape
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    design = torch.stack([torch.ones(h * w), xs.flatten(), ys.flatten()], dim=1)  # (HW, 3)
    design = design.repeat(f, 1)  # (F*HW, 3)
    pixels = video.permute(0, 2, 3, 1).reshape(f * h * w, c)  # (F*HW, C)
    brightness = pixels.sum(dim=1)
    inliers = brightness <= brightness.quantile(0.7)
    plane = torch.zeros(3, c)
    for _ in range(iters):
        if int(inliers.sum()) < 3:
            break
        plane = torch.linalg.lstsq(design[inliers], pixels[inliers]).solution  # (3, C)
        residual = (pixels - design @ plane).norm(dim=1)  # (F*HW,)
        inliers = residual < INLIER_THRESHOLD
    return (design[: h * w] @ plane).reshape(h, w, c).permute(2, 0, 1)  # (C, H, W)


def recover_content(video: torch.Tensor) -> Content:
    """Recover colour and motion direction from one (F, C, H, W) video in [0, 1]."""
    video = _check_video(video)
    f, _, h, w = video.shape
    background = estimate_background(video)  # (C, H, W)
    distance = (video - background[None]).norm(dim=1)  # (F, H, W)
    mask = distance > FOREGROUND_THRESHOLD
    fg_fraction = float(mask.float().mean())
    core = distance > CORE_THRESHOLD
    if not bool(core.any()):
        return Content(colour=None, direction=None, foreground_fraction=fg_fraction)
    mean_colour = video.permute(0, 2, 3, 1)[core].mean(dim=0)  # (C,)
    palette_names = list(COLOURS)
    palette = torch.tensor([COLOURS[n] for n in palette_names])  # (P, C)
    colour = palette_names[int((palette - mean_colour).norm(dim=1).argmin())]

    # Centroid per frame, weighted by the distance (sub-pixel accurate at anti-aliased edges).
    weight = distance * mask  # (F, H, W)
    mass = weight.sum(dim=(1, 2))  # (F,)
    present = mass > 0
    if int(present.sum()) < 2:
        return Content(colour=colour, direction=None, foreground_fraction=fg_fraction)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                            indexing="ij")
    cx = (weight * xs).sum(dim=(1, 2))[present] / mass[present]  # (F',)
    cy = (weight * ys).sum(dim=(1, 2))[present] / mass[present]
    frames = torch.arange(f, dtype=torch.float32)[present]
    frames = frames - frames.mean()
    slope_x = float((frames * (cx - cx.mean())).sum() / (frames**2).sum())
    slope_y = float((frames * (cy - cy.mean())).sum() / (frames**2).sum())
    if max(abs(slope_x), abs(slope_y)) < MIN_SPEED:
        return Content(colour=colour, direction=None, foreground_fraction=fg_fraction)
    if abs(slope_x) >= abs(slope_y):
        motion = (1 if slope_x > 0 else -1, 0)
    else:
        motion = (0, 1 if slope_y > 0 else -1)
    direction = next(name for name, d in DIRECTIONS.items() if d == motion)
    return Content(colour=colour, direction=direction, foreground_fraction=fg_fraction)


def content_match(video: torch.Tensor, prompt: str) -> dict[str, float]:
    """1.0 / 0.0 for one (F, C, H, W) video in [0, 1]: colour, direction and both recovered as prompted.

    Raises ValueError for a prompt outside the built-in model's grammar."""
    spec = parse_prompt(prompt)
    got = recover_content(video)
    colour, direction = got.colour == spec.colour, got.direction == spec.direction
    return {"content": float(colour and direction), "content_colour": float(colour),
            "content_direction": float(direction)}


def content_accuracy(videos: torch.Tensor | Sequence[torch.Tensor], prompts: Sequence[str]) -> dict[str, float]:
    """Fraction of videos whose recovered colour / direction / both match their prompt.

    videos: (N, F, C, H, W) or a sequence of (F, C, H, W), values in [0, 1]; prompts: N grammar prompts.
    """
    if len(videos) != len(prompts):
        raise ValueError(f"len(videos)={len(videos)} must equal len(prompts)={len(prompts)}")
    if len(prompts) == 0:
        raise ValueError("prompts=[] is not allowed: content_accuracy needs at least one video")
    scores = [content_match(video, prompt) for video, prompt in zip(videos, prompts)]
    n = len(prompts)
    return {"colour": sum(s["content_colour"] for s in scores) / n,
            "direction": sum(s["content_direction"] for s in scores) / n,
            "both": sum(s["content"] for s in scores) / n}
