"""Procedural training videos for the built-in tiny model: one coloured shape moving over a dark background.

Every video is a deterministic function of its ``VideoSpec`` (colour, shape, direction, background: what
the prompt names) and a seed (size, speed, start position, exact tints: what the prompt leaves free).
Some spec combinations are held out of training so the model card can measure generalisation to prompts
it never saw.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch

# RGB in [0, 1]. Every palette colour is bright (max channel >= 0.9) and far from every background (<= 0.35),
# which is what lets `jensenkv.eval.content` separate the shape from the background.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.95, 0.10, 0.10),
    "green": (0.10, 0.90, 0.10),
    "blue": (0.15, 0.30, 1.00),
    "yellow": (0.95, 0.90, 0.10),
    "white": (0.95, 0.95, 0.95),
    "cyan": (0.10, 0.90, 0.90),
    "magenta": (0.90, 0.10, 0.90),
}
SHAPES: tuple[str, ...] = ("circle", "square")
# (dx, dy) in image coordinates: x grows to the right, y grows downwards.
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
BACKGROUNDS: tuple[str, ...] = ("dark", "gradient")


@dataclass(frozen=True)
class VideoSpec:
    """What a prompt says about a video."""

    colour: str
    shape: str
    direction: str
    background: str

    def __post_init__(self) -> None:
        for key, value, allowed in (
            ("colour", self.colour, tuple(COLOURS)),
            ("shape", self.shape, SHAPES),
            ("direction", self.direction, tuple(DIRECTIONS)),
            ("background", self.background, BACKGROUNDS),
        ):
            if value not in allowed:
                raise ValueError(f"{key}={value!r} is not allowed: choose one of {list(allowed)}")

    @property
    def prompt(self) -> str:
        return f"a {self.colour} {self.shape} moving {self.direction} on a {self.background} background"


def parse_prompt(prompt: str) -> VideoSpec:
    """Inverse of ``VideoSpec.prompt``; raises ValueError for text outside the grammar."""
    words = prompt.strip().lower().split()
    pattern = "a <colour> <shape> moving <direction> on a <background> background"
    if (
        len(words) != 9
        or words[0] != "a"
        or words[3] != "moving"
        or words[5:7] != ["on", "a"]
        or words[8] != "background"
    ):
        raise ValueError(f"prompt={prompt!r} does not follow the grammar {pattern!r}")
    return VideoSpec(colour=words[1], shape=words[2], direction=words[4], background=words[7])


def all_specs() -> list[VideoSpec]:
    """Every (colour, shape, direction, background) combination, in a fixed order."""
    return [VideoSpec(*combo) for combo in itertools.product(COLOURS, SHAPES, DIRECTIONS, BACKGROUNDS)]


def is_held_out(spec: VideoSpec) -> bool:
    """A fixed arithmetic rule picks ~1/8 of the combinations; every single attribute value (and every
    colour-direction pair) still occurs in training, only these exact combinations do not."""
    ci = list(COLOURS).index(spec.colour)
    si = SHAPES.index(spec.shape)
    di = list(DIRECTIONS).index(spec.direction)
    bi = BACKGROUNDS.index(spec.background)
    return (ci * 3 + si * 5 + di * 7 + bi * 11) % 8 == 0


def train_specs() -> list[VideoSpec]:
    return [s for s in all_specs() if not is_held_out(s)]


def held_out_specs() -> list[VideoSpec]:
    return [s for s in all_specs() if is_held_out(s)]


@dataclass(frozen=True)
class DataConfig:
    """Free parameters of the renderer (sizes in pixels, speed in pixels per frame)."""

    height: int = 16
    width: int = 16
    num_frames: int = 8
    radius_min: float = 2.5        # circle radius / half the square's side
    radius_max: float = 3.5
    speed_min: float = 0.8
    speed_max: float = 1.2         # also capped so the shape stays inside the frame for num_frames
    colour_jitter: float = 0.05
    background_max: float = 0.35   # brightest background channel value

    def to_dict(self) -> dict:
        return asdict(self)


def _uniform(gen: torch.Generator, low: float, high: float, size: tuple[int, ...] = ()) -> torch.Tensor:
    return low + (high - low) * torch.rand(size, generator=gen)


def _background(spec: VideoSpec, gen: torch.Generator, cfg: DataConfig) -> torch.Tensor:
    """(C, H, W) background image: one dark tint, or a linear ramp between a darker and a lighter tint."""
    if spec.background == "dark":
        tint = _uniform(gen, 0.0, cfg.background_max * 0.6, (3,))
        return tint.view(3, 1, 1).expand(3, cfg.height, cfg.width).clone()
    low = _uniform(gen, 0.0, cfg.background_max * 0.3, (3,))
    high = _uniform(gen, cfg.background_max * 0.6, cfg.background_max, (3,))
    angle = _uniform(gen, 0.0, 2 * torch.pi)
    ys, xs = torch.meshgrid(torch.arange(cfg.height, dtype=torch.float32),
                            torch.arange(cfg.width, dtype=torch.float32), indexing="ij")  # (H, W) each
    proj = xs * torch.cos(angle) + ys * torch.sin(angle)
    ramp = (proj - proj.min()) / (proj.max() - proj.min())  # (H, W) in [0, 1]
    return low.view(3, 1, 1) + (high - low).view(3, 1, 1) * ramp


def _coverage(spec: VideoSpec, cx: torch.Tensor, cy: torch.Tensor, radius: torch.Tensor,
              cfg: DataConfig) -> torch.Tensor:
    """(F, H, W) anti-aliased shape coverage in [0, 1] for per-frame centres cx, cy (F,)."""
    ys, xs = torch.meshgrid(torch.arange(cfg.height, dtype=torch.float32),
                            torch.arange(cfg.width, dtype=torch.float32), indexing="ij")
    dx = xs[None] - cx[:, None, None]  # (F, H, W)
    dy = ys[None] - cy[:, None, None]
    if spec.shape == "circle":
        dist = torch.sqrt(dx**2 + dy**2)
    else:  # square: Chebyshev distance
        dist = torch.maximum(dx.abs(), dy.abs())
    return (radius + 0.5 - dist).clamp(0.0, 1.0)


def render_video(spec: VideoSpec, seed: int, cfg: DataConfig = DataConfig()) -> torch.Tensor:
    """Render one video, (F, C, H, W) float32 in [0, 1], deterministic in (spec, seed, cfg)."""
    if cfg.num_frames < 2:
        raise ValueError(f"num_frames={cfg.num_frames} is not allowed: a motion needs at least 2 frames")
    gen = torch.Generator().manual_seed(int(seed))
    radius = _uniform(gen, cfg.radius_min, cfg.radius_max)
    size_along = cfg.width if DIRECTIONS[spec.direction][0] != 0 else cfg.height
    size_across = cfg.height if DIRECTIONS[spec.direction][0] != 0 else cfg.width
    # The fastest speed that keeps the whole shape inside the frame for all frames.
    room = size_along - 1 - 2 * float(radius)
    speed = torch.clamp(_uniform(gen, cfg.speed_min, cfg.speed_max), max=room / (cfg.num_frames - 1))
    travel = float(speed) * (cfg.num_frames - 1)
    start = float(radius) + _uniform(gen, 0.0, max(room - travel, 0.0))
    across = _uniform(gen, float(radius), size_across - 1 - float(radius))
    steps = torch.arange(cfg.num_frames, dtype=torch.float32)  # (F,)
    along = start + speed * steps  # (F,) increasing coordinate
    dx, dy = DIRECTIONS[spec.direction]
    if dx != 0:
        cx = along if dx > 0 else (cfg.width - 1) - along
        cy = across.expand(cfg.num_frames)
    else:
        cy = along if dy > 0 else (cfg.height - 1) - along
        cx = across.expand(cfg.num_frames)
    colour = (torch.tensor(COLOURS[spec.colour]) + _uniform(gen, -cfg.colour_jitter, cfg.colour_jitter, (3,)))
    colour = colour.clamp(0.0, 1.0)
    background = _background(spec, gen, cfg)  # (C, H, W)
    alpha = _coverage(spec, cx, cy, radius, cfg)[:, None]  # (F, 1, H, W)
    video = background[None] * (1 - alpha) + colour.view(1, 3, 1, 1) * alpha  # (F, C, H, W)
    return video.clamp(0.0, 1.0)


def sample_batch(batch_size: int, gen: torch.Generator, specs: list[VideoSpec],
                 cfg: DataConfig = DataConfig()) -> tuple[torch.Tensor, list[str]]:
    """Draw ``batch_size`` (spec, seed) pairs from ``gen``; returns videos (B, F, C, H, W) in [0, 1] and prompts."""
    if not specs:
        raise ValueError("specs=[] is not allowed: sample_batch needs at least one VideoSpec")
    idx = torch.randint(len(specs), (batch_size,), generator=gen).tolist()
    seeds = torch.randint(2**31 - 1, (batch_size,), generator=gen).tolist()
    videos = torch.stack([render_video(specs[i], s, cfg) for i, s in zip(idx, seeds)])
    return videos, [specs[i].prompt for i in idx]
