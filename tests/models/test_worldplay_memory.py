"""HY-WorldPlay's memory selection (WorldPlay's select_aligned_memory_frames): the sizes, retrieval of a revisited
view, a seeded point cloud that leaves the global RNG alone, and append mode's whole past."""
from __future__ import annotations

import torch

from jensenkv.models.worldplay.memory import (MemorySelector, MemorySettings, fov_overlap, points_in_ball,
                                              select_memory)
from jensenkv.models.worldplay.trajectory import load_trajectory

SETTINGS = MemorySettings()  # WorldPlay's 20 = 12 recent + sink 0-3 + one 4-frame chunk


def memories(trajectory: str, chunks: int, settings: MemorySettings = SETTINGS) -> list[list[int]]:
    tr = load_trajectory(trajectory, chunks * 4)
    select = MemorySelector(settings)
    return [select(tr.w2c, i) for i in range(chunks)]


def test_memory_sizes_over_eight_chunks():
    mem = memories("forward", 8)
    assert [len(m) for m in mem] == [0, 4, 8, 12, 16, 20, 20, 20]  # chunk 0 has no past; then the whole past up to 20
    last = mem[-1]
    assert last[:4] == [0, 1, 2, 3] and last[-12:] == list(range(16, 28))  # sink + last 12 (+ one chunk)


def test_a_revisited_view_retrieves_its_chunk():
    orbit = select_memory(load_trajectory("orbit", 48).w2c, 44, SETTINGS)  # frames 44-47 look where 4-7 did
    assert orbit[4:8] == [4, 5, 6, 7]
    forward = select_memory(load_trajectory("forward", 48).w2c, 44, SETTINGS)  # control: straight on, the
    assert forward[4:8] == [28, 29, 30, 31]                                     # nearest past chunk wins


def test_fov_overlap_known_answers():
    points = points_in_ball(20_000, 8.0, 0)
    turn = load_trajectory("left-60", 61).w2c  # 60 x 3 degrees: facing backwards at the end
    assert fov_overlap(turn[0], turn[0], points, SETTINGS) == 1.0  # the same view sees all of its points
    assert fov_overlap(turn[60], turn[0], points, SETTINGS) == 0.0  # the opposite view sees none of them
    assert 0.0 < fov_overlap(turn[5], turn[0], points, SETTINGS) < 1.0  # 15 degrees apart: partly


def test_the_point_cloud_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = points_in_ball(1000, 8.0, 3), points_in_ball(1000, 8.0, 3), points_in_ball(1000, 8.0, 4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.norm(dim=1).max()) < 8.0
    tr = load_trajectory("orbit", 48).w2c
    same = [select_memory(tr, 44, SETTINGS, points_in_ball(50_000, 8.0, 7)) for _ in range(2)]
    assert same[0] == same[1]
    other = fov_overlap(tr[44], tr[4], points_in_ball(50_000, 8.0, 8), SETTINGS)
    assert other != fov_overlap(tr[44], tr[4], points_in_ball(50_000, 8.0, 7), SETTINGS)  # the seed matters


def test_append_mode_keeps_the_whole_past():
    append = MemorySettings(mode="append")
    assert [len(m) for m in memories("orbit", 8, append)] == [0, 4, 8, 12, 16, 20, 24, 28]
    assert memories("orbit", 8, append)[-1] == list(range(28))


def test_sizes_come_from_the_settings():
    small = MemorySettings(memory_frames=12, context_frames=4, sink_frames=4)
    mem = memories("orbit", 5, small)
    assert [len(m) for m in mem] == [0, 4, 8, 12, 12]
    assert mem[-1][:4] == [0, 1, 2, 3] and mem[-1][-4:] == [12, 13, 14, 15]
