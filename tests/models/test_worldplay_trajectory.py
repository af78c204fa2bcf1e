"""HY-WorldPlay trajectories: presets, WorldPlay's pose strings and pose JSON, the normalised intrinsics, and the
81-class action labels (known answers for each translation / rotation class), with the bad-input lines."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from jensenkv.models.worldplay.trajectory import (DEFAULT_K, from_poses, load_trajectory, parse_pose_string,
                                                  poses_from_motions, write_pose_json)

KEY = "generation.worldplay.trajectory"


def labels(spec: str, frames: int) -> list[int]:
    return load_trajectory(spec, frames).actions.tolist()


@pytest.mark.parametrize(("command", "label"), [
    ("w", 1 * 9), ("s", 2 * 9), ("d", 3 * 9), ("a", 4 * 9),   # translation class x 9
    ("right", 1), ("left", 2), ("up", 3), ("down", 4),         # rotation class: yaw right / left, pitch up / down
])
def test_each_command_gives_its_action_class(command, label):
    assert labels(f"{command}-3", 4) == [0, label, label, label]  # frame 0 has no predecessor: label 0


def test_a_diagonal_move_is_forward_and_right_and_a_turning_move_combines_both_classes():
    c2w = poses_from_motions([{"forward": 0.1, "right": 0.1}, {"forward": 0.1, "yaw": math.radians(3)}])
    k = np.broadcast_to(np.array(DEFAULT_K), (3, 3, 3))
    assert from_poses(c2w, k).actions.tolist() == [0, 5 * 9, 1 * 9 + 1]  # (forward, right) = class 5
    still = poses_from_motions([{"forward": 5e-5}])  # below WorldPlay's 1e-4 move threshold: no move
    assert from_poses(still, k[:2]).actions.tolist() == [0, 0]


def test_presets_forward_turn_orbit():
    forward = load_trajectory("forward", 8)
    c2w = torch.linalg.inv(forward.w2c)
    assert torch.allclose(c2w[:, 2, 3], 0.08 * torch.arange(8, dtype=torch.float64))  # 0.08 per latent frame
    assert forward.actions.tolist() == [0] + [9] * 7
    assert load_trajectory("turn", 5).actions.tolist() == [0, 1, 1, 1, 1]
    orbit = torch.linalg.inv(load_trajectory("orbit", 9).w2c)
    centre = orbit[:, :3, 3] + orbit[:, :3, 2]  # the point one unit ahead stays put: the camera circles it
    assert torch.allclose(centre, centre[:1].expand_as(centre), atol=1e-9)
    assert torch.allclose(orbit[-1], torch.eye(4, dtype=torch.float64), atol=1e-9)  # a full circle
    assert not torch.allclose(orbit[4], torch.eye(4, dtype=torch.float64), atol=1e-3)  # control: it moved


def test_pose_strings_follow_worldplay_syntax():
    assert parse_pose_string("w-2, right-1") == [{"forward": 0.08}, {"forward": 0.08}, {"yaw": math.radians(3)}]
    assert len(load_trajectory("w-31", 32)) == 32  # run.sh's POSE='w-31': 1 + 31 latent frames
    with pytest.raises(ValueError, match=rf"{KEY}='jump-3' is not allowed: command 'jump-3'"):
        load_trajectory("jump-3", 4)


def test_intrinsics_are_normalised_as_worldplay_does():
    k = load_trajectory("forward", 2).intrinsics[0]
    expected = torch.tensor([[969.6969696969696 / 1920, 0, 0.5], [0, 969.6969696969696 / 1080, 0.5], [0, 0, 1]],
                            dtype=torch.float64)
    assert torch.allclose(k, expected)


def test_a_pose_file_round_trips_and_its_extrinsics_are_camera_to_world(tmp_path):
    c2w = poses_from_motions([{"forward": 0.2, "yaw": 0.1}] * 5)
    path = write_pose_json(tmp_path / "pose.json", c2w)
    loaded = load_trajectory(str(path), 6)
    assert torch.allclose(loaded.w2c, torch.linalg.inv(torch.from_numpy(c2w)))
    assert loaded.actions.tolist() == [0] + [1 * 9 + 1] * 5  # forward + yaw right
    assert len(load_trajectory(str(path), 4)) == 4  # a longer file: its first frames


def test_a_trajectory_shorter_than_the_video_is_refused(tmp_path):
    with pytest.raises(ValueError, match=rf"{KEY}='w-3' is not allowed: it has 4 latent frames but the video has 8"):
        load_trajectory("w-3", 8)
    path = write_pose_json(tmp_path / "short.json", poses_from_motions([{"forward": 0.1}] * 2))
    with pytest.raises(ValueError, match=r"it has 3 latent frames but the video has 4"):
        load_trajectory(str(path), 4)


def test_a_camera_matrix_that_is_not_invertible_is_refused(tmp_path):
    c2w = poses_from_motions([{"forward": 0.1}] * 3)
    c2w[2, 2] = 0.0  # a zero row: singular
    path = write_pose_json(tmp_path / "bad.json", c2w)
    with pytest.raises(ValueError, match=r"the camera matrix \(extrinsic\) of latent frame 2 is not invertible"):
        load_trajectory(str(path), 4)
    assert len(load_trajectory(str(path), 2)) == 2  # control: the frames before it are fine


def test_malformed_pose_files_name_the_key(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"1": {"extrinsic": np.eye(4).tolist(), "K": list(DEFAULT_K)}}))
    with pytest.raises(ValueError, match=rf'{KEY}=.* needs an object with keys "0".."n-1"'):
        load_trajectory(str(bad), 1)
    with pytest.raises(FileNotFoundError, match=r"the pose file .*absent.json does not exist"):
        load_trajectory(str(tmp_path / "absent.json"), 1)
