"""Which past latent frames a new WorldPlay chunk sees: its memory (``generation.worldplay.memory``).

``rebuild`` is WorldPlay's ``select_aligned_memory_frames`` (hyvideo/utils/retrieval_context.py): while the
past holds at most ``memory_frames`` frames, all of it; after that the last ``context_frames`` frames, the
sink frames 0..sink_frames-1 and the past chunks (of ``chunk_frames``) whose views best overlap the new
chunk's, by a Monte-Carlo field-of-view overlap, until ``memory_frames`` is reached. With WorldPlay's
20 / 12 / 4 / 4: the last 12, frames 0-3 and one retrieved 4-frame chunk. The cache is then rebuilt from
those frames every chunk. ``append`` (QuantVideoGen's variant) keeps the whole past: no retrieval, and only
the newest chunk's tokens are written to the cache.

The point cloud is drawn from a seeded ``torch.Generator`` (``fov_seed``); WorldPlay draws it from the
unseeded global RNG, so its retrieval is not reproducible from chunk 6 on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemorySettings:
    """The sizes and the FOV test of the memory (``generation.worldplay``; WorldPlay's values as defaults)."""

    mode: str = "rebuild"                 # rebuild | append
    memory_frames: int = 20               # frames in memory at most
    context_frames: int = 12              # the most recent frames, always kept
    sink_frames: int = 4                  # frames 0..sink_frames-1, always kept once the past is longer
    chunk_frames: int = 4                 # latent frames per chunk (the retrieval unit)
    fov_degrees: tuple[float, float] = (60.0, 35.0)   # horizontal, vertical field of view of the overlap test
    fov_distance: float = 8.0             # a point counts for a past view only within this distance of it
    fov_points: int = 50_000              # Monte-Carlo points, uniform in a ball of fov_radius around the camera
    fov_radius: float = 8.0
    fov_seed: int = 0


def points_in_ball(n: int, radius: float, seed: int) -> torch.Tensor:
    """(n, 3) float32 points uniform in a ball (WorldPlay's generate_points_in_sphere: r, phi, u drawn in that
    order), from a CPU generator seeded with ``seed``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = radius * torch.rand(n, generator=gen).pow(1 / 3)
    phi = 2 * math.pi * torch.rand(n, generator=gen)
    theta = torch.acos(1 - 2 * torch.rand(n, generator=gen))
    return torch.stack((r * theta.sin() * phi.cos(), r * theta.sin() * phi.sin(), r * theta.cos()), dim=1)


def _view_angles(rotation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pitch, yaw) in degrees of a camera's forward axis: the third row of its (3, 3) world-to-camera rotation."""
    x, y, z = rotation[2, 0], rotation[2, 1], rotation[2, 2]
    return torch.atan2(y, torch.sqrt(x ** 2 + z ** 2)).rad2deg(), torch.atan2(x, z).rad2deg()


def _in_view(points: torch.Tensor, centre: torch.Tensor, pitch: torch.Tensor, yaw: torch.Tensor,
             half_h: float, half_v: float) -> torch.Tensor:
    """(N,) whether each point (N, 3) lies within the horizontal / vertical half-angles of a view (z forward)."""
    v = points - centre  # (N, 3)
    azimuth = torch.atan2(v[:, 0], v[:, 2]).rad2deg()
    elevation = torch.atan2(v[:, 1], torch.sqrt(v[:, 0] ** 2 + v[:, 2] ** 2)).rad2deg()
    d_az = torch.remainder(azimuth - yaw + 180, 360) - 180
    d_el = torch.remainder(elevation - pitch + 180, 360) - 180
    return (d_az.abs() < half_h) & (d_el.abs() < half_v)


def fov_overlap(w2c_query: torch.Tensor, w2c_past: torch.Tensor, points: torch.Tensor,
                settings: MemorySettings) -> float:
    """Fraction of the query view's points (in the query camera's frame) that the past view also sees within
    ``fov_distance`` (WorldPlay's calculate_fov_overlap_similarity, float64). w2c: (4, 4) each."""
    query = w2c_query.double()
    past = torch.linalg.inv(query @ torch.linalg.inv(w2c_past.double()))  # past camera in the query's frame
    current = torch.eye(4, dtype=torch.float64)
    r_cur, t_cur = current[:3, :3], current[:3, 3]
    r_past, t_past = past[:3, :3], past[:3, 3]
    centre_cur, centre_past = -r_cur.T @ t_cur, -r_past.T @ t_past  # (3,) camera centres
    half_h, half_v = settings.fov_degrees[0] / 2, settings.fov_degrees[1] / 2
    world = points.double() + centre_cur  # (N, 3)
    seen_cur = _in_view(world, centre_cur, *_view_angles(r_cur), half_h, half_v)
    seen_past = _in_view(world, centre_past, *_view_angles(r_past), half_h, half_v)
    seen_past &= torch.linalg.norm(world - centre_past, dim=1) < settings.fov_distance
    count = seen_cur.sum()
    if count == 0:
        return 0.0
    return float((seen_cur & seen_past).sum().float() / count.float())  # float32, as WorldPlay


def select_memory(w2c: torch.Tensor, current: int, settings: MemorySettings,
                  points: torch.Tensor | None = None) -> list[int]:
    """Sorted past latent frames in memory for the chunk starting at frame ``current``; w2c (n, 4, 4) covers
    at least the chunk (the query frames ``current .. current + chunk_frames - 1``).

    append, or a past of at most ``memory_frames`` frames: all of it. Otherwise the last ``context_frames``,
    the sink and the best chunks: each candidate chunk starting at sink_frames, sink_frames + chunk_frames, ...
    before the context is scored by 1 - overlap of its frames h and h + 2 with every query frame, averaged;
    the lowest first (ties: the earlier chunk), until sink + retrieved reach memory_frames - context_frames.
    """
    if settings.mode == "append" or current <= settings.memory_frames:
        return list(range(current))
    if points is None:
        points = points_in_ball(settings.fov_points, settings.fov_radius, settings.fov_seed)
    n = int(w2c.shape[0])
    context = list(range(max(0, current - settings.context_frames), current))
    queries = list(range(current, min(current + settings.chunk_frames, n)))
    candidates = range(settings.sink_frames, current - settings.context_frames, settings.chunk_frames)
    scored = []
    for start in candidates:
        total = 0.0
        for q in queries:
            d1 = 1.0 - fov_overlap(w2c[q], w2c[start], points, settings)
            d2 = 1.0 - fov_overlap(w2c[q], w2c[start + 2], points, settings)
            total += (d1 + d2) / 2.0
        scored.append((start, total / len(queries)))
    scored.sort(key=lambda item: item[1])  # stable: equal scores keep the earlier chunk first
    memory = list(range(settings.sink_frames))
    budget = settings.memory_frames - settings.context_frames
    for start, _ in scored:
        if len(memory) >= budget:
            break
        if start not in memory:
            memory.extend(range(start, start + settings.chunk_frames))
    return sorted(set(context) | set(memory))


class MemorySelector:
    """The memory of every chunk of one video, with one seeded point cloud (drawn on first use)."""

    def __init__(self, settings: MemorySettings):
        self.settings = settings
        self._points: torch.Tensor | None = None

    @property
    def points(self) -> torch.Tensor:
        if self._points is None:
            s = self.settings
            self._points = points_in_ball(s.fov_points, s.fov_radius, s.fov_seed)  # (N, 3) float32
        return self._points

    def __call__(self, w2c: torch.Tensor, chunk_index: int) -> list[int]:
        """Past frames in memory for chunk ``chunk_index`` (chunk 0: none)."""
        current = chunk_index * self.settings.chunk_frames
        if current == 0:
            return []
        needs_points = self.settings.mode == "rebuild" and current > self.settings.memory_frames
        return select_memory(w2c, current, self.settings, self.points if needs_points else None)
